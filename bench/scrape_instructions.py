"""Instructions of one kubelet scrape, counted by valgrind: a figure the machine's speed and load
do not move.

    python bench/scrape_instructions.py [--nodes 50] [--rounds 3,13] [--top 25]

Timed figures of a scrape (bench/fixed_costs.py --per-scrape, bench/scrape_cpu.py) move by 10-30 %
from one run to the next on these shared machines, more than most single changes save.
``valgrind --tool=callgrind`` counts the instructions a process executes instead: the same code,
inputs and environment give nearly the same count whatever else the machine is doing (two runs
of 13 rounds differed by 0.001 % on 1 Dec's afternoon machine, 1.3 % on its evening one, the C
code's part equal: compare changes larger than that). This runs ``bench/fixed_costs.py
--per-scrape`` under callgrind twice, with the two numbers of rounds given (each round scrapes every simulated kubelet once,
over real TLS on loopback, decodes and stores as `kcms standalone` does), and prints the
difference divided by the extra scrapes: start-up, connections and warm-up cancel out. Then the
functions that account for it (self instructions), by library.

What it does not count: time in the kernel (the socket calls), and what an instruction costs (a
cache miss, a branch mispredicted, the CPU's clock). ``rep movsb`` (glibc's memcpy of a long run)
counts one instruction a byte, so copies weigh more here than in time. A function callgrind
finds no symbol for is listed by address, and the library it names for it can change from run to
run (libcrypto's code, say, under the ``cryptography`` wheel's copy): compare totals. Compare two trees with
``PYTHONPATH=/path/to/tree``. Needs valgrind (Debian's package ``valgrind``). Not a test: it
asserts nothing. About a minute a run at 50 nodes.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

_LINE = re.compile(r"^\s*([0-9,]+) \([^)]*\)\s+(.*)$")


def run(rounds: int, nodes: int, work: Path) -> tuple[int, dict[str, int]]:
    """Total instructions of one run, and each function's own (``file:function [library]``)."""
    out = work / f"callgrind.{rounds}"
    bench = Path(__file__).with_name("fixed_costs.py")
    subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, str(bench),
         "--per-scrape", "--nodes", str(nodes), "--rounds", str(rounds)],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    text = subprocess.run(
        ["callgrind_annotate", "--auto=no", "--threshold=100", str(out)], check=True, capture_output=True, text=True
    ).stdout
    total, functions = 0, {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        count, name = int(m.group(1).replace(",", "")), m.group(2).strip()
        if "PROGRAM TOTALS" in name:
            total = count
        else:
            functions[name] = functions.get(name, 0) + count
    if not total:
        raise SystemExit(f"no totals in callgrind_annotate's output for {out}")
    return total, functions


def library(name: str) -> str:
    m = re.search(r"\[([^\]]*)\]\s*$", name)
    return m.group(1).rsplit("/", 1)[-1] if m else "(library not named)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--rounds", default="3,13", help="the two runs' rounds, fewer first (default 3,13)")
    ap.add_argument("--top", type=int, default=25, help="functions listed (default 25)")
    args = ap.parse_args()
    low, high = (int(x) for x in args.rounds.split(","))
    if not 0 < low < high:
        ap.error("argument --rounds: two numbers, the first smaller, e.g. 3,13")
    import kcms

    print(f"kcms from {Path(kcms.__file__).parent}; {args.nodes} nodes, rounds {low} and {high}")
    with tempfile.TemporaryDirectory(prefix="kcms-instr-") as tmp:
        work = Path(tmp)
        total_low, f_low = run(low, args.nodes, work)
        total_high, f_high = run(high, args.nodes, work)
    scrapes = (high - low) * args.nodes
    per_scrape = (total_high - total_low) / scrapes
    print(f"{per_scrape:,.0f} instructions a scrape ({total_low:,} and {total_high:,} in all)")
    delta = {k: (f_high.get(k, 0) - f_low.get(k, 0)) / scrapes for k in f_low.keys() | f_high.keys()}
    libraries: dict[str, float] = {}
    for name, n in delta.items():
        libraries[library(name)] = libraries.get(library(name), 0.0) + n
    print("by library: " + ", ".join(f"{lib} {n:,.0f}" for lib, n in sorted(libraries.items(), key=lambda x: -x[1])[:8]))
    for name, n in sorted(delta.items(), key=lambda x: -x[1])[: args.top]:
        short = re.sub(r"^.*?/Python-3[^/]*/", "", re.sub(r"\s*\[[^\]]*\]\s*$", "", name))
        print(f"{n:10,.0f}  {short[:100]}  [{library(name)}]")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")  # the same hash key in every run (the sim's too)
    sys.exit(main())
