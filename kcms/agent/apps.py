"""Application metrics: the Prometheus endpoints of this node's pods that ask to be scraped.

A pod is scraped when it is Running, has an IP and carries the annotations

* ``prometheus.io/scrape: "true"`` (required),
* ``prometheus.io/port`` (required: a port number),
* ``prometheus.io/path`` (default ``/metrics``),
* ``prometheus.io/scheme`` (``http``, the default, or ``https``; certificates are not verified:
  pods rarely hold certificates for their IPs, and the agent sends no credentials).

Every sample of the text it returns becomes a sample about ``ObjectRef("pods", ns, name)`` with the
app's labels, except reserved ones (``kcms_*`` and ``__*``), which are dropped. The app's timestamp
is kept when it gives one, else the time the response arrived. ``# TYPE`` lines are honoured
(:attr:`AppSource.types`: counter and gauge families as such, histogram and summary ``_count``,
``_sum`` and ``_bucket`` series as counters, summary quantiles as gauges). NaN samples are skipped;
malformed lines are skipped and counted (``errors["malformed"]``), as are failed scrapes
(``errors["scrape"]``) and pods whose annotations do not make an address (``errors["annotation"]``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable

import aiohttp

from kcms.agent.buffer import Sample
from kcms.agent.pods import AgentPod
from kcms.model import ObjectRef
from kcms.sources.promtext import LineError, parse_sample_line, parse_timestamp, parse_value

__all__ = ["AppSource", "parse_exposition", "scrape_url"]

log = logging.getLogger(__name__)

SCRAPE = "prometheus.io/scrape"
PORT = "prometheus.io/port"
PATH = "prometheus.io/path"
SCHEME = "prometheus.io/scheme"


def scrape_url(pod: AgentPod) -> str | None:
    """The URL to scrape for ``pod``; None if it does not ask to be scraped or cannot be.

    Raises ``ValueError`` for annotations that ask for a scrape but are unusable.
    """
    if pod.annotations.get(SCRAPE, "").lower() != "true" or pod.phase != "Running" or not pod.ip:
        return None
    port_text = pod.annotations.get(PORT, "")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{pod.namespace}/{pod.name}: {PORT} must be a port number, not {port_text!r}")
    scheme = pod.annotations.get(SCHEME, "http").lower()
    if scheme not in ("http", "https"):
        raise ValueError(f"{pod.namespace}/{pod.name}: {SCHEME} must be http or https, not {scheme!r}")
    path = pod.annotations.get(PATH, "/metrics") or "/metrics"
    if not path.startswith("/"):
        path = "/" + path
    host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip
    return f"{scheme}://{host}:{int(port_text)}{path}"


def parse_exposition(
    text: str, obj: ObjectRef, now: float, types: dict[str, str] | None = None
) -> tuple[list[Sample], int]:
    """Samples of Prometheus text about ``obj`` and the number of malformed lines skipped.

    ``types`` (if given) receives the exposition type of each series name declared by ``# TYPE``.
    """
    out: list[Sample] = []
    malformed = 0
    for line in text.splitlines():
        if not line or line.isspace():
            continue
        if line[0] == "#":
            if types is not None and line.startswith("# TYPE "):
                _declare(line, types)
            continue
        try:
            name, labels, value_text, ts_text = parse_sample_line(line)
            value = parse_value(value_text)
            ts = now if ts_text is None else parse_timestamp(ts_text) / 1000.0
        except (LineError, ValueError):
            malformed += 1
            continue
        if math.isnan(value):
            continue
        kept = tuple(sorted((k, v) for k, v in labels.items() if not k.startswith(("kcms_", "__"))))
        out.append((name, obj, kept, ts, value))
    return out, malformed


def _declare(line: str, types: dict[str, str]) -> None:
    parts = line.split()
    if len(parts) != 4:
        return
    name, kind = parts[2], parts[3]
    if kind in ("counter", "gauge"):
        types[name] = kind
    elif kind in ("histogram", "summary"):
        for suffix in ("_count", "_sum", "_bucket"):
            types[name + suffix] = "counter"
        if kind == "summary":
            types[name] = "gauge"


class AppSource:
    """Scrapes the annotated pods of ``pods()`` concurrently (see the module docstring)."""

    def __init__(
        self,
        pods: Callable[[], Iterable[AgentPod]],
        timeout: float = 5.0,
        max_body: int = 16 << 20,
        concurrency: int = 16,
    ) -> None:
        self.pods = pods
        self.timeout = timeout
        self.max_body = max_body
        self.concurrency = concurrency
        self.types: dict[str, str] = {}
        self.errors: dict[str, int] = {"malformed": 0, "scrape": 0, "annotation": 0}
        self.last_scraped = 0  # endpoints scraped successfully in the last collection
        self._session: aiohttp.ClientSession | None = None

    def _count(self, reason: str, n: int = 1) -> None:
        self.errors[reason] = self.errors.get(reason, 0) + n

    async def collect(self, now: float) -> list[Sample]:
        """Scrape every annotated pod once; the samples of those that answered."""
        targets: list[tuple[AgentPod, str]] = []
        for pod in self.pods():
            try:
                url = scrape_url(pod)
            except ValueError as e:
                self._count("annotation")
                log.debug("not scraping: %s", e)
                continue
            if url is not None:
                targets.append((pod, url))
        if not targets:
            self.last_scraped = 0
            return []
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                connector=aiohttp.TCPConnector(ssl=False, limit=self.concurrency),
            )
        gate = asyncio.Semaphore(self.concurrency)
        results = await asyncio.gather(*(self._scrape(pod, url, gate) for pod, url in targets))
        out: list[Sample] = []
        for samples in results:
            if samples is not None:
                out.extend(samples)
        self.last_scraped = sum(1 for r in results if r is not None)
        return out

    async def _scrape(self, pod: AgentPod, url: str, gate: asyncio.Semaphore) -> list[Sample] | None:
        assert self._session is not None
        async with gate:
            try:
                async with self._session.get(url, headers={"Accept": "text/plain;version=0.0.4"}) as resp:
                    if resp.status != 200:
                        raise aiohttp.ClientError(f"HTTP {resp.status}")
                    chunks: list[bytes] = []
                    size = 0
                    async for chunk in resp.content.iter_chunked(1 << 16):
                        size += len(chunk)
                        if size > self.max_body:
                            raise aiohttp.ClientError(f"response larger than {self.max_body} bytes")
                        chunks.append(chunk)
                    body = b"".join(chunks)
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
                self._count("scrape")
                log.debug("scraping %s/%s at %s failed: %s", pod.namespace, pod.name, url, e)
                return None
        obj = ObjectRef("pods", pod.namespace, pod.name)
        samples, malformed = parse_exposition(body.decode("utf-8", "replace"), obj, time.time(), self.types)
        if malformed:
            self._count("malformed", malformed)
        return samples

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None
