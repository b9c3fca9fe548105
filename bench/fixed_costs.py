"""Fixed costs of `kcms standalone` in a small cluster: idle CPU and RSS, measured from outside.

    python bench/fixed_costs.py --nodes 50 --seconds 120 [--repeat 2] [--hold 0]

The simulator serves N kubelets (30 pods x 2 containers each) on 127.x addresses, the test
suite's fake kube-apiserver serves their Nodes and Pods, and `kcms standalone` scrapes them every
15 s, exactly as bench/resource_pipeline.py wires them. Once the process is ready and has done two
scrape cycles, we measure its CPU seconds (the process CPU clock; user and system apart in /proc's
10 ms ticks) over --seconds of idle running (no queries at all, not even /metrics) and its RSS (and
USS: memory private to the process) at the end. Printed: millicores in total and per node, RSS/USS
MiB, and metrics-server's CPU per node scaled to this machine's speed as bench/resource_pipeline.py
scales it (bench/resource_report.py; the machine's Python loop timed before and after the windows),
with KCMS's ratio to it in each window (at 50, 1000 and 5000 nodes: the sizes issue 9 measured).

Which KCMS: the one `python -m kcms` finds from a temporary directory (the processes start there,
so a checkout in the current directory does not shadow it): PYTHONPATH=/path/to/checkout picks
another; the first line printed names it.

--hold N keeps everything running N seconds after the measurement and prints the KCMS pid, for
py-spy (`py-spy record -d 60 -p PID -o /tmp/x.svg`). KCMS_BENCH_CPROFILE=FILE runs it under cProfile.

--per-scrape: no KCMS process; this process scrapes the simulator's kubelets with KCMS's own
KubeletClient into a ResourceStore, cycle after cycle (one a second), and prints the CPU of one
scrape and its parts: decode (kcms/sources/kubelet_decode.py), store, cyclic GC (gc.callbacks)
and the rest (HTTP/TLS, asyncio). Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import trustme
from resource_client import process_cpu_seconds
from resource_report import machine_loop_seconds, reference


def wait_for_line(proc: subprocess.Popen, needle: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise SystemExit(f"process exited with {proc.returncode} before printing {needle!r}")
        if needle in line:
            return
    raise SystemExit(f"timed out waiting for {needle!r}")


class Client:
    """HTTPS with the benchmark's client certificate (kept apart from resource_pipeline.py's)."""

    def __init__(self, base: str, cert: trustme.LeafCert) -> None:
        self.base = base
        self.ctx = ssl.create_default_context()
        self.ctx.check_hostname = False
        self.ctx.verify_mode = ssl.CERT_NONE
        with tempfile.NamedTemporaryFile("wb", suffix=".pem", delete=False) as f:
            f.write(cert.private_key_and_cert_chain_pem.bytes())
        self.ctx.load_cert_chain(f.name)

    def get(self, path: str, timeout: float = 30.0) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.base + path, context=self.ctx, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()


def cpu_seconds(p: psutil.Process) -> float:
    """The process's CPU seconds, to the nanosecond where Linux's process CPU clock can be read
    (/proc's user and system times come in 10 ms ticks: ±7 % of a 120 s window at 50 nodes)."""
    running = process_cpu_seconds(p.pid)
    if running is not None:
        return running
    t = p.cpu_times()
    return t.user + t.system


async def per_scrape(work: Path, rounds: int, history: float = 600.0) -> None:
    import asyncio
    import gc

    import kcms.collector.kubelet as kubelet
    from kcms.heap import HeapFreezer
    from kcms.kube.inventory import StaticInventory
    from kcms.store.history import HistoryStore
    from kcms.store.resource import ResourceStore

    spent = {"decode": 0.0, "store": 0.0, "gc": 0.0, "collections": 0}
    started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.process_time()
        else:
            spent["gc"] += time.process_time() - started[0]
            spent["collections"] += 1

    orig: list = []  # the client's own decoder (with its start-time block reuse), set below

    def timed_decode(node: str, body: bytes):
        t = time.process_time()
        try:
            return orig[0](node, body)
        finally:
            spent["decode"] += time.process_time() - t

    nodes = list(StaticInventory.from_file(work / "inventory.json").nodes())
    client = kubelet.KubeletClient(
        kubelet.KubeletClientConfig(
            ca_file=str(work / "kubelet-ca.pem"), preferred_address_types=("InternalIP",)
        )
    )
    orig.append(client._decode)
    client._decode = timed_decode  # the same decoder, timed
    store, heap = ResourceStore(15.0), HeapFreezer()
    if history > 0:  # kcms standalone's default --history 10m: every store() records too
        store.history = HistoryStore(history, 15.0)

    async def cycle() -> None:
        client.start_cycle()
        batches = await asyncio.gather(*(client.scrape(n) for n in nodes))
        t = time.process_time()
        for b in batches:
            store.store(b)
        spent["store"] += time.process_time() - t
        heap.after_cycle()  # as kcms standalone does after each cycle

    for _ in range(3):  # connections, first readings, rates
        await cycle()
        await asyncio.sleep(1.0)
    spent.update(decode=0.0, store=0.0, gc=0.0, collections=0)
    gc.callbacks.append(on_gc)
    c0 = time.process_time()
    for _ in range(rounds):
        await cycle()
        await asyncio.sleep(1.0)
    total = time.process_time() - c0
    gc.callbacks.remove(on_gc)
    await client.close()
    n = rounds * len(nodes)
    rest = total - spent["decode"] - spent["store"]
    print(
        f"{n} scrapes of {len(nodes)} kubelets: {total / n * 1e6:.0f} us CPU per scrape = decode "
        f"{spent['decode'] / n * 1e6:.0f} + store {spent['store'] / n * 1e6:.0f} + rest (HTTP, TLS, "
        f"asyncio) {rest / n * 1e6:.0f}; of all that, cyclic GC {spent['gc'] / n * 1e6:.0f} "
        f"({spent['collections'] / n:.2f} collections a scrape); history {history:g} s; "
        f"load {os.getloadavg()[0]:.2f}"
    )
    templates = client.decode_reuse.templates
    print(f"body templates (kcms/sources/decode_template.py): {templates.hits} bodies read from one, "
          f"{templates.misses} did not fit theirs")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--pods-per-node", type=int, default=30)
    ap.add_argument("--resolution", type=float, default=15.0)
    ap.add_argument("--seconds", type=float, default=120.0, help="idle measurement window (default 120)")
    ap.add_argument("--repeat", type=int, default=1, help="measurement windows, one after another")
    ap.add_argument("--hold", type=float, default=0.0, help="keep running this long after, for py-spy")
    ap.add_argument("--address-base", default="127.60.0.1")
    ap.add_argument("--port", type=int, default=10250)
    ap.add_argument("--secure-port", type=int, default=18543)
    ap.add_argument("--extra", default="", help="extra `kcms standalone` flags, space separated")
    ap.add_argument("--per-scrape", action="store_true", help="per-scrape CPU in this process (see above)")
    ap.add_argument("--rounds", type=int, default=20, help="--per-scrape: cycles measured (default 20)")
    ap.add_argument("--history", type=float, default=600.0,
                    help="--per-scrape: history retention in seconds, 0 off (default 600, as standalone)")  # fmt: skip
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kcms-fixed-"))
    ca = trustme.CA()
    (work / "client-ca.pem").write_bytes(ca.cert_pem.bytes())
    me = ca.issue_cert("kcms-bench", common_name="kcms-bench", organization_name="system:masters")
    kcms = [sys.executable, "-m", "kcms"]
    # KCMS_BENCH_CPROFILE=FILE: run `kcms standalone` under cProfile (written when it stops);
    # KCMS_BENCH_ENTRY=SCRIPT: run this script with the standalone arguments instead of `-m kcms`.
    profiled = kcms
    if os.environ.get("KCMS_BENCH_CPROFILE"):
        profiled = kcms[:1] + ["-m", "cProfile", "-o", os.environ["KCMS_BENCH_CPROFILE"]] + kcms[1:]
    elif os.environ.get("KCMS_BENCH_ENTRY"):
        profiled = [sys.executable, os.environ["KCMS_BENCH_ENTRY"]]
    sim = subprocess.Popen(
        kcms + ["simulate", "--nodes", str(args.nodes), "--pods-per-node", str(args.pods_per_node),
                "--containers-per-pod", "2", "--address-base", args.address_base,
                "--port", str(args.port), "--write-inventory", str(work / "inventory.json"),
                "--ca-out", str(work / "kubelet-ca.pem")],
        stdout=subprocess.PIPE, text=True, cwd=work,
    )  # fmt: skip
    server = kube = None
    try:
        wait_for_line(sim, "serving", 600)
        if args.per_scrape:
            import asyncio

            asyncio.run(per_scrape(work, args.rounds, args.history))
            return 0
        kube = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("fake_kube_apiserver.py")),
             str(work / "inventory.json"), str(work / "kubeconfig")],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        wait_for_line(kube, "ready", 600)
        t_start = time.monotonic()
        server = subprocess.Popen(
            profiled + ["standalone", "--kubeconfig", str(work / "kubeconfig"),
                    "--kubelet-certificate-authority", str(work / "kubelet-ca.pem"),
                    "--kubelet-preferred-address-types", "InternalIP", "--kubelet-port", str(args.port),
                    "--metric-resolution", f"{args.resolution}s", "--secure-port", str(args.secure_port),
                    "--bind-address", "127.0.0.1", "--cert-dir", str(work / "certs"),
                    "--client-ca-file", str(work / "client-ca.pem"), "--authentication-skip-lookup",
                    "-v", "0"] + args.extra.split(),
            stdout=subprocess.DEVNULL, stderr=open(work / "kcms.log", "w"), cwd=work,
        )  # fmt: skip
        proc = psutil.Process(server.pid)
        client = Client(f"https://127.0.0.1:{args.secure_port}", me)
        while True:
            try:
                if client.get("/readyz", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            if server.poll() is not None:
                raise SystemExit(f"kcms exited {server.returncode}; see {work / 'kcms.log'}")
            if time.monotonic() - t_start > 300:
                raise SystemExit("kcms did not become ready within 300 s")
            time.sleep(0.2)
        ready_after = time.monotonic() - t_start
        cpu_start = cpu_seconds(proc)
        time.sleep(2 * args.resolution)  # two whole cycles of warm-up, no requests
        print(f"workload: {args.nodes} nodes x {args.pods_per_node} pods x 2 containers, "
              f"resolution {args.resolution:g}s; idle (no queries); KCMS pid {server.pid}, "
              f"code {Path(importlib.util.find_spec('kcms').origin).parent}")  # fmt: skip
        print(f"ready after {ready_after:.2f} s; CPU to ready {cpu_start:.2f} s")
        # The machine's speed now, for metrics-server's CPU figure scaled to it (as in
        # bench/resource_pipeline.py); measured again after the windows, since it drifts by the hour.
        loop_s = machine_loop_seconds()
        windows: list[float] = []
        for i in range(args.repeat):
            load0 = os.getloadavg()[0]
            c0, t0, ticks0 = cpu_seconds(proc), time.monotonic(), proc.cpu_times()
            time.sleep(args.seconds)
            c1, t1, ticks1 = cpu_seconds(proc), time.monotonic(), proc.cpu_times()
            mem = proc.memory_full_info()
            mc = (c1 - c0) / (t1 - t0) * 1000
            windows.append(mc / args.nodes)
            print(
                f"window {i + 1}: {t1 - t0:.0f} s  CPU {c1 - c0:.3f} s = {mc:.2f} millicores "
                f"({mc / args.nodes:.3f} per node; in ticks user {ticks1.user - ticks0.user:.2f} s, "
                f"system {ticks1.system - ticks0.system:.2f} s)  RSS {mem.rss / 2**20:.1f} MiB "
                f"({mem.rss / 1e6 / args.nodes:.3f} MB per node)  USS {mem.uss / 2**20:.1f} MiB  "
                f"threads {proc.num_threads()}  load {load0:.2f}->{os.getloadavg()[0]:.2f}",
                flush=True,
            )
        loop_after = machine_loop_seconds()
        ref = reference(args.nodes, "cpu_mc_per_node", (loop_s + loop_after) / 2)
        if math.isnan(ref):
            ratios = "no reference at this size"
        else:
            ratios = " / ".join(f"{w / ref:.2f}x" for w in windows)
        print(
            f"this machine's Python loop {loop_s * 1000:.1f} ms before the windows, "
            f"{loop_after * 1000:.1f} ms after; metrics-server's CPU scaled to it "
            f"(bench/resource_report.py): {ref:.4f} mcore a node; KCMS / metrics-server: {ratios}",
            flush=True,
        )
        if args.hold > 0:
            print(f"holding {args.hold:g} s: py-spy record -d 60 -p {server.pid}", flush=True)
            time.sleep(args.hold)
    finally:
        for p in (server, kube, sim):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
