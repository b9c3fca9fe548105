"""Resource pipeline benchmark: every figure of issue 9's table for `kcms standalone`, beside
metrics-server's, at each cluster size in turn.

    python bench/resource_pipeline.py --nodes 50,1000,5000 [--json out.json] [--kcms-arg=--flag=value ...]

Per size, fresh processes: the simulator (N kubelets over TLS on 127.x addresses, 30 pods x 2
containers each), the fake kube-apiserver (bench/fake_kube_apiserver.py: Nodes and Pods by paged
LIST + WATCH, as in a cluster) and `kcms standalone` (plus any --kcms-arg). Measured from outside:

1. start: from the moment KCMS's process is started, the node metrics list is polled until 95 %
   of the nodes are in it, then the pod metrics list until 95 % of the inventory's pods are
   (the pod figure is known to within one list's duration, printed);
2. quiet: once KCMS has completed --settle-cycles scrape cycles since start (its steady state:
   every node's body template made), CPU seconds of KCMS's whole process tree (parent + every
   descendant, reaped ones included) over --cycles whole scrape cycles with no queries ->
   millicores per node at the resolution; RSS of the tree (sum over processes) at the end -> MB
   per node;
3. lists: all nodes, all pods, one namespace by label (the HPA's query,
   --hpa-namespace/--hpa-selector), each with Accept-Encoding gzip and identity, over one kept-alive
   TLS connection; p50 is the figure;
4. the socket-write floor: the same client receiving the very bytes KCMS sent for all pods from a
   minimal asyncio+ssl server (pre-rendered, same TLS version); list time / floor time. Then
   lists paired with floor transfers (one right before or after the other, in turn; the median of
   the pairs' ratios: the pair shares whatever the machine is doing). Then, for gzip, the list and
   the floor again, each taken wholly between two scrape cycles and wholly
   during one (KCMS's /metrics says when a cycle starts and ends): the five lists of step 3 fall
   wherever the cycles put them, and on 2 cores a list or a floor transfer that a 5000-node cycle
   overlaps shares the machine with it (the simulator holds the other core);
5. load: --load-clients processes list all pods in a loop for at least --load-cycles whole scrape
   cycles while KCMS collects: failed scrapes by reason and cycle durations (deltas of KCMS's
   /metrics), list latency, the fewest pods a list held, and pods served right after the phase;
6. pods served at the end: % of the inventory's pods present in the all-pods list.

It prints the raw lines per size, then a Markdown table (one column per size; cells "KCMS /
metrics-server (ratio)") to paste into the README; --json saves everything. Where the reference
figures come from: bench/resource_report.py. Not a test: it asserts nothing and takes minutes.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import multiprocessing.queues
import os
import queue
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import orjson
import psutil
import trustme
from resource_client import Client, Response, items_of, list_loop, read_scrapes, tree_cpu_seconds, tree_memory
from resource_report import machine_loop_seconds, markdown_table, raw_lines, reference_lines

BENCH = Path(__file__).resolve().parent
NODES_PATH = "/apis/metrics.k8s.io/v1beta1/nodes"
PODS_PATH = "/apis/metrics.k8s.io/v1beta1/pods"
HISTORY = "/apis/history.kcms.io/v1alpha1"  # served unless --kcms-arg=--history=0 (docs/history.md)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def wait_for_line(proc: subprocess.Popen, needle: str, timeout: float) -> None:
    """Read ``proc``'s stdout until a line contains ``needle``; then keep draining it in the
    background (a full pipe would block the process)."""
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                raise SystemExit(f"{proc.args[:4]} exited with {proc.returncode} before printing {needle!r}")
            continue
        if needle in line:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
            return
    raise SystemExit(f"timed out waiting for {needle!r}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))] if xs else float("nan")


def served_pct(body: bytes, inventory: set[tuple[str, str]]) -> float:
    listed = {(i["metadata"].get("namespace", ""), i["metadata"]["name"]) for i in items_of(body)}
    return 100.0 * len(listed & inventory) / len(inventory) if inventory else float("nan")


class ProcessRun:
    """The processes of one benchmark run (the child processes it spawned, stopped in reverse) and
    a client certificate in ``system:masters`` for reading KCMS; bench/prometheus_bridge.py's runs
    are one too."""

    def __init__(self, work: Path, ca: trustme.CA) -> None:
        self.work, self.ca = work, ca
        me = ca.issue_cert("kcms-bench", common_name="kcms-bench", organization_name="system:masters")
        self.cert_chain = str(work / "client.pem")
        me.private_key_and_cert_chain_pem.write_to_path(self.cert_chain)
        self.procs: list[subprocess.Popen] = []

    def spawn(self, cmd: list[str], **kw: object) -> subprocess.Popen:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    def kcms_died(self) -> SystemExit:
        tail = (self.work / "kcms.log").read_text(errors="replace")[-3000:]
        return SystemExit(f"kcms exited {self.server.returncode}; its log ends:\n{tail}")  # type: ignore[attr-defined]


class Run(ProcessRun):
    """One cluster size: its processes, client and figures."""

    def __init__(self, args: argparse.Namespace, nodes: int, work: Path, ca: trustme.CA) -> None:
        super().__init__(work, ca)
        self.args, self.nodes = args, nodes
        self.r: dict = {"nodes": nodes, "pods_per_node": args.pods_per_node, "kcms_args": args.kcms_arg}

    # ---- processes -------------------------------------------------------------------------------

    def start_cluster(self) -> None:
        a, w = self.args, self.work
        log(f"{self.nodes} nodes: starting the simulator")
        sim = self.spawn(
            [sys.executable, "-m", "kcms", "simulate", "--nodes", str(self.nodes),
             "--pods-per-node", str(a.pods_per_node), "--containers-per-pod", "2",
             "--address-base", a.address_base, "--port", str(a.port),
             "--write-inventory", str(w / "inventory.json"), "--ca-out", str(w / "kubelet-ca.pem")],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        wait_for_line(sim, "serving", 1800)
        self.simulator = psutil.Process(sim.pid)
        items = orjson.loads((w / "inventory.json").read_bytes())["items"]
        self.inventory = {
            (o["metadata"]["namespace"], o["metadata"]["name"])
            for o in items
            if o.get("kind") == "Pod" and (o.get("status") or {}).get("phase") == "Running"
        }
        self.r["pods"] = len(self.inventory)
        del items
        log(f"{self.nodes} nodes: starting the fake kube-apiserver ({len(self.inventory)} pods)")
        kube = self.spawn(
            [sys.executable, str(BENCH / "fake_kube_apiserver.py"), str(w / "inventory.json"), str(w / "kubeconfig")],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        wait_for_line(kube, "ready", 1800)
        (w / "client-ca.pem").write_bytes(self.ca.cert_pem.bytes())

    def start_kcms(self) -> float:
        a, w = self.args, self.work
        self.port = free_port()
        cmd = [sys.executable, "-m", "kcms", "standalone",
               "--kubeconfig", str(w / "kubeconfig"),
               "--kubelet-certificate-authority", str(w / "kubelet-ca.pem"),
               "--kubelet-preferred-address-types", "InternalIP", "--kubelet-port", str(a.port),
               "--metric-resolution", f"{a.resolution:g}s",
               "--secure-port", str(self.port), "--bind-address", "127.0.0.1",
               "--cert-dir", str(w / "certs"), "--client-ca-file", str(w / "client-ca.pem"),
               "--authentication-skip-lookup", "-v", "0", *a.kcms_arg]  # fmt: skip
        log(f"{self.nodes} nodes: starting kcms standalone {' '.join(a.kcms_arg)}")
        t0 = time.monotonic()
        self.server = self.spawn(
            cmd, stdout=subprocess.DEVNULL, stderr=open(w / "kcms.log", "w"), cwd=a.kcms_root or None
        )  # `-m kcms` imports the package from the working directory first
        self.proc = psutil.Process(self.server.pid)
        self.client = Client("127.0.0.1", self.port, self.cert_chain)
        return t0

    # ---- 1. start ----------------------------------------------------------------------------------

    def measure_start(self, t0: float) -> None:
        want_nodes, want_pods = 0.95 * self.nodes, 0.95 * len(self.inventory)
        ready = nodes95 = pods95 = None
        pods_poll = float("nan")
        while ready is None or nodes95 is None or pods95 is None:
            if self.server.poll() is not None:
                raise self.kcms_died()
            if time.monotonic() - t0 > self.args.start_timeout:
                raise SystemExit(
                    f"not serving 95 % within {self.args.start_timeout} s (ready {ready}, nodes {nodes95})"
                )
            try:
                if ready is None and self.client.get("/readyz", timeout=10).status == 200:
                    ready = time.monotonic() - t0
                if nodes95 is None:
                    r = self.client.get(NODES_PATH, timeout=60)
                    if r.status == 200 and len(items_of(r.body)) >= want_nodes:
                        nodes95 = time.monotonic() - t0
                elif pods95 is None:
                    r = self.client.get(PODS_PATH, timeout=300)
                    if r.status == 200 and len(items_of(r.body)) >= want_pods:
                        pods95, pods_poll = time.monotonic() - t0, r.seconds
            except OSError:  # not listening yet
                self.client.close()
            time.sleep(0.2)
        rss, nproc = tree_memory(self.proc)
        self.r.update(t_ready_s=ready, t95_nodes_s=nodes95, t95_pods_s=pods95, t95_pods_poll_s=pods_poll,
                      rss_mb_at_start=rss / 1e6)  # fmt: skip
        log(f"{self.nodes} nodes: 95 % of nodes served after {nodes95:.1f} s, of pods after {pods95:.1f} s")

    # ---- 2. quiet cycles ------------------------------------------------------------------------------

    def wait_cycles(self, after: float, count: int) -> None:
        """Until KCMS has completed ``count`` cycles more than ``after``."""
        deadline = time.monotonic() + (count + 2) * self.args.resolution * 4
        while read_scrapes(self.client).cycles < after + count:
            if self.server.poll() is not None:
                raise self.kcms_died()
            if time.monotonic() > deadline:
                raise SystemExit(f"KCMS did not complete {count} scrape cycles in time")
            time.sleep(0.25)

    def measure_quiet(self) -> None:
        a = self.args
        # Steady state first: KCMS makes a node's body template at its third full decode, at most
        # 2000 a cycle, so 5000 nodes build theirs in cycles 3-5 (1.1-1.8 ms each); a service's CPU
        # is what it costs from then on. Then start on a cycle boundary and measure whole cycles.
        # Polling /metrics costs the server CPU too (~4 ms a GET at 50 nodes, as much as 9 scrapes,
        # 27 Nov): the window sleeps through its cycles and past the last one's expected end, and
        # its CPU is read before the one poll that confirms the count. (Until 27 Nov 21:10 it polled
        # every 0.25 s from a second before the end: ~5 polls in a 50-node window of 4 cycles, which
        # cost 60-90 ms of CPU in all.)
        done = read_scrapes(self.client).cycles
        if done < a.settle_cycles:
            time.sleep(max(0.0, (a.settle_cycles - done) * a.resolution - 2.0))
            self.wait_cycles(0, a.settle_cycles)
        self.wait_cycles(read_scrapes(self.client).cycles, 1)
        # The machine's speed where its CPU is measured (the reference is scaled by it): the loop
        # timed when the run started could be 15 minutes and 15 % away (34.2 against 39.4 ms in
        # two runs 5 minutes apart, 1 Dec). Timed here, just after a cycle, and again just after
        # the window's last one: while KCMS waits for its next tick, not while it scrapes.
        loop_before = machine_loop_seconds()
        s0 = read_scrapes(self.client)
        cpu0, sim0 = tree_cpu_seconds(self.proc), tree_cpu_seconds(self.simulator)
        mean_wall = s0.cycle_seconds / s0.cycles if s0.cycles > 0 else 1.0
        time.sleep(a.cycles * a.resolution + min(a.resolution / 2, max(0.5, 2 * mean_wall)))
        deadline = time.monotonic() + (a.cycles + 2) * a.resolution * 4
        while True:
            cpu1, sim1 = tree_cpu_seconds(self.proc), tree_cpu_seconds(self.simulator)
            s1 = read_scrapes(self.client)
            if s1.cycles >= s0.cycles + a.cycles:
                break
            if self.server.poll() is not None:
                raise self.kcms_died()
            if time.monotonic() > deadline:
                raise SystemExit(f"KCMS did not complete {a.cycles} scrape cycles in time")
            time.sleep(0.25)
        loop_after = machine_loop_seconds()
        rss, nproc = tree_memory(self.proc)
        pss, _ = tree_memory(self.proc, pss=True)
        cycles = s1.cycles - s0.cycles
        cycle_cpu = (cpu1 - cpu0) / cycles
        # The simulator serves the same bodies every cycle with the same code whatever KCMS tree is
        # measured: its CPU in the same window is a reference the machine moves with KCMS's. Two
        # 5000-node runs, 2 Dec: the simulator took 8.9 and 5.6 s of CPU in 55 s (of two different
        # KCMS trees' runs: 1.39 and 0.83 s a cycle), while the timed loop moved 44 -> 35 ms only.
        simulator_cpu = (sim1 - sim0) / cycles
        per_simulator = cycle_cpu / simulator_cpu if simulator_cpu > 0 else None
        self.r.update(
            quiet_from_cycle=s0.cycles, cycles=cycles, cycle_cpu_s=cycle_cpu, cycle_wall_s=(s1.cycle_seconds - s0.cycle_seconds) / cycles,
            cpu_mc_per_node=cycle_cpu / a.resolution * 1000 / self.nodes,
            rss_mb=rss / 1e6, pss_mb=pss / 1e6, processes=nproc, rss_mb_per_node=rss / 1e6 / self.nodes,
            quiet_failures=s1.delta(s0),
            simulator_cycle_cpu_s=simulator_cpu, cpu_per_simulator_cpu=per_simulator,
            machine_loop_s=(loop_before + loop_after) / 2, machine_loop_quiet_s=[loop_before, loop_after],
        )  # fmt: skip
        log(
            f"{self.nodes} nodes: {self.r['cpu_mc_per_node']:.4f} mcore and {self.r['rss_mb_per_node']:.3f} MB per node"
            f" (the machine's loop {loop_before * 1000:.1f} ms before the window, {loop_after * 1000:.1f} after;"
            f" the simulator's CPU {simulator_cpu:.3f} s a cycle, KCMS {'n/a' if per_simulator is None else f'{per_simulator:.3f}x'} it)"
        )

    # ---- 3. lists -------------------------------------------------------------------------------------

    def time_list(self, path: str, encoding: str, n: int) -> tuple[dict, Response]:
        samples, wire, r = [], [], None
        rendered = []  # all pods: nodes whose pods each list rendered (node blocks, on_list)
        for _ in range(n):
            before = read_scrapes(self.client).blocks_rendered if path == PODS_PATH else {}
            r = self.client.get(path, encoding=encoding)
            if r.status != 200:
                raise SystemExit(f"GET {path}: HTTP {r.status}: {r.body[:300]!r}")
            samples.append(r.seconds * 1000)
            wire.append(r.wire_seconds * 1000)
            if path == PODS_PATH:
                after = read_scrapes(self.client).blocks_rendered
                rendered.append(int(after.get("on_list", 0) - before.get("on_list", 0)))
        assert r is not None
        fig = {"p50_ms": statistics.median(samples), "p99_ms": pct(samples, 0.99), "max_ms": max(samples),
               "n": n, "items": len(items_of(r.body)), "wire_bytes": r.wire_bytes, "body_bytes": len(r.body),
               "content_encoding": r.encoding, "samples_ms": [round(x, 1) for x in samples],
               "wire_p50_ms": statistics.median(wire), "wire_samples_ms": [round(x, 1) for x in wire]}  # fmt: skip
        if rendered:
            fig["nodes_rendered"] = rendered
        return fig, r

    def measure_lists(self) -> None:
        a = self.args
        hpa = (f"/apis/metrics.k8s.io/v1beta1/namespaces/{a.hpa_namespace}/pods?"
               + urllib.parse.urlencode({"labelSelector": a.hpa_selector}))  # fmt: skip
        self.r["hpa_path"] = hpa
        self.r["lists"], self.pods_wire = {}, {}
        for enc in ("gzip", "identity"):
            nodes, _ = self.time_list(NODES_PATH, enc, a.requests)
            pods, r = self.time_list(PODS_PATH, enc, a.pod_requests)
            self.pods_wire[enc] = (r.raw, r.encoding)  # as on the wire, for the floor server to send again
            self.r["pods_served_pct_before_load"] = served_pct(r.body, self.inventory)
            del r
            hpa_fig, _ = self.time_list(hpa, enc, a.requests)
            self.r["lists"][enc] = {"nodes": nodes, "pods": pods, "hpa": hpa_fig}
            self.r["lists"][enc].update(self.history_lists(enc))
        self.r["tls"] = self.client.tls()
        rss, _ = tree_memory(self.proc)
        self.r["rss_mb_after_lists"] = rss / 1e6
        log(f"{self.nodes} nodes: lists (p50 ms) " + json.dumps({
            e: {k: round(v["p50_ms"], 1) for k, v in f.items()} for e, f in self.r["lists"].items()}))  # fmt: skip

    def history_lists(self, enc: str) -> dict:
        """history.kcms.io: one pod's, one namespace's pods' and all nodes' history (when served)."""
        if self.client.get(HISTORY, timeout=30).status != 200:
            self.r["history"] = False
            return {}
        self.r["history"] = True
        ns, name = min(self.inventory)
        one, r = self.time_list(f"{HISTORY}/namespaces/{ns}/pods/{name}", enc, self.args.requests)
        body = orjson.loads(r.body)
        one["points"] = len(body["containers"][0]["points"]) if body.get("containers") else 0
        namespace, r = self.time_list(
            f"{HISTORY}/namespaces/{self.args.hpa_namespace}/pods", enc, self.args.pod_requests
        )
        nodes, r = self.time_list(f"{HISTORY}/nodes", enc, self.args.pod_requests)
        nodes["points"] = sum(len(i["points"]) for i in items_of(r.body))
        return {"history_pod": one, "history_namespace": namespace, "history_nodes": nodes}

    # ---- 4. the socket-write floor --------------------------------------------------------------

    def measure_floor(self) -> None:
        floor_cert = str(self.work / "floor.pem")
        self.ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(floor_cert)
        self.r["floor"] = {}
        for enc, (raw, got) in self.pods_wire.items():
            body_file = self.work / f"pods-{enc}.body"
            body_file.write_bytes(raw)
            tls_version = self.r["tls"][0] or "TLSv1.3"
            srv = subprocess.Popen(
                [sys.executable, str(BENCH / "resource_client.py"), "floor", "--body", str(body_file),
                 "--content-encoding", got, "--tls-version", tls_version, "--cert-chain", floor_cert],
                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
            )  # fmt: skip
            try:
                assert srv.stdout is not None
                port = int(srv.stdout.readline().split()[1])
                client = Client("127.0.0.1", port)
                client.get("/", encoding=enc)  # the handshake, as KCMS's connection had it already
                samples, wire = [], []
                for _ in range(self.args.pod_requests):
                    r = client.get("/", encoding=enc)
                    samples.append(r.seconds * 1000)
                    wire.append(r.wire_seconds * 1000)
                tls = client.tls()
                paired = self.paired(client, enc)
                if enc == "gzip":
                    self.r["by_cycle"] = self.by_cycle(client, enc)
                client.close()
            finally:
                srv.terminate()
                srv.wait(10)
            p50 = statistics.median(samples)
            wire50 = statistics.median(wire)
            self.r["floor"][enc] = {"p50_ms": p50, "wire_bytes": len(raw), "tls": tls,
                                    "ratio": self.r["lists"][enc]["pods"]["p50_ms"] / p50,
                                    "wire_p50_ms": wire50,
                                    "wire_ratio": self.r["lists"][enc]["pods"]["wire_p50_ms"] / wire50,
                                    "paired": paired}  # fmt: skip
            body_file.unlink()

    def paired(self, floor: Client, enc: str) -> dict:
        """--pod-requests lists of every pod, each paired with a floor transfer (``floor``: the bare
        server's client) right before or after it, in turn: the pair shares the machine's state (a
        scrape cycle running or not), where the five lists of step 3 and the floor's five come
        seconds apart. The figure is the median of the pairs' ratios. Lists that render nodes
        themselves come first, untimed (at most three): the history lists before these outlast the
        15 s rendering ahead waits for a list, so the first list renders every node again (the
        first two paired lists took 4514 and 2473 ms to the last byte at 09:57)."""
        for _ in range(3):
            before = read_scrapes(self.client).blocks_rendered.get("on_list", 0)
            self.client.get(PODS_PATH, encoding=enc)
            if read_scrapes(self.client).blocks_rendered.get("on_list", 0) == before:
                break
        lists: list[Response] = []
        floors: list[Response] = []
        for i in range(self.args.pod_requests):
            if i % 2 == 0:
                lists.append(self.client.get(PODS_PATH, encoding=enc))
                floors.append(floor.get("/", encoding=enc))
            else:
                floors.append(floor.get("/", encoding=enc))
                lists.append(self.client.get(PODS_PATH, encoding=enc))
        fig: dict = {
            "list_ms": [round(r.seconds * 1000, 1) for r in lists],
            "floor_ms": [round(r.seconds * 1000, 1) for r in floors],
            "list_wire_ms": [round(r.wire_seconds * 1000, 1) for r in lists],
            "floor_wire_ms": [round(r.wire_seconds * 1000, 1) for r in floors],
        }
        if lists:
            ratios = [a.seconds / b.seconds for a, b in zip(lists, floors, strict=True)]
            wire_ratios = [a.wire_seconds / b.wire_seconds for a, b in zip(lists, floors, strict=True)]
            fig.update(ratios=[round(x, 3) for x in ratios], ratio=statistics.median(ratios),
                       wire_ratios=[round(x, 3) for x in wire_ratios], wire_ratio=statistics.median(wire_ratios))  # fmt: skip
        return fig

    def by_cycle(self, floor: Client, enc: str) -> dict:
        """The list of every pod and its floor (``floor``: the bare server's client), taken in turn
        wholly between two scrape cycles and wholly during one; per phase the samples, p50s and
        their ratio. Skipped where the quiet cycles took under --by-cycle-min-seconds: a list then
        rarely meets a cycle, and none fits in one."""
        if self.r["cycle_wall_s"] < self.args.by_cycle_min_seconds:
            return {"skipped": f"cycles of {self.r['cycle_wall_s']:.2f} s"}
        out: dict = {}
        for phase in ("between", "during"):
            before = read_scrapes(self.client)
            lists, floors = self.in_phase(phase, [
                lambda: self.client.get(PODS_PATH, encoding=enc),
                lambda: floor.get("/", encoding=enc),
            ])  # fmt: skip
            list_wire = [r.wire_seconds * 1000 for r in lists]
            floor_wire = [r.wire_seconds * 1000 for r in floors]
            lists = [r.seconds * 1000 for r in lists]
            floors = [r.seconds * 1000 for r in floors]
            fig: dict = {"list_ms": [round(x, 1) for x in lists], "floor_ms": [round(x, 1) for x in floors],
                         "list_wire_ms": [round(x, 1) for x in list_wire],
                         "floor_wire_ms": [round(x, 1) for x in floor_wire]}  # fmt: skip
            # nodes the phase's lists rendered themselves, and served as of their previous scrape
            counts = read_scrapes(self.client).delta(before)
            fig["nodes_on_list"] = int(counts["nodes_on_list"])
            fig["nodes_previous"] = int(counts["nodes_previous"])
            if lists and floors:
                fig.update(list_p50_ms=statistics.median(lists), floor_p50_ms=statistics.median(floors),
                           ratio=statistics.median(lists) / statistics.median(floors),
                           list_wire_p50_ms=statistics.median(list_wire),
                           floor_wire_p50_ms=statistics.median(floor_wire),
                           wire_ratio=statistics.median(list_wire) / statistics.median(floor_wire))  # fmt: skip
            out[phase] = fig
        log(f"{self.nodes} nodes: list all pods ({enc}) by scrape-cycle phase " + json.dumps(out))
        return out

    def in_phase(self, phase: str, calls: list[Callable[[], Response]], max_cycles: int = 2) -> list[list[Response]]:
        """Up to --pod-requests results of each of ``calls`` (called in turn), each of a call that
        ran wholly between two scrape cycles (``between``: from once a cycle has ended until no
        other had begun) or wholly during one (``during``: from once a cycle has begun until it had
        not yet ended), over at most ``max_cycles`` cycles."""
        want = self.args.pod_requests
        samples: list[list[Response]] = [[] for _ in calls]
        deadline = time.monotonic() + (max_cycles + 1) * self.args.resolution * 2
        for _ in range(max_cycles):
            if min(map(len, samples)) >= want:
                break
            prev = read_scrapes(self.client)
            while True:  # the edge, polled every 50 ms: a cycle ends (between) or begins (during)
                if self.server.poll() is not None:
                    raise self.kcms_died()
                if time.monotonic() > deadline:
                    return samples
                time.sleep(0.05)
                now = read_scrapes(self.client)
                if phase == "between" and now.cycles > prev.cycles:
                    base = now.last_cycle_start  # the cycle that ended; none begins until the next
                    break
                if phase == "during" and now.last_cycle_start > prev.last_cycle_start:
                    base = prev.cycles  # cycles completed before the one that began
                    break
                prev = now
            in_phase = True
            while in_phase and min(map(len, samples)) < want:
                for call, got in zip(calls, samples, strict=True):
                    got_r = call()
                    after = read_scrapes(self.client)
                    if (after.last_cycle_start if phase == "between" else after.cycles) != base:
                        in_phase = False  # a cycle began (between) or ended (during) before the call did
                        break
                    if len(got) < want:
                        got.append(got_r)
        return samples

    # ---- 5. listing clients while collecting ------------------------------------------------------

    def measure_load(self) -> None:
        a = self.args
        ctx = multiprocessing.get_context("spawn")
        stop, results = ctx.Event(), ctx.Queue()
        workers = [
            ctx.Process(target=list_loop, args=("127.0.0.1", self.port, self.cert_chain, PODS_PATH, "gzip", stop, results),
                        daemon=True)
            for _ in range(a.load_clients)
        ]  # fmt: skip
        for w in workers:
            w.start()
        lists: list[tuple] = []
        done = 0  # clients that stopped
        # The phase starts once every client has sent its first list; whole cycles under load are
        # those that complete after the one in progress at that moment.
        time.sleep(1.0)
        s0 = read_scrapes(self.client)
        log(
            f"{self.nodes} nodes: {a.load_clients} clients list all pods in a loop for {a.load_cycles}+ cycles"
        )
        durations, last = [], s0
        deadline = time.monotonic() + (a.load_cycles + 3) * a.resolution * 4
        while last.cycles < s0.cycles + a.load_cycles + 1:
            if self.server.poll() is not None:
                raise self.kcms_died()
            if time.monotonic() > deadline:
                log("load phase: cycles did not complete in time; ending it")
                break
            time.sleep(0.5)
            done += drain(results, lists)
            now = read_scrapes(self.client)
            if now.cycles > last.cycles:
                durations.append((now.cycle_seconds - last.cycle_seconds) / (now.cycles - last.cycles))
            last = now
        s1 = read_scrapes(self.client)
        stop.set()
        r = self.client.get(PODS_PATH, encoding="gzip")
        end_pct = served_pct(r.body, self.inventory)
        # each client ends its list in progress, sends what it has and None
        deadline = time.monotonic() + 300
        while done < len(workers) and time.monotonic() < deadline:
            try:
                item = results.get(timeout=1.0)
            except queue.Empty:
                continue
            if item is None:
                done += 1
            else:
                lists.append(item)
        for w in workers:
            w.join(5)
            if w.is_alive():
                w.terminate()
        ok = [x for x in lists if x[3] == 200]
        ms = [x[1] * 1000 for x in ok]
        delta = s1.delta(s0)
        self.r["load"] = {
            "clients": a.load_clients, **delta, "cycle_seconds": durations,
            "cycle_max_s": max(durations, default=float("nan")),
            "cycle_mean_s": statistics.fmean(durations) if durations else float("nan"),
            "lists": len(ok), "list_errors": [x[3] for x in lists if x[3] != 200][:10],
            "list_p50_ms": statistics.median(ms) if ms else float("nan"), "list_max_ms": max(ms, default=float("nan")),
            "min_items_pct": 100.0 * min((x[2] for x in ok), default=0) / len(self.inventory),
            "pods_served_pct_end": end_pct, "nodes_missing_end": s1.nodes_missing,
        }  # fmt: skip
        self.r["pods_served_pct"] = end_pct
        rss, _ = tree_memory(self.proc)
        self.r["rss_mb_after_load"] = rss / 1e6

    def run(self) -> dict:
        try:
            self.start_cluster()
            t0 = self.start_kcms()
            self.measure_start(t0)
            self.measure_quiet()
            self.measure_lists()
            self.measure_floor()
            if self.args.load_clients > 0:
                self.measure_load()
            else:
                r = self.client.get(PODS_PATH, encoding="gzip")
                self.r["pods_served_pct"] = served_pct(r.body, self.inventory)
        finally:
            self.stop()
        return self.r


def drain(results: multiprocessing.queues.Queue, into: list[tuple]) -> int:
    """Take what the list clients sent so far; the number of them that stopped (sent None)."""
    stopped = 0
    while True:
        try:
            item = results.get_nowait()
        except queue.Empty:
            return stopped
        if item is None:
            stopped += 1
        else:
            into.append(item)


def code_version(root: str | None) -> str:
    """The commit the measured KCMS code is at, and whether kcms/ has changes not committed."""
    if root:
        return f"the kcms package in {root}"
    repo = Path.cwd()  # where `python -m kcms` imports it from
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "kcms"], cwd=repo, capture_output=True, text=True
        )
    except OSError:
        return "unknown"
    return head.stdout.strip() + (" + uncommitted changes in kcms/" if dirty.stdout.strip() else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--nodes",
        default="50,1000,5000",
        help="cluster sizes, comma-separated, run in turn (default 50,1000,5000)",
    )
    ap.add_argument("--pods-per-node", type=int, default=30)
    ap.add_argument(
        "--resolution", type=float, default=15.0, help="seconds (default 15; KCMS needs at least 10)"
    )
    ap.add_argument("--cycles", type=int, default=4, help="quiet scrape cycles measured for CPU (default 4)")
    ap.add_argument(
        "--by-cycle-min-seconds",
        type=float,
        default=0.5,
        help="list all pods and its floor between and during scrape cycles where the quiet cycles "
        "took at least this long (default 0.5)",
    )
    ap.add_argument(
        "--settle-cycles",
        type=int,
        default=5,
        help="scrape cycles KCMS completes after start before the quiet cycles begin (default 5: "
        "every node's body template is made by then)",
    )
    ap.add_argument("--requests", type=int, default=20, help="requests per node and HPA listing (default 20)")
    ap.add_argument(
        "--pod-requests", type=int, default=5, help="requests per all-pods listing and floor (default 5)"
    )
    ap.add_argument(
        "--load-clients",
        type=int,
        default=2,
        help="client processes listing all pods in the load phase (default 2; 0: no phase)",
    )
    ap.add_argument(
        "--load-cycles",
        type=int,
        default=3,
        help="whole scrape cycles the load phase lasts at least (default 3)",
    )
    ap.add_argument("--hpa-namespace", default="team-a")
    ap.add_argument(
        "--hpa-selector",
        default="app=web",
        help="labelSelector of the HPA's query (default app=web: one Deployment's pods)",
    )
    ap.add_argument(
        "--kcms-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument to `kcms standalone` (repeatable; use --kcms-arg=--flag=value)",
    )
    ap.add_argument(
        "--start-timeout", type=float, default=900.0, help="seconds until 95 %% of pods must be served"
    )
    ap.add_argument(
        "--kcms-root",
        metavar="DIR",
        help="measure the kcms package in DIR (e.g. `git archive <commit> kcms | tar -x -C DIR`) "
        "instead of this checkout's; the simulator and the fake API stay this checkout's",
    )
    ap.add_argument("--address-base", default="127.50.0.1")
    ap.add_argument("--port", type=int, default=10250)
    ap.add_argument("--json", metavar="FILE", help="also write every figure here")
    args = ap.parse_args()  # fmt: skip
    try:
        sizes = [int(x) for x in args.nodes.split(",") if x.strip()]
    except ValueError:
        ap.error(f"argument --nodes: not a comma-separated list of integers: {args.nodes!r}")
    if not sizes or min(sizes) < 1:
        ap.error("argument --nodes: every size must be at least 1")
    if args.kcms_root and not (Path(args.kcms_root) / "kcms" / "__main__.py").is_file():
        ap.error(f"argument --kcms-root: no kcms package in {args.kcms_root}")
    for flag in ("requests", "pod_requests", "cycles", "load_cycles"):
        if getattr(args, flag) < 1:  # each figure needs one sample; fail now rather than after minutes
            ap.error(f"argument --{flag.replace('_', '-')}: at least 1")
    if args.settle_cycles < 0:
        ap.error("argument --settle-cycles: at least 0")
    if args.resolution < 10:
        ap.error("argument --resolution: KCMS's --metric-resolution is at least 10 s")

    ca = trustme.CA()
    results = []
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load = os.getloadavg()
    version = code_version(args.kcms_root)
    loop_s = machine_loop_seconds()  # before anything runs (each size's CPU reference uses its own, see measure_quiet)
    log(f"this machine's Python loop: {loop_s * 1000:.1f} ms (bench/resource_report.py)")
    for n in sizes:
        work = Path(tempfile.mkdtemp(prefix=f"kcms-bench-{n}-"))
        r = Run(args, n, work, ca).run()
        r["machine_loop_start_s"] = loop_s  # machine_loop_s, which scales the CPU reference, is timed around the quiet window
        results.append(r)
        print("\n".join(raw_lines(r)), flush=True)
    print()
    print("\n".join(reference_lines(sizes, loop_s, {r["nodes"]: r["machine_loop_s"] for r in results})))
    table = markdown_table(results)
    print()
    print(
        f"Measured {started} on {os.cpu_count()} cores, load average at start {load[0]:.2f}, "
        f"KCMS at {version}; cells: KCMS / metrics-server (ratio):"
    )
    print()
    print(table, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"started": started, "loadavg": load, "code": version, "args": vars(args), "results": results,
             "table": table},
            indent=1, default=str,
        ))  # fmt: skip
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
