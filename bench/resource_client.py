"""What `bench/resource_pipeline.py` measures with: one HTTPS client, the socket-write floor
server, the list-in-a-loop load clients, process-tree meters and a /metrics reader.

The same :class:`Client` (``http.client`` over one kept-alive TLS connection, the way kubectl and
the aggregator reuse theirs) times KCMS and the floor server, so the ratio between them is the
server's cost alone. ``Accept-Encoding`` is chosen per request: ``gzip`` (what kubectl and the
kube-apiserver's aggregator proxy send) or ``identity``; a gzip body is inflated inside the timed
call (a piece at a time, as a streaming client does: :data:`INFLATE_PIECE`), since a real client
cannot use it before; the time to the body's last byte is kept too (``wire_seconds``).

The floor server (``python bench/resource_client.py floor ...``) is plain asyncio + ssl: it
answers every request on a connection with the same pre-rendered bytes (status line, headers,
body exactly as KCMS sent them), over the TLS version KCMS negotiated. The time a client needs
to receive those bytes from it is what any Python server on this machine needs at least.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import re
import ssl
import sys
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import orjson
import psutil

# Inflated a piece at a time inside the timed call, the output dropped as it comes (kubectl's Go
# client streams the body into its JSON decoder the same way; the application's copy is inflated
# afterwards, untimed). Inflating the whole 57 MB list into one new buffer made that buffer's page
# faults part of the figure, and on this VM they cost 16-28 ms of system time in one list and
# 475-763 ms in another (28 Nov, an instrumented 5000-node run: the second list after the quiet
# phase took 794 ms, 754 of them inflating, while KCMS's event loop was idle; docs/performance.md).
INFLATE_PIECE = 64 * 1024


def timed_inflate(raw: bytes) -> None:
    """Inflate a gzip body a piece at a time, keeping none of it; raise zlib.error if it is not
    one whole gzip member."""
    inflater = zlib.decompressobj(31)
    view = memoryview(raw)
    for i in range(0, len(view), INFLATE_PIECE):
        inflater.decompress(view[i : i + INFLATE_PIECE])
    inflater.flush()
    if not inflater.eof:
        raise zlib.error("truncated gzip body")


class Response:
    """One response: ``seconds`` from the request sent to the body received and inflated (a piece
    at a time, see :data:`INFLATE_PIECE`), ``wire_seconds`` to its last byte received; ``body`` as
    the application sees it (inflated on first use, outside the timing)."""

    __slots__ = ("status", "raw", "encoding", "seconds", "wire_seconds", "_body")

    def __init__(
        self, status: int, raw: bytes, encoding: str, seconds: float, wire_seconds: float, body: bytes | None = None
    ) -> None:
        self.status, self.raw, self.encoding = status, raw, encoding
        self.seconds, self.wire_seconds = seconds, wire_seconds
        self._body = body

    @property
    def body(self) -> bytes:
        if self._body is None:
            self._body = zlib.decompress(self.raw, 31) if self.encoding in ("gzip", "x-gzip") else self.raw
        return self._body

    @property
    def wire_bytes(self) -> int:
        return len(self.raw)


class Client:
    """One kept-alive HTTPS connection with a client certificate; reconnects when the server closed it."""

    def __init__(self, host: str, port: int, cert_chain: str | None = None, timeout: float = 300.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.ctx = ssl.create_default_context()
        self.ctx.check_hostname = False
        self.ctx.verify_mode = ssl.CERT_NONE
        if cert_chain:
            self.ctx.load_cert_chain(cert_chain)
        self.conn: http.client.HTTPSConnection | None = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def tls(self) -> tuple[str, str]:
        """(TLS version, cipher) of the current connection."""
        sock = self.conn.sock if self.conn is not None else None
        if not isinstance(sock, ssl.SSLSocket):
            return "", ""
        cipher = sock.cipher()
        return sock.version() or "", cipher[0] if cipher else ""

    def get(self, path: str, encoding: str = "gzip", timeout: float | None = None, whole: bool = False) -> Response:
        """GET ``path``; a gzip body is inflated inside the timing, a piece at a time (``whole``:
        into one buffer, the body kept, as every list was timed until 28 Nov 15:00; the load
        clients still do, so their figures compare with earlier runs')."""
        headers = {"Accept": "application/json", "Accept-Encoding": encoding}
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx)
            # this request's timeout, not the one of the request that opened the connection
            self.conn.timeout = timeout or self.timeout
            if self.conn.sock is not None:
                self.conn.sock.settimeout(self.conn.timeout)
            t0 = time.perf_counter()
            try:
                self.conn.request("GET", path, headers=headers)
                resp = self.conn.getresponse()
                raw = resp.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
                    http.client.CannotSendRequest, http.client.BadStatusLine):  # fmt: skip
                self.close()  # a kept-alive connection the server closed meanwhile: once more, fresh
                if attempt:
                    raise
                continue
            except BaseException:
                self.close()
                raise
            wire = time.perf_counter() - t0
            enc = (resp.getheader("Content-Encoding") or "").lower()
            body = None
            if enc not in ("gzip", "x-gzip"):
                body = raw
            elif whole:
                body = zlib.decompress(raw, 31)
            else:
                timed_inflate(raw)
            seconds = time.perf_counter() - t0
            if resp.getheader("Connection", "").lower() == "close":
                self.close()
            return Response(resp.status, raw, enc, seconds, wire, body)
        raise AssertionError("unreachable")


def items_of(body: bytes) -> list[dict]:
    return orjson.loads(body).get("items") or []


# ---- the KCMS process tree -------------------------------------------------------------------


def tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds of a running process, to the nanosecond (Linux: its process CPU clock, the
    clockid that ``clock_getcpuclockid(pid)`` gives), or None where that cannot be read.
    /proc's user and system times come in 10 ms ticks: 4 cycles of 50 nodes cost ~60 ms of CPU,
    so ticks alone left the 50-node figure ±17 %."""
    try:
        return time.clock_gettime(((~pid) << 3) | 2)
    except (OSError, OverflowError):
        return None


def tree_cpu_seconds(proc: psutil.Process) -> float:
    """CPU seconds of the process and every descendant, including descendants already reaped
    (their time is in their parent's children_user/children_system, in ticks)."""
    total = 0.0
    for p in tree(proc):
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        running = process_cpu_seconds(p.pid)
        total += (t.user + t.system if running is None else running) + t.children_user + t.children_system
    return total


def tree_memory(proc: psutil.Process, pss: bool = False) -> tuple[int, int]:
    """(sum of RSS, number of processes); with ``pss``, the sum of PSS instead (shared pages of
    forked children counted once in all), which reads every process's smaps: slower."""
    total, count = 0, 0
    for p in tree(proc):
        try:
            total += p.memory_full_info().pss if pss else p.memory_info().rss
            count += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):
            continue
    return total, count


# ---- KCMS's own /metrics ---------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})? (\S+)", re.M)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
WANTED = (
    "kcms_scrape_cycle_duration_seconds_count",
    "kcms_scrape_cycle_duration_seconds_sum",
    "kcms_scrape_last_cycle_timestamp_seconds",
    "kcms_kubelet_scrape_failures_total",
    "kcms_kubelet_scrapes_total",
    "kcms_kubelet_nodes_missing",
    "kcms_metrics_pod_blocks_rendered_total",
    "kcms_metrics_pod_blocks_previous_total",
)


@dataclass
class Scrapes:
    """The scrape loop's figures from one read of KCMS's /metrics (summed over label values)."""

    cycles: float = float("nan")
    cycle_seconds: float = float("nan")
    last_cycle_start: float = float("nan")
    failures_by_reason: dict[str, float] = field(default_factory=dict)
    scrapes: dict[str, float] = field(default_factory=dict)  # result -> count
    nodes_missing: float = float("nan")
    blocks_rendered: dict[str, float] = field(default_factory=dict)  # when (ahead, on_list) -> nodes
    blocks_previous: float = 0.0  # nodes a list of every pod served as of their previous scrape

    def delta(self, before: Scrapes) -> dict[str, Any]:
        reasons = sorted(set(self.failures_by_reason) | set(before.failures_by_reason))
        return {
            "cycles": self.cycles - before.cycles,
            "failures_by_reason": {
                r: self.failures_by_reason.get(r, 0) - before.failures_by_reason.get(r, 0) for r in reasons
            },
            "scrapes_failed": self.scrapes.get("failure", 0) - before.scrapes.get("failure", 0),
            "scrapes_succeeded": self.scrapes.get("success", 0) - before.scrapes.get("success", 0),
            # the list of every pod's node blocks: rendered by a list, ahead, or served as of the
            # node's previous scrape (kcms/apis/metrics/blocks.py)
            "nodes_on_list": self.blocks_rendered.get("on_list", 0) - before.blocks_rendered.get("on_list", 0),
            "nodes_ahead": self.blocks_rendered.get("ahead", 0) - before.blocks_rendered.get("ahead", 0),
            "nodes_previous": self.blocks_previous - before.blocks_previous,
        }


def parse_scrapes(text: str) -> Scrapes:
    out = Scrapes()
    for m in _SAMPLE.finditer(text):
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        if name not in WANTED:
            continue
        v = float(value)
        lab = dict(_LABEL.findall(labels))
        if name.endswith("_count"):
            out.cycles = v
        elif name.endswith("_sum"):
            out.cycle_seconds = v
        elif name == "kcms_scrape_last_cycle_timestamp_seconds":
            out.last_cycle_start = v
        elif name == "kcms_kubelet_scrape_failures_total":
            reason = lab.get("reason", "")
            out.failures_by_reason[reason] = out.failures_by_reason.get(reason, 0) + v
        elif name == "kcms_kubelet_scrapes_total":
            result = lab.get("result", "")
            out.scrapes[result] = out.scrapes.get(result, 0) + v
        elif name == "kcms_kubelet_nodes_missing":
            out.nodes_missing = v
        elif name == "kcms_metrics_pod_blocks_rendered_total":
            out.blocks_rendered[lab.get("when", "")] = v
        elif name == "kcms_metrics_pod_blocks_previous_total":
            out.blocks_previous = v
    return out


def read_scrapes(client: Client) -> Scrapes:
    r = client.get("/metrics", encoding="identity")
    if r.status != 200:
        raise SystemExit(f"GET /metrics: HTTP {r.status}: {r.body[:300]!r}")
    return parse_scrapes(r.body.decode())


# ---- clients listing in a loop (one process each, so that they do not share a GIL) -----------


def list_loop(
    host: str, port: int, cert_chain: str, path: str, encoding: str, stop: Any, results: Any
) -> None:
    """Lists ``path`` until ``stop`` is set; puts (wall time sent, seconds, items, status) per list,
    then None (the reader must drain ``results`` meanwhile: a full pipe stops the process's exit)."""
    try:
        _list_until(Client(host, port, cert_chain), path, encoding, stop, results)
    finally:
        results.put(None)


def _list_until(client: Client, path: str, encoding: str, stop: Any, results: Any) -> None:
    while not stop.is_set():
        sent = time.time()
        try:
            r = client.get(path, encoding=encoding, whole=True)
        except OSError as e:
            results.put((sent, float("nan"), -1, f"error: {e}"))
            time.sleep(0.5)
            continue
        n = len(items_of(r.body)) if r.status == 200 else -1
        results.put((sent, r.seconds, n, r.status))


# ---- the socket-write floor -------------------------------------------------------------------

TLS_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


async def _serve_floor(response: bytes, ctx: ssl.SSLContext) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")  # a GET has no body
                writer.write(response)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx, limit=1 << 16)
    print(f"port {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def floor_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="resource_client.py floor")
    ap.add_argument("--body", required=True, help="file with the body bytes, as sent on the wire")
    ap.add_argument("--content-encoding", default="")
    ap.add_argument("--tls-version", default="TLSv1.3", choices=sorted(TLS_VERSIONS))
    ap.add_argument("--cert-chain", required=True, help="PEM: key and certificate chain")
    args = ap.parse_args(argv)
    body = open(args.body, "rb").read()
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    if args.content_encoding:
        head += f"Content-Encoding: {args.content_encoding}\r\n"
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ctx.maximum_version = TLS_VERSIONS[args.tls_version]
    ctx.load_cert_chain(args.cert_chain)
    asyncio.run(_serve_floor(head.encode() + b"\r\n" + body, ctx))


if __name__ == "__main__":
    if sys.argv[1:2] != ["floor"]:
        sys.exit(
            "usage: resource_client.py floor --body FILE --cert-chain PEM [--tls-version V] [--content-encoding E]"
        )
    floor_main(sys.argv[2:])
