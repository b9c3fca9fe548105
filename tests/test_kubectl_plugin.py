"""`kubectl kcms` as the user runs it: the installed `kubectl-kcms` script found by the real kubectl on
PATH, and `kcms top`, as real processes against real `kcms demo` processes (with history, and with
`--history 0`), compared with what the API returns at the same moment and with the real `kubectl top`.

Values move every resolution (15 s): a comparison reads the API (or runs `kubectl top`) before and after
the plugin and only counts when both reads are equal, retrying otherwise (`same_moment`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import aiohttp
import pytest
import yaml
from _http_helpers import serve_app
from _kubectl import KUBECTL
from _process_helpers import STOP_WAIT_SECONDS
from _stores import free_port
from aiohttp import web

from kcms.quantity import parse_quantity

SCRIPTS = Path(sysconfig.get_path("scripts"))
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl binary not installed")
BLOCKS = set("▁▂▃▄▅▆▇█")


def plugin_env() -> dict[str, str]:
    """PATH with the installed console scripts and kubectl only (one kubectl-kcms, no pyenv shim)."""
    if not (SCRIPTS / "kubectl-kcms").exists():
        pytest.fail(
            f"kubectl-kcms is not installed in {SCRIPTS}: run `pip install -e .` (pyproject.toml's scripts)"
        )
    dirs = [str(SCRIPTS)] + ([os.path.dirname(KUBECTL)] if KUBECTL else []) + ["/usr/bin", "/bin"]
    return {
        **os.environ,
        "PATH": os.pathsep.join(dict.fromkeys(dirs)),
        "KUBECONFIG": "",
        "HOME": "/nonexistent",
    }


def kubectl_kcms(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`kubectl kcms ARGV`: kubectl finds the plugin on PATH and runs it."""
    assert KUBECTL is not None
    return subprocess.run(
        ["kubectl", "kcms", *argv], capture_output=True, text=True, timeout=timeout, env=plugin_env(),
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def kcms_top(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`kcms top ARGV` with the installed `kcms` script."""
    return subprocess.run(
        [str(SCRIPTS / "kcms"), "top", *argv], capture_output=True, text=True, timeout=timeout, env=plugin_env(),
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def kubectl(kubeconfig: str, *argv: str) -> subprocess.CompletedProcess:
    assert KUBECTL is not None
    return subprocess.run(
        [KUBECTL, "--kubeconfig", kubeconfig, *argv], capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def raw(kubeconfig: str, path: str) -> dict:
    """``kubectl get --raw PATH``, without the objects' creationTimestamp (the time of the request in
    metrics.k8s.io, as in metrics-server: it is not part of the values)."""
    out = kubectl(kubeconfig, "get", "--raw", path)
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    for item in body.get("items", []):
        item.get("metadata", {}).pop("creationTimestamp", None)
    return body


def same_moment(read: Callable[[], object], act: Callable[[], subprocess.CompletedProcess]):
    """(before, result of act) for a run of ``act`` between two equal ``read()``s (retried)."""
    for _ in range(8):
        before = read()
        result = act()
        if read() == before:
            return before, result
        time.sleep(1)
    pytest.fail("the API's values changed around every one of 8 runs")


def clean_stderr(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The run failed with exit code 1 and exactly one line on stderr (no traceback); that line."""
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().split("\n")
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == ""
    return lines[0]


# ---- independent expectations (kubectl's units, computed here from the API objects) ---------------
def cores(q: str) -> str:
    return f"{math.ceil(parse_quantity(q) * 1000)}m"


def mebibytes(q: str | Decimal) -> str:
    value = q if isinstance(q, Decimal) else parse_quantity(q)
    return f"{math.ceil(value) // 2**20}Mi"


def pod_rows(body: dict, with_ns: bool) -> list[list[str]]:
    rows = []
    for item in body["items"]:
        cpu = sum((parse_quantity(c["usage"]["cpu"]) for c in item["containers"]), Decimal(0))
        mem = sum((parse_quantity(c["usage"]["memory"]) for c in item["containers"]), Decimal(0))
        lead = [item["metadata"]["namespace"]] if with_ns else []
        rows.append(lead + [item["metadata"]["name"], f"{math.ceil(cpu * 1000)}m", mebibytes(mem)])
    return sorted(rows)


def cells(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().split("\n")]


# ---- the demo processes -------------------------------------------------------------------------------
def start_demo(work_dir: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [str(SCRIPTS / "kcms"), "demo", "--secure-port", str(port), "--nodes", "3", "--pods-per-node", "4",
         "--work-dir", str(work_dir), "--exit-after", "900s", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    kubeconfig = str(work_dir / "kubeconfig")
    deadline = time.monotonic() + 60
    while True:  # ready, and pod metrics served (the first two scrapes are done)
        assert proc.poll() is None, "kcms demo exited"
        if os.path.exists(kubeconfig):
            out = kcms_top("pods", "-A", "--kubeconfig", kubeconfig, "--sparkline", "off")
            if out.returncode == 0 and out.stdout.count("\n") > 1:
                return proc, kubeconfig
        assert time.monotonic() < deadline, "kcms demo served no pod metrics within 60 s"
        time.sleep(1)


def stop_demo(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(STOP_WAIT_SECONDS) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.stderr is not None
    assert "Traceback" not in proc.stderr.read()


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Iterator[str]:
    """A `kcms demo` with history (the default 10m); its kubeconfig. Waits for 3 history points."""
    proc, kubeconfig = start_demo(tmp_path_factory.mktemp("demo"))
    try:
        deadline = time.monotonic() + 90
        while True:
            out = kcms_top("nodes", "-o", "json", "--kubeconfig", kubeconfig)
            items = json.loads(out.stdout)["items"] if out.returncode == 0 else []
            hist = [i for i in items if i["kind"] == "NodeMetricsHistory"]
            if hist and min(len(h["points"]) for h in hist) >= 3:
                break
            assert time.monotonic() < deadline, "no 3 history points within 90 s"
            time.sleep(2)
        yield kubeconfig
    finally:
        stop_demo(proc)


@pytest.fixture(scope="module")
def plain_demo(tmp_path_factory) -> Iterator[str]:
    """A `kcms demo --history 0`: metrics.k8s.io without history.kcms.io, as metrics-server."""
    proc, kubeconfig = start_demo(tmp_path_factory.mktemp("plain"), "--history", "0")
    try:
        yield kubeconfig
    finally:
        stop_demo(proc)


def pods_of(kubeconfig: str, ns: str | None = None) -> Callable[[], dict]:
    path = f"/apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods" if ns else "/apis/metrics.k8s.io/v1beta1/pods"
    return lambda: raw(kubeconfig, path)


# ---- found and run by kubectl ---------------------------------------------------------------------------
@needs_kubectl
def test_kubectl_finds_the_installed_plugin():
    listed = subprocess.run(
        ["kubectl", "plugin", "list"], capture_output=True, text=True, timeout=60, env=plugin_env()
    )
    assert listed.returncode == 0, listed.stderr
    assert str(SCRIPTS / "kubectl-kcms") in listed.stdout
    helped = kubectl_kcms("--help")
    assert helped.returncode == 0 and "kubectl kcms" in helped.stdout
    for command in ("top", "metrics", "get", "dashboard"):
        assert command in helped.stdout


@needs_kubectl
def test_top_pods_all_namespaces_equals_the_api_and_kubectl_top(demo):
    body, out = same_moment(pods_of(demo), lambda: kubectl_kcms("top", "pods", "-A", "--kubeconfig", demo))
    assert out.returncode == 0, out.stderr
    clean_stderr(out)
    table = cells(out.stdout)
    assert table[0] == ["NAMESPACE", "NAME", "CPU(cores)", "MEMORY(bytes)", "CPU-HISTORY(5m)"]
    assert [row[:4] for row in table[1:]] == pod_rows(body, with_ns=True)
    assert len(table) - 1 == len(body["items"]) == 12
    # Without the history column the output is kubectl's, byte for byte (same layout, units, order).
    theirs, ours = same_moment(
        lambda: kubectl(demo, "top", "pods", "-A").stdout,
        lambda: kubectl_kcms("top", "pods", "-A", "--sparkline", "off", "--kubeconfig", demo),
    )
    assert ours.returncode == 0 and ours.stdout == theirs


@needs_kubectl
@pytest.mark.parametrize(
    "flags",
    [
        ["-n", "team-b"],
        ["-n", "team-b", "--containers"],
        ["-n", "team-b", "--sort-by", "cpu"],
        ["-A", "--sort-by", "memory", "--containers"],
        ["-A", "-l", "app in (web,cache)"],
        ["-n", "default", "--no-headers"],
    ],
)
def test_kcms_top_pods_flags_print_what_kubectl_top_prints(demo, flags):
    theirs, ours = same_moment(
        lambda: kubectl(demo, "top", "pods", *flags).stdout,
        lambda: kcms_top("pods", *flags, "--sparkline", "off", "--kubeconfig", demo),
    )
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == theirs and theirs.strip()


def test_top_pods_namespace_selector_and_sorting_against_the_api(demo):
    ns_items = pods_of(demo, "team-b")
    body, out = same_moment(
        ns_items, lambda: kcms_top("pods", "-n", "team-b", "--sort-by", "cpu", "--kubeconfig", demo)
    )
    assert out.returncode == 0, out.stderr
    rows = [r[:3] for r in cells(out.stdout)[1:]]
    expected = pod_rows(body, with_ns=False)
    assert sorted(rows) == expected
    millis = [int(r[1][:-1]) for r in rows]
    assert millis == sorted(millis, reverse=True)
    # -l narrows to the pods whose labels match, as the API's labelSelector does.
    label_body = raw(demo, "/apis/metrics.k8s.io/v1beta1/namespaces/team-b/pods?labelSelector=app%3Dcache")
    out = kcms_top("pods", "-n", "team-b", "-l", "app=cache", "--sparkline", "off", "--kubeconfig", demo)
    names = [r[0] for r in cells(out.stdout)[1:]]
    assert names == sorted(i["metadata"]["name"] for i in label_body["items"]) and names
    # The context's namespace is the default: the demo's kubeconfig names none, so "default".
    out = kcms_top("pods", "--sparkline", "off", "--kubeconfig", demo)
    assert {r[0] for r in cells(out.stdout)[1:]} == {
        i["metadata"]["name"]
        for i in raw(demo, "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods")["items"]
    }


def test_top_nodes_values_sparkline_and_history_in_json(demo):
    nodes = lambda: raw(demo, "/apis/metrics.k8s.io/v1beta1/nodes")  # noqa: E731
    body, out = same_moment(nodes, lambda: kcms_top("nodes", "--sort-by", "memory", "--kubeconfig", demo))
    assert out.returncode == 0, out.stderr
    clean_stderr(out)
    # The demo is no kube-apiserver: no /api/v1/nodes, so no allocatable: one warning, % unknown.
    assert "warning: CPU(%) and MEMORY(%) are <unknown>" in out.stderr and "/api/v1/nodes" in out.stderr
    table = cells(out.stdout)
    assert table[0] == ["NAME", "CPU(cores)", "CPU(%)", "MEMORY(bytes)", "MEMORY(%)", "MEMORY-HISTORY(5m)"]
    expected = {
        i["metadata"]["name"]: [
            cores(i["usage"]["cpu"]),
            "<unknown>",
            mebibytes(i["usage"]["memory"]),
            "<unknown>",
        ]
        for i in body["items"]
    }
    assert {r[0]: r[1:5] for r in table[1:]} == expected
    mem = [
        parse_quantity(i["usage"]["memory"])
        for i in sorted(body["items"], key=lambda i: i["metadata"]["name"])
    ]
    assert [r[0] for r in table[1:]] == [
        n for _, n in sorted(zip(mem, sorted(expected), strict=True), key=lambda p: -p[0])
    ]
    history = raw(demo, "/apis/history.kcms.io/v1alpha1/nodes?since=5m")
    points = {h["metadata"]["name"]: len(h["points"]) for h in history["items"]}
    for line in out.stdout.rstrip("\n").split("\n")[1:]:
        name = line.split()[0]
        spark = line.rstrip()[-20:]  # 5m of 15 s slots, newest last
        assert set(spark.strip()) <= BLOCKS and spark[-1] in BLOCKS
        # one filled slot per point of the window (give or take the one a scrape adds meanwhile)
        assert abs(sum(c in BLOCKS for c in spark) - min(points[name], 20)) <= 1, (spark, points[name])
    short = kcms_top("nodes", "--since", "2m", "--sparkline", "cpu", "--kubeconfig", demo)
    assert cells(short.stdout)[0][-1] == "CPU-HISTORY(2m)"
    column = short.stdout.index("CPU-HISTORY(2m)")
    for line in short.stdout.rstrip("\n").split("\n")[1:]:  # 2m of 15 s slots: 8 characters
        assert line[column + 7] in BLOCKS and line[column + 8 :].strip() == "", line
    doc = json.loads(kcms_top("nodes", "-o", "json", "--kubeconfig", demo).stdout)
    kinds = [i["kind"] for i in doc["items"]]
    assert doc["kind"] == "List" and kinds == ["NodeMetrics"] * 3 + ["NodeMetricsHistory"] * 3
    assert {i["metadata"]["name"] for i in doc["items"]} == set(expected)


def test_top_pods_yaml_and_containers_history(demo):
    out = kcms_top("pods", "-n", "team-b", "-o", "yaml", "--kubeconfig", demo)
    assert out.returncode == 0, out.stderr
    doc = yaml.safe_load(out.stdout)
    metrics = [i for i in doc["items"] if i["kind"] == "PodMetrics"]
    history = [i for i in doc["items"] if i["kind"] == "PodMetricsHistory"]
    assert metrics and {m["metadata"]["name"] for m in metrics} == {h["metadata"]["name"] for h in history}
    assert all(m["metadata"]["namespace"] == "team-b" for m in metrics)
    out = kcms_top("pods", "-n", "team-b", "--containers", "--kubeconfig", demo)
    table = cells(out.stdout)
    assert table[0] == ["POD", "NAME", "CPU(cores)", "MEMORY(bytes)", "CPU-HISTORY(5m)"]
    containers = sum(len(m["containers"]) for m in metrics)
    assert len(table) - 1 == containers
    assert all(set(r[4]) <= BLOCKS for r in table[1:])


@needs_kubectl
def test_without_history_it_falls_back_to_kubectl_top(plain_demo):
    groups = [g["name"] for g in raw(plain_demo, "/apis")["groups"]]
    assert "metrics.k8s.io" in groups and "history.kcms.io" not in groups
    for flags in (["pods", "-A"], ["pods", "-n", "team-b", "--containers", "--sort-by", "memory"]):
        theirs, ours = same_moment(
            lambda flags=flags: kubectl(plain_demo, "top", *flags).stdout,
            lambda flags=flags: kubectl_kcms("top", *flags, "--kubeconfig", plain_demo),
        )
        assert ours.returncode == 0 and ours.stderr == "", ours.stderr
        assert ours.stdout == theirs and "HISTORY" not in ours.stdout
    out = kcms_top("nodes", "-o", "json", "--kubeconfig", plain_demo)
    assert out.returncode == 0
    assert {i["kind"] for i in json.loads(out.stdout)["items"]} == {"NodeMetrics"}


def test_watch_prints_again_and_stops_cleanly_on_interrupt(demo):
    proc = subprocess.Popen(
        [str(SCRIPTS / "kcms"), "top", "pods", "-n", "team-b", "--watch", "--interval", "1s", "--kubeconfig", demo],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=plugin_env(), stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        headers = 0
        while headers < 2:
            line = proc.stdout.readline()
            assert line, "the watch stopped printing"
            headers += line.startswith("NAME ")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        assert "Traceback" not in proc.stderr.read()  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_metrics_and_get_show_what_the_custom_and_external_apis_serve(demo):
    out = kcms_top("pods", "--help")  # `kcms top` only has top; the rest goes through kubectl-kcms
    assert out.returncode == 0
    plugin = [str(SCRIPTS / "kubectl-kcms")]
    run = lambda *a: subprocess.run(plugin + list(a) + ["--kubeconfig", demo], capture_output=True, text=True,  # noqa: E731
                                    timeout=60, env=plugin_env())  # fmt: skip
    listed = run("metrics")
    assert listed.returncode == 0, listed.stderr
    custom = raw(demo, "/apis/custom.metrics.k8s.io/v1beta2")["resources"]
    external = raw(demo, "/apis/external.metrics.k8s.io/v1beta1")["resources"]
    rows = cells(listed.stdout)
    assert rows[0] == ["TYPE", "RESOURCE", "METRIC", "NAMESPACED"]
    assert sorted(tuple(r) for r in rows[1:]) == sorted(
        [("custom", *r["name"].split("/"), str(r["namespaced"]).lower()) for r in custom]
        + [("external", "-", r["name"], "true") for r in external]
    )
    path = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/team-b/pods/*/http_requests_per_second"
    body, got = same_moment(
        lambda: raw(demo, path), lambda: run("get", "http_requests_per_second", "--pods", "-n", "team-b")
    )
    assert got.returncode == 0, got.stderr
    table = cells(got.stdout)
    assert table[0][:4] == ["OBJECT", "VALUE", "WINDOW", "TIMESTAMP"]
    assert sorted(r[:2] for r in table[1:]) == sorted(
        [f"pod/{i['describedObject']['name']}", i["value"]] for i in body["items"]
    )
    path = (
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/team-b/queue_backlog?labelSelector=queue%3Demails"
    )
    body, got = same_moment(
        lambda: raw(demo, path),
        lambda: run("get", "queue_backlog", "--external", "-l", "queue=emails", "-n", "team-b"),
    )
    assert got.returncode == 0, got.stderr
    assert [r[:3] for r in cells(got.stdout)[1:]] == [
        ["queue_backlog", "queue=emails", body["items"][0]["value"]]
    ]
    # Stored series have history (the newest slot filled); derived ones (<m>_per_second) have none.
    table = cells(got.stdout)
    assert table[0][-1] == "HISTORY(5m)" and table[1][-1][-1] in BLOCKS
    series = raw(
        demo, "/apis/history.kcms.io/v1alpha1/namespaces/team-b/series?metric=queue_backlog&resource=external"
    )
    labels = {tuple(sorted(i["metric"]["selector"]["matchLabels"].items())) for i in series["items"]}
    assert (("queue", "emails"),) in labels
    assert "HISTORY" not in cells(run("get", "http_requests_per_second", "--pods", "-n", "team-b").stdout)[0]
    dep = next(r["name"] for r in custom if r["name"].startswith("deployments.apps/"))
    metric = dep.split("/")[1]
    app = raw(demo, "/apis/metrics.k8s.io/v1beta1/namespaces/team-b/pods")["items"][0]["metadata"]["labels"][
        "app"
    ]
    got = run("get", metric, "--object", f"deployment/{app}", "-n", "team-b", "-o", "json")
    assert got.returncode == 0, got.stderr
    items = [i for i in json.loads(got.stdout)["items"] if "describedObject" in i and "value" in i]
    assert items and items[0]["describedObject"]["name"] == app
    missing = run("get", "no_such_metric", "--pods", "-n", "team-b")
    assert missing.returncode == 0 and missing.stdout == ""
    assert missing.stderr.startswith(
        "No values of no_such_metric found in team-b namespace. (no_such_metric is not in"
    )
    bad = run("get", "queue_backlog", "--object", "deployments.apps", "-n", "team-b")
    assert one_error_line(bad) == "error: --object deployments.apps: expected RESOURCE/NAME"


def test_dashboard_command_serves_the_page(demo):
    proc = subprocess.Popen(
        [str(SCRIPTS / "kubectl-kcms"), "dashboard", "--kubeconfig", demo, "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=plugin_env(), stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/\S*", line)
        assert url, line
        import urllib.request

        with urllib.request.urlopen(url.group(0), timeout=30) as resp:  # noqa: S310 (a loopback URL)
            assert resp.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_bad_flags_and_selectors_are_one_line_errors(demo):
    line = one_error_line(kcms_top("pods", "-A", "-l", "app in (web", "--kubeconfig", demo))
    assert line.startswith("error: invalid label selector") and "--selector" in line
    line = one_error_line(kcms_top("pods", "--field-selector", "metadata.name", "--kubeconfig", demo))
    assert line.startswith("error: invalid field selector")
    line = one_error_line(kcms_top("pods", "-n", "team-b", "no-such-pod", "--kubeconfig", demo))
    assert line.startswith("Error from server (NotFound)")
    line = one_error_line(kcms_top("pods", "--since", "soon", "--kubeconfig", demo))
    assert "--since" in line
    line = one_error_line(kcms_top("pods", "--kubeconfig", "/nonexistent/kubeconfig"))
    assert "--kubeconfig" in line and "no such file" in line
    out = kcms_top("pods", "--sort-by", "disk", "--kubeconfig", demo)
    assert out.returncode == 2 and "--sort-by" in out.stderr and "Traceback" not in out.stderr


def test_imports_no_server_machinery():
    code = (
        "import sys; from kcms.kubectl import main, top, get, metrics, client, run; "
        "print(sorted(m for m in sys.modules if m.startswith('kcms.') and m.split('.')[1] in "
        "('apiserver', 'apis', 'store', 'collector', 'standalone', 'server', 'sim', 'agent', 'dashboard')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
    assert shutil.which("kcms", path=str(SCRIPTS))
    # `kcms top` goes through kcms.cmd.main, which builds no server parser for it and imports no server module
    code = (
        "import sys; from kcms.cmd.main import main; rc = main(['top', 'pods', '--kubeconfig', '/nonexistent']); "
        "print(rc, sorted(m for m in sys.modules if m.startswith('kcms.') and m.split('.')[1] in "
        "('apiserver', 'apis', 'store', 'collector', 'standalone', 'server', 'sim', 'agent', 'dashboard', 'cli_ha')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "1 []", out.stdout + out.stderr
    assert out.stderr == "error: --kubeconfig /nonexistent: no such file\n"


# ---- nodes with allocatable: KCMS behind an aggregator, as in a cluster ----------------------------------
async def run_async(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
        env=env or plugin_env(),
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


def kubeconfig_doc(path: str) -> dict:
    return yaml.safe_load(Path(path).read_text())


@needs_kubectl
async def test_top_nodes_percentages_equal_kubectl_top_behind_an_aggregator(demo, fake_kube, ca, tmp_path):
    """In a cluster, kubectl reads /api/v1/nodes from the kube-apiserver and metrics.k8s.io through its
    aggregation layer. Here a loopback proxy plays that layer: /api/** goes to the fake API server
    (tests/fakeapi.py) holding the nodes, everything else to the real `kcms demo`."""
    from fakeapi import make_node

    names = sorted(i["metadata"]["name"] for i in raw(demo, "/apis/metrics.k8s.io/v1beta1/nodes")["items"])
    for i, name in enumerate(names + ["sim-node-without-metrics"]):
        node = make_node(name, labels={"pool": "a" if i % 2 == 0 else "b"})
        node["status"]["allocatable"] = {"cpu": f"{2 + i}", "memory": f"{4 + 4 * i}Gi", "pods": "110"}
        node["status"]["capacity"] = {"cpu": f"{4 + i}", "memory": f"{8 + 4 * i}Gi", "pods": "110"}
        fake_kube.upsert(node)
    doc = kubeconfig_doc(demo)
    demo_url = doc["clusters"][0]["cluster"]["server"]
    demo_ca = tmp_path / "demo-ca.pem"
    demo_ca.write_bytes(base64.b64decode(doc["clusters"][0]["cluster"]["certificate-authority-data"]))
    upstream_ssl = {
        "demo": ssl.create_default_context(cafile=str(demo_ca)),
        "fake": ssl.create_default_context(cadata=ca.cert_pem.bytes().decode()),
    }
    async with aiohttp.ClientSession() as session:

        async def forward(request: web.Request) -> web.Response:
            to_fake = request.path == "/api" or request.path.startswith("/api/")
            base, ctx = (fake_kube.url, upstream_ssl["fake"]) if to_fake else (demo_url, upstream_ssl["demo"])
            headers = {"Authorization": f"Bearer {fake_kube.admin_token}"} if to_fake else {}
            async with session.get(base + request.path_qs, ssl=ctx, headers=headers) as resp:
                body = await resp.read()
                return web.Response(body=body, status=resp.status, content_type="application/json")

        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", forward)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1").configure_cert(ctx)
        runner, port = await serve_app(app, ssl_context=ctx, access_log=None)
        try:
            front = fake_kube.write_kubeconfig(tmp_path / "front")
            front_doc = json.loads(front.read_text())
            front_doc["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
            front.write_text(json.dumps(front_doc))
            for flags in (
                [],
                ["--sort-by", "cpu"],
                ["-l", f"kubernetes.io/hostname in ({names[0]},{names[2]})"],
                ["--show-capacity", "--no-headers"],
            ):
                for _ in range(8):
                    before = await run_async(KUBECTL, "top", "nodes", *flags, "--kubeconfig", str(front))
                    ours = await run_async(
                        str(SCRIPTS / "kubectl-kcms"), "top", "nodes", *flags, "--sparkline", "off",
                        "--kubeconfig", str(front),
                    )  # fmt: skip
                    after = await run_async(KUBECTL, "top", "nodes", *flags, "--kubeconfig", str(front))
                    if before == after:
                        break
                else:
                    pytest.fail("kubectl top nodes changed around every one of 8 runs")
                assert before[0] == 0, before[2]
                assert ours == (0, before[1], ""), (flags, ours, before)
                assert "%" in ours[1] and ("<unknown>" in ours[1]) == ("-l" not in flags)
            # With history, the sparkline is one more column; the percentages are the same.
            rc, out, err = await run_async(
                str(SCRIPTS / "kubectl-kcms"), "top", "nodes", "--kubeconfig", str(front)
            )
            assert rc == 0 and err == ""
            table = cells(out)
            assert table[0][-1] == "CPU-HISTORY(5m)" and all("%" in r[2] for r in table[1:4])
            assert table[-1] == ["sim-node-without-metrics"] + ["<unknown>"] * 4 + ["-"]
        finally:
            await runner.cleanup()


def test_sparkline_slots_scale_and_gaps():
    from kcms.kubectl.sparkline import Axis, parse_time, resolution

    t0 = 1_700_000_000.0
    ramp = [(t0 + 15 * i, float(i)) for i in range(20)]
    assert resolution([ramp]) == 15
    # right after start: the first point's gap to the next is short of a resolution (13 s: the
    # first cycle's rescrape, then the next cycle a resolution after the first began)
    assert resolution([[(t0, 1.0), (t0 + 13, 1.0), (t0 + 28, 1.0)]]) == 15
    axis = Axis(ramp[-1][0], 300, 15)
    line = axis.render(ramp)
    assert len(line) == axis.width == 20
    assert line[0] == "▁" and line[-1] == "█"
    assert list(line) == sorted(line, key="▁▂▃▄▅▆▇█".index)  # a ramp never goes down
    # jitter of a few seconds keeps each point in its own slot; a missing scrape is a space
    jittered = [(t + (4 if i % 2 else -4), v) for i, (t, v) in enumerate(ramp) if i != 10]
    assert axis.render(jittered)[10] == " " and axis.render(jittered).count(" ") == 1
    # zero everywhere is the lowest block; a younger row starts with spaces; old points are dropped
    assert axis.render([(t, 0.0) for t, _ in ramp]) == "▁" * 20
    assert axis.render(ramp[15:]) == " " * 15 + axis.render(ramp[15:]).lstrip()
    assert axis.render([(t0 - 3600, 5.0)]) == " " * 20
    # a longer window is cut into at most 40 slots
    assert Axis(t0, 3600, 15).width == 40
    assert parse_time("2026-11-23T17:11:32.123456789Z") == parse_time("2026-11-23T17:11:32.123456Z")
    assert parse_time("yesterday") is None and parse_time(12) is None


def test_a_reader_that_goes_away_is_no_error(demo):
    """`kubectl kcms top pods -A -o json --watch | head -c 10`: the watch writes until the pipe is
    full and gone, then ends with exit code 0 and nothing on stderr."""
    proc = subprocess.Popen(
        [str(SCRIPTS / "kubectl-kcms"), "top", "pods", "-A", "-o", "json", "--watch", "--interval", "0.1s",
         "--kubeconfig", demo],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=plugin_env(), stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(10) == b'{\n  "apiVe'
    proc.stdout.close()
    assert proc.wait(60) == 0
    assert proc.stderr.read() == b""


def test_watch_on_a_terminal_clears_the_screen_each_round(demo):
    """On a terminal, --watch redraws in place (clear screen, then the table), as `watch` does."""
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [str(SCRIPTS / "kcms"), "top", "nodes", "--watch", "--interval", "1s", "--kubeconfig", demo],
        stdout=follower, stderr=subprocess.PIPE, env=plugin_env(), stdin=subprocess.DEVNULL,
    )  # fmt: skip
    os.close(follower)
    try:
        seen = b""
        deadline = time.monotonic() + 60
        while seen.count(b"\x1b[H\x1b[2J") < 2:
            assert time.monotonic() < deadline, seen
            seen += os.read(leader, 65536)
        frames = seen.split(b"\x1b[H\x1b[2J")[1:]
        assert frames[0].decode().split()[:5] == [
            "NAME",
            "CPU(cores)",
            "CPU(%)",
            "MEMORY(bytes)",
            "MEMORY(%)",
        ]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        assert "Traceback" not in err
        assert err.count("warning: CPU(%) and MEMORY(%) are <unknown>") == 1  # said once, not each round
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()
