"""Push reporting from the agent (``kcms agent --push``): every ``interval`` the node's kubelet
readings and the agent's new custom series go to the active KCMS server's ``POST /push/v1/nodes``
(:mod:`kcms.apis.nodepush`) as a MessagePack :class:`~kcms.store.wire.Write`, gzip-encoded.

Endpoints: the one that accepted the last push is tried first, then the others in the order given.
A ``503`` (a standby server), a connection error, a timeout or another 5xx moves on to the next
endpoint; any other 4xx (a bad token, a missing RBAC grant, a body the server refuses) is logged and
counted and the round ends there: retrying elsewhere would not help. The bearer token is read again
before every push: the kubelet rotates a projected ServiceAccount token file (at 80% of its
``expirationSeconds``, swapping it atomically). A ``401`` answered to a token that has changed on disk
since it was read is retried once at once with the new one. A token source that yields nothing (a
missing or empty file) sends nothing: an anonymous push would only be refused (``no_token``).

The server binds each push to the node the credential names (:mod:`kcms.apis.nodebinding`), so the
token must be the agent pod's own bound ServiceAccount token (its node claim, or its pod claim); the
``refused`` count of an answer covers readings and samples the server would not take from this node
(another node's, pods the server's inventory does not place here, bounds).

Custom series: a push carries the points of the agent's buffer newer than the newest timestamp the
last accepted push carried (the buffer's ``since``), and names the server's ``X-KCMS-Push-Epoch``
it continues. The first push to an endpoint other than the one that accepted last (a failover)
carries the whole buffer instead: the new active server starts empty. So does a push the server
answers ``409 Conflict`` (it restarted, or was a standby in between: its epoch changed), resent at
once to the same endpoint.

Counter ``kcms_agent_pushes_total{endpoint, outcome}``; outcomes: ``accepted``, ``standby`` (503),
``unreachable`` (connection error or timeout), ``server_error`` (another 5xx), ``epoch_changed``
(409: the whole buffer follows), ``too_large`` (413: retried at once with only the newest point of
each series), ``rejected`` (another 4xx), ``no_token`` (the token source gave nothing; nothing sent),
``collect_error`` (``collect()`` raised; endpoint ``""``). Items an accepted push had refused are
counted in ``kcms_agent_push_refused_items_total``.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import ssl
from collections.abc import Awaitable, Callable

import aiohttp
import msgspec
from prometheus_client import Counter

from kcms.agent.buffer import SampleBuffer
from kcms.sources.exposition import parse_exposition
from kcms.store.wire import CONTENT_TYPE, Write, WriteAck, decode, encode, samples_to_wire
from kcms.tasks import cancel_and_wait, run_every

__all__ = ["NODES_PATH", "PushReporter"]

log = logging.getLogger(__name__)

NODES_PATH = "/push/v1/nodes"
EPOCH_HEADER = "X-KCMS-Push-Epoch"

PUSHES = Counter(
    "kcms_agent_pushes", "Pushes to KCMS servers, by endpoint and outcome.", ["endpoint", "outcome"]
)
REFUSED_ITEMS = Counter(
    "kcms_agent_push_refused_items",
    "Readings and samples accepted pushes carried that the server refused (see its "
    "kcms_push_node_refused_total for the reasons).",
)


_RESEND = object()  # the server's epoch changed: send the whole buffer
_TOO_LARGE = object()  # 413: send only the newest point of each series


class _Refused(Exception):
    """A 4xx other than 503: do not try the other endpoints this round."""


class PushReporter:
    """Pushes ``collect()`` (plus the buffer's new series) to the first endpoint that accepts it."""

    def __init__(
        self,
        endpoints: list[str],
        *,
        interval: float = 15.0,
        timeout: float = 5.0,
        token_source: Callable[[], str | None] | None = None,
        ca_file: str | None = None,
        collect: Callable[[], Awaitable[Write]],
        buffer: SampleBuffer | None = None,
    ) -> None:
        """``endpoints``: base URLs (``https://kcms.kube-system.svc:443``). ``collect()``: the write
        to send (the node's readings). ``buffer``: custom series sent along (None: none)."""
        if not endpoints:
            raise ValueError("at least one endpoint is required")
        if not interval > 0 or not timeout > 0:
            raise ValueError("interval and timeout must be positive")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.interval = float(interval)
        self.timeout = float(timeout)
        self.token_source = token_source
        self.ca_file = ca_file
        self.collect = collect
        self.buffer = buffer
        self.active_endpoint: str | None = None
        self.pushes = 0  # rounds that some endpoint accepted
        self.last_ack: WriteAck | None = None
        self._epoch: str | None = None  # X-KCMS-Push-Epoch of active_endpoint
        self._since_ms: int | None = None  # newest point carried to active_endpoint; None: send all
        # Built now, so that a bad CA file stops start-up (OSError / ssl.SSLError).
        self._ssl = ssl.create_default_context(cafile=ca_file)
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Push every ``interval`` seconds in a background task (the first push at once)."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="agent push reporter")

    async def stop(self) -> None:
        """Stop pushing and close the connections."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _loop(self) -> None:
        await run_every(self.interval, self.push_once, "push round")

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl, limit=4),
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                auto_decompress=True,
            )
        return self._session

    # ---- one round -----------------------------------------------------------------------------

    def _series(self, since_ms: int | None, latest: bool = False) -> tuple[list, int | None]:
        """Buffered points newer than ``since_ms`` (None: all; ``latest``: the newest of each series)
        as wire samples, and the newest timestamp among them in ms."""
        if self.buffer is None:
            return [], None
        text = self.buffer.render(None if latest else 0 if since_ms is None else since_ms)
        samples, _ = parse_exposition(text)
        if not samples:
            return [], None
        newest = max(round(s[3] * 1000.0) for s in samples)
        return samples_to_wire(samples), newest

    async def push_once(self) -> bool:
        """One report; True when an endpoint accepted it."""
        try:
            write = await self.collect()
        except Exception:
            PUSHES.labels("", "collect_error").inc()
            log.exception("collecting the push failed")
            return False
        order = self.endpoints
        if self.active_endpoint is not None:
            order = [self.active_endpoint] + [e for e in self.endpoints if e != self.active_endpoint]
        for endpoint in order:
            continuing = endpoint == self.active_endpoint and self._since_ms is not None
            try:
                ack, epoch, newest = await self._push_series(
                    endpoint, write, "delta" if continuing else "all"
                )
                if ack is _RESEND:  # the server's epoch changed: it lacks the older points
                    log.info("%s holds data afresh: sending the whole buffer", endpoint)
                    continuing = False
                    ack, epoch, newest = await self._push_series(endpoint, write, "all")
                if ack is _TOO_LARGE and newest is not None:
                    log.warning("the push is over %s's size limit: sending the newest points only", endpoint)
                    ack, epoch, newest = await self._push_series(endpoint, write, "latest")
                if ack is _TOO_LARGE:
                    raise _Refused(413)
            except _Refused:
                return False
            if ack is None or ack is _RESEND:
                continue
            assert isinstance(ack, WriteAck)
            if endpoint != self.active_endpoint:
                log.info("pushing to %s", endpoint)
            self.active_endpoint, self._epoch = endpoint, epoch
            self.last_ack = ack
            self.pushes += 1
            if not continuing:
                self._since_ms = newest or 0
            elif newest is not None:
                self._since_ms = max(newest, self._since_ms or 0)
            return True
        log.warning("no endpoint accepted the push (%s)", ", ".join(order))
        return False

    async def _push_series(
        self, endpoint: str, write: Write, mode: str
    ) -> tuple[WriteAck | object | None, str | None, int | None]:
        """POST ``write`` plus buffered points: ``delta`` (new since the last accepted push), ``all``
        or ``latest`` (the newest of each series). Returns ``(answer, epoch, newest point carried in
        ms)``; the answer is a WriteAck, None (try the next endpoint), _RESEND or _TOO_LARGE."""
        delta = mode == "delta"
        samples, newest = self._series(self._since_ms if delta else None, latest=mode == "latest")
        body = Write(nodes=write.nodes, samples=[*write.samples, *samples], series=write.series)
        ack, epoch = await self._post(endpoint, body, self._epoch if delta else None)
        return ack, epoch, newest

    async def _post(
        self, endpoint: str, write: Write, continues: str | None
    ) -> tuple[WriteAck | object | None, str | None]:
        """POST one write (continuing epoch ``continues``, if given). Returns ``(ack, epoch)``;
        ``(None, None)``: try the next endpoint; ``(_RESEND, None)`` after a 409, ``(_TOO_LARGE,
        None)`` after a 413; raises _Refused after another 4xx."""
        body = gzip.compress(encode(write), compresslevel=3)
        headers = {
            "Content-Type": CONTENT_TYPE,
            "Content-Encoding": "gzip",
            "Accept": CONTENT_TYPE,
            "User-Agent": "kcms-agent",
        }
        if continues:
            headers[EPOCH_HEADER] = continues
        url = endpoint + NODES_PATH
        token = None
        for attempt in (1, 2):
            if self.token_source is not None:
                token = self.token_source()
                if not token:
                    PUSHES.labels(endpoint, "no_token").inc()
                    log.warning("no bearer token to push with (the token file is missing or empty)")
                    raise _Refused(0)
                headers["Authorization"] = f"Bearer {token}"
            try:
                async with self._client().post(url, data=body, headers=headers) as r:
                    payload = await r.read()
                    status = r.status
                    epoch = r.headers.get(EPOCH_HEADER)
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
                PUSHES.labels(endpoint, "unreachable").inc()
                log.info("push to %s failed: %s", endpoint, e or type(e).__name__)
                return None, None
            # a 401 for a token rotated meanwhile: once more with the new one
            if status != 401 or attempt == 2 or self.token_source is None or self.token_source() == token:
                break
            PUSHES.labels(endpoint, "rejected").inc()
            log.info(
                "push to %s: 401 with a token that has since rotated; retrying with the new one", endpoint
            )
        if status == 200:
            try:
                ack = decode(payload, WriteAck)
            except (msgspec.ValidationError, msgspec.DecodeError) as e:
                PUSHES.labels(endpoint, "server_error").inc()
                log.warning("push to %s: unreadable answer: %s", endpoint, e)
                return None, None
            PUSHES.labels(endpoint, "accepted").inc()
            if ack.refused:
                REFUSED_ITEMS.inc(ack.refused)
                log.warning("%s refused %d readings or samples of this push", endpoint, ack.refused)
            return ack, epoch
        text = payload[:300].decode("utf-8", "replace")
        if status == 409 and continues:
            PUSHES.labels(endpoint, "epoch_changed").inc()
            return _RESEND, None
        if status == 413:
            PUSHES.labels(endpoint, "too_large").inc()
            log.warning("push to %s refused as too large: %s", endpoint, text)
            return _TOO_LARGE, None
        if status == 503:
            PUSHES.labels(endpoint, "standby").inc()
            log.debug("%s is a standby: %s", endpoint, text)
            return None, None
        if status >= 500:
            PUSHES.labels(endpoint, "server_error").inc()
            log.warning("push to %s: HTTP %d: %s", endpoint, status, text)
            return None, None
        PUSHES.labels(endpoint, "rejected").inc()
        log.warning("push to %s refused: HTTP %d: %s", endpoint, status, text)
        raise _Refused(status)
