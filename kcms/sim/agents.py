"""``SimulatedAgents``: one KCMS node agent endpoint per simulated node, plain HTTP on loopback.

Plain and open, like ``kcms agent --insecure-serving``: a collector scrapes them only when told so
explicitly (``--agent-insecure-http``, or ``AgentAccess(insecure_http=True)``); by default it speaks
TLS and refuses them (reason ``tls``).

Each agent serves ``GET /metrics`` in the agent exposition format (see
:mod:`kcms.sources.exposition`): the application samples of :class:`kcms.sim.apps.SimulatedAppMetrics`
for the pods of its node, plus synthetic node gauges (``node_load1``, ``node_memory_working_set_bytes``).
Samples that are about no single pod (a Deployment's ``queue_backlog`` and the external
``queue_backlog{queue=...}`` of a namespace) are served by one agent only, so that every series has
exactly one source: that of the first node (in index order) running a pod of the Deployment, or of
the namespace. Every agent thus reports only what its node may (:mod:`kcms.nodescope`: its node, its
pods, namespaced objects of namespaces it runs pods of), as the collector checks for bound targets
(:meth:`SimulatedAgents.bound_targets`).

Points lie on a grid of ``period`` seconds (multiples of ``period`` since the epoch), from the tick at
or before :meth:`SimulatedAgents.start` up to now, and are kept ``buffer_seconds`` (5 minutes), so
``?since=<ms>`` answers every buffered point newer than ``since``, oldest first per series. Values
are functions of time (:func:`kcms.sim.apps.requests_rate`, :func:`kcms.sim.apps.backlog`), so tests
know what must be served.

Failure injection per agent (:meth:`SimulatedAgents.set_mode`): ``"slow"`` (answers only after
``slow_seconds`` or at stop), ``"error"`` (HTTP 500), ``"garbage"`` (a body that is not UTF-8).
"""

from __future__ import annotations

import asyncio
import math
import socket
import time

from aiohttp import web

from kcms.model import ObjectRef
from kcms.sim.apps import Sample, SimulatedAppMetrics
from kcms.sim.cluster import SimulatedCluster

__all__ = ["AGENT_MODES", "SimulatedAgents", "render_samples"]

AGENT_MODES = ("ok", "slow", "error", "garbage")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
GARBAGE = b"\x00\xff\xfe not an exposition {{{ \xc3\x28\n"


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _format_value(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def render_samples(samples: list[Sample]) -> tuple[bytes, int]:
    """The exposition body of ``samples`` (families contiguous, each series' points in the order
    given) and the number of sample lines in it."""
    families: dict[str, dict[tuple[ObjectRef, tuple], list[str]]] = {}
    for metric, obj, labels, ts, value in samples:
        families.setdefault(metric, {}).setdefault((obj, labels), []).append(
            f"{_format_value(value)} {round(ts * 1000)}"
        )
    out: list[str] = []
    n = 0
    for metric, series in families.items():
        kind = "counter" if metric.endswith("_total") else "gauge"
        out.append(f"# TYPE {metric} {kind}")
        for (obj, labels), points in series.items():
            head = (
                f'{metric}{{kcms_resource="{obj.resource}",kcms_namespace="{obj.namespace}",kcms_name="{obj.name}"'
                + "".join(f',{k}="{_escape(v)}"' for k, v in labels)
                + "} "
            )
            out.extend(head + p for p in points)
            n += len(points)
    out.append("")
    return "\n".join(out).encode(), n


class SimulatedAgents:
    """Agent endpoints for every node of a :class:`SimulatedCluster` (see the module docstring).

    ``port_per_agent=True``: every agent on 127.0.0.1 with its own ephemeral port. ``False``: each
    agent on its node's own address (the cluster must give nodes distinct addresses) and ``port``.
    """

    def __init__(
        self,
        cluster: SimulatedCluster,
        *,
        port_per_agent: bool = True,
        port: int = 9102,
        period: float = 1.0,
        buffer_seconds: float = 300.0,
        slow_seconds: float = 3600.0,
        history: float = 0.0,
    ) -> None:
        """``history``: seconds of points the agents already hold when they start (the demo uses
        it so that rates are served at once, as from agents that have been running a while)."""
        if not period > 0 or not buffer_seconds >= period:
            raise ValueError("need period > 0 and buffer_seconds >= period")
        self.cluster = cluster
        self.port_per_agent = port_per_agent
        self.port = port
        self.period = float(period)
        self.buffer_seconds = float(buffer_seconds)
        self.slow_seconds = slow_seconds
        self.history = float(history)
        self.apps = SimulatedAppMetrics(cluster, sink=None, period=period)
        names = cluster.node_names()
        self.modes: dict[str, str] = dict.fromkeys(names, "ok")
        self.requests: dict[str, int] = dict.fromkeys(names, 0)
        self.lines_sent: dict[str, int] = dict.fromkeys(names, 0)  # sample lines, all answers
        self.last_since: dict[str, int | None] = dict.fromkeys(names)
        self._endpoints: dict[str, tuple[str, int]] = {}
        self._by_sock: dict[tuple[str, int], str] = {}
        self._servers: list[asyncio.AbstractServer] = []
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()
        self._ticks: dict[int, dict[str, list[Sample]]] = {}
        self.first_tick = 0  # index of the first tick served (ticks are k * period)

    # ----- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind every agent's socket and start serving."""
        if not self.port_per_agent and len({n.address for n in self.cluster.nodes}) < len(self.cluster.nodes):
            raise ValueError("port_per_agent=False needs a distinct address per node")
        self.first_tick = math.floor((time.time() - self.history) / self.period)
        app = web.Application()
        app.router.add_get("/metrics", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        assert self._runner.server is not None
        loop = asyncio.get_running_loop()
        try:
            for node in self.cluster.nodes:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                address = "127.0.0.1" if self.port_per_agent else node.address
                sock.bind((address, 0 if self.port_per_agent else self.port))
                sock.listen(128)
                sock.setblocking(False)
                bound = sock.getsockname()[:2]
                self._endpoints[node.name] = bound
                self._by_sock[bound] = node.name
                self._servers.append(await loop.create_server(self._runner.server, sock=sock))
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop serving; slow answers in progress end at once."""
        self._stopping.set()
        for srv in self._servers:
            srv.close()
        self._servers.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> SimulatedAgents:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ----- addressing and failure injection ----------------------------------------------------

    def targets(self) -> list[tuple[str, str]]:
        """``(node name, "host:port")`` of every agent (after :meth:`start`)."""
        return [(name, f"{host}:{port}") for name, (host, port) in self._endpoints.items()]

    def bound_targets(self) -> list[tuple[str, str, str]]:
        """``(node name, "host:port", node name)``: :meth:`targets` bound to their nodes, for a
        collector that checks each agent's samples against its node."""
        return [(name, address, name) for name, address in self.targets()]

    def url(self, node: str) -> str:
        """The base URL of ``node``'s agent, e.g. ``http://127.0.0.1:40123``."""
        host, port = self._endpoints[node]
        return f"http://{host}:{port}"

    def set_mode(self, node: str, mode: str) -> None:
        """Make ``node``'s agent "ok", "slow", "error" (HTTP 500) or "garbage" (not UTF-8)."""
        if mode not in AGENT_MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {', '.join(AGENT_MODES)}")
        self.modes[node] = mode

    # ----- ground truth ------------------------------------------------------------------------

    def tick_times(self, now: float | None = None) -> list[float]:
        """The times of the points buffered at ``now``, oldest first."""
        now = time.time() if now is None else now
        last = math.floor(now / self.period)
        first = max(self.first_tick, math.ceil((now - self.buffer_seconds) / self.period))
        return [k * self.period for k in range(first, last + 1)]

    def samples_at(self, node: str, t: float) -> list[Sample]:
        """What ``node``'s agent holds for time ``t`` (a tick time)."""
        k = round(t / self.period)
        by_node = self._ticks.get(k)
        if by_node is None:
            by_node = self._ticks[k] = self._generate(k * self.period)
            horizon = k - math.ceil(self.buffer_seconds / self.period) - 1
            for old in [x for x in self._ticks if x < horizon]:
                del self._ticks[old]
        return by_node.get(node, [])

    def _generate(self, t: float) -> dict[str, list[Sample]]:
        cluster = self.cluster
        # The home of a Deployment's series ((namespace, app)) and of a namespace's ((namespace, "")):
        # the first node running one of its pods, so that the agent reporting it may.
        homes: dict[tuple[str, str], str] = {}
        for n in cluster.nodes:
            for pod in n.pods:
                homes.setdefault((pod.namespace, pod.app), n.name)
                homes.setdefault((pod.namespace, ""), n.name)
        out: dict[str, list[Sample]] = {n.name: [] for n in cluster.nodes}
        for s in self.apps.samples(t):
            obj = s[1]
            if obj.resource == "pods":
                node = cluster.node_of_pod(obj.namespace, obj.name)
            else:  # a Deployment named after its app, or a namespace's external series (name "")
                node = homes[(obj.namespace, obj.name)]
            out[node].append(s)
        for n in cluster.nodes:
            ref = ObjectRef("nodes", "", n.name)
            load = round(n.rate * (1.0 + 0.1 * math.sin(t / 30.0)), 3)
            out[n.name].append(("node_load1", ref, (), t, load))
            out[n.name].append(("node_memory_working_set_bytes", ref, (), t, float(n.memory(t))))
        return out

    def body(self, node: str, since_ms: int | None, now: float | None = None) -> tuple[bytes, int]:
        """The answer of ``node``'s agent to ``/metrics[?since=]`` at ``now``, and its sample lines."""
        ticks = self.tick_times(now)
        if since_ms is None:
            ticks = ticks[-1:]
        else:
            ticks = [t for t in ticks if round(t * 1000) > since_ms]
        samples = [s for t in ticks for s in self.samples_at(node, t)]
        return render_samples(samples)

    # ----- serving -----------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        transport = request.transport
        sockname = transport.get_extra_info("sockname") if transport is not None else None
        node = self._by_sock.get(tuple(sockname[:2])) if sockname else None
        if node is None:
            return web.Response(status=404, text="no simulated agent on this address")
        self.requests[node] += 1
        mode = self.modes[node]
        if mode == "slow":
            try:
                await asyncio.wait_for(self._stopping.wait(), self.slow_seconds)
            except TimeoutError:
                pass
            return web.Response(status=503, text="simulated slow agent gave up")
        if mode == "error":
            return web.Response(status=500, text="simulated agent failure")
        if mode == "garbage":
            return web.Response(body=GARBAGE, headers={"Content-Type": CONTENT_TYPE})
        since_text = request.query.get("since")
        since: int | None = None
        if since_text is not None:
            try:
                since = int(since_text)
            except ValueError:
                return web.Response(status=400, text=f"since must be milliseconds, not {since_text!r}")
        self.last_since[node] = since
        now = time.time()
        body, lines = self.body(node, since, now)
        self.lines_sent[node] += lines
        headers = {"Content-Type": CONTENT_TYPE, "X-KCMS-Agent-Time": str(round(now * 1000))}
        return web.Response(body=body, headers=headers)
