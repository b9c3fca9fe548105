"""The benchmarks still run (figures are theirs to print; nothing here is timed)."""

from __future__ import annotations

import gzip
import json
import math
import statistics
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

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


def test_gc_blocks_prints_both_modes_and_their_ratio() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gc_blocks.py"), "--nodes", "200", "--repeat", "1"],
        capture_output=True, text=True, timeout=300, cwd=REPO, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    for mode in ("tracked", "untracked"):
        assert any(ln.split()[:2] == [mode, "gen"] and "gen 1 over 400" in ln for ln in lines), (mode, lines)
    assert any(ln.strip().startswith("tracked / untracked: gen 0") for ln in lines), lines


def _resource_pipeline(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "bench" / "resource_pipeline.py"), "--pods-per-node", "4",
         "--resolution", "10", "--cycles", "1", "--load-cycles", "1", "--requests", "2", "--pod-requests", "2",
         "--address-base", "127.62.0.1", *extra],
        capture_output=True, text=True, timeout=400, cwd=tmp_path, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_resource_pipeline_runs_each_size_and_prints_every_figure_of_issue_9(tmp_path: Path) -> None:
    out = _resource_pipeline(tmp_path, "--nodes", "2,3", "--settle-cycles", "3", "--by-cycle-min-seconds", "0", "--json", str(tmp_path / "r.json"))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    # one Markdown column per size, every row filled for each
    table = [ln for ln in out.stdout.splitlines() if ln.startswith("| ")]
    # history is on by default, and the report says so per column (docs/history.md)
    assert table[0] == "| | 2 nodes, history | 3 nodes, history |", table[:2]
    labels = [ln.split(" | ")[0].removeprefix("| ") for ln in table[1:]]
    for row in ("CPU per node", "RSS per node", "time until 95 % of nodes", "time until 95 % of pods",
                "list all nodes (Accept-Encoding gzip)", "list all pods (Accept-Encoding identity)",
                "list all pods / socket-write floor (gzip)", "list all pods / socket-write floor (identity)",
                "list all pods / socket-write floor, each list paired with a floor transfer (gzip)",
                "one namespace by label, the HPA's query (gzip)", "pods served at the end",
                "while 2 clients list all pods: failed scrapes", "history of one pod (gzip)",
                "history of one namespace (gzip)", "history of all nodes (gzip)"):  # fmt: skip
        assert any(label.startswith(row) for label in labels), (row, labels)
    for ln in table[2:]:
        cells = ln.strip("|").split(" | ")
        assert len(cells) == 3 and all(c.strip() and c.strip() != "-" for c in cells[1:]), ln
    assert "reference 2 nodes: none" in out.stdout

    results = json.loads((tmp_path / "r.json").read_text())["results"]
    assert [r["nodes"] for r in results] == [2, 3]
    for r in results:
        pods = r["nodes"] * 4
        assert r["pods"] == pods
        # every node and pod of the inventory is served, in both encodings, and after the load phase
        for enc in ("gzip", "identity"):
            assert r["lists"][enc]["nodes"]["items"] == r["nodes"], r["lists"][enc]
            assert r["lists"][enc]["pods"]["items"] == pods, r["lists"][enc]
            assert 0 <= r["lists"][enc]["hpa"]["items"] <= pods
            # the floor server sent exactly the bytes KCMS sent for all pods
            assert r["floor"][enc]["wire_bytes"] == r["lists"][enc]["pods"]["wire_bytes"] > 0
            assert r["floor"][enc]["tls"][0] == r["tls"][0]
            # each time to the last byte is part of its time with the body inflated
            pods_fig = r["lists"][enc]["pods"]
            assert len(pods_fig["wire_samples_ms"]) == len(pods_fig["samples_ms"])
            assert all(0 < w <= t for w, t in zip(pods_fig["wire_samples_ms"], pods_fig["samples_ms"], strict=True))
            assert 0 < r["floor"][enc]["wire_p50_ms"] <= r["floor"][enc]["p50_ms"]
            assert r["floor"][enc]["wire_ratio"] == pytest.approx(pods_fig["wire_p50_ms"] / r["floor"][enc]["wire_p50_ms"])
            # lists paired with floor transfers: the figure is the median of each pair's ratio
            paired = r["floor"][enc]["paired"]
            assert len(paired["list_wire_ms"]) == len(paired["floor_wire_ms"]) == 2, paired
            for key, lists_key, floors_key in (("ratio", "list_ms", "floor_ms"),
                                               ("wire_ratio", "list_wire_ms", "floor_wire_ms")):  # fmt: skip
                ratios = paired[key + "s"]
                assert paired[key] == pytest.approx(statistics.median(ratios), abs=1e-3), paired
                # each pair's ratio is its list over its floor (times rounded to 0.1 ms)
                for x, a, b in zip(ratios, paired[lists_key], paired[floors_key], strict=True):
                    assert x > 0 and abs(x * b - a) <= 0.05 + 0.05 * x + 1e-3 * b, paired
        assert r["lists"]["identity"]["pods"]["content_encoding"] == ""
        assert r["pods_served_pct"] == 100.0 and r["load"]["pods_served_pct_end"] == 100.0
        assert r["load"]["lists"] > 0 and r["load"]["cycles"] >= 2
        assert r["load"]["scrapes_failed"] + r["load"]["scrapes_succeeded"] >= r["nodes"] * 2
        assert r["cpu_mc_per_node"] > 0 and r["rss_mb_per_node"] > 0 and r["processes"] >= 1
        assert r["quiet_from_cycle"] >= 3  # CPU measured once KCMS had settled (--settle-cycles)
        # the CPU reference is scaled by the machine's loop timed around the quiet window, not at the start
        before, after = r["machine_loop_quiet_s"]
        assert 0 < before < 10 and 0 < after < 10 and r["machine_loop_start_s"] > 0
        assert r["machine_loop_s"] == pytest.approx((before + after) / 2)
        # the simulator's CPU in the same quiet cycles, the in-window reference
        assert r["simulator_cycle_cpu_s"] > 0
        assert r["cpu_per_simulator_cpu"] == pytest.approx(r["cycle_cpu_s"] / r["simulator_cycle_cpu_s"])
        assert f"against the simulator's in the same cycles: {r['cpu_per_simulator_cpu']:.3f}x" in out.stdout
        assert f"{r['nodes']} nodes: loop {r['machine_loop_s'] * 1000:.1f} ms around the quiet phase" in out.stdout
        # the list of every pod and its floor, taken wholly between two scrape cycles (a cycle of
        # 2-3 nodes lasts milliseconds: one wholly during it is rare, and not asserted)
        between = r["by_cycle"]["between"]
        assert len(between["list_ms"]) == len(between["floor_ms"]) == 2 and between["ratio"] > 0, between
        assert len(between["list_wire_ms"]) == len(between["floor_wire_ms"]) == 2 and between["wire_ratio"] > 0
        assert all(w <= t for w, t in zip(between["list_wire_ms"], between["list_ms"], strict=True)), between
        assert 0 < r["t95_nodes_s"] <= r["t95_pods_s"]


def test_resource_pipeline_passes_kcms_args_and_stops_on_kcms_failure(tmp_path: Path) -> None:
    out = _resource_pipeline(tmp_path, "--nodes", "2", "--kcms-arg=--no-such-flag")
    assert out.returncode != 0
    # KCMS got the argument, refused it, and the benchmark said so with KCMS's own message
    assert "kcms exited" in out.stderr and "--no-such-flag" in out.stderr, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]


def test_cpu_paired_takes_metrics_servers_cpu_from_the_issue_codes_run(tmp_path: Path) -> None:
    """bench/cpu_paired.py at 2 nodes, with this checkout as both trees (the mechanics, not the
    figure): each pair's reference is the first run's CPU divided by the issue's ratio."""
    small = ["--resolution", "10", "--pods-per-node", "4", "--settle-cycles", "3", "--by-cycle-min-seconds", "0",
             "--address-base", "127.63.0.1"]  # fmt: skip
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "cpu_paired.py"), "--kcms-root", str(REPO), "--issue-root", str(REPO),
         "--nodes", "2", "--issue-ratio", "2.5", "--pairs", "1", "--cycles", "1", "--json", str(tmp_path / "p.json"),
         *(f"--pipeline-arg={a}" for a in small)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    (pair,) = json.loads((tmp_path / "p.json").read_text())["pairs"]
    assert pair["issue_cpu_mc_per_node"] > 0 and pair["cpu_mc_per_node"] > 0
    assert pair["metrics_server_cpu_mc_per_node"] == pytest.approx(pair["issue_cpu_mc_per_node"] / 2.5)
    assert pair["ratio"] == pytest.approx(pair["cpu_mc_per_node"] / pair["metrics_server_cpu_mc_per_node"])
    assert math.isnan(pair["ratio_loop_scaled"])  # the issue measured no 2-node cluster
    assert "x metrics-server's (the issue's / 2.5)" in out.stdout
    assert "2 nodes, CPU a node against metrics-server's, paired with the issue's code: " in out.stdout
    refused = subprocess.run([sys.executable, str(REPO / "bench" / "cpu_paired.py"), "--kcms-root", ".",
                              "--issue-root", ".", "--nodes", "7"], capture_output=True, text=True)  # fmt: skip
    assert refused.returncode == 2 and "--issue-ratio" in refused.stderr


def test_resource_report_derives_metrics_server_figures_as_documented() -> None:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import resource_report as rr
    finally:
        sys.path.remove(str(REPO / "bench"))
    assert rr.reference(1000, "list_pods_ms") == 1636 and rr.reference(5000, "t95_nodes_s") == 44
    assert math.isnan(rr.reference(7, "list_nodes_ms"))
    for n in (50, 1000, 5000):
        for key in ("cpu_mc_per_node", "rss_mb_per_node"):
            runs = rr.KCMS_AT_ISSUE_RUNS[n][key]
            if runs:  # metrics-server's figure = KCMS's at the issue / the issue's ratio
                assert rr.reference(n, key) == statistics.median(runs) / rr.ISSUE_RATIOS[n][key]
    # on a machine twice as slow (its loop takes twice as long) KCMS at the issue would have taken
    # twice the CPU: so does the CPU reference; RSS does not depend on speed
    slow = 2 * rr.KCMS_AT_ISSUE_LOOP_S
    assert math.isclose(rr.reference(50, "cpu_mc_per_node", slow), 2 * rr.reference(50, "cpu_mc_per_node"))
    assert rr.reference(50, "rss_mb_per_node", slow) == rr.reference(50, "rss_mb_per_node")
    assert 0 < rr.machine_loop_seconds(repeat=1) < 10
    r = {"nodes": 1000, "cpu_mc_per_node": 0.03, "rss_mb_per_node": 0.3, "t95_nodes_s": 12.05, "t95_pods_s": 13.0,
         "pods_served_pct": 100.0,
         "lists": {e: {"nodes": {"p50_ms": 14.0}, "pods": {"p50_ms": 818.0, "items": 30000, "wire_bytes": 9e6,
                                                                   "wire_p50_ms": 300.0},
                       "hpa": {"p50_ms": 18.5, "items": 690}} for e in ("gzip", "identity")},
         "floor": {e: {"p50_ms": 100.0, "ratio": 8.18, "wire_p50_ms": 50.0, "wire_ratio": 6.0}
                       for e in ("gzip", "identity")}}  # fmt: skip
    table = rr.markdown_table([r])
    assert "| time until 95 % of nodes are served | 12.1 / 24.1 s (0.50x) |" in table, table
    cpu_ref = rr.reference(1000, "cpu_mc_per_node")
    assert f"| CPU per node, KCMS / metrics-server | 0.030 / {cpu_ref:.3f} mcore" in table, table
    r["machine_loop_s"] = slow
    assert f"0.030 / {2 * cpu_ref:.3f} mcore" in rr.markdown_table([r])
    # the reference lines scale each size by its own loop where one was timed, else the start's
    lines = "\n".join(rr.reference_lines([50, 1000], rr.KCMS_AT_ISSUE_LOOP_S, {1000: slow}))
    assert f"cpu_mc_per_node {2 * cpu_ref:.3f} " in lines and f"cpu_mc_per_node {cpu_ref:.3f} " not in lines, lines
    assert f"cpu_mc_per_node {rr.reference(50, 'cpu_mc_per_node'):.3f} " in lines, lines
    assert "| list all pods (Accept-Encoding gzip) | 818 / 1 636 ms (0.50x), 30 000 pods, 9.0 MB |" in table, table
    assert "| list all pods / socket-write floor (gzip) | 8.2x (floor 100 ms); to the last byte 6.0x (300 / 50 ms) |" in table, table


def test_prometheus_bridge_runs_against_a_real_prometheus_and_prints_every_figure(tmp_path: Path) -> None:
    """bench/prometheus_bridge.py at a small size: a real Prometheus, kcms standalone with the bridge;
    every figure of issue 10's benchmark printed, each request answered, the queries KCMS sent found
    in Prometheus's query log (one per request) and replayed."""
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "prometheus_bridge.py"), "--series", "300", "--requests", "5",
         "--json", str(tmp_path / "p.json")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    for needle in ("discovery GET /apis/custom.metrics.k8s.io/v1beta2: p50", "named: KCMS p50",
                   "wildcard: KCMS p50", "named overhead: p50", "wildcard overhead: p50", "RSS of KCMS:",
                   "p99 / target 10 ms", "p99 / target 5 ms", "/ target 150 MB"):  # fmt: skip
        assert needle in out.stdout, (needle, out.stdout)
    (r,) = json.loads((tmp_path / "p.json").read_text())["results"]
    assert r["series"] >= 250 and r["pods"] == 100
    assert r["discovery"]["n"] == 5 and r["rss_mb"] > 0
    for kind in ("named", "wildcard"):
        assert r[kind]["queries_per_request"] >= 1.0 and r[kind]["prometheus_http"]["n"] == 5
    assert 'pod="' in r["named"]["example_query"] and 'pod=~"' in r["wildcard"]["example_query"]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]


def test_remote_write_quick_run_prints_every_figure_against_the_target() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "remote_write.py"), "--quick"],
        capture_output=True, text=True, timeout=300, cwd=REPO, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    for name in ("decode", "decode+bind+store", "first round (cold)", "HTTPS, wall", "HTTPS, server CPU"):
        line = next(ln for ln in out.stdout.splitlines() if ln.strip().startswith(name + " "))
        assert "samples/s median" in line and "x the 200,000 target" in line, line


def test_the_bench_client_inflates_in_pieces_and_refuses_a_cut_body() -> None:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import resource_client as rc
    finally:
        sys.path.remove(str(REPO / "bench"))
    text = b"".join(b'{"n":%d},' % i for i in range(200_000))  # several pieces of compressed input
    body = gzip.compress(text, 1)
    assert len(body) > 2 * rc.INFLATE_PIECE
    rc.timed_inflate(body)
    for cut in (body[:-9], body[: rc.INFLATE_PIECE + 1], body[:20]):
        with pytest.raises(zlib.error):
            rc.timed_inflate(cut)
    with pytest.raises(zlib.error):  # a corrupt piece, not only a short one
        rc.timed_inflate(body[:100] + bytes(200) + body[300:])
    # the application's copy is inflated on first use, outside the timing, and only then
    r = rc.Response(200, body, "gzip", 0.2, 0.1)
    assert r._body is None and r.body == text and r.wire_bytes == len(body)
    assert rc.Response(200, text, "", 0.1, 0.1, text).body is text
