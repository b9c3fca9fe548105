"""``SimulatedCluster``: many fake kubelets over HTTPS on loopback, in one process.

One aiohttp application and runner serve every node; each node has its own listening socket
(its own 127.x.y.z address on a shared port, or 127.0.0.1 with its own ephemeral port), and the
node answering a request is found from the socket's local address and port.
"""

from __future__ import annotations

import asyncio
import math
import resource
import socket
import ssl
import time
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from kcms.sim.inventory import inventory_objects
from kcms.sim.kubelet import MODES, make_app
from kcms.sim.tls import ServerCertificates, client_context
from kcms.sim.workload import SimContainer, SimNode, SimPod, generate_nodes, node_addresses


def raise_nofile_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1048576)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            return soft
    return soft


class SimulatedCluster:
    """A set of simulated kubelets with known true usage, for demos, tests and benchmarks.

    Usage::

        cluster = SimulatedCluster(nodes=3, pods_per_node=5, seed=1, ca=trustme_ca)
        await cluster.start()
        ...  # scrape cluster.node_url(name) with cluster.client_ssl_context()
        await cluster.stop()
    """

    def __init__(
        self,
        nodes: int = 3,
        pods_per_node: int = 5,
        containers_per_pod: tuple[int, int] | int = (1, 3),
        seed: int = 1,
        ca: Any | None = None,
        address_base: str = "127.1.0.1",
        port: int = 10250,
        one_port_per_node: bool = False,
        restart_every: float | None = None,
        token: str | None = None,
        non_running_pods: bool = False,
        slow_seconds: float = 3600.0,
    ) -> None:
        if nodes < 1:
            raise ValueError("nodes must be >= 1")
        if pods_per_node < 0:
            raise ValueError("pods_per_node must be >= 0")
        if isinstance(containers_per_pod, int):
            containers_per_pod = (containers_per_pod, containers_per_pod)
        lo, hi = containers_per_pod
        if not 1 <= lo <= hi:
            raise ValueError("containers_per_pod must be a range lo..hi with 1 <= lo <= hi")
        if restart_every is not None and not restart_every > 0:
            raise ValueError("restart_every must be > 0 seconds")
        if not 0 <= port <= 65535:
            raise ValueError("port must be in 0..65535")
        self.seed = seed
        self.token = token
        self.one_port_per_node = one_port_per_node
        self.non_running_pods = non_running_pods
        self.slow_seconds = slow_seconds
        self._ca = ca
        self.ca_pem: bytes = b""
        self.created = time.time()
        if one_port_per_node:
            addresses = ["127.0.0.1"] * nodes
            ports = [0] * nodes
        else:
            addresses = node_addresses(address_base, nodes)
            ports = [port] * nodes
        self.nodes: list[SimNode] = generate_nodes(
            nodes=nodes,
            pods_per_node=pods_per_node,
            containers_per_pod=(lo, hi),
            seed=seed,
            now=self.created,
            addresses=addresses,
            ports=ports,
            restart_every=restart_every,
        )
        self._by_name = {n.name: n for n in self.nodes}
        self._pods: dict[tuple[str, str], tuple[SimNode, SimPod]] = {
            (p.namespace, p.name): (n, p) for n in self.nodes for p in n.pods
        }
        self._by_sock: dict[tuple[str, int], SimNode] = {}
        self._servers: dict[str, asyncio.AbstractServer] = {}
        self._runner: web.AppRunner | None = None
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()

    # ----- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind every node's socket and start serving."""
        raise_nofile_limit()
        self._contexts = await asyncio.to_thread(self._server_contexts)
        self._runner = web.AppRunner(make_app(self), access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        try:
            for node in self.nodes:
                await self._listen(node)
        except BaseException:
            await self.stop()
            raise

    def _bind(self, node: SimNode) -> socket.socket:
        """Bind and listen on the node's address now (connections queue in the backlog at once)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((node.address, node.port))
            sock.listen(512)
            sock.setblocking(False)
        except OSError as e:
            sock.close()
            raise OSError(e.errno, f"cannot listen on {node.address}:{node.port} for {node.name}: {e}") from e
        if node.port == 0:
            node.port = sock.getsockname()[1]
        self._by_sock[(node.address, node.port)] = node
        return sock

    async def _serve(self, node: SimNode, sock: socket.socket) -> None:
        assert self._runner is not None and self._runner.server is not None
        loop = asyncio.get_running_loop()
        try:
            ctx = self._contexts[node.address]
            srv = await loop.create_server(self._runner.server, sock=sock, ssl=ctx, backlog=512)
        except BaseException:
            sock.close()
            raise
        if node.mode == "down" or self._stopping.is_set():
            srv.close()
        else:
            self._servers[node.name] = srv

    def _server_contexts(self) -> dict[str, ssl.SSLContext]:
        """A certificate per node address, naming the address, the node and localhost."""
        certs = ServerCertificates(self._ca)
        self.ca_pem = certs.ca_pem
        names: dict[str, list[str]] = {}
        for node in self.nodes:
            names.setdefault(node.address, [node.address, "localhost"]).append(node.name)
        if self.one_port_per_node:  # every node on 127.0.0.1: one certificate, no node names
            names = {address: [address, "localhost"] for address in names}
        return {address: certs.context(ids) for address, ids in names.items()}

    async def _listen(self, node: SimNode) -> None:
        await self._serve(node, self._bind(node))

    async def stop(self) -> None:
        """Stop serving and close every connection."""
        self._stopping.set()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for srv in self._servers.values():
            srv.close()
        self._servers.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> SimulatedCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def slow_wait(self) -> None:
        """What a "slow" node does: wait far longer than any scrape timeout (or until stop)."""
        try:
            await asyncio.wait_for(self._stopping.wait(), self.slow_seconds)
        except TimeoutError:
            pass

    # ----- addressing ------------------------------------------------------------------------

    def node_for_request(self, request: web.Request) -> SimNode | None:
        """The node whose socket received ``request``."""
        transport = request.transport
        if transport is None:
            return None
        sockname = transport.get_extra_info("sockname")
        if not sockname:
            return None
        return self._by_sock.get((sockname[0], sockname[1]))

    def node_names(self) -> list[str]:
        """Every node name, in index order."""
        return [n.name for n in self.nodes]

    def node(self, name: str) -> SimNode:
        """The simulated node called ``name`` (KeyError if none)."""
        return self._by_name[name]

    def node_url(self, name: str) -> str:
        """The kubelet base URL of node ``name``, e.g. ``https://127.1.0.1:10250``."""
        n = self._by_name[name]
        return f"https://{n.address}:{n.port}"

    def client_ssl_context(self) -> ssl.SSLContext:
        """A client SSLContext that trusts the simulated kubelets' CA (after :meth:`start`)."""
        if not self.ca_pem:
            raise RuntimeError("start the cluster first")
        return client_context(self.ca_pem)

    # ----- failure injection -----------------------------------------------------------------

    def set_node_mode(self, node: str, mode: str) -> None:
        """Make node ``node`` behave: "ok", "slow" (never answers in time), "error" (HTTP 500),
        "garbage" (malformed bodies) or "down" (refuses new connections, drops open ones).
        """
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
        n = self._by_name[node]
        old, n.mode = n.mode, mode
        if self._runner is None or old == mode:
            return
        if mode == "down":
            srv = self._servers.pop(node, None)
            if srv is not None:
                srv.close()
        elif old == "down":
            # Bind and listen now (so connections queue at once); serve from the next loop turn.
            sock = self._bind(n)
            task = asyncio.get_running_loop().create_task(self._serve(n, sock))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    # ----- ground truth ----------------------------------------------------------------------

    def container(self, namespace: str, pod: str, container: str) -> SimContainer:
        """The simulated container (KeyError if none)."""
        _, p = self._pods[(namespace, pod)]
        for c in p.containers:
            if c.name == container:
                return c
        raise KeyError((namespace, pod, container))

    def pod(self, namespace: str, pod: str) -> SimPod:
        """The simulated pod (KeyError if none)."""
        return self._pods[(namespace, pod)][1]

    def node_of_pod(self, namespace: str, pod: str) -> str:
        """The name of the node running the pod."""
        return self._pods[(namespace, pod)][0].name

    def true_container_rate(self, namespace: str, pod: str, container: str) -> float:
        """The container's true CPU usage, cores."""
        return self.container(namespace, pod, container).rate

    def true_pod_rate(self, namespace: str, pod: str) -> float:
        """The pod's true CPU usage (sum of its containers), cores."""
        return self.pod(namespace, pod).rate

    def true_node_rate(self, node: str) -> float:
        """The node's true CPU usage (its containers plus node overhead), cores."""
        return self._by_name[node].rate

    def memory_at(self, namespace: str, pod: str, container: str, t: float | None = None) -> int:
        """The container's working set bytes at time ``t`` (default now)."""
        return self.container(namespace, pod, container).memory(time.time() if t is None else t)

    def pod_memory_at(self, namespace: str, pod: str, t: float | None = None) -> int:
        """The pod's working set bytes at time ``t`` (default now)."""
        return self.pod(namespace, pod).memory(time.time() if t is None else t)

    def node_memory_at(self, node: str, t: float | None = None) -> int:
        """The node's working set bytes at time ``t`` (default now)."""
        return self._by_name[node].memory(time.time() if t is None else t)

    def container_start_time(self, namespace: str, pod: str, container: str) -> float:
        """The container's current start time (seconds since the epoch), after scheduled restarts."""
        c = self.container(namespace, pod, container)
        c.advance(time.time())
        return c.start_time

    def cpu_seconds_at(self, namespace: str, pod: str, container: str, t: float) -> float:
        """The container's cumulative CPU core-seconds at ``t`` (since its current start)."""
        return self.container(namespace, pod, container).cpu_ns(t) / 1e9

    def force_restart(self, namespace: str, pod: str, container: str, at: float | None = None) -> float:
        """Restart a container now (or at ``at``): new start time, counter back to 0. Returns it."""
        c = self.container(namespace, pod, container)
        when = time.time() if at is None else at
        c.restart(when)
        if c.restart_every and c.restart_rng is not None:
            c.next_restart = when + c.restart_rng.expovariate(1.0 / c.restart_every)
        else:
            c.next_restart = math.inf
        return when

    def request_count(self, node: str) -> int:
        """How many requests node ``node`` has received."""
        return self._by_name[node].requests

    # ----- inventory -------------------------------------------------------------------------

    def inventory_objects(self) -> list[dict]:
        """Node and Pod objects (Kubernetes v1 JSON) describing the simulated cluster."""
        return inventory_objects(self.nodes, seed=self.seed, non_running_pods=self.non_running_pods)

    def write_inventory(self, path: str | Path) -> None:
        """Write :meth:`inventory_objects` as a v1 ``List`` JSON document to ``path``."""
        doc = {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": self.inventory_objects()}
        Path(path).write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
