"""The benchmarks still run (figures are theirs to print; nothing here is timed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_scaleout_quick_run_stores_every_acknowledged_sample() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "scaleout.py"), "--quick"],
        capture_output=True, text=True, timeout=300, cwd=REPO, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    for mode in ("standalone", "multi-store", "sharded"):
        assert any(ln.startswith(f"  {mode}: stores stored") for ln in lines), mode
    # one store, one copy: what it holds is exactly what it acknowledged
    line = next(ln for ln in lines if ln.startswith("  standalone: stores stored"))
    assert "= 1.000 x acknowledged" in line, line
    assert "sharded 4 stores vs 1 store: ingestion" in out.stdout


def test_series_object_quick_run_prints_every_operation_and_ratio() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "series_object.py"), "--quick"],
        capture_output=True, text=True, timeout=300, cwd=REPO, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert any(ln.split()[:1] == ["1000"] for ln in lines) and any(ln.split()[:1] == ["10000"] for ln in lines)
    assert "ratio 10000/1000" in out.stdout
    for op in ("append", "append_block", "update", "push", "query", "query *", "provider", "gc half", "gc all"):
        assert any(ln.strip().startswith(op + " ") for ln in lines if ln.startswith("  ")), op
