"""What the cyclic garbage collector pays for node blocks that are still young.

    python bench/gc_blocks.py [--nodes 5000] [--pods-per-node 30] [--repeat 5]

Node blocks (kcms/apis/metrics/blocks.py) are rendered ahead during a scrape cycle and live for a
resolution; until the cycle's heap freeze (kcms/heap.py) every young collection meets them. This
makes a frozen inventory of ``nodes x pods-per-node`` PodInfos and their keys, then a block a node
(a tuple of its pods' keys, a tuple of their PodInfos, its text), and times one gen-0 collection
over those blocks and one gen-1 collection over twice as many, with the blocks untracked
(``_gzsplice.acyclic``, what blocks.py does where the C module is built) and tracked (what it
does without it; the lists the blocks held before 8e45ac3 cost the same). Prints ms per pass and
the ratio. Not a test: it asserts nothing.

Measured (29 Nov 01:02, 5000 x 30, --repeat 3): tracked, gen 0 9.4-9.8 ms and gen 1 16.0-16.4 ms;
untracked, 0.06-0.07 and 0.11-0.13 ms (145x less). A first probe with the blocks' lists of before
8e45ac3 (00:00, five runs): 8.8-12.1 and 18.9-24.8 ms.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kcms.apis.metrics import blocks, gzblocks  # noqa: E402
from kcms.model import PodInfo  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--pods-per-node", type=int, default=30)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    per = args.pods_per_node
    try:
        from kcms.apis.metrics._gzsplice import acyclic
    except ImportError:
        raise SystemExit(
            "kcms.apis.metrics._gzsplice is not built: python setup.py build_ext --inplace"
        ) from None
    pods = [
        PodInfo(f"ns{i % 50}", f"pod-{i}", {"app": "web", "tier": f"t{i % 7}"}, f"n{i // per}", "Running", "")
        for i in range(args.nodes * per)
    ]
    keys = [(pod.namespace, pod.name) for pod in pods]
    gc.collect()
    gc.freeze()  # the inventory is old by the time blocks are rendered, as after a cycle's freeze

    def render() -> list[blocks._NodeBlock]:
        return [
            blocks._NodeBlock(
                {}, tuple(keys[n * per : (n + 1) * per]), tuple(pods[n * per : (n + 1) * per]), b"x"
            )
            for n in range(args.nodes)
        ]

    results: dict[str, tuple[list[float], list[float]]] = {"untracked": ([], []), "tracked": ([], [])}
    gc.disable()
    try:
        for _ in range(args.repeat):
            for mode, untrack in (("tracked", lambda obj: obj), ("untracked", acyclic)):
                gzblocks.acyclic = untrack
                gc.collect()
                first = render()
                started = time.perf_counter()
                gc.collect(0)
                results[mode][0].append(1e3 * (time.perf_counter() - started))
                second = render()  # gen 1 now holds ``first``; gen 0 ``second``
                started = time.perf_counter()
                gc.collect(1)
                results[mode][1].append(1e3 * (time.perf_counter() - started))
                del first, second
    finally:
        gzblocks.acyclic = acyclic
        gc.enable()
    print(f"{args.nodes} nodes x {per} pods, {args.repeat} runs, ms per pass (median, range):")
    for mode, (gen0, gen1) in results.items():
        print(
            f"  {mode:9s} gen 0 over {args.nodes} young blocks {statistics.median(gen0):7.2f} "
            f"({min(gen0):.2f}-{max(gen0):.2f}); gen 1 over {2 * args.nodes} {statistics.median(gen1):7.2f} "
            f"({min(gen1):.2f}-{max(gen1):.2f})"
        )
    ratio0 = statistics.median(results["tracked"][0]) / max(statistics.median(results["untracked"][0]), 1e-6)
    ratio1 = statistics.median(results["tracked"][1]) / max(statistics.median(results["untracked"][1]), 1e-6)
    print(f"  tracked / untracked: gen 0 {ratio0:.0f}x, gen 1 {ratio1:.0f}x")


if __name__ == "__main__":
    main()
