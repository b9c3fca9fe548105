"""History on the store's hot path: what `--history` costs per scrape and in memory, in one process.

    python bench/history_store.py [--nodes 1000] [--pods-per-node 30] [--containers 2] [--cycles 12]
                                  [--history 600] [--resolution 15]

Builds the batches a scrape of N nodes yields (pods x containers each, counters growing every
cycle), then stores them cycle after cycle into a ``ResourceStore`` without and with a
``HistoryStore`` attached (kcms/store/history.py), alternating the two so that machine load hits
both alike. Prints, per cycle of all nodes: the median time of ``store()`` (and per node), the
history's share of it; and the memory the history holds per node once its rings are allocated
(tracemalloc, exact bytes of Python allocations, so independent of other processes), with the
number of objects the cyclic GC tracks for it. Not a test: asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kcms.model import NodeBatch, ResourcePoint  # noqa: E402
from kcms.store.history import HistoryStore  # noqa: E402
from kcms.store.resource import ResourceStore  # noqa: E402


def batches(nodes: int, pods: int, containers: int, cycle: int, resolution: float) -> list[NodeBatch]:
    t = 1_700_000_000.0 + cycle * resolution
    out = []
    for n in range(nodes):
        b = NodeBatch(f"node-{n:05d}", ResourcePoint(1.0, t, int(cycle * 7.5e9) + n, 8 << 30))
        for p in range(pods):
            b.pods[(f"ns-{p % 10}", f"pod-{n}-{p}")] = {
                f"c{c}": ResourcePoint(1.0, t, int(cycle * 1.2e9) + p + c, (200 + p) << 20)
                for c in range(containers)
            }
        out.append(b)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods-per-node", type=int, default=30)
    ap.add_argument("--containers", type=int, default=2)
    ap.add_argument("--cycles", type=int, default=12, help="timed cycles of each kind (default 12)")
    ap.add_argument("--history", type=float, default=600.0, help="seconds kept (default 600)")
    ap.add_argument("--resolution", type=float, default=15.0)
    a = ap.parse_args()

    plain = ResourceStore(a.resolution)
    kept = ResourceStore(a.resolution)
    kept.history = HistoryStore(a.history, a.resolution)
    # Two warm-up cycles (the first reading of each container gives no rate, the second does).
    times: dict[str, list[float]] = {"without": [], "with": []}
    for cycle in range(a.cycles + 2):
        work = batches(a.nodes, a.pods_per_node, a.containers, cycle, a.resolution)
        # the batches are consumed (screened) by store(): one copy each
        work2 = batches(a.nodes, a.pods_per_node, a.containers, cycle, a.resolution)
        order = [("without", plain, work), ("with", kept, work2)]
        if cycle % 2:
            order.reverse()
        for name, store, bs in order:
            gc.disable()
            t0 = time.perf_counter()
            for b in bs:
                store.store(b, received=float(cycle))
            elapsed = time.perf_counter() - t0
            gc.enable()
            if cycle >= 2:
                times[name].append(elapsed)
    w, wo = statistics.median(times["with"]), statistics.median(times["without"])
    print(
        f"store() of {a.nodes} nodes x {a.pods_per_node} pods x {a.containers} containers, median of {a.cycles} "
        f"cycles: without history {wo * 1e3:.1f} ms ({wo / a.nodes * 1e6:.1f} us/node), with "
        f"{w * 1e3:.1f} ms ({w / a.nodes * 1e6:.1f} us/node): +{(w - wo) / a.nodes * 1e6:.1f} us/node "
        f"(+{(w / wo - 1) * 100:.0f} %); ranges {min(times['without']) * 1e3:.1f}-{max(times['without']) * 1e3:.1f} / "
        f"{min(times['with']) * 1e3:.1f}-{max(times['with']) * 1e3:.1f} ms"
    )
    # history.record() alone, on the pairs the store holds now (min of rounds: the least disturbed by
    # other processes on the machine)
    history = kept.history
    assert history is not None
    entries = [(n, e) for n, e in kept._nodes.items()]
    rounds = []
    for k in range(a.cycles):
        gc.disable()
        t0 = time.perf_counter()
        for name, e in entries:
            assert e.last is not None
            last = ResourcePoint(
                e.last.start_time, e.last.timestamp + 1000.0 * (k + 1), e.last.cpu_ns, e.last.memory
            )
            history.record(name, last, e.prev, e.pods)
        rounds.append(time.perf_counter() - t0)
        gc.enable()
    best = min(rounds)
    containers = a.pods_per_node * a.containers
    print(
        f"history.record() alone: {best / a.nodes * 1e6:.1f} us per node ({best / a.nodes / containers * 1e9:.0f} ns per "
        f"container; min of {a.cycles} rounds, median {statistics.median(rounds) / a.nodes * 1e6:.1f} us) = "
        f"{best * 1e3:.1f} ms per cycle of {a.nodes} nodes"
    )
    del plain, kept, history
    gc.collect()

    # Memory: the same scrapes into a store without and one with history (both from nothing, under
    # tracemalloc); the difference is what the history holds. Its rings are allocated whole on a
    # pod's first scrape, so the figure after 2 cycles and after filling (and wrapping) every ring
    # should agree.
    cycles_full = HistoryStore(a.history, a.resolution).capacity + 2
    traced = {}
    for with_history in (False, True):
        gc.collect()
        tracemalloc.start()
        store = ResourceStore(a.resolution)
        if with_history:
            store.history = HistoryStore(a.history, a.resolution)
        for cycle in range(cycles_full):
            for b in batches(a.nodes, a.pods_per_node, a.containers, cycle, a.resolution):
                store.store(b, received=float(cycle))
            if cycle == 1:
                gc.collect()
                traced[with_history, 2] = tracemalloc.get_traced_memory()[0]
        gc.collect()
        traced[with_history, cycles_full] = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
    history = store.history
    assert history is not None
    gc.collect()
    gc.collect()
    ids = {id(x) for h in history._nodes.values() for x in (h.data, *h.pods.values())}
    tracked_pods = sum(1 for o in gc.get_objects() if id(o) in ids)
    nodes, pods, slots = history.stats()

    def per_node(cycles: int) -> float:
        return (traced[True, cycles] - traced[False, cycles]) / a.nodes / 1e6

    print(
        f"history memory ({a.history:g} s at {a.resolution:g} s: {history.capacity} slots per object): "
        f"{per_node(cycles_full):.4f} MB per node after {cycles_full} cycles (rings full and wrapped), "
        f"{per_node(2):.4f} MB per node after 2; the resource store alone "
        f"{traced[False, cycles_full] / a.nodes / 1e6:.4f} MB per node (traced); "
        f"{nodes} nodes, {pods} pods, {slots} slots held; pod records tracked by the GC: {tracked_pods}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
