"""Resource pipeline benchmark: simulated kubelets -> `kcms standalone`, measured from outside.

    python bench/resource_pipeline.py --nodes 1000 --pods-per-node 30

The simulator (one process) serves N kubelets over TLS on 127.x addresses, each with P pods of
2 containers; the test suite's fake kube-apiserver (another process) serves their Node and Pod
objects. `kcms standalone` (another process) scrapes them every --metric-resolution. We
measure the KCMS process alone with psutil: CPU seconds per scrape cycle (and so millicores
per node at that resolution), RSS per node, the cycle wall time it reports in its own
/metrics, and the latency of listing all node metrics, all pod metrics and one namespace.
It prints figures and the ratios to metrics-server v0.9 measured on this kind of machine with
the same workload (see README). Not a test: it asserts nothing and takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import trustme

# metrics-server v0.9 on this kind of machine, 1000 nodes x 30 pods x 2 containers, 15 s.
REFERENCE = {"millicores_per_node": 0.058, "rss_mb_per_node": 0.40, "list_nodes_ms": 12.0}


def wait_for_line(proc: subprocess.Popen, needle: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                raise SystemExit(f"process exited with {proc.returncode} before printing {needle!r}")
            continue
        if needle in line:
            return
    raise SystemExit(f"timed out waiting for {needle!r}")


class Client:
    """A tiny HTTPS client with a client certificate (the benchmark's own identity)."""

    def __init__(self, base: str, ca: trustme.CA, cert: trustme.LeafCert) -> None:
        self.base = base
        self.ctx = ssl.create_default_context()
        self.ctx.check_hostname = False
        self.ctx.verify_mode = ssl.CERT_NONE
        with tempfile.NamedTemporaryFile("wb", suffix=".pem", delete=False) as f:
            f.write(cert.private_key_and_cert_chain_pem.bytes())
        self.ctx.load_cert_chain(f.name)

    def get(self, path: str, timeout: float = 30.0) -> tuple[int, bytes]:
        req = urllib.request.Request(self.base + path, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()


def metric_value(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


def cpu_seconds(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def time_requests(client: Client, path: str, n: int) -> tuple[float, float, int]:
    samples, items = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        status, body = client.get(path)
        samples.append((time.perf_counter() - t0) * 1000)
        if status != 200:
            raise SystemExit(f"GET {path}: HTTP {status}: {body[:300]!r}")
        items = len(json.loads(body)["items"])
    samples.sort()
    return statistics.median(samples), samples[int(0.99 * (len(samples) - 1))], items


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods-per-node", type=int, default=30)
    ap.add_argument("--resolution", type=float, default=15.0, help="seconds (default 15)")
    ap.add_argument("--cycles", type=int, default=4, help="scrape cycles measured (default 4)")
    ap.add_argument("--requests", type=int, default=20, help="requests per listing measured (default 20)")
    ap.add_argument("--address-base", default="127.50.0.1")
    ap.add_argument("--port", type=int, default=10250)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kcms-bench-"))
    ca = trustme.CA()
    (work / "client-ca.pem").write_bytes(ca.cert_pem.bytes())
    me = ca.issue_cert("kcms-bench", common_name="kcms-bench", organization_name="system:masters")
    kcms = [sys.executable, "-m", "kcms"]
    sim = subprocess.Popen(
        kcms
        + [
            "simulate",
            "--nodes",
            str(args.nodes),
            "--pods-per-node",
            str(args.pods_per_node),
            "--containers-per-pod",
            "2",
            "--address-base",
            args.address_base,
            "--port",
            str(args.port),
            "--write-inventory",
            str(work / "inventory.json"),
            "--ca-out",
            str(work / "kubelet-ca.pem"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    server = kube = None
    try:
        wait_for_line(sim, "serving", 600)
        # Nodes and pods come from a (fake) kube-apiserver by paged LIST + WATCH, as in a cluster.
        kube = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("fake_kube_apiserver.py")),
             str(work / "inventory.json"), str(work / "kubeconfig")],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        wait_for_line(kube, "ready", 600)
        port = 18443
        server = subprocess.Popen(
            kcms
            + [
                "standalone",
                "--kubeconfig",
                str(work / "kubeconfig"),
                "--kubelet-certificate-authority",
                str(work / "kubelet-ca.pem"),
                "--kubelet-preferred-address-types",
                "InternalIP",
                "--kubelet-port",
                str(args.port),
                "--metric-resolution",
                f"{args.resolution}s",
                "--secure-port",
                str(port),
                "--bind-address",
                "127.0.0.1",
                "--cert-dir",
                str(work / "certs"),
                "--client-ca-file",
                str(work / "client-ca.pem"),
                "--authentication-skip-lookup",
                "-v",
                "0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(work / "kcms.log", "w"),
        )
        proc = psutil.Process(server.pid)
        client = Client(f"https://127.0.0.1:{port}", ca, me)
        t_start = time.monotonic()
        while True:  # ready = metrics can be served
            try:
                status, _ = client.get("/readyz", timeout=5)
                if status == 200:
                    break
            except OSError:
                pass
            if server.poll() is not None:
                raise SystemExit(f"kcms exited {server.returncode}; see {work / 'kcms.log'}")
            if time.monotonic() - t_start > 300:
                raise SystemExit("kcms did not become ready within 300 s")
            time.sleep(0.2)
        ready_after = time.monotonic() - t_start
        rss_ready = proc.memory_info().rss
        if os.environ.get("KCMS_BENCH_RSS_TIMELINE"):
            for i in range(40):
                print(f"t+{i}s rss {proc.memory_info().rss / 2**20:.1f} MiB", flush=True)
                time.sleep(1)

        def cycles() -> tuple[float, float]:
            _, text = client.get("/metrics")
            t = text.decode()
            return (
                metric_value(t, "kcms_scrape_cycle_duration_seconds_count"),
                metric_value(t, "kcms_scrape_cycle_duration_seconds_sum"),
            )

        # Wait for a cycle boundary, then measure CPU over whole cycles with no queries. Polling
        # /metrics costs the server CPU too, so we sleep through the cycles and poll only at the end.
        n0, s0 = cycles()
        while cycles()[0] == n0:
            time.sleep(0.25)
        n0, s0 = cycles()
        cpu0 = cpu_seconds(proc)
        time.sleep(args.cycles * args.resolution - 1.0)
        while cycles()[0] < n0 + args.cycles:
            time.sleep(0.25)
        cpu1 = cpu_seconds(proc)
        n1, s1 = cycles()
        rss = proc.memory_info().rss
        cycle_cpu = (cpu1 - cpu0) / (n1 - n0)
        cycle_wall = (s1 - s0) / (n1 - n0)
        millicores_per_node = cycle_cpu / args.resolution * 1000 / args.nodes

        nodes_p50, nodes_p99, n_nodes = time_requests(
            client, "/apis/metrics.k8s.io/v1beta1/nodes", args.requests
        )
        pods_p50, pods_p99, n_pods = time_requests(
            client, "/apis/metrics.k8s.io/v1beta1/pods", max(3, args.requests // 4)
        )
        ns_p50, ns_p99, n_ns = time_requests(
            client, "/apis/metrics.k8s.io/v1beta1/namespaces/team-a/pods", args.requests
        )
        rss_after = proc.memory_info().rss

        print(
            f"workload: {args.nodes} nodes x {args.pods_per_node} pods x 2 containers, "
            f"resolution {args.resolution:g}s, KCMS process only"
        )
        print(f"ready after start:          {ready_after:8.2f} s")
        print(f"scrape cycle wall time:     {cycle_wall:8.3f} s  (mean of {n1 - n0:.0f} cycles)")
        print(f"CPU per cycle:              {cycle_cpu:8.3f} s")
        print(
            f"millicores per node:        {millicores_per_node:8.4f}   "
            f"(metrics-server {REFERENCE['millicores_per_node']}; ratio "
            f"{millicores_per_node / REFERENCE['millicores_per_node']:.2f}x)"
        )
        print(
            f"RSS:                        {rss / 2**20:8.1f} MiB steady ({rss_ready / 2**20:.1f} when ready), "
            f"{rss_after / 2**20:.1f} MiB after queries"
        )
        print(
            f"RSS per node:               {rss / 1e6 / args.nodes:8.3f} MB   "
            f"(metrics-server {REFERENCE['rss_mb_per_node']}; ratio "
            f"{rss / 1e6 / args.nodes / REFERENCE['rss_mb_per_node']:.2f}x)"
        )
        print(
            f"list all nodes ({n_nodes:5d}):      p50 {nodes_p50:8.1f} ms  p99 {nodes_p99:8.1f} ms  "
            f"(metrics-server {REFERENCE['list_nodes_ms']} ms; ratio {nodes_p50 / REFERENCE['list_nodes_ms']:.2f}x)"
        )
        print(f"list all pods ({n_pods:6d}):      p50 {pods_p50:8.1f} ms  p99 {pods_p99:8.1f} ms")
        print(f"list one namespace ({n_ns:5d}): p50 {ns_p50:8.1f} ms  p99 {ns_p99:8.1f} ms")
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
