"""The API server's own Prometheus metrics (module-level, so several servers in one process share them)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

REQUEST_DURATION = Histogram(
    "kcms_apiserver_request_duration_seconds",
    "Time to answer a request, by verb, API group, resource and HTTP code.",
    ["verb", "group", "resource", "code"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
REQUESTS = Counter(
    "kcms_apiserver_requests",
    "Requests answered, by verb, API group, resource and HTTP code.",
    ["verb", "group", "resource", "code"],
)
AUTHENTICATIONS = Counter(
    "kcms_apiserver_authentication_attempts",
    "Authentication outcomes, by method (requestheader, x509, token, anonymous, none, invalid-token).",
    ["method"],
)
AUTHORIZATIONS = Counter(
    "kcms_apiserver_authorization_decisions",
    "Authorization outcomes (allowed, denied, always-allowed-path, by-handler: authenticated and left to "
    "the handler, which decides per item, error).",
    ["decision"],
)
SPOOFED_HEADERS = Counter(
    "kcms_apiserver_requestheader_rejected",
    "Requests carrying request-header identity headers that were ignored (no valid front-proxy certificate).",
)
