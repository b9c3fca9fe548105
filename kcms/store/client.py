"""A client of one `kcms store` replica (see :mod:`kcms.store.service`).

Responses are bounded as Go's HTTP client bounds them, with aiohttp's parser limits set on the
session (:func:`session_limits`): a status line or header line of at most 8190 bytes and at most
128 header fields, so at most ~1 MiB of headers (Go's ``Transport`` allows 10 MiB in all, http2 the
same); a store never sends more than a handful. A token source that yields ``""`` (a token file
empty or unusable and nothing loaded before it) makes a request fail at once with a
:class:`StoreError`; no request goes out with a blank ``Authorization`` header.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any

import aiohttp

from kcms.store import wire


class StoreError(Exception):
    """A replica did not answer usefully: unreachable, timed out, or an error status."""

    def __init__(self, store: str, message: str, status: int = 0) -> None:
        super().__init__(f"store {store}: {message}")
        self.store = store
        self.status = status


# aiohttp's parser limits for responses (its defaults since 3.10; set here so older versions and
# future default changes cannot loosen them).
MAX_RESPONSE_LINE = 8190
MAX_RESPONSE_FIELD = 8190
MAX_RESPONSE_HEADERS = 128


def session_limits() -> dict[str, int]:
    """Keyword arguments for ``aiohttp.ClientSession`` bounding response status and header lines."""
    return {
        "max_line_size": MAX_RESPONSE_LINE,
        "max_field_size": MAX_RESPONSE_FIELD,
        "max_headers": MAX_RESPONSE_HEADERS,
    }


def client_ssl_context(ca_file: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca_file or None)
    return ctx


class StoreClient:
    """Requests to one replica at ``url`` (``http://`` or ``https://host:port``).

    ``token()`` gives the bearer token: ``None`` sends none (no token configured), ``""`` means the
    configured token is unusable right now, and the request fails without being sent.

    Each request has its own deadline (``timeout`` seconds) and is retried ``retries`` times on a
    connection error or timeout, never on an answer: a replica that answered an error is not asked
    again within the same call.
    """

    def __init__(
        self,
        name: str,
        url: str,
        session: aiohttp.ClientSession,
        token: Callable[[], str | None],
        *,
        timeout: float = 2.0,
        retries: int = 1,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> None:
        self.name = name
        self.url = url.rstrip("/")
        self.session = session
        self.token = token
        self.timeout = timeout
        self.retries = retries
        self.ssl = ssl_context if self.url.startswith("https:") else None
        # The name the certificate must carry when ``url`` holds an address (EndpointSlices give
        # pod IPs; certificates name the pods' DNS names).
        self.tls_name = {"server_hostname": server_hostname} if server_hostname and self.ssl else {}

    def __repr__(self) -> str:
        return f"StoreClient({self.name!r}, {self.url!r})"

    async def _post(self, path: str, body: Any, typ: type, deadline: float | None = None) -> Any:
        return await self._post_encoded(path, wire.encode(body), typ, deadline)

    async def _post_encoded(self, path: str, data: bytes, typ: type, deadline: float | None = None) -> Any:
        headers = {"Content-Type": wire.CONTENT_TYPE, "Accept-Encoding": "gzip"}
        token = self.token()
        if token is not None:
            if not token:
                raise StoreError(
                    self.name, f"{path}: no usable bearer token (token file empty or being rewritten)"
                )
            headers["Authorization"] = "Bearer " + token
        limit = aiohttp.ClientTimeout(total=deadline or self.timeout)
        attempt = 0
        free_retry_used = False
        while True:
            try:
                async with self.session.post(
                    self.url + path, data=data, headers=headers, timeout=limit, ssl=self.ssl, **self.tls_name
                ) as resp:
                    raw = await resp.read()
                    if resp.status != 200:
                        message = raw[:300].decode("utf-8", "replace")
                        raise StoreError(self.name, f"{path}: HTTP {resp.status}: {message}", resp.status)
                    return wire.decode(raw, typ)
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
                attempt += 1
                # A pooled keep-alive connection to a replica that restarted fails at once with a
                # disconnect: that costs one free retry on a new connection, not a failed request.
                if isinstance(e, aiohttp.ServerDisconnectedError) and not free_retry_used:
                    free_retry_used = True
                    attempt -= 1
                    continue
                if attempt > self.retries:
                    raise StoreError(self.name, f"{path}: {type(e).__name__}: {e}") from None
            except ValueError as e:  # an answer we cannot decode
                raise StoreError(self.name, f"{path}: malformed answer: {e}") from None

    async def write(self, body: wire.Write) -> wire.WriteAck:
        return await self._post("/store/v1/write", body, wire.WriteAck)

    async def write_encoded(self, data: bytes) -> wire.WriteAck:
        """A write already encoded with :func:`kcms.store.wire.encode` (one body, many replicas)."""
        return await self._post_encoded("/store/v1/write", data, wire.WriteAck)

    async def query_series(self, q: wire.SeriesQuery) -> list[wire.SeriesRow]:
        return await self._post("/store/v1/query/series", q, list[wire.SeriesRow])

    async def query_resource(self, q: wire.ResourceQuery) -> wire.ResourceRows:
        return await self._post("/store/v1/query/resource", q, wire.ResourceRows)

    async def metrics(self) -> list[tuple[str, str]]:
        return await self._post("/store/v1/metrics", None, list[tuple[str, str]])

    async def export(self, req: wire.ExportRequest, deadline: float | None = None) -> wire.Write:
        return await self._post("/store/v1/export", req, wire.Write, deadline=deadline)

    async def ready(self) -> bool:
        try:
            async with self.session.get(
                self.url + "/readyz",
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                ssl=self.ssl,
                **self.tls_name,
            ) as resp:
                return resp.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False
