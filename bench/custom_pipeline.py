"""Series store benchmark: ingestion rate, query latency while ingesting, RSS per stored point.

    python bench/custom_pipeline.py                  # 1 M series: 100 metrics x 10 000 pods
    python bench/custom_pipeline.py --series 100000  # scaled down: 10 metrics x 10 000 pods

Everything runs in this one process on one core, the way the store runs inside `kcms standalone`:
writes and reads share one thread, so "while ingesting" means queries interleaved with ingest
batches. Each metric has one series per pod (10 000 pods in 10 namespaces of 1 000); a quarter of
the metrics are counters (``*_total``). One round writes one point to every series, 15 s of
simulated time apart, batch by batch (one batch = one metric for every pod, the shape of a push
of one metric from every pod or of one scrape fan-in).

Phases:
  1. create: the first round, which creates every series;
  2. fill: --rounds more rounds with the key objects the store already holds (pure append path);
  3. decoded keys: two rounds whose samples carry fresh ObjectRef and str objects, as samples
     decoded from a push request do (equal but not identical keys);
  4. queries while ingesting: rounds again, and after every batch: named-object queries (one pod,
     latest / rate / p99 over 5 min) and 1000-pod wildcard queries (a whole namespace, latest /
     rate / avg over 5 min), plus one incremental GC call (budget 10 000).
Then RSS (psutil) growth since before the store was filled, per stored point.

Targets from the issue: >= 500 000 samples/s on one core; named query p99 < 2 ms; 1000-pod
wildcard p99 < 50 ms; < 300 bytes of RSS per stored point. Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

import psutil

from kcms.model import ObjectRef
from kcms.store.series import SeriesStore

PODS_PER_NAMESPACE = 1000
INTERVAL = 15.0
T0 = 1_700_000_000.0


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def fresh(text: str) -> str:
    """An equal string that is a different object (as decoding a request would produce)."""
    return (text + ".")[:-1]


class Workload:
    def __init__(self, series: int, per_metric: int) -> None:
        self.per_metric = per_metric
        n_metrics = max(1, series // per_metric)
        self.metrics = [
            f"app_requests_{i}_total" if i % 4 == 0 else f"app_gauge_{i}" for i in range(n_metrics)
        ]
        self.namespaces = [f"ns-{i}" for i in range(max(1, per_metric // PODS_PER_NAMESPACE))]
        self.pods = [
            ObjectRef("pods", self.namespaces[i % len(self.namespaces)], f"pod-{i}")
            for i in range(per_metric)
        ]
        self.rng = random.Random(1)

    def batch(self, metric: str, r: int, decoded: bool = False) -> list:
        ts = T0 + INTERVAL * r
        if metric.endswith("_total"):
            vals = [float(r * (i % 97 + 1)) for i in range(len(self.pods))]
        else:
            rnd = self.rng.random
            vals = [rnd() * 100.0 for _ in self.pods]
        if decoded:
            return [
                (fresh(metric), ObjectRef("pods", fresh(o.namespace), fresh(o.name)), (), ts, v)
                for o, v in zip(self.pods, vals, strict=True)
            ]
        return [(metric, o, (), ts, v) for o, v in zip(self.pods, vals, strict=True)]


def ingest_round(store: SeriesStore, w: Workload, r: int, decoded: bool = False) -> tuple[int, float]:
    accepted = 0
    spent = 0.0
    for metric in w.metrics:
        b = w.batch(metric, r, decoded)
        t = time.perf_counter()
        accepted += store.append_many(b)
        spent += time.perf_counter() - t
    return accepted, spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--series", type=int, default=1_000_000, help="series in the store (default 1 M)")
    ap.add_argument("--per-metric", type=int, default=10_000, help="series (pods) per metric")
    ap.add_argument("--rounds", type=int, default=30, help="fill rounds after the first (points per series)")
    ap.add_argument(
        "--query-rounds", type=int, default=3, help="rounds of ingestion interleaved with queries"
    )
    ap.add_argument("--named-per-batch", type=int, default=20, help="named queries after each batch")
    args = ap.parse_args()

    proc = psutil.Process()
    w = Workload(args.series, args.per_metric)
    store = SeriesStore()  # defaults: retention 600 s, stale 300 s, max 720 points, window 60 s
    gc.collect()
    rss0 = proc.memory_info().rss
    n_series = len(w.metrics) * len(w.pods)
    print(
        f"workload: {len(w.metrics)} metrics x {len(w.pods)} pods = {n_series:,} series; "
        f"{len(w.namespaces)} namespaces of <= {PODS_PER_NAMESPACE} pods; batches of {len(w.pods):,} samples"
    )

    r = 0
    n, dt = ingest_round(store, w, r)
    print(f"create   : {n:,} samples in {dt:.2f} s = {n / dt:,.0f} samples/s (first point of every series)")

    total_n, total_dt = 0, 0.0
    for _ in range(args.rounds):
        r += 1
        n, dt = ingest_round(store, w, r)
        total_n += n
        total_dt += dt
    if total_n:
        print(
            f"append   : {total_n:,} samples in {total_dt:.2f} s = {total_n / total_dt:,.0f} samples/s "
            f"({args.rounds} rounds, keys identical to the stored ones)"
        )

    total_n, total_dt = 0, 0.0
    for _ in range(2):
        r += 1
        n, dt = ingest_round(store, w, r, decoded=True)
        total_n += n
        total_dt += dt
    print(
        f"append   : {total_n:,} samples in {total_dt:.2f} s = {total_n / total_dt:,.0f} samples/s "
        "(2 rounds, freshly decoded keys: new ObjectRef and str objects)"
    )

    # ---------------------------------------------------------------- queries while ingesting
    rng = random.Random(2)
    named: dict[str, list[float]] = {"latest": [], "rate": [], "agg_p99_5m": []}
    wild: dict[str, list[float]] = {"latest": [], "rate": [], "agg_avg_5m": []}
    wild_sizes: list[int] = []
    gc_ms: list[float] = []
    gauges = [m for m in w.metrics if not m.endswith("_total")] or w.metrics
    counters = [m for m in w.metrics if m.endswith("_total")] or w.metrics
    ingest_n, ingest_dt = 0, 0.0
    missing = 0  # named queries that did not find their one series (should stay 0)
    for _ in range(args.query_rounds):
        r += 1
        now = T0 + INTERVAL * r
        for metric in w.metrics:
            b = w.batch(metric, r)
            t = time.perf_counter()
            ingest_n += store.append_many(b)
            ingest_dt += time.perf_counter() - t
            for _ in range(args.named_per_batch):
                o = w.pods[rng.randrange(len(w.pods))]
                for kind, name in (
                    ("latest", rng.choice(gauges)),
                    ("rate", rng.choice(counters)[: -len("_total")] + "_per_second"),
                    ("agg_p99_5m", rng.choice(gauges) + "_agg_p99_5m"),
                ):
                    t = time.perf_counter()
                    res = store.query("pods", o.namespace, [o.name], name, now=now)
                    named[kind].append(time.perf_counter() - t)
                    missing += len(res) != 1
            ns = rng.choice(w.namespaces)
            for kind, name in (
                ("latest", rng.choice(gauges)),
                ("rate", rng.choice(counters)[: -len("_total")] + "_per_second"),
                ("agg_avg_5m", rng.choice(gauges) + "_agg_avg_5m"),
            ):
                t = time.perf_counter()
                res = store.query("pods", ns, None, name, now=now)
                wild[kind].append(time.perf_counter() - t)
                wild_sizes.append(len(res))
            t = time.perf_counter()
            store.collect_garbage(now=now, budget=10_000)
            gc_ms.append((time.perf_counter() - t) * 1e3)

    print(
        f"append   : {ingest_n / ingest_dt:,.0f} samples/s while serving queries "
        f"({args.query_rounds} rounds, ingestion time only)"
    )
    if missing:
        print(f"WARNING  : {missing} named queries found no series")
    for kind, lat in named.items():
        print(
            f"named    : {kind:<11} n={len(lat):<6} p50 {pct(lat, 50) * 1e3:.3f} ms  "
            f"p99 {pct(lat, 99) * 1e3:.3f} ms  max {max(lat) * 1e3:.3f} ms"
        )
    for kind, lat in wild.items():
        print(
            f"wildcard : {kind:<11} n={len(lat):<6} p50 {pct(lat, 50) * 1e3:.2f} ms  "
            f"p99 {pct(lat, 99) * 1e3:.2f} ms  max {max(lat) * 1e3:.2f} ms  "
            f"({statistics.mean(wild_sizes):.0f} objects per answer)"
        )
    print(
        f"gc       : budget 10 000 series, p50 {pct(gc_ms, 50):.2f} ms  p99 {pct(gc_ms, 99):.2f} ms per call"
    )

    gc.collect()
    rss = proc.memory_info().rss
    st = store.stats()
    print(
        f"memory   : {st['series']:,} series, {st['points']:,} points "
        f"({st['points'] / st['series']:.0f} per series), RSS +{(rss - rss0) / 2**20:,.0f} MiB = "
        f"{(rss - rss0) / st['points']:.1f} bytes per stored point "
        f"({(rss - rss0) / st['series']:.0f} bytes per series)"
    )


if __name__ == "__main__":
    main()
