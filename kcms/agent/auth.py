"""Who may read the agent's ``/metrics``: authentication and authorization as the kubelet does them.

Every pod's metrics on a node are in the agent's buffer, so ``/metrics`` is guarded like the
kubelet's own ``/metrics`` (and not like its deprecated read-only port):

1. **Authentication**, first match wins:
   - a client certificate verified by the TLS layer against ``--client-ca-file`` (mutual TLS): the
     user is the subject's common name, the groups its organizations (as the kube-apiserver reads
     ``system:node:<name>`` in ``system:nodes``). A certificate that does not verify never gets
     here: the handshake fails.
   - ``Authorization: Bearer <token>``, checked with a TokenReview (cached: accepted tokens
     ``TOKEN_TTL``, refused ones ``TOKEN_FAILURE_TTL``; the cache keeps digests, never tokens).
   Neither: ``401`` (reason ``unauthenticated``); a token the API server refuses: ``401``
   (``invalid_token``).
2. **Authorization**: a SubjectAccessReview with the resource attributes the kubelet uses for its
   ``/metrics``: verb ``get``, resource ``nodes``, subresource ``metrics``, name = this node. So a
   ClusterRole granting ``nodes/metrics`` ``get`` (metrics-server's and KCMS's collector roles have
   it) suffices, and a Role cannot grant it. Decisions are cached (allowed ``ALLOWED_TTL``, denied
   ``DENIED_TTL``). Denied: ``403`` (``forbidden``).
   A review the API server cannot answer: ``503`` with ``Retry-After`` (``review_unavailable``):
   the caller may retry; nothing is served on a guess.
3. **Bounded reviews**: every unknown token costs the API server a TokenReview (the cache is per
   token), so at most ``max_pending`` requests whose caller is not yet known may wait for reviews
   at once (``--max-pending-reviews``, default ``DEFAULT_MAX_PENDING``); more are answered ``429``
   with ``Retry-After`` (``too_many_reviews``) at once. A token that authenticated and was
   authorized within ``TOKEN_TTL`` is known and never waits behind them, so a flood of made-up
   tokens (or a hung API server) cannot lock the collector out or pile up connections.

Refusals are ``Status`` JSON bodies (no metric in them), counted in
``kcms_agent_metrics_refusals_total{reason}`` and logged in one escaped line each.
The agent is a node component: it uses :mod:`kcms.kube.reviews`, not the apiserver kit.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import time
from collections import OrderedDict
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import Counter

from kcms.kube.reviews import AccessReviewer, ReviewError, TokenReviewer
from kcms.limits import printable
from kcms.model import RequestAttributes, UserInfo
from kcms.statusbody import status_object

__all__ = ["REASONS", "MetricsAuth", "status_response"]

log = logging.getLogger(__name__)

# The kubelet's defaults for its webhook authenticator and authorizer caches.
TOKEN_TTL = 120.0
TOKEN_FAILURE_TTL = 10.0
ALLOWED_TTL = 300.0
DENIED_TTL = 30.0
DEFAULT_MAX_PENDING = 32
MAX_KNOWN = 1024  # digests of recently accepted tokens kept (the collector needs one)

UNAUTHENTICATED = "unauthenticated"
INVALID_TOKEN = "invalid_token"
FORBIDDEN = "forbidden"
REVIEW_UNAVAILABLE = "review_unavailable"
TOO_MANY_REVIEWS = "too_many_reviews"
REASONS = (UNAUTHENTICATED, INVALID_TOKEN, FORBIDDEN, REVIEW_UNAVAILABLE, TOO_MANY_REVIEWS)

REFUSALS = Counter(
    "kcms_agent_metrics_refusals",
    "Requests for the agent's /metrics refused, by reason.",
    ["reason"],
)
for _reason in REASONS:  # every series exists from the start (a rate of 0 is not "unknown")
    REFUSALS.labels(_reason)

_STATUS_REASON = {401: "Unauthorized", 403: "Forbidden", 429: "TooManyRequests", 503: "ServiceUnavailable"}


def status_response(code: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    """A Kubernetes ``Status`` (kind Status, apiVersion v1) with ``code`` and ``message``."""
    body = status_object(code, _STATUS_REASON.get(code, ""), message)
    return web.Response(
        status=code, body=orjson.dumps(body), content_type="application/json", headers=headers
    )


def _certificate_user(peercert: dict[str, Any]) -> UserInfo | None:
    """The user of a verified client certificate (``ssl.SSLSocket.getpeercert()`` form)."""
    name = ""
    groups: list[str] = []
    for rdn in peercert.get("subject") or ():
        for key, value in rdn:
            if key == "commonName" and not name:
                name = str(value)
            elif key == "organizationName":
                groups.append(str(value))
    if not name:
        return None
    return UserInfo(name=name, groups=tuple(groups))


class MetricsAuth:
    """Authenticates and authorizes a request for ``/metrics`` (see the module docstring)."""

    def __init__(
        self,
        node_name: str,
        tokens: TokenReviewer,
        access: AccessReviewer,
        max_pending: int = DEFAULT_MAX_PENDING,
    ) -> None:
        self.node_name = node_name
        self.tokens = tokens
        self.access = access
        self.max_pending = max_pending
        self.pending = 0  # requests of unknown callers waiting for reviews now
        self._known: OrderedDict[bytes, float] = OrderedDict()  # token digest -> known until (monotonic)
        self._attrs = RequestAttributes(
            verb="get",
            path="/metrics",
            resource_request=True,
            api_version="v1",
            resource="nodes",
            subresource="metrics",
            name=node_name,
        )

    @classmethod
    def from_client(cls, node_name: str, client: Any, max_pending: int = DEFAULT_MAX_PENDING) -> MetricsAuth:
        """Reviews through ``client`` (a :class:`kcms.kube.client.KubeClient`), kubelet cache TTLs."""
        return cls(
            node_name,
            TokenReviewer(client, TOKEN_TTL, failure_ttl=TOKEN_FAILURE_TTL),
            AccessReviewer(client, ALLOWED_TTL, DENIED_TTL),
            max_pending,
        )

    def _is_known(self, digest: bytes) -> bool:
        until = self._known.get(digest)
        if until is None:
            return False
        if until < time.monotonic():
            del self._known[digest]
            return False
        return True

    def _remember(self, digest: bytes) -> None:
        self._known[digest] = time.monotonic() + TOKEN_TTL
        self._known.move_to_end(digest)
        while len(self._known) > MAX_KNOWN:
            self._known.popitem(last=False)

    def _refuse(
        self, request: web.Request, reason: str, code: int, message: str, detail: str = ""
    ) -> web.Response:
        """Count, log (one escaped line) and answer a refusal."""
        REFUSALS.labels(reason).inc()
        log.info(
            "/metrics refused (%s, %d) from %s: %s",
            reason,
            code,
            printable(request.remote or "?"),
            printable(detail or message),
        )
        headers = None
        if code == 401:
            headers = {"WWW-Authenticate": 'Bearer realm="kcms-agent"'}
        elif code in (429, 503):
            headers = {"Retry-After": "1"}
        return status_response(code, message, headers)

    async def check(self, request: web.Request) -> web.Response | None:
        """None if the caller may read this node's metrics, else the refusal to send."""
        user: UserInfo | None = None
        transport = request.transport
        ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
        if isinstance(ssl_object, ssl.SSLObject):
            peercert = ssl_object.getpeercert()
            if peercert:  # only a certificate the context verified is returned here
                user = _certificate_user(peercert)
        if user is not None:  # the CA vouched for it: only the (cached) authorization is left
            return await self._authorize(request, user)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return self._refuse(request, UNAUTHENTICATED, 401, "Unauthorized")
        digest = hashlib.sha256(token.encode()).digest()
        if self._is_known(digest):
            return await self._review(request, token, digest)
        if self.pending >= self.max_pending:
            return self._refuse(
                request, TOO_MANY_REVIEWS, 429, "too many requests awaiting authentication, retry later"
            )
        self.pending += 1
        try:
            return await self._review(request, token, digest)
        finally:
            self.pending -= 1

    async def _review(self, request: web.Request, token: str, digest: bytes) -> web.Response | None:
        try:
            user = await self.tokens.authenticate(token)
        except ReviewError as e:
            return self._refuse(
                request, REVIEW_UNAVAILABLE, 503, "authentication is unavailable, retry later", f"{e}"
            )
        if user is None:
            return self._refuse(request, INVALID_TOKEN, 401, "Unauthorized")
        refusal = await self._authorize(request, user)
        if refusal is None:
            self._remember(digest)
        return refusal

    async def _authorize(self, request: web.Request, user: UserInfo) -> web.Response | None:
        try:
            allowed, why = await self.access.authorize(user, self._attrs)
        except ReviewError as e:
            return self._refuse(
                request,
                REVIEW_UNAVAILABLE,
                503,
                "authorization is unavailable, retry later",
                f"{user.name}: {e}",
            )
        if not allowed:
            message = (
                f'nodes "{self.node_name}" is forbidden: User "{user.name}" cannot get resource '
                f'"nodes/metrics" in API group "" at the cluster scope'
            )
            return self._refuse(request, FORBIDDEN, 403, message + (f": {why}" if why else ""))
        log.debug("/metrics read by %s", printable(user.name))
        return None
