"""A generic aggregated-API-server kit: TLS serving with certificate reload, delegated
authentication (front-proxy request headers, client certificates, bearer tokens) and authorization
(SubjectAccessReview), discovery, OpenAPI v2/v3, ``Status`` errors, JSON and ``Table`` output,
health checks, overload protection (max-in-flight, probes exempt; :mod:`.inflight`), a guarded
listener (header/idle/body deadlines, protocol errors as ``Status``; :mod:`kcms.httpguard`) and
its own Prometheus metrics.

Typical use::

    server = AggregatedAPIServer(ServingOptions(secure_port=0), AuthnOptions(...), AuthzOptions(...))
    server.install(APIGroupVersion("metrics.k8s.io", "v1beta1", resources, routes, defs, paths))
    await server.start()
"""

from .authn import AuthnOptions, TokenAuthenticator
from .authz import AccessAuthorizer, AuthzOptions
from .discovery import APIGroupVersion, Route
from .requestinfo import request_attributes
from .responses import (
    StatusError,
    TableConverter,
    bad_request,
    forbidden,
    internal_error,
    method_not_allowed,
    not_acceptable,
    not_found,
    respond,
    service_unavailable,
    unauthorized,
)
from .server import ATTRIBUTES, USER, AggregatedAPIServer
from .serving import ServingOptions, generate_self_signed

__all__ = [
    "ATTRIBUTES",
    "USER",
    "APIGroupVersion",
    "AccessAuthorizer",
    "AggregatedAPIServer",
    "AuthnOptions",
    "AuthzOptions",
    "Route",
    "ServingOptions",
    "StatusError",
    "TableConverter",
    "TokenAuthenticator",
    "bad_request",
    "forbidden",
    "generate_self_signed",
    "internal_error",
    "method_not_allowed",
    "not_acceptable",
    "not_found",
    "request_attributes",
    "respond",
    "service_unavailable",
    "unauthorized",
]
