"""CPU of one kubelet scrape's Python work, in process: decode -> store -> history.

    python bench/scrape_cpu.py [--nodes 50] [--cycles 40] [--history 600] [--profile FILE]

The simulator's own workload (kcms/sim: 30 pods x 2 containers per node, bodies exactly as
`kcms simulate` serves them, one timestamp per body) renders each node's ``/metrics/resource`` body
at 15 s steps; they are rendered first, then decoded with one DecodeReuse (as a KubeletClient does)
and stored in a ResourceStore with a HistoryStore (standalone's default ``--history 10m``), cycle
after cycle. Printed: microseconds of CPU (time.process_time) per scrape for decode, store (which
includes the history record) and both, best and median over --repeat passes. No HTTP/TLS here:
bench/fixed_costs.py --per-scrape measures that part. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import statistics
import time

from kcms.sim.kubelet import render_resource_metrics
from kcms.sim.workload import generate_nodes, node_addresses
from kcms.sources.kubelet_decode import DecodeReuse, decode_resource_metrics
from kcms.store.history import HistoryStore
from kcms.store.resource import ResourceStore


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--pods-per-node", type=int, default=30)
    ap.add_argument("--cycles", type=int, default=40, help="scrape cycles per pass (default 40)")
    ap.add_argument("--repeat", type=int, default=3, help="passes (default 3)")
    ap.add_argument("--history", type=float, default=600.0, help="history seconds, 0 off (default 600)")
    ap.add_argument("--profile", default="", help="write a cProfile of the last pass here")
    ap.add_argument("--no-templates", action="store_true", help="decode without body templates")
    args = ap.parse_args()
    try:  # body templates (kcms/sources/decode_template.py) as a KubeletClient uses them, where they exist
        from kcms.sources.decode_template import DEFAULT_TEMPLATES

        templates = not args.no_templates
    except ImportError:
        DEFAULT_TEMPLATES, templates = 0, False

    now = time.time()
    nodes = generate_nodes(
        nodes=args.nodes,
        pods_per_node=args.pods_per_node,
        containers_per_pod=(2, 2),
        seed=1,
        now=now - 3600,
        addresses=node_addresses("127.60.0.1", args.nodes),
        ports=[10250] * args.nodes,
        restart_every=None,
    )
    # the bodies of each cycle, rendered up front (the simulator's CPU is not ours)
    t0 = now - 15.0 * (args.cycles + 2)
    bodies = [
        [(n.name, render_resource_metrics(n, t0 + 15.0 * k)) for n in nodes] for k in range(args.cycles)
    ]
    scrapes = args.cycles * args.nodes
    results: dict[str, list[float]] = {"decode": [], "store": [], "total": []}
    for rep in range(args.repeat):
        reuse = DecodeReuse(max_templates=DEFAULT_TEMPLATES) if templates else DecodeReuse()
        store = ResourceStore(15.0)
        if args.history > 0:
            store.history = HistoryStore(args.history, 15.0)
        prof = cProfile.Profile() if args.profile and rep == args.repeat - 1 else None
        dec = sto = 0.0
        gc.collect()
        if prof is not None:
            prof.enable()
        for k, cycle in enumerate(bodies):
            reuse.new_cycle()
            c0 = time.process_time()
            batches = [decode_resource_metrics(name, body, now=now, reuse=reuse) for name, body in cycle]
            c1 = time.process_time()
            for b in batches:
                store.store(b)
            c2 = time.process_time()
            if k >= 2:  # the first two cycles fill the store and the reuse: not the steady state
                dec += c1 - c0
                sto += c2 - c1
            gc.freeze()  # as kcms.heap.HeapFreezer does after each cycle
        if prof is not None:
            prof.disable()
            prof.dump_stats(args.profile)
        n = scrapes - 2 * args.nodes
        results["decode"].append(dec / n * 1e6)
        results["store"].append(sto / n * 1e6)
        results["total"].append((dec + sto) / n * 1e6)
        gc.unfreeze()
    parts = "  ".join(f"{k} {min(v):.0f} (median {statistics.median(v):.0f})" for k, v in results.items())
    print(f"{args.nodes} nodes x {args.pods_per_node} pods x 2 containers, history {args.history:g} s: "
          f"us CPU per scrape: {parts}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
