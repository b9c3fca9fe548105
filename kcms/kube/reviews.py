"""Delegated authentication and authorization against the Kubernetes API server.

- `TokenReviewer`: bearer tokens checked with TokenReview (authentication.k8s.io/v1), cached.
- `AccessReviewer`: requests checked with SubjectAccessReview (authorization.k8s.io/v1), cached.
- `read_extension_apiserver_authentication`: the kube-system/extension-apiserver-authentication ConfigMap
  (client CA, front-proxy request-header settings) that an aggregated API server trusts.

Caches are bounded (oldest entries evicted first) and entries expire after their TTL. Concurrent
identical look-ups share one request. Errors talking to the API server raise `ReviewError` and are
never cached.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

import aiohttp

from kcms.kube.client import KubeAPIError, KubeClient
from kcms.model import RequestAttributes, UserInfo

V = TypeVar("V")

TOKENREVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECTACCESSREVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
EXTENSION_AUTH_CONFIGMAP = "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication"


class ReviewError(Exception):
    """The review could not be made (API server unreachable or refused the review itself)."""


class _TTLCache(Generic[V]):
    """A bounded map of key -> value with a per-entry expiry, plus in-flight de-duplication."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._data: OrderedDict[Hashable, tuple[float, V]] = OrderedDict()
        self._inflight: dict[Hashable, asyncio.Future[tuple[V, float]]] = {}

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: Hashable) -> tuple[bool, V | None]:
        hit = self._data.get(key)
        if hit is None:
            return False, None
        if hit[0] < time.monotonic():
            del self._data[key]
            return False, None
        return True, hit[1]

    def put(self, key: Hashable, value: V, ttl: float) -> None:
        if ttl <= 0:
            return
        self._data[key] = (time.monotonic() + ttl, value)
        self._data.move_to_end(key)
        while len(self._data) > self.max_entries:
            self._data.popitem(last=False)

    async def get_or_fetch(self, key: Hashable, fetch: Callable[[], Awaitable[tuple[V, float]]]) -> V:
        """Cached value, or the result of ``fetch`` (value, ttl) shared by all concurrent callers."""
        found, value = self.get(key)
        if found:
            return value  # type: ignore[return-value]
        fut = self._inflight.get(key)
        if fut is not None:
            try:
                return (await asyncio.shield(fut))[0]
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not fut.cancelled() or (task is not None and task.cancelling()):
                    raise
                return await self.get_or_fetch(key, fetch)  # the fetching caller was cancelled: retry
        fut = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            result = await fetch()
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except Exception as e:
            fut.set_exception(e)
            fut.exception()  # mark retrieved: waiters (if any) get it too
            raise
        else:
            fut.set_result(result)
            self.put(key, result[0], result[1])
        finally:
            self._inflight.pop(key, None)
        return result[0]


async def _post_review(client: KubeClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    try:
        return await client.post_json(path, body)
    except (KubeAPIError, aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
        raise ReviewError(f"{body['kind']} failed: {e}") from e


class TokenReviewer:
    """Authenticates bearer tokens with TokenReview; authenticated results cached ``cache_ttl`` seconds,
    rejections ``failure_ttl`` seconds."""

    def __init__(
        self,
        client: KubeClient,
        cache_ttl: float = 10.0,
        *,
        failure_ttl: float = 2.0,
        audiences: tuple[str, ...] = (),
        max_entries: int = 10_000,
    ) -> None:
        self.client = client
        self.cache_ttl = cache_ttl
        self.failure_ttl = failure_ttl
        self.audiences = audiences
        self._cache: _TTLCache[UserInfo | None] = _TTLCache(max_entries)

    async def authenticate(self, token: str) -> UserInfo | None:
        """The user the token belongs to, or None if the API server does not accept it."""
        key = hashlib.sha256(token.encode()).digest()  # do not keep raw tokens around
        return await self._cache.get_or_fetch(key, lambda: self._review(token))

    async def _review(self, token: str) -> tuple[UserInfo | None, float]:
        spec: dict[str, Any] = {"token": token}
        if self.audiences:
            spec["audiences"] = list(self.audiences)
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        status = (await _post_review(self.client, TOKENREVIEWS, body)).get("status") or {}
        if not status.get("authenticated"):
            return None, self.failure_ttl
        u = status.get("user") or {}
        extra = tuple(
            sorted((str(k), tuple(str(x) for x in v or ())) for k, v in (u.get("extra") or {}).items())
        )
        user = UserInfo(
            name=u.get("username", ""),
            uid=u.get("uid", ""),
            groups=tuple(u.get("groups") or ()),
            extra=extra,
        )
        return user, self.cache_ttl


def access_review_spec(user: UserInfo, attrs: RequestAttributes) -> dict[str, Any]:
    """The SubjectAccessReview spec for ``user`` doing ``attrs``."""
    spec: dict[str, Any] = {"user": user.name, "groups": list(user.groups)}
    if user.uid:
        spec["uid"] = user.uid
    if user.extra:
        spec["extra"] = {k: list(v) for k, v in user.extra}
    if attrs.resource_request:
        ra = {
            "namespace": attrs.namespace,
            "verb": attrs.verb,
            "group": attrs.api_group,
            "version": attrs.api_version,
            "resource": attrs.resource,
            "subresource": attrs.subresource,
            "name": attrs.name,
        }
        spec["resourceAttributes"] = {k: v for k, v in ra.items() if v}
    else:
        spec["nonResourceAttributes"] = {"path": attrs.path, "verb": attrs.verb}
    return spec


class AccessReviewer:
    """Authorizes requests with SubjectAccessReview, caching decisions per (user, attributes)."""

    def __init__(
        self,
        client: KubeClient,
        allowed_ttl: float = 10.0,
        denied_ttl: float = 10.0,
        *,
        max_entries: int = 10_000,
    ) -> None:
        self.client = client
        self.allowed_ttl = allowed_ttl
        self.denied_ttl = denied_ttl
        self._cache: _TTLCache[tuple[bool, str]] = _TTLCache(max_entries)

    async def authorize(self, user: UserInfo, attrs: RequestAttributes) -> tuple[bool, str]:
        """(allowed, reason) for ``user`` doing ``attrs``."""
        return await self._cache.get_or_fetch((user, attrs), lambda: self._review(user, attrs))

    async def _review(self, user: UserInfo, attrs: RequestAttributes) -> tuple[tuple[bool, str], float]:
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": access_review_spec(user, attrs),
        }
        status = (await _post_review(self.client, SUBJECTACCESSREVIEWS, body)).get("status") or {}
        allowed = bool(status.get("allowed")) and not status.get("denied")
        reason = str(status.get("reason") or status.get("evaluationError") or "")
        return (allowed, reason), self.allowed_ttl if allowed else self.denied_ttl


def _json_list(value: str | None) -> list[str]:
    if not value:
        return []
    try:
        parsed = json.loads(value)
    except ValueError:
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(parsed, list):
        return [str(v) for v in parsed]
    return [str(parsed)]


async def read_extension_apiserver_authentication(client: KubeClient) -> dict[str, Any]:
    """Read kube-system/extension-apiserver-authentication and parse its data.

    Returns a dict with the ConfigMap's key names: ``client-ca-file`` and ``requestheader-client-ca-file``
    (PEM text, "" when absent) and the JSON-list keys ``requestheader-allowed-names``,
    ``requestheader-username-headers``, ``requestheader-uid-headers``, ``requestheader-group-headers``,
    ``requestheader-extra-headers-prefix`` (lists of str, [] when absent). Raises KubeAPIError.
    """
    data = (await client.get_json(EXTENSION_AUTH_CONFIGMAP)).get("data") or {}
    out: dict[str, Any] = {
        "client-ca-file": data.get("client-ca-file", ""),
        "requestheader-client-ca-file": data.get("requestheader-client-ca-file", ""),
    }
    for key in (
        "requestheader-allowed-names",
        "requestheader-username-headers",
        "requestheader-uid-headers",
        "requestheader-group-headers",
        "requestheader-extra-headers-prefix",
    ):
        out[key] = _json_list(data.get(key))
    return out
