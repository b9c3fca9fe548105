"""`kcms standalone --scrape-workers N`: kubelets scraped by child processes, for real.

Real `kcms standalone` processes against simulated kubelets over TLS and the fake Kubernetes API,
read over HTTPS; worker processes found with psutil and killed with real signals. An attacking
worker is a real child process speaking the frame protocol (kcms/collector/workerproto.py).
"""

from __future__ import annotations

import asyncio
import calendar
import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import psutil
import pytest
from _stores import free_port
from prometheus_client import REGISTRY

from kcms.cmd.main import build_parser
from kcms.collector.kubelet import KubeletClientConfig
from kcms.collector.scrapeloop import AUTO_MIN_CPUS, AUTO_MIN_NODES, auto_workers
from kcms.collector.workerproto import (
    HEADER,
    Batch,
    CycleEnd,
    CycleStart,
    FrameError,
    FrameReader,
    FromWorker,
    frame,
)
from kcms.collector.workers import ScrapeWorkers, shard_of
from kcms.kube.inventory import StaticInventory
from kcms.model import NodeBatch, ResourcePoint
from kcms.quantity import parse_quantity
from kcms.sim import SimulatedCluster
from kcms.store.resource import ResourceStore

BASE = "/apis/metrics.k8s.io/v1beta1"
READER = "reader-token"
WAIT = 60.0  # seconds any one condition may take on a loaded machine before the test gives up


def cores(q: str) -> float:
    return float(parse_quantity(q))


def epoch(ts: str) -> float:
    return float(calendar.timegm(time.strptime(ts, "%Y-%m-%dT%H:%M:%SZ")))


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


class Standalone:
    """A `kcms standalone` process; its stderr (and its workers') goes to a file."""

    def __init__(self, fake, sim: SimulatedCluster, tmp: Path, workers: str, *extra: str) -> None:
        self.fake, self.sim, self.workers = fake, sim, workers
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.stderr_path = tmp / f"standalone-{workers}-{self.port}.log"
        kubelet_ca = tmp / "kubelet-ca.pem"
        kubelet_ca.write_bytes(fake.ca.cert_pem.bytes())  # the one test CA issued the kubelets' certificates
        self.argv = [
            sys.executable, "-m", "kcms", "standalone", "--kubeconfig", str(fake.kubeconfig),
            "--secure-port", str(self.port), "--bind-address", "127.0.0.1",
            "--cert-dir", str(tmp / f"certs-{self.port}"), "--kubelet-certificate-authority", str(kubelet_ca),
            "--kubelet-use-node-status-port", "--kubelet-preferred-address-types", "InternalIP",
            "--authentication-skip-lookup",
            "--metric-resolution", "10s", "--kubelet-request-timeout", "2s", "--scrape-workers", workers, *extra,
        ]  # fmt: skip
        self.proc: subprocess.Popen | None = None
        self.ssl = ssl.create_default_context()
        self.ssl.check_hostname, self.ssl.verify_mode = False, ssl.CERT_NONE

    def start(self) -> Standalone:
        self.stderr = self.stderr_path.open("wb")
        self.proc = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.stderr,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        return self

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    async def get(self, path: str) -> tuple[int, object]:
        headers = {"Authorization": f"Bearer {READER}", "Accept": "application/json"}
        async with aiohttp.ClientSession() as s, s.get(self.url + path, ssl=self.ssl, headers=headers) as r:
            if r.content_type == "application/json":
                return r.status, await r.json()
            return r.status, await r.text()

    async def metrics(self) -> str:
        status, text = await self.get("/metrics")
        assert status == 200, text
        return text  # type: ignore[return-value]

    async def until(self, what: str, check) -> object:
        """Poll ``check`` (an async callable returning a truthy result when done) until it holds."""
        t0 = time.monotonic()
        while True:
            assert self.proc is not None and self.proc.poll() is None, (
                f"kcms exited early:\n{self.log()[-3000:]}"
            )
            try:
                result = await check()
            except aiohttp.ClientError:
                result = None
            if result:
                return result
            assert time.monotonic() - t0 < WAIT, f"{what}: not within {WAIT:.0f}s\n{self.log()[-3000:]}"
            await asyncio.sleep(0.3)

    async def all_served(self, since: float = 0.0) -> tuple[dict, dict] | None:
        """(nodes, pods) by name once every node and every pod of the simulation is served, with
        readings taken at or after ``since`` (epoch seconds, whole)."""
        status, nodes = await self.get(f"{BASE}/nodes")
        if status != 200:
            return None
        status, pods = await self.get(f"{BASE}/pods")
        if status != 200:
            return None
        by_node = {i["metadata"]["name"]: i for i in nodes["items"]}  # type: ignore[index]
        by_pod = {(i["metadata"]["namespace"], i["metadata"]["name"]): i for i in pods["items"]}  # type: ignore[index]
        want_pods = {(p.namespace, p.name) for n in self.sim.nodes for p in n.pods}
        if set(by_node) != set(self.sim.node_names()) or set(by_pod) != want_pods:
            return None
        if any(epoch(i["timestamp"]) < since for i in [*by_node.values(), *by_pod.values()]):
            return None
        return by_node, by_pod

    def children(self) -> list[psutil.Process]:
        assert self.proc is not None
        return psutil.Process(self.proc.pid).children()

    async def worker_pids(self) -> dict[str, int]:
        text = await self.metrics()
        pids = {}
        for line in text.splitlines():
            if line.startswith("kcms_scrape_worker_pid{"):
                worker = line.split('worker="', 1)[1].split('"', 1)[0]
                pids[worker] = int(float(line.rsplit(" ", 1)[1]))
        return pids

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(30)
        finally:
            self.stderr.close()


def gone(pids: list[int]) -> bool:
    """True when none of ``pids`` is a live process (a zombie not yet reaped counts as gone)."""
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


async def wait_gone(pids: list[int]) -> None:
    t0 = time.monotonic()
    while not gone(pids):
        assert time.monotonic() - t0 < WAIT, f"processes {pids} still running"
        await asyncio.sleep(0.2)


def check_values(sim: SimulatedCluster, nodes: dict, pods: dict) -> None:
    """Every value is the simulation's truth: CPU the true rate, memory the exact working set at
    the reading's timestamp."""
    for name, item in nodes.items():
        assert cores(item["usage"]["cpu"]) == pytest.approx(sim.true_node_rate(name), rel=0.01)
        assert int(parse_quantity(item["usage"]["memory"])) == sim.node_memory_at(
            name, epoch(item["timestamp"])
        )
    for (ns, name), item in pods.items():
        want = sorted(c.name for c in sim.pod(ns, name).containers)
        assert sorted(c["name"] for c in item["containers"]) == want
        for c in item["containers"]:
            true = sim.true_container_rate(ns, name, c["name"])
            assert cores(c["usage"]["cpu"]) == pytest.approx(true, rel=0.01, abs=2e-9)
            at = epoch(item["timestamp"])
            assert int(parse_quantity(c["usage"]["memory"])) == sim.memory_at(ns, name, c["name"], at)


@pytest.fixture
async def cluster(ca, fake_kube):
    # The kubelets demand the kubeconfig's bearer token: a worker scrapes only with the token
    # the parent passed it.
    sim = SimulatedCluster(
        nodes=6, pods_per_node=3, containers_per_pod=2, seed=5, ca=ca, one_port_per_node=True,
        token=fake_kube.admin_token,
    )  # fmt: skip
    await sim.start()
    for obj in sim.inventory_objects():
        fake_kube.upsert(obj)
    fake_kube.tokens[READER] = {"username": "reader", "groups": ["readers"]}
    try:
        yield sim
    finally:
        await sim.stop()


async def test_workers_serve_the_same_values_as_in_process_scraping(cluster, fake_kube, tmp_path):
    """--scrape-workers 0, 1 and 2 side by side on the same kubelets: the same nodes, pods and
    containers with the same (true) values; the workers' scrapes counted in the parent's /metrics;
    a worker lists nothing from the API, listens on nothing and talks only to kubelets; SIGTERM
    leaves no process behind and no traceback."""
    procs = {w: Standalone(fake_kube, cluster, tmp_path, w).start() for w in ("0", "1", "2")}
    try:
        served = {
            w: await p.until(f"--scrape-workers {w} serving every pod", p.all_served)
            for w, p in procs.items()
        }
        for nodes, pods in served.values():
            check_values(cluster, nodes, pods)
        base_nodes, base_pods = served["0"]
        for w in ("1", "2"):
            nodes, pods = served[w]
            for name, item in nodes.items():
                assert cores(item["usage"]["cpu"]) == pytest.approx(
                    cores(base_nodes[name]["usage"]["cpu"]), rel=0.01
                )
            for key, item in pods.items():
                base = {c["name"]: c for c in base_pods[key]["containers"]}
                for c in item["containers"]:
                    assert cores(c["usage"]["cpu"]) == pytest.approx(
                        cores(base[c["name"]]["usage"]["cpu"]), rel=0.01
                    )

        kubelet_ports = {n.port for n in cluster.nodes}
        for w, p in procs.items():
            text = await p.metrics()
            assert metric(text, "kcms_scrape_workers") == float(w)
            assert metric(text, 'kcms_kubelet_scrapes_total{result="success"}') >= len(cluster.nodes)
            assert metric(text, "kcms_kubelet_scrape_duration_seconds_count") >= len(cluster.nodes)
            assert metric(text, "kcms_scrape_cycle_duration_seconds_count") >= 1
            assert metric(text, "kcms_kubelet_nodes_missing") == 0.0
            assert metric(text, 'kcms_store_objects{kind="nodes"}') == float(len(cluster.nodes))
            workers = [c for c in p.children() if "kcms.collector.worker" in " ".join(c.cmdline())]
            assert len(workers) == int(w) and len(p.children()) == int(w)
            assert sorted((await p.worker_pids()).values()) == sorted(c.pid for c in workers)
            for c in workers:
                conns = c.net_connections(kind="inet")
                assert not [k for k in conns if k.status == psutil.CONN_LISTEN], conns
                # kubelets only: never the Kubernetes API
                assert {k.raddr.port for k in conns if k.raddr} <= kubelet_ports, conns
        # one node list per parent, none by a worker
        lists = [r for r in fake_kube.requests if r[1] == "/api/v1/nodes" and not r[2].get("watch")]
        assert len(lists) == len(procs)
    finally:
        pids = [c.pid for p in procs.values() if p.proc and p.proc.poll() is None for c in p.children()]
        codes = {w: p.stop() for w, p in procs.items()}
    assert codes == {"0": 0, "1": 0, "2": 0}
    await wait_gone(pids)
    for p in procs.values():
        assert "Traceback" not in p.log(), p.log()[-3000:]


async def test_a_killed_worker_is_restarted_and_a_silent_node_is_reported(cluster, fake_kube, tmp_path):
    """SIGKILL of a worker: it is restarted (logged, counted, a new pid on /metrics) and every node
    is served again with fresh readings. A kubelet that stops answering is named in /readyz?verbose
    and counted in kcms_kubelet_nodes_missing, and comes back when it answers."""
    p = Standalone(fake_kube, cluster, tmp_path, "2").start()
    try:
        await p.until("serving every pod", p.all_served)
        before = await p.worker_pids()
        assert sorted(before) == ["0", "1"]
        victim = before["0"]
        os.kill(victim, signal.SIGKILL)
        killed_at = int(time.time()) + 1

        async def restarted():
            pids = await p.worker_pids()
            text = await p.metrics()
            exited = metric(text, 'kcms_scrape_worker_restarts_total{reason="exited"}')
            return pids.get("0") not in (None, victim) and exited == 1.0 and pids

        after = await p.until("worker 0 restarted", restarted)
        assert after["1"] == before["1"]  # the other one was left alone
        assert sorted(c.pid for c in p.children()) == sorted(after.values())
        nodes, pods = await p.until("every node scraped after the kill", lambda: p.all_served(killed_at))
        check_values(cluster, nodes, pods)
        assert "scrape worker 0 ended (exited" in p.log()

        down = cluster.node_names()[0]
        cluster.set_node_mode(down, "down")

        async def reported():
            status, text = await p.get("/readyz?verbose")
            missing = metric(await p.metrics(), "kcms_kubelet_nodes_missing")
            return status == 200 and f"not scraped for over a resolution: {down}" in text and missing == 1.0

        await p.until("the silent node reported", reported)
        cluster.set_node_mode(down, "ok")

        async def back():
            status, text = await p.get("/readyz?verbose")
            return (
                "[+]nodes-scraped ok\n" in text
                and metric(await p.metrics(), "kcms_kubelet_nodes_missing") == 0.0
            )

        await p.until("the node back", back)
        text = await p.metrics()  # the worker's failed scrapes of it, counted by the parent
        assert any(
            line.startswith(f'kcms_kubelet_scrape_failures_total{{node="{down}"')
            for line in text.splitlines()
        )
        workers = [c.pid for c in p.children()]
    finally:
        code = p.stop()
    assert code == 0
    await wait_gone(workers)
    log = p.log()
    assert "Traceback" not in log, log[-3000:]


async def test_workers_exit_when_the_parent_dies(cluster, fake_kube, tmp_path):
    """SIGKILL of the parent (no chance to clean up): its workers see their stdin close and exit."""
    p = Standalone(fake_kube, cluster, tmp_path, "2").start()
    try:
        pids = await p.until("two workers", lambda: _two(p))
        assert sorted(pids) == sorted(c.pid for c in p.children())
    finally:
        p.stop(signal.SIGKILL)
    await wait_gone(pids)
    assert "Traceback" not in p.log()


async def _two(p: Standalone) -> list[int] | None:
    pids = await p.worker_pids()
    return sorted(pids.values()) if len(pids) == 2 else None


@pytest.mark.parametrize("value", ["-1", "65", "two", "1.5", ""])
def test_a_bad_scrape_workers_value_stops_startup_naming_the_flag(value):
    r = subprocess.run(
        [sys.executable, "-m", "kcms", "standalone", "--scrape-workers", value],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert r.returncode == 2
    assert "argument --scrape-workers" in r.stderr and "Traceback" not in r.stderr


def test_auto_fits_small_clusters_and_uses_a_spare_cpu_for_large_ones():
    assert build_parser().parse_args(["standalone"]).scrape_workers is None  # auto by default
    assert build_parser().parse_args(["standalone", "--scrape-workers", "0"]).scrape_workers == 0
    assert auto_workers(AUTO_MIN_NODES - 1, 8) == 0
    assert auto_workers(AUTO_MIN_NODES, AUTO_MIN_CPUS) == 1
    assert auto_workers(5000, AUTO_MIN_CPUS - 1) == 0  # no spare core: a worker would only compete
    standalone = build_parser()._subparsers._group_actions[0].choices["standalone"]  # type: ignore[union-attr]
    help_text = " ".join(standalone.format_help().split())  # whatever the terminal's width
    assert f"{AUTO_MIN_NODES} nodes" in help_text and f"{AUTO_MIN_CPUS} CPUs or more" in help_text
    # the shard of a node is stable and spreads nodes over the workers
    names = [f"node-{i}" for i in range(1000)]
    counts = [sum(shard_of(n, 4) == w for n in names) for w in range(4)]
    assert min(counts) > 200 and [shard_of(n, 4) for n in names] == [shard_of(n, 4) for n in names]


# A worker gone bad: it answers the parent's Hello with a batch for a node it was not given, a
# batch mixing an absurd reading with a good one (claiming to have screened it), a cycle summary naming a foreign node, a bad
# label, impossible durations and negative counts, then an oversized frame; then it hangs.
HOSTILE = r"""
import math, sys, time
import msgspec
from kcms.collector.workerproto import Batch, CycleEnd, CycleStart, HEADER, frame
from kcms.model import NodeBatch, ResourcePoint
node, pod_ns, pod = sys.argv[1], sys.argv[2], sys.argv[3]
sys.stdin.buffer.read1(1 << 16)  # the Hello (and maybe the nodes): not needed to attack
now = time.time()
good = ResourcePoint(now - 3600, now, 10**12, 1 << 20)
out = sys.stdout.buffer
out.write(frame(CycleStart(now)))
out.write(frame(Batch.of(NodeBatch("intruder", good, {("default", "x"): {"c": good}}))))
absurd = ResourcePoint(now - 3600, now + 10**6, 10**12, 1 << 20)  # far in the future
mixed = {(pod_ns, pod): {"c": good}, ("default", "bad"): {"c": absurd}}
# the batch as a Batch frame, plus a screening mark of its own (NodeBatch.screened) that would let
# the absurd reading through if the parent's store believed it
forged = msgspec.msgpack.encode(["batch", node, good, mixed, {}, now])
out.write(HEADER.pack(len(forged)) + forged)
out.write(frame(CycleEnd(now, 0.5, 1, [0.01, math.nan, -1.0] + [0.01] * 100000,
                         [("intruder", "timeout"), (node, "BAD LABEL {}")], {"x y": 5, "ok_reason": -3}, -1)))
out.write(HEADER.pack(0xFFFFFFF0))
out.flush()
time.sleep(3600)
"""


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


async def test_a_hostile_worker_is_contained(tmp_path, caplog):
    """What a worker sends is input: a batch for a node outside its shard is dropped and counted,
    an absurd reading is refused by the store (its good neighbour kept), summary labels are checked
    and bounded, and an oversized frame gets it killed and restarted, all without a traceback; the
    parent keeps going. A worker has no other way in: pipes only, no socket (see the first test)."""
    sim = SimulatedCluster(nodes=2, pods_per_node=1, containers_per_pod=1, seed=9)
    inventory = StaticInventory(sim.inventory_objects())
    node = sim.nodes[0]
    pod = node.pods[0]
    store = ResourceStore(10.0)
    script = tmp_path / "hostile.py"
    script.write_text(HOSTILE)
    pool = ScrapeWorkers(
        inventory, KubeletClientConfig(), store.store, workers=1, resolution=10.0, timeout=2.0
    )
    pool.command = [sys.executable, str(script), node.name, pod.namespace, pod.name]
    refused0 = sample("kcms_scrape_worker_refused_batches_total")
    protocol0 = sample("kcms_scrape_worker_restarts_total", {"reason": "protocol"})
    success0 = sample("kcms_kubelet_scrapes_total", {"result": "success"})
    invalid0 = sample("kcms_kubelet_scrape_failures_total", {"node": node.name, "reason": "invalid"})
    pool.start()
    try:
        t0 = time.monotonic()
        while sample("kcms_scrape_worker_restarts_total", {"reason": "protocol"}) < protocol0 + 2:
            assert time.monotonic() - t0 < WAIT, "the hostile worker was not killed and restarted"
            await asyncio.sleep(0.1)
        assert pool.healthy()[0]
    finally:
        await pool.stop()
    assert sample("kcms_scrape_worker_refused_batches_total") >= refused0 + 2
    assert store.node_names() == [node.name]  # not "intruder"
    assert store.pod_keys() == [(pod.namespace, pod.name)]  # the absurd pod refused, the good one kept
    assert sample("kcms_kubelet_scrape_failures_total", {"node": "intruder", "reason": "timeout"}) == 0.0
    assert (
        sample("kcms_kubelet_scrape_failures_total", {"node": node.name, "reason": "invalid"}) >= invalid0 + 2
    )
    assert REGISTRY.get_sample_value("kcms_kubelet_rejected_samples_total", {"reason": "x y"}) is None
    # a summary counts at most one duration per node of its shard (2 nodes), never NaN or -1
    successes = sample("kcms_kubelet_scrapes_total", {"result": "success"}) - success0
    assert 0 < successes <= 2 * 3
    assert any("killing it" in r.getMessage() and "frame of" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


async def test_a_rotated_kubelet_token_reaches_the_workers(ca):
    """The parent re-reads its token source (the kubeconfig's token file or service-account token)
    and sends a changed token to every worker; the kubelets that refused the old one answer."""
    sim = SimulatedCluster(nodes=3, pods_per_node=2, containers_per_pod=1, seed=4, ca=ca, one_port_per_node=True,
                           token="token-2")  # fmt: skip
    await sim.start()
    current = ["token-1"]
    config = KubeletClientConfig(
        use_node_status_port=True, preferred_address_types=("InternalIP",),
        extra_ca_pem=[ca.cert_pem.bytes().decode()], token_source=lambda: current[0],
    )  # fmt: skip
    store = ResourceStore(10.0)
    pool = ScrapeWorkers(
        StaticInventory(sim.inventory_objects()), config, store.store, workers=2, resolution=1.0, timeout=0.5
    )
    refused = {
        n: sample("kcms_kubelet_scrape_failures_total", {"node": n, "reason": "http_401"})
        for n in sim.node_names()
    }
    pool.start()
    try:
        t0 = time.monotonic()
        while not all(sample("kcms_kubelet_scrape_failures_total", {"node": n, "reason": "http_401"}) > refused[n]
                      for n in sim.node_names()):  # fmt: skip
            assert time.monotonic() - t0 < WAIT, "the old token was not refused"
            await asyncio.sleep(0.1)
        assert store.node_names() == []
        current[0] = "token-2"
        while sorted(store.node_names()) != sim.node_names():
            assert time.monotonic() - t0 < WAIT, "not scraped with the new token"
            await asyncio.sleep(0.1)
    finally:
        await pool.stop()
        await sim.stop()


def test_frames_are_bounded_and_typed():
    reader = FrameReader(FromWorker, 1 << 20)
    with pytest.raises(FrameError, match="at most"):
        list(reader.feed(HEADER.pack(1 << 30)))  # refused on its header, before 1 GiB is buffered
    reader = FrameReader(FromWorker, 1 << 20)
    with pytest.raises(FrameError, match="malformed"):
        list(reader.feed(HEADER.pack(3) + b"\x93\x01\x02"))
    # a parent's frame is not a worker's
    from kcms.collector.workerproto import Token

    with pytest.raises(FrameError):
        list(FrameReader(FromWorker, 1 << 20).feed(frame(Token("x"))))
    # split anywhere, frames come out whole and in order
    msgs = [CycleStart(1.0), Batch.of(NodeBatch("n", ResourcePoint(1.0, 2.0, 3, 4))), CycleStart(2.0)]
    data = b"".join(frame(m) for m in msgs)
    reader = FrameReader(FromWorker, 1 << 20)
    got = []
    for i in range(len(data)):
        got += list(reader.feed(data[i : i + 1]))
    assert got == msgs and reader.buffered == 0
    # only the readings and refusals go: a worker's screening mark and columns stay in the worker
    sent = NodeBatch("n", ResourcePoint(1.0, 2.0, 3, 4), {("d", "p"): {"c": ResourcePoint(1.0, 2.0, 3, 4)}})
    sent.screened = 5.0
    (msg,) = FrameReader(FromWorker, 1 << 20).feed(frame(Batch.of(sent)))
    got_batch = msg.node_batch()
    assert got_batch == sent and got_batch.screened == 0.0 and got_batch.columns is None
    assert CycleEnd  # the summary type is exercised by the hostile worker above


async def test_auto_decides_once_the_nodes_are_listed(fake_kube):
    """auto with the node list in: a worker at AUTO_MIN_NODES nodes (on AUTO_MIN_CPUS+ CPUs); with
    the list not in yet: decided when the inventory has listed the nodes."""
    from kcms.collector.kubelet import KubeletClient
    from kcms.collector.scheduler import Collector
    from kcms.collector.scrapeloop import AutoScrape, scrape_loop, usable_cpus
    from kcms.kube.client import KubeClient
    from kcms.kube.inventory import KubeInventory

    client = KubeletClient(KubeletClientConfig())
    store = ResourceStore(10.0)
    big = SimulatedCluster(nodes=AUTO_MIN_NODES, pods_per_node=0, seed=2)
    chosen = scrape_loop(
        None, StaticInventory(big.inventory_objects()), client, store.store, resolution=10.0, timeout=2.0
    )
    assert isinstance(chosen, ScrapeWorkers if usable_cpus() >= AUTO_MIN_CPUS else Collector)
    small = SimulatedCluster(nodes=3, pods_per_node=1, seed=2)
    for obj in small.inventory_objects():
        fake_kube.upsert(obj)
    kube = await KubeClient.load(str(fake_kube.kubeconfig))
    inventory = KubeInventory(kube)
    auto = scrape_loop(None, inventory, client, store.store, resolution=10.0, timeout=2.0)
    assert isinstance(auto, AutoScrape)
    auto.start()
    try:
        assert auto.healthy() == (True, "waiting for the node list")
        await inventory.start()
        t0 = time.monotonic()
        while auto.active is None:
            assert time.monotonic() - t0 < WAIT
            await asyncio.sleep(0.05)
        assert isinstance(auto.active, Collector)  # 3 nodes: scraped in-process
    finally:
        await auto.stop()
        await inventory.stop()
        await kube.close()
        await client.close()
