"""Prometheus bridge benchmark (issue 10): `kcms standalone --prometheus-url` against a REAL
Prometheus holding 1 000 and 10 000 series, beside Prometheus's own time for the same PromQL.

    python bench/prometheus_bridge.py [--series 1000,10000] [--requests 300] [--json out.json]

Per size, fresh processes: the simulated exporter (kcms/sim/prometheus.py, ``SimExporter.bulk``:
100 pods in namespace ``bench``, one container, the rest of the series as ``app_bulk_<m>`` gauges),
a real Prometheus scraping it every second (its query log on, so each query KCMS sends is seen
with Prometheus's own timings), the fake kube-apiserver (bench/fake_kube_apiserver.py) serving the
exporter's nodes and pods, and `kcms standalone` with ``--prometheus-url``, ``--config`` (one rule
over every pod series + resourceRules) and ``--resource-metrics-source prometheus`` (no kubelets).

Measured from outside, over one kept-alive TLS connection (client certificate, system:masters):

1. discovery: ``GET /apis/custom.metrics.k8s.io/v1beta2`` ``--requests`` times, p50/p99 (the list
   is built by the background relist; a request never waits on Prometheus);
2. named: ``.../namespaces/bench/pods/<pod>/<metric>`` (one pod) and wildcard:
   ``.../namespaces/bench/pods/*/<metric>`` (all 100 pods), cycling over the metrics, p50/p99;
3. Prometheus's own time for the same PromQL: every query KCMS sent in phase 2 is read back from
   Prometheus's query log and replayed straight to Prometheus (HTTP, kept alive, same machine),
   p50/p99; the log's execTotalTime (evaluation inside Prometheus) is printed too. Overhead =
   KCMS's latency - the direct round trip, per quantile;
4. RSS of KCMS's process tree after all requests (and right after discovery was complete).

Targets (issue 10) printed as ratios: discovery p99 < 10 ms, overhead p99 < 5 ms, RSS < 150 MB at
10 000 series. The machine is shared: repeat and report ranges. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

import orjson
import psutil
import trustme

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
from fakeobjects import make_node, make_pod  # noqa: E402
from resource_client import Client, tree_memory  # noqa: E402
from resource_pipeline import ProcessRun, free_port, log, pct, wait_for_line  # noqa: E402

from kcms.sim.prometheus import RealPrometheus, SimExporter, ThreadedExporter  # noqa: E402

CUSTOM = "/apis/custom.metrics.k8s.io/v1beta2"
NAMESPACE = "bench"
TARGETS = {"discovery_p99_ms": 10.0, "overhead_p99_ms": 5.0, "rss_mb": 150.0}

ADAPTER_CONFIG = """
rules:
- seriesQuery: '{namespace!="",pod!=""}'
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
resourceRules:
  cpu:
    containerQuery: 'sum(rate(container_cpu_usage_seconds_total{<<.LabelMatchers>>,container!=""}[5s])) by (<<.GroupBy>>)'
    nodeQuery: 'sum(rate(container_cpu_usage_seconds_total{<<.LabelMatchers>>,id="/"}[5s])) by (<<.GroupBy>>)'
    resources:
      overrides: {node: {resource: node}, namespace: {resource: namespace}, pod: {resource: pod}}
    containerLabel: container
  memory:
    containerQuery: 'sum(container_memory_working_set_bytes{<<.LabelMatchers>>,container!=""}) by (<<.GroupBy>>)'
    nodeQuery: 'sum(container_memory_working_set_bytes{<<.LabelMatchers>>,id="/"}) by (<<.GroupBy>>)'
    resources:
      overrides: {node: {resource: node}, namespace: {resource: namespace}, pod: {resource: pod}}
    containerLabel: container
  window: 5s
"""


def quantiles(samples_s: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples_s]
    return {"p50_ms": statistics.median(ms), "p99_ms": pct(ms, 0.99), "max_ms": max(ms), "n": len(ms)}


class Run(ProcessRun):
    """One series count: its processes and figures."""

    def __init__(self, args: argparse.Namespace, series: int, work: Path, ca: trustme.CA) -> None:
        super().__init__(work, ca)
        self.args, self.series = args, series
        self.exporter = SimExporter.bulk(series)
        self.r: dict = {"series": self.exporter.series_count, "pods": len(self.exporter.pods)}
        self.query_log = work / "query.log"

    # ---- processes ---------------------------------------------------------------------------------

    def start_backends(self) -> None:
        w, exp = self.work, self.exporter
        log(f"{self.series} series: exporter and Prometheus")
        self.served = ThreadedExporter(exp).start()
        self.prom = RealPrometheus(
            [self.served.target], extra_config={"global": {"query_log_file": str(self.query_log)}}
        ).start()
        self.prom.wait_scrapes_sync(3, 120)
        objects = [make_node(n) for n in exp.nodes] + [
            make_pod(p.namespace, p.name, p.node, labels={"app": p.deployment}, containers=exp.containers)
            for p in exp.pods
        ]
        (w / "inventory.json").write_bytes(orjson.dumps({"items": objects}))
        kube = self.spawn(
            [sys.executable, str(BENCH / "fake_kube_apiserver.py"), str(w / "inventory.json"), str(w / "kubeconfig")],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        wait_for_line(kube, "ready", 120)
        (w / "client-ca.pem").write_bytes(self.ca.cert_pem.bytes())
        (w / "adapter.yaml").write_text(ADAPTER_CONFIG)

    def start_kcms(self) -> None:
        w = self.work
        self.port = free_port()
        cmd = [sys.executable, "-m", "kcms", "standalone",
               "--kubeconfig", str(w / "kubeconfig"),
               "--prometheus-url", self.prom.url, "--config", str(w / "adapter.yaml"),
               "--resource-metrics-source", "prometheus", "--metric-resolution", "10s",
               "--secure-port", str(self.port), "--bind-address", "127.0.0.1",
               "--cert-dir", str(w / "certs"), "--client-ca-file", str(w / "client-ca.pem"),
               "--authentication-skip-lookup", "-v", "0", *self.args.kcms_arg]  # fmt: skip
        log(f"{self.series} series: starting kcms standalone")
        self.t0 = time.monotonic()
        self.server = self.spawn(cmd, stdout=subprocess.DEVNULL, stderr=open(w / "kcms.log", "w"), cwd=REPO)
        self.proc = psutil.Process(self.server.pid)
        self.client = Client("127.0.0.1", self.port, self.cert_chain)

    def stop(self) -> None:
        super().stop()
        if hasattr(self, "prom"):
            self.prom.stop()
        if hasattr(self, "served"):
            self.served.stop()

    # ---- measurements --------------------------------------------------------------------------

    def wait_discovery(self) -> None:
        """Until discovery lists every app_bulk metric (the first relist is done)."""
        want = {f"pods/app_bulk_{m}" for m in range(self.exporter.bulk_metrics)} | {
            "pods/http_requests_total"
        }
        deadline = self.t0 + self.args.start_timeout
        while True:
            if self.server.poll() is not None:
                raise self.kcms_died()
            if time.monotonic() > deadline:
                raise SystemExit(f"discovery did not list all {len(want)} pod metrics in time")
            try:
                r = self.client.get(CUSTOM, timeout=30)
                if r.status == 200 and want <= {x["name"] for x in orjson.loads(r.body)["resources"]}:
                    self.r["discovery_resources"] = len(orjson.loads(r.body)["resources"])
                    break
            except OSError:
                self.client.close()
            time.sleep(0.2)
        self.r["t_discovery_s"] = time.monotonic() - self.t0
        self.r["rss_mb_after_discovery"] = tree_memory(self.proc)[0] / 1e6
        log(f"{self.series} series: discovery complete {self.r['t_discovery_s']:.1f} s after start")

    def timed(self, paths: list[str]) -> list[float]:
        out = []
        for path in paths:
            r = self.client.get(path, encoding="identity")
            if r.status != 200:
                raise SystemExit(f"GET {path}: HTTP {r.status}: {r.body[:300]!r}")
            out.append(r.seconds)
        return out

    def metrics(self) -> list[str]:
        return [f"app_bulk_{m}" for m in range(self.exporter.bulk_metrics)]

    def logged_queries(self, offset: int) -> tuple[list[dict], int]:
        """Query-log entries after byte ``offset`` and the new offset."""
        with open(self.query_log, "rb") as f:
            f.seek(offset)
            data = f.read()
        entries = [json.loads(line) for line in data.splitlines() if line.strip()]
        return [e for e in entries if e.get("params", {}).get("query")], offset + len(data)

    def direct(self, queries: list[str]) -> list[float]:
        """Each PromQL straight to Prometheus over one kept-alive connection."""
        host, port = "127.0.0.1", self.prom.port
        conn = http.client.HTTPConnection(host, port, timeout=60)
        out = []
        try:
            for q in queries:
                t0 = time.perf_counter()
                conn.request("GET", "/api/v1/query?" + urllib.parse.urlencode({"query": q}))
                resp = conn.getresponse()
                body = resp.read()
                out.append(time.perf_counter() - t0)
                if resp.status != 200:
                    raise SystemExit(f"Prometheus answered {resp.status} to {q!r}: {body[:300]!r}")
        finally:
            conn.close()
        return out

    def measure(self) -> None:
        n = self.args.requests
        self.timed([CUSTOM] * 20)  # warm the connection
        self.r["discovery"] = quantiles(self.timed([CUSTOM] * n))
        pods, metrics = self.exporter.pods, self.metrics()
        for kind, path_of in (
            ("named", lambda i: f"{CUSTOM}/namespaces/{NAMESPACE}/pods/{pods[i % len(pods)].name}/{metrics[i % len(metrics)]}"),
            ("wildcard", lambda i: f"{CUSTOM}/namespaces/{NAMESPACE}/pods/*/{metrics[i % len(metrics)]}"),
        ):  # fmt: skip
            self.timed([path_of(i) for i in range(10)])  # warm-up, not counted
            _, offset = self.logged_queries(0)
            kcms = self.timed([path_of(i) for i in range(n)])
            entries, _ = self.logged_queries(offset)
            queries = [e["params"]["query"] for e in entries]
            if len(queries) < n:
                raise SystemExit(f"{kind}: Prometheus logged {len(queries)} queries for {n} requests")
            exec_s = [
                e.get("stats", {}).get("timings", {}).get("execTotalTime", float("nan")) for e in entries
            ]
            direct = self.direct(queries[:n])
            fig = {
                "kcms": quantiles(kcms),
                "prometheus_http": quantiles(direct),
                "prometheus_exec": quantiles(exec_s),
            }
            fig["overhead_p50_ms"] = fig["kcms"]["p50_ms"] - fig["prometheus_http"]["p50_ms"]
            fig["overhead_p99_ms"] = fig["kcms"]["p99_ms"] - fig["prometheus_http"]["p99_ms"]
            fig["example_query"] = queries[0][:200]
            fig["queries_per_request"] = len(queries) / n
            self.r[kind] = fig
        rss, nproc = tree_memory(self.proc)
        self.r.update(rss_mb=rss / 1e6, processes=nproc)

    def run(self) -> dict:
        try:
            self.start_backends()
            self.start_kcms()
            self.wait_discovery()
            self.measure()
        finally:
            self.stop()
        return self.r


def raw_lines(r: dict) -> list[str]:
    s = r["series"]
    d = r["discovery"]
    lines = [
        f"{s} series ({r['pods']} pods, {r['discovery_resources']} discovery entries): "
        f"discovery complete {r['t_discovery_s']:.1f} s after start",
        f"  discovery GET {CUSTOM}: p50 {d['p50_ms']:.2f} ms, p99 {d['p99_ms']:.2f} ms (n={d['n']})"
        f"  -> p99 / target {TARGETS['discovery_p99_ms']:g} ms = {d['p99_ms'] / TARGETS['discovery_p99_ms']:.2f}",
    ]
    for kind in ("named", "wildcard"):
        f = r[kind]
        k, h, e = f["kcms"], f["prometheus_http"], f["prometheus_exec"]
        lines += [
            f"  {kind}: KCMS p50 {k['p50_ms']:.2f} ms, p99 {k['p99_ms']:.2f} ms; Prometheus direct p50 "
            f"{h['p50_ms']:.2f} ms, p99 {h['p99_ms']:.2f} ms (its execTotalTime p50 {e['p50_ms']:.2f} ms, "
            f"p99 {e['p99_ms']:.2f} ms); queries per request {f['queries_per_request']:.2f}",
            f"  {kind} overhead: p50 {f['overhead_p50_ms']:.2f} ms, p99 {f['overhead_p99_ms']:.2f} ms"
            f"  -> p99 / target {TARGETS['overhead_p99_ms']:g} ms = {f['overhead_p99_ms'] / TARGETS['overhead_p99_ms']:.2f}",
            f"    e.g. {f['example_query']}",
        ]
    lines.append(
        f"  RSS of KCMS: {r['rss_mb']:.1f} MB after the requests ({r['rss_mb_after_discovery']:.1f} MB after "
        f"discovery)  -> / target {TARGETS['rss_mb']:g} MB = {r['rss_mb'] / TARGETS['rss_mb']:.2f}"
    )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--series", default="1000,10000", help="series counts, comma-separated (default 1000,10000)"
    )
    ap.add_argument("--requests", type=int, default=300, help="requests per measured path (default 300)")
    ap.add_argument("--start-timeout", type=float, default=300.0, help="seconds until discovery is complete")
    ap.add_argument("--kcms-arg", action="append", default=[], metavar="ARG",
                    help="extra argument to `kcms standalone` (repeatable; --kcms-arg=--flag=value)")  # fmt: skip
    ap.add_argument("--json", metavar="FILE", help="also write every figure here")
    args = ap.parse_args()
    try:
        sizes = [int(x) for x in args.series.split(",") if x.strip()]
    except ValueError:
        ap.error(f"argument --series: not a comma-separated list of integers: {args.series!r}")
    if not sizes or min(sizes) < 1:
        ap.error("argument --series: every count must be at least 1")
    if args.requests < 1:
        ap.error("argument --requests: at least 1")
    ca = trustme.CA()
    load = os.getloadavg()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results = []
    for n in sizes:
        work = Path(tempfile.mkdtemp(prefix=f"kcms-prom-bench-{n}-"))
        r = Run(args, n, work, ca).run()
        results.append(r)
        print("\n".join(raw_lines(r)), flush=True)
    print(f"Measured {started} on {os.cpu_count()} cores, load average at start {load[0]:.2f}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"started": started, "load": load, "results": results}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
