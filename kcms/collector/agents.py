"""The collector of KCMS node agents: discover agent pods, scrape ``/metrics`` incrementally, store.

Targets come from a pods informer (the ``--agent-selector`` label selector; Running pods with a
``status.hostIP``, scraped at ``https://<hostIP>:<port>``; the target is named ``<namespace>/<pod>``)
or from a static ``targets`` callable of ``(name, "host:port")`` pairs (simulations).

How agents are reached is an :class:`AgentAccess`: HTTPS, the agent's certificate verified against
``ca_file`` for the name ``server_name`` (default ``kcms-agent.kube-system.svc``: one certificate
for every agent, as the DaemonSet mounts it; ``""`` checks the target's own address instead), and
the collector's bearer token (``token_source``, called before every scrape: the in-cluster
ServiceAccount token or ``--agent-token-file``, re-read when it changes) or a client certificate.
A certificate that does not verify fails the scrape before any request is sent (reason
``tls_verify``): the token never reaches an impostor. ``insecure_tls`` skips the verification
(tests); ``insecure_http`` scrapes plain HTTP and sends no token (simulated agents).

Every ``interval`` seconds every target is scraped concurrently (at most ``max_in_flight`` at once),
each under its own ``timeout`` (default 90% of the interval), so a slow agent costs the others
nothing. The first scrape of a target asks for everything it buffers (``?since=0``); later ones
ask ``?since=<newest timestamp seen from that target, ms>`` and get only newer points. Samples go to
``store.append_many``; the store refuses points not newer than a series' last one, and those are
counted as duplicates (``kcms_collector_agent_duplicate_samples_total``), never stored twice.

A caveat of ``since``: it is one timestamp per target, so a point the agent buffers later with an
older timestamp than one already seen (a source read late) is not fetched again.

The cursor never moves past the agent's own clock (its ``X-KCMS-Agent-Time`` header) nor past this
collector's: the parser already refuses lines more than ``--max-future-skew`` ahead
(``future_timestamp``), and a hostile or skewed agent that stamps points (or its header) ahead
cannot make the collector skip its later real points. An agent whose clock runs ahead of ours sends
its newest points again on the next scrape; the store counts them as duplicates.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client import Counter, Gauge, Histogram

from kcms.kube.client import KubeClient
from kcms.kube.informer import Informer
from kcms.sources.exposition import DEFAULT_MAX_BYTES, ExpositionError, parse_exposition
from kcms.tasks import cancel_and_wait

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_AGENT_SERVER_NAME",
    "AgentAccess",
    "AgentCollector",
    "AgentPod",
    "TokenFile",
    "agent_access",
    "agent_pod_from_json",
]

SCRAPE_FAILURES = Counter(
    "kcms_agent_scrape_failures_total", "Failed agent scrapes, by target and reason.", ["target", "reason"]
)
SCRAPES = Counter("kcms_collector_agent_scrapes_total", "Agent scrapes, by result.", ["result"])
SAMPLES = Counter("kcms_collector_agent_samples_total", "Agent samples stored.")
DUPLICATES = Counter(
    "kcms_collector_agent_duplicate_samples_total",
    "Agent samples not stored: not newer than the series' last point.",
)
REJECTED = Counter(
    "kcms_collector_agent_rejected_samples_total", "Agent sample lines dropped, by reason.", ["reason"]
)
SCRAPE_DURATION = Histogram(
    "kcms_collector_agent_scrape_duration_seconds",
    "Time to fetch, parse and store one agent's metrics.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
TARGETS = Gauge("kcms_collector_agent_targets", "Agent endpoints scraped in the last cycle.")

DEFAULT_MAX_BODY = DEFAULT_MAX_BYTES
DEFAULT_AGENT_SERVER_NAME = "kcms-agent.kube-system.svc"


def _file_stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class TokenFile:
    """A bearer token read from ``path``, read again whenever the file changes (projected
    ServiceAccount tokens are rotated in place); None while the file is missing or empty."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._token: str | None = None

    def __call__(self) -> str | None:
        stamp = _file_stamp(self.path)
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                with open(self.path, encoding="utf-8") as f:
                    self._token = f.read().strip() or None
            except (OSError, UnicodeDecodeError) as e:
                log.warning("cannot read the agent token file %s: %s", self.path, e)
                self._token = None
        return self._token


@dataclass(frozen=True, slots=True)
class AgentAccess:
    """How the collector reaches agents (see the module docstring)."""

    insecure_http: bool = False
    ca_file: str | None = None  # None: the system trust store
    server_name: str = DEFAULT_AGENT_SERVER_NAME  # "": the target's address must be in the certificate
    insecure_tls: bool = False
    token_source: Callable[[], str | None] | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None

    def ssl_context(self) -> ssl.SSLContext:
        """The client TLS context; raises OSError or ssl.SSLError for unreadable files."""
        ctx = ssl.create_default_context(cafile=self.ca_file)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.insecure_tls:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.client_cert_file:
            ctx.load_cert_chain(self.client_cert_file, self.client_key_file or None)
        return ctx


def agent_access(args: Any, kube: KubeClient | None) -> AgentAccess:
    """The :class:`AgentAccess` of the ``--agent-*`` flags in ``args`` (see kcms.cli); the token
    defaults to ``kube``'s credential (in a cluster, the ServiceAccount token, re-read as it rotates)."""
    if getattr(args, "agent_insecure_http", False):
        return AgentAccess(insecure_http=True)
    token_file = getattr(args, "agent_token_file", "")
    token_source = TokenFile(token_file) if token_file else (kube.bearer_token if kube is not None else None)
    return AgentAccess(
        ca_file=getattr(args, "agent_ca_file", "") or None,
        server_name=getattr(args, "agent_tls_server_name", DEFAULT_AGENT_SERVER_NAME),
        insecure_tls=getattr(args, "agent_insecure_tls", False),
        token_source=token_source,
        client_cert_file=getattr(args, "agent_client_certificate", "") or None,
        client_key_file=getattr(args, "agent_client_key", "") or None,
    )


AGENT_TIME_HEADER = "X-KCMS-Agent-Time"  # the agent's clock when it made the body, ms


def _agent_ms(value: str | None) -> int | None:
    """The agent's clock from its header: a plain integer of milliseconds, else None (ignored)."""
    if value is None or not 0 < len(value) <= 18 or not value.isascii() or not value.isdigit():
        return None
    return int(value)


class _Failure(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(slots=True, frozen=True)
class AgentPod:
    """The parts of an agent Pod the collector needs."""

    namespace: str
    name: str
    phase: str
    host_ip: str


def agent_pod_from_json(obj: dict[str, Any]) -> AgentPod:
    """An :class:`AgentPod` from a v1 Pod object (as listed or watched)."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    return AgentPod(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        phase=str(status.get("phase") or ""),
        host_ip=str(status.get("hostIP") or ""),
    )


class AgentCollector:
    """Scrapes node agents into a series store (see the module docstring).

    ``kube`` is a :class:`KubeClient` for discovery (``None`` with a static ``targets`` callable).
    """

    def __init__(
        self,
        kube: KubeClient | None,
        store: Any,
        *,
        selector: str,
        port: int = 9102,
        interval: float = 5.0,
        timeout: float | None = None,
        max_in_flight: int = 100,
        targets: Callable[[], Iterable[tuple[str, str]]] | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY,
        access: AgentAccess | None = None,
    ) -> None:
        if kube is None and targets is None:
            raise ValueError("AgentCollector needs a Kubernetes client or a targets callable")
        if not interval > 0:
            raise ValueError(f"interval must be positive, not {interval!r}")
        self.store = store
        self.selector = selector
        self.port = port
        self.interval = float(interval)
        self.timeout = float(timeout) if timeout is not None else 0.9 * self.interval
        self.max_body_bytes = max_body_bytes
        self.access = access if access is not None else AgentAccess()
        self.scheme = "http" if self.access.insecure_http else "https"
        self._ssl: ssl.SSLContext | None = None
        self._ssl_stamp: tuple | None = None
        self._static = targets
        self.informer: Informer[AgentPod] | None = None
        if targets is None and kube is not None:
            self.informer = Informer(
                kube,
                "/api/v1/pods",
                agent_pod_from_json,
                key=lambda p: (p.namespace, p.name),
                label_selector=selector,
            )
        self._semaphore = asyncio.Semaphore(max_in_flight)
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._since: dict[str, int] = {}  # target -> newest timestamp seen, ms
        self._last_reason: dict[str, str] = {}  # target -> reason of its last failure
        # Counts since construction (the Prometheus counters are process-wide).
        self.cycles = 0
        self.last_cycle_started = 0.0  # monotonic; 0 until the first cycle
        self.last_cycle_failures = 0
        self.last_cycle_seconds = 0.0
        self.stored = 0
        self.duplicates = 0
        self.failures: dict[tuple[str, str], int] = {}  # (target, reason) -> count
        self.rejected: dict[str, int] = {}

    # ----- discovery ---------------------------------------------------------------------------

    def has_synced(self) -> bool:
        """True once targets are known (always, with static targets)."""
        return self.informer is None or self.informer.has_synced()

    async def sync(self) -> None:
        """Start discovery (if any) and return once the first list of agent pods is in."""
        if self.informer is not None:
            await self.informer.start()

    def targets(self) -> list[tuple[str, str]]:
        """``(name, "host:port")`` of every agent to scrape now."""
        if self._static is not None:
            return list(self._static())
        if self.informer is None:
            return []
        out = []
        for p in self.informer.values():
            if p.phase == "Running" and p.host_ip:
                host = f"[{p.host_ip}]" if ":" in p.host_ip else p.host_ip
                out.append((f"{p.namespace}/{p.name}", f"{host}:{self.port}"))
        return out

    # ----- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start discovery and the scrape loop in the background."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kcms-agent-scrape-loop")

    async def stop(self) -> None:
        """Stop the loop and discovery; close connections."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        if self.informer is not None:
            await self.informer.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def healthy(self) -> tuple[bool, str]:
        """Liveness: the loop runs and started a cycle recently."""
        if self._task is None or self._task.done():
            return False, "agent scrape loop is not running"
        if self.last_cycle_started == 0.0:
            return (
                True,
                "waiting for agent discovery" if not self.has_synced() else "waiting for the first cycle",
            )
        age = time.monotonic() - self.last_cycle_started
        limit = 2 * self.interval + self.timeout
        if age > limit:
            return False, f"last agent scrape cycle started {age:.1f}s ago (limit {limit:.1f}s)"
        return True, "ok"

    async def _run(self) -> None:
        await self.sync()
        next_tick = time.monotonic()
        while True:
            await self.run_cycle()
            next_tick += self.interval
            delay = next_tick - time.monotonic()
            if delay < 0:  # a cycle overran: skip the missed ticks rather than bunch them up
                next_tick += (-delay // self.interval + 1) * self.interval
                delay = next_tick - time.monotonic()
            await asyncio.sleep(delay)

    # ----- scraping ----------------------------------------------------------------------------

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=max(60.0, 2 * self.interval))
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers={"Accept": "text/plain"},
                skip_auto_headers=("User-Agent",),
                # A hostile agent's status line or header lines: at most 8190 bytes each and 128
                # fields (~1 MiB in all, where Go's client allows 10 MiB), reason "connection".
                max_line_size=8190,
                max_field_size=8190,
                max_headers=128,
            )
        return self._session

    def _request_options(self) -> dict[str, Any]:
        """TLS context, server name and bearer token of one scrape (nothing for plain HTTP)."""
        access = self.access
        if access.insecure_http:
            return {}
        files = [f for f in (access.ca_file, access.client_cert_file, access.client_key_file) if f]
        stamp = tuple(_file_stamp(f) for f in files)
        if self._ssl is None or stamp != self._ssl_stamp:  # first scrape, or a rotated CA or cert
            try:
                self._ssl = access.ssl_context()
            except (OSError, ssl.SSLError) as e:  # e.g. the CA's Secret is not mounted yet
                self._ssl = None
                raise _Failure("tls_config", f"cannot load the agent TLS files: {e}") from None
            self._ssl_stamp = stamp
        options: dict[str, Any] = {"ssl": self._ssl}
        if access.server_name and not access.insecure_tls:
            options["server_hostname"] = access.server_name
        token = access.token_source() if access.token_source is not None else None
        if token:
            options["headers"] = {"Authorization": f"Bearer {token}"}
        return options

    async def run_cycle(self) -> int:
        """Scrape every target once, concurrently; return how many failed."""
        t0 = time.monotonic()
        self.last_cycle_started = t0
        targets = dict(self.targets())
        self._forget([t for t in {*self._since, *self._last_reason} if t not in targets])
        TARGETS.set(len(targets))
        results = await asyncio.gather(*(self._scrape_one(n, a) for n, a in targets.items()))
        failures = results.count(False)
        self.cycles += 1
        self.last_cycle_failures = failures
        self.last_cycle_seconds = time.monotonic() - t0
        log.debug(
            "agent cycle: %d targets, %d failed, %.3fs", len(targets), failures, self.last_cycle_seconds
        )
        return failures

    def _forget(self, gone: list[str]) -> None:
        """Drop the state and the failure series of targets no longer discovered."""
        if not gone:
            return
        for name in gone:
            self._since.pop(name, None)
            self._last_reason.pop(name, None)
        dropped = set(gone)
        for key in [k for k in self.failures if k[0] in dropped]:
            del self.failures[key]
            try:
                SCRAPE_FAILURES.remove(*key)
            except KeyError:
                pass

    async def _fetch(self, url: str) -> tuple[bytes, int | None]:
        """The body and the agent's clock (``X-KCMS-Agent-Time``, ms; None if absent or not a number)."""
        limit = self.max_body_bytes
        try:
            async with self._get_session().get(url, **self._request_options()) as resp:
                if resp.status != 200:
                    raise _Failure(f"http_{resp.status}", f"HTTP {resp.status}")
                if resp.content_length is not None and resp.content_length > limit:
                    raise _Failure("too_large", f"body of {resp.content_length} bytes over {limit}")
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_any():
                    size += len(chunk)
                    if size > limit:
                        raise _Failure("too_large", f"body over {limit} bytes")
                    chunks.append(chunk)
                return b"".join(chunks), _agent_ms(resp.headers.get(AGENT_TIME_HEADER))
        except aiohttp.ClientConnectorCertificateError as e:  # an impostor, or a wrong CA / name
            raise _Failure("tls_verify", f"the agent's certificate does not verify: {e}") from None
        except (aiohttp.ClientSSLError, ssl.SSLError) as e:
            raise _Failure("tls", f"{e.__class__.__name__}: {e}") from None
        except (aiohttp.ClientError, OSError) as e:
            raise _Failure("connection", f"{e.__class__.__name__}: {e}") from None

    async def _scrape_one(self, name: str, address: str) -> bool:
        # A target seen for the first time is asked for everything it buffers (since=0): agents
        # keep 5 minutes, so a collector that (re)starts gets that history back and serves
        # rates and windows at once instead of after two scrapes.
        since = self._since.get(name)
        url = f"{self.scheme}://{address}/metrics?since={0 if since is None else since}"
        async with self._semaphore:
            t0 = time.monotonic()
            try:
                async with asyncio.timeout(self.timeout):
                    body, agent_ms = await self._fetch(url)
                samples, rejected = parse_exposition(body, max_bytes=self.max_body_bytes)
            except _Failure as e:
                return self._failed(name, url, e.reason, str(e))
            except TimeoutError:
                return self._failed(name, url, "timeout", f"no answer within {self.timeout:.2f}s")
            except ExpositionError as e:
                return self._failed(name, url, f"decode_{e.reason}", str(e))
            try:
                accepted = self.store.append_many(samples)
            except ValueError as e:  # the parser checks what the store does; this is a bug if seen
                return self._failed(name, url, "store", str(e))
            SCRAPE_DURATION.observe(time.monotonic() - t0)
        if samples:
            newest = round(max(s[3] for s in samples) * 1000)
            # Never past the agent's clock nor ours: a point stamped ahead must not hide the
            # agent's later real points (see the module docstring).
            ceiling = round(time.time() * 1000)
            if agent_ms is not None and agent_ms < ceiling:
                ceiling = agent_ms
            newest = min(newest, ceiling)
            if since is None or newest > since:
                self._since[name] = newest
        dup = len(samples) - accepted
        self.stored += accepted
        self.duplicates += dup
        SAMPLES.inc(accepted)
        if dup:
            DUPLICATES.inc(dup)
        for reason, count in rejected.items():
            REJECTED.labels(reason).inc(count)
            self.rejected[reason] = self.rejected.get(reason, 0) + count
        if rejected:
            log.info("agent %s: dropped sample lines %s", name, rejected)
        SCRAPES.labels("success").inc()
        if self._last_reason.pop(name, None) is not None:
            log.info("agent %s at %s: scraping again", name, address)
        return True

    def _failed(self, name: str, url: str, reason: str, message: str) -> bool:
        SCRAPES.labels("failure").inc()
        SCRAPE_FAILURES.labels(name, reason).inc()
        key = (name, reason)
        self.failures[key] = self.failures.get(key, 0) + 1
        # Say it once per change of reason; repeats of the same failure go to debug.
        level = logging.DEBUG if self._last_reason.get(name) == reason else logging.WARNING
        self._last_reason[name] = reason
        log.log(level, "scrape of agent %s (%s) failed (%s): %s", name, url, reason, message)
        return False
