"""KCMS's CPU against metrics-server's, with the code issue 9 was filed against run on the same
machine minutes apart instead of a timed loop in between.

    python bench/cpu_paired.py --kcms-root TREE --issue-root ISSUE_TREE [--nodes 50] [--pairs 2]

``bench/resource_pipeline.py`` has no metrics-server to run: it takes metrics-server's CPU as
KCMS's CPU at the issue (commit 75468bb, measured on 26 Nov) divided by the issue's ratio, scaled
by how long this machine takes for a fixed Python loop. On these shared machines that timing moves
more than the CPU it scales: 51.8 and 69.4 ms just before and after one 50-node window on 1 Dec,
while four 50-node runs of two trees, alternated, spent 15.75 / 15.45 and 14.53 / 14.15 ms of CPU
a cycle. This runs ``bench/resource_pipeline.py`` (CPU and RSS only: ``--requests 3 --pod-requests
1 --load-clients 0``) alternately with the issue's code (``ISSUE_TREE``: ``git archive 75468bb kcms
| tar -x -C ISSUE_TREE``) and the code measured (``TREE``, a directory holding a ``kcms`` package,
built), and takes metrics-server's CPU as the issue code's CPU in the run just before, divided by
the issue's ratio at that size (3.0 at 50 nodes). It prints each pair, the loop-scaled ratio of
the same run for comparison, the ratio with each run's CPU taken against the simulator's in the
same cycles (the simulator is the same code in both runs, so this takes out the machine's speed
between them), and the pairs' range. Not a test: it asserts nothing. About 8 minutes
a pair at 50 nodes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import resource_report

HERE = Path(__file__).resolve().parent


def run(root: str, nodes: int, cycles: int, out: Path, extra: list[str]) -> dict:
    """One ``resource_pipeline.py`` run of the kcms package in ``root``: its result at ``nodes``."""
    cmd = [sys.executable, str(HERE / "resource_pipeline.py"), "--nodes", str(nodes), "--cycles", str(cycles),
           "--requests", "3", "--pod-requests", "1", "--load-clients", "0", "--kcms-root", root,
           "--json", str(out), *extra]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"resource_pipeline.py failed for {root}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return json.loads(out.read_text())["results"][0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kcms-root", required=True, help="the tree whose kcms package is measured")
    ap.add_argument("--issue-root", required=True, help="a tree of commit 75468bb's kcms package")
    ap.add_argument("--nodes", type=int, default=50, help="cluster size (default 50)")
    ap.add_argument("--issue-ratio", type=float,
                    help="KCMS's CPU / metrics-server's at the issue (default the issue's at --nodes: 50, 1000, 5000)")  # fmt: skip
    ap.add_argument("--pairs", type=int, default=2, help="issue / measured runs, alternated (default 2)")
    ap.add_argument("--cycles", type=int, default=8, help="quiet cycles a run (default 8)")
    ap.add_argument("--pipeline-arg", action="append", default=[], help="passed on to resource_pipeline.py")
    ap.add_argument("--json", metavar="FILE", help="also write every pair here")
    args = ap.parse_args()
    issue_ratio = args.issue_ratio or resource_report.ISSUE_RATIOS.get(args.nodes, {}).get("cpu_mc_per_node")
    if not issue_ratio:
        ap.error(f"argument --issue-ratio: the issue has no ratio at {args.nodes} nodes; give one")
    pairs = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.pairs):
            issue = run(args.issue_root, args.nodes, args.cycles, Path(tmp) / f"issue{k}.json", args.pipeline_arg)
            now = run(args.kcms_root, args.nodes, args.cycles, Path(tmp) / f"now{k}.json", args.pipeline_arg)
            ms = issue["cpu_mc_per_node"] / issue_ratio  # metrics-server's, from the run just before
            loop_ref = resource_report.reference(args.nodes, "cpu_mc_per_node", now["machine_loop_s"])
            pair = {
                "issue_cpu_mc_per_node": issue["cpu_mc_per_node"],
                "issue_cycle_cpu_s": issue["cycle_cpu_s"],
                "cpu_mc_per_node": now["cpu_mc_per_node"],
                "cycle_cpu_s": now["cycle_cpu_s"],
                "metrics_server_cpu_mc_per_node": ms,
                "ratio": now["cpu_mc_per_node"] / ms,
                "ratio_loop_scaled": now["cpu_mc_per_node"] / loop_ref,
            }
            # Each run's CPU against the simulator's in the same cycles (the same code serving the
            # same bodies in both runs): the machine's speed between the two runs taken out.
            if issue.get("cpu_per_simulator_cpu") and now.get("cpu_per_simulator_cpu"):
                pair["ratio_simulator_scaled"] = issue_ratio * now["cpu_per_simulator_cpu"] / issue["cpu_per_simulator_cpu"]
            pairs.append(pair)
            print(
                f"pair {k + 1}: the issue's code {issue['cpu_mc_per_node']:.4f} mcore a node "
                f"({issue['cycle_cpu_s'] * 1e3:.2f} ms a cycle), measured {now['cpu_mc_per_node']:.4f} "
                f"({now['cycle_cpu_s'] * 1e3:.2f} ms): {pair['ratio']:.2f}x metrics-server's (the issue's "
                f"/ {issue_ratio:g}); scaled by the loop instead, {pair['ratio_loop_scaled']:.2f}x"
                + (f"; each against the simulator's CPU, {pair['ratio_simulator_scaled']:.2f}x"
                   if "ratio_simulator_scaled" in pair else ""),
                flush=True,
            )
    ratios = [p["ratio"] for p in pairs]
    print(f"{args.nodes} nodes, CPU a node against metrics-server's, paired with the issue's code: "
          f"{min(ratios):.2f}-{max(ratios):.2f}x over {len(ratios)} pairs")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"nodes": args.nodes, "pairs": pairs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
