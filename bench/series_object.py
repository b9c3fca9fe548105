"""Cost per series when one object has many labelled series: must stay flat from 1 000 to 100 000.

    python bench/series_object.py                       # 1 000, 10 000 and 100 000 series, 3 runs
    python bench/series_object.py --sizes 1000,80000 --repeat 5
    python bench/series_object.py --quick               # smoke run (1 000 and 10 000, 1 run)

Every series is about the same object (``pods/default/web-0``), of one metric, with labels
``path=/p/<i>`` and ``code=200``: the shape of one push of many labelled series for one object,
which used to be quadratic (80 000 series took 15 s through the push endpoint). Operations, each
on a fresh ``SeriesStore`` in this process, one core, no HTTP and no codec:

  append       : SeriesStore.append_many of n new series (one point each);
  append_block : SeriesStore.append_block of the same n series (what the store service receives);
  update       : one more point to each of the n existing series (append_many);
  push         : PushAPI.ingest of n new series (the /push/v1/samples checks, cardinality index and
                 store append, without HTTP and JSON), limits raised to n;
  query        : SeriesStore.query of the object by name (n results);
  query *      : SeriesStore.query of every object of the namespace (n results);
  provider     : StoreProvider.get_metrics of the object (the custom metrics read path's store side);
  gc half      : collect_garbage (budget 10 000 a call) when every other series has expired
                 (removals from the middle of the object's series);
  gc all       : collect_garbage until every series has expired and is removed.

Figures are microseconds per series (the median of --repeat runs), then the ratio of the largest
size to the smallest per operation: ~1 means linear, a ratio near the size ratio means quadratic.
Prints figures and ratios; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import statistics
import time
from collections.abc import Callable

from kcms.apis.provider import EVERYTHING, StoreProvider
from kcms.apis.push import PushAPI, PushLimits, PushSample
from kcms.model import Labels, ObjectRef
from kcms.store.series import SeriesStore

METRIC = "http_requests_total"
OBJ = ObjectRef("pods", "default", "web-0")
OPS = ("append", "append_block", "update", "push", "query", "query *", "provider", "gc half", "gc all")


def labels_of(n: int) -> list[Labels]:
    return [(("code", "200"), ("path", f"/p/{i}")) for i in range(n)]


def filled(labels: list[Labels], t0: float) -> SeriesStore:
    store = SeriesStore(retention=600, stale_after=300)
    store.append_many((METRIC, OBJ, lb, t0, 1.0) for lb in labels)
    return store


def timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn`` took (the cyclic collector off: its pauses depend on the whole heap, not on us)."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    finally:
        gc.enable()


def run_once(n: int) -> dict[str, float]:
    """Seconds per series of every operation for ``n`` series on one object."""
    t0 = time.time() - 10
    labels = labels_of(n)
    out: dict[str, float] = {}

    store = SeriesStore(retention=600, stale_after=300)
    samples = [(METRIC, OBJ, lb, t0, 1.0) for lb in labels]
    out["append"] = timed(lambda: store.append_many(samples))
    assert store.stats()["series"] == n
    again = [(METRIC, OBJ, lb, t0 + 1, 2.0) for lb in labels]
    out["update"] = timed(lambda: store.append_many(again))

    block_store = SeriesStore(retention=600, stale_after=300)
    strings = [METRIC, OBJ.resource, OBJ.namespace, OBJ.name]
    rows = [(0, 1, 2, 3, i, t0, 1.0) for i in range(n)]
    out["append_block"] = timed(lambda: block_store.append_block(strings, labels, rows))
    assert block_store.stats()["series"] == n

    push_store = SeriesStore(retention=600, stale_after=300)
    limits = PushLimits()
    for f in dataclasses.fields(limits):  # every series cap (per metric, per writer, total) raised to n
        if f.name.startswith("max_series"):
            setattr(limits, f.name, n)
    push = PushAPI(push_store, limits)
    pushed = [PushSample(METRIC, OBJ.resource, OBJ.namespace, OBJ.name, dict(lb), 1.0, t0) for lb in labels]
    summary = None

    def ingest() -> None:
        nonlocal summary
        summary = push.ingest(pushed, now=t0 + 1)

    out["push"] = timed(ingest)
    assert summary is not None and summary.accepted == n, summary and summary.rejected

    now = t0 + 2
    found: list = []
    out["query"] = timed(lambda: found.append(store.query("pods", "default", ["web-0"], METRIC, now=now)))
    out["query *"] = timed(lambda: found.append(store.query("pods", "default", None, METRIC, now=now)))
    provider = StoreProvider(store, lambda _r: True)
    out["provider"] = timed(
        lambda: found.append(
            asyncio.run(provider.get_metrics("pods", "default", ["web-0"], METRIC, EVERYTHING))
        )
    )
    assert all(len(f) == n for f in found), [len(f) for f in found]

    # every other series stops at t0, the others get a point 400 s later: at t0 + 700 half expire
    half = filled(labels, t0)
    half.append_many((METRIC, OBJ, lb, t0 + 400, 1.0) for lb in labels[1::2])

    def collect(s: SeriesStore, at: float, keep: int) -> None:
        while s.stats()["series"] > keep:
            s.collect_garbage(now=at, budget=10_000)

    out["gc half"] = timed(lambda: collect(half, t0 + 700, n // 2))
    assert half.stats()["series"] == n // 2
    full = filled(labels, t0)
    out["gc all"] = timed(lambda: collect(full, t0 + 1000, 0))
    assert full.stats() == {"series": 0, "points": 0, "metrics": 0}
    # "gc half" removes n / 2 series, the others n
    return {op: secs / (n // 2 if op == "gc half" else n) for op, secs in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,100000", help="series on the object, comma-separated")
    ap.add_argument("--repeat", type=int, default=3, help="runs per size (median)")
    ap.add_argument("--quick", action="store_true", help="1 000 and 10 000 series, one run")
    args = ap.parse_args()
    sizes = [1000, 10_000] if args.quick else [int(s) for s in args.sizes.split(",")]
    repeat = 1 if args.quick else max(1, args.repeat)
    if len(sizes) < 2 or min(sizes) < 2:
        ap.error("argument --sizes: at least two sizes, each at least 2")

    print(f"µs per series, {len(OPS)} operations on one object, median of {repeat} run(s)")
    print(f"{'series':>8} " + " ".join(f"{op:>12}" for op in OPS))
    figures: dict[int, dict[str, float]] = {}
    for n in sizes:
        runs = [run_once(n) for _ in range(repeat)]
        figures[n] = {op: statistics.median(r[op] for r in runs) for op in OPS}
        print(f"{n:>8} " + " ".join(f"{figures[n][op] * 1e6:>12.3f}" for op in OPS), flush=True)
    lo, hi = min(sizes), max(sizes)
    print(f"ratio {hi}/{lo} (1 = flat; {hi // lo} = quadratic)")
    for op in OPS:
        print(f"  {op:<12} {figures[hi][op] / figures[lo][op]:6.2f}")


if __name__ == "__main__":
    main()
