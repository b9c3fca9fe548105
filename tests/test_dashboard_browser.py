"""The dashboard in a real headless Chromium (Debian's chromium + chromedriver, driven by Selenium)
against real `kcms demo` processes: the rendered tables match the API, charts are drawn from the
history API's points, custom and external metrics are listed with their values and windows, a stale
node is shown, the page works without history, a hostile label renders as text, and the local server
refuses what it must while the demo stays ready. Also writes the documentation's screenshot
(KCMS_WRITE_SCREENSHOT=1 updates docs/images/dashboard.png).

Chromium and chromedriver missing is a failure naming `sh tests/system-deps.sh`, never a skip.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kcms.kube.client import KubeClient
from kcms.quantity import parse_quantity

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
RESOLUTION = 10  # seconds: the demo's --metric-resolution (its minimum), so history fills quickly
WAIT = 180.0  # generous bound on waiting for the page or the demo (not a timing check)
HOSTILE = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">&amp;'


# ---- fixtures ------------------------------------------------------------------------------------
def _chromium_driver():
    missing = [
        p for p in (CHROMIUM, CHROMEDRIVER) if not (os.path.exists(p) or shutil.which(os.path.basename(p)))
    ]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not found: run `sh tests/system-deps.sh` (installs chromium and chromium-driver)"
        )
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is not installed: pip install -e '.[test]'")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    profile = tempfile.mkdtemp(prefix="kcms-chromium-")
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--window-size=1280,900",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver_path = CHROMEDRIVER if os.path.exists(CHROMEDRIVER) else shutil.which("chromedriver")
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
    )
    return driver, profile


@pytest.fixture(scope="module")
def browser():
    driver, profile = _chromium_driver()
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


class Demo:
    """A running `kcms demo` process: its kubeconfig and its dashboard URL."""

    def __init__(self, proc: subprocess.Popen, work: Path, url: str, stderr: Path) -> None:
        self.proc, self.work, self.url, self.stderr = proc, work, url, stderr
        self.kubeconfig = str(work / "kubeconfig")

    def api(self, path: str, **params: str) -> dict:
        """GET ``path`` from the demo's API server with its kubeconfig (as the dashboard does)."""
        return asyncio.run(_get(self.kubeconfig, path, params))

    def post(self, path: str, body: dict) -> dict:
        async def go() -> dict:
            async with await KubeClient.load(self.kubeconfig) as kube:
                return await kube.post_json(path, body)

        return asyncio.run(go())


async def _get(kubeconfig: str, path: str, params: dict) -> dict:
    async with await KubeClient.load(kubeconfig) as kube:
        return await kube.get_json(path, params or None)


def _start_demo(tmp: Path, *extra: str) -> Iterator[Demo]:
    stderr = tmp / "stderr"
    with open(stderr, "wb") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kcms",
                "demo",
                "--secure-port",
                "0",
                "--work-dir",
                str(tmp / "work"),
                f"--metric-resolution={RESOLUTION}s",
                *extra,
            ],  # fmt: skip
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    url = ""
    deadline = time.monotonic() + WAIT
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("Dashboard"):
            url = proc.stdout.readline().strip()
            break
    if not url:
        proc.kill()
        pytest.fail(f"kcms demo printed no dashboard URL; stderr:\n{stderr.read_text()[-3000:]}")
    demo = Demo(proc, tmp / "work", url, stderr)
    try:
        yield demo
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
        log = stderr.read_text()
        assert code == 0, log[-3000:]
        assert "Traceback" not in log, log[-5000:]


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Iterator[Demo]:
    """A demo whose last simulated kubelet goes down after two scrapes (a stale node)."""
    yield from _start_demo(tmp_path_factory.mktemp("demo"), "--down-nodes", "1")


@pytest.fixture(scope="module")
def demo_without_history(tmp_path_factory) -> Iterator[Demo]:
    yield from _start_demo(tmp_path_factory.mktemp("demo-nohist"), "--history", "0")


# ---- helpers -------------------------------------------------------------------------------------
def wait_for(what: str, probe: Callable[[], Any], timeout: float = WAIT, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what} (last: {value!r})")
        time.sleep(every)


def open_page(browser, url: str, *, min_points: int = 0) -> dict:
    """Load the dashboard and wait until it drew a refresh (and, with ``min_points``, until the node
    history it drew has that many points); return that refresh's snapshot."""
    browser.get(url)

    def ready():
        snap = browser.execute_script("return window.kcmsDashboard && window.kcmsDashboard.snapshot")
        if not snap or not snap["nodes"]:
            return None
        if min_points:  # of the nodes being scraped (a downed one keeps the few it had)
            live = {n["metadata"]["name"] for n in snap["nodes"]}
            points = [len(h["points"]) for h in snap["nodeHistory"] if h["metadata"]["name"] in live]
            if not points or min(points) < min_points:
                return None
        return snap

    return wait_for("the dashboard to draw", ready)


def cpu_text(q: str | None) -> str:
    return "—" if q is None else f"{math.ceil(parse_quantity(q) * 1000)}m"  # kubectl top: MilliValue


def mem_text(q: str | None) -> str:
    return "—" if q is None else f"{math.ceil(parse_quantity(q)) // 1048576}Mi"  # kubectl top: Value/Mi


def pod_sum(pod: dict, key: str) -> str:
    total = sum(parse_quantity(c["usage"][key]) for c in pod["containers"])
    return f"{math.ceil(total * 1000)}m" if key == "cpu" else f"{math.ceil(total) // 1048576}Mi"


READ_TABLES = """
const rows = (sel) => [...document.querySelectorAll(sel)].map((tr) => [...tr.cells].map((td) => td.textContent));
return {
  snap: window.kcmsDashboard.snapshot,
  refreshes: window.kcmsDashboard.refreshes,
  nodeHead: [...document.querySelectorAll('#nodes-table thead th')].map((th) => th.textContent),
  podHead: [...document.querySelectorAll('#pods-table thead th')].map((th) => th.textContent),
  nodes: rows('#nodes-table tbody tr'),
  pods: rows('#pods-table tbody tr'),
};
"""

# Non-transparent pixels of each canvas under ``root`` (uPlot draws on a canvas).
CANVAS_PIXELS = """
return [...document.querySelectorAll(arguments[0])].map((c) => {
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 3; i < d.length; i += 4) if (d[i] !== 0) n++;
  return n;
});
"""


def same_moment(snap_items: list[dict], api_items: list[dict], key: Callable[[dict], Any]) -> bool:
    """Whether the page's snapshot and an API read are of the same scrape (timestamps equal)."""
    page = {key(i): i["timestamp"] for i in snap_items}
    api = {key(i): i["timestamp"] for i in api_items}
    return page == api


# ---- tests ---------------------------------------------------------------------------------------
def test_tables_match_the_api(demo, browser):
    open_page(browser, demo.url)
    # The page's tables and the JSON it drew them from are read in one script (one moment); that JSON
    # is then compared with the API read at the same scrape (values move every resolution).
    for _ in range(20):
        page = browser.execute_script(READ_TABLES)
        api_nodes = demo.api("/apis/metrics.k8s.io/v1beta1/nodes")["items"]
        api_pods = demo.api("/apis/metrics.k8s.io/v1beta1/pods")["items"]
        snap = page["snap"]
        if same_moment(snap["nodes"], api_nodes, lambda i: i["metadata"]["name"]) and same_moment(
            snap["pods"], api_pods, lambda i: (i["metadata"]["namespace"], i["metadata"]["name"])
        ):
            break
        time.sleep(1)
    else:
        pytest.fail("the page and the API never showed the same scrape")
    assert page["nodeHead"][:3] == ["Name", "CPU(cores)", "Memory(bytes)"]  # kubectl top's columns
    by_name = {n["metadata"]["name"]: n for n in api_nodes}
    rendered = {r[0]: r for r in page["nodes"] if r[0] in by_name}
    assert set(rendered) == set(by_name)
    for name, node in by_name.items():
        assert rendered[name][1] == cpu_text(node["usage"]["cpu"]), name
        assert rendered[name][2] == mem_text(node["usage"]["memory"]), name
    assert page["podHead"][:5] == ["Namespace", "Name", "Containers", "CPU(cores)", "Memory(bytes)"]
    by_pod = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in api_pods}
    rows = {(r[0], r[1]): r for r in page["pods"]}
    assert set(rows) == set(by_pod) and len(rows) > 10
    for key, pod in by_pod.items():
        assert rows[key][2] == str(len(pod["containers"]))
        assert rows[key][3] == pod_sum(pod, "cpu"), key
        assert rows[key][4] == pod_sum(pod, "memory"), key
    # Top consumers: the pods with the highest CPU, in order.
    top = browser.execute_script(
        "return [...document.querySelectorAll('#top-cpu tbody tr')].map((tr) => tr.cells[0].textContent)"
    )
    want = sorted(
        by_pod, key=lambda k: -sum(parse_quantity(c["usage"]["cpu"]) for c in by_pod[k]["containers"])
    )
    assert top[:3] == [f"{ns}/{name}" for ns, name in want[:3]]
    # The page reads again by itself, every resolution (the metrics' window; right after the
    # start, the window of the first quick re-scrape, at least 5 s, until the next cycle's).
    wait_for(
        f"a refresh every {RESOLUTION}s",
        lambda: f"every {RESOLUTION}s" in browser.execute_script("return document.getElementById('status').textContent"),
    )
    drawn = page["refreshes"]
    wait_for(
        "an automatic refresh",
        lambda: browser.execute_script("return window.kcmsDashboard.refreshes") > drawn,
    )


def test_charts_drawn_from_the_history(demo, browser):
    snap = open_page(browser, demo.url, min_points=3)
    assert snap["history"] is True
    # Every node and pod row with history has its sparklines drawn (pixels on the canvas).
    counts = browser.execute_script(
        "return [...document.querySelectorAll('#nodes-table tbody tr:not(.missing) .spark')].map(s => +s.dataset.points)"
    )
    assert counts and min(counts) >= 3
    pixels = browser.execute_script(CANVAS_PIXELS, "#nodes-table tbody tr:not(.missing) .spark canvas")
    assert len(pixels) == len(counts) and min(pixels) > 0
    pod_pixels = browser.execute_script(CANVAS_PIXELS, "#pods-table .spark canvas")
    assert len(pod_pixels) >= 2 * 10 and min(pod_pixels) > 0

    # The large chart of a node: as many points as the history API has for it.
    browser.execute_script("document.querySelector('#nodes-table tr[data-node=\"sim-node-0001\"]').click()")
    for _ in range(20):
        chart = browser.execute_script(
            "const c = document.getElementById('selected-cpu'); const s = window.kcmsDashboard.snapshot;"
            "return {points: +c.dataset.points, series: +c.dataset.series, name: document.getElementById('selected').dataset.name,"
            " hist: s.nodeHistory.find(h => h.metadata.name === 'sim-node-0001')}"
        )
        api = demo.api("/apis/history.kcms.io/v1alpha1/nodes/sim-node-0001")
        if chart["hist"]["points"][-1]["timestamp"] == api["points"][-1]["timestamp"]:
            break
        time.sleep(1)
    assert chart["name"] == "sim-node-0001"
    assert chart["hist"]["points"] == api["points"]  # the page drew the API's points
    assert chart["points"] == len(api["points"]) >= 3
    assert chart["series"] == 1
    assert min(browser.execute_script(CANVAS_PIXELS, "#selected-cpu canvas, #selected-memory canvas")) > 0

    # A pod with several containers: one line per container plus the pod's total.
    pod = next(p for p in snap["podHistory"] if len(p["containers"]) >= 2)
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    browser.execute_script(
        'document.querySelector(`#pods-table tr[data-namespace="${arguments[0]}"][data-pod="${arguments[1]}"]`).click()',
        ns,
        name,
    )
    chart = browser.execute_script(
        "const c = document.getElementById('selected-memory'); const s = window.kcmsDashboard.snapshot;"
        "return {points: +c.dataset.points, series: +c.dataset.series, name: document.getElementById('selected').dataset.name,"
        " hist: s.podHistory.find(h => h.metadata.name === arguments[0] && h.metadata.namespace === arguments[1])}",
        name,
        ns,
    )
    assert chart["name"] == f"{ns}/{name}"
    assert chart["series"] == len(chart["hist"]["containers"]) + 1
    stamps = {p["timestamp"] for c in chart["hist"]["containers"] for p in c["points"]}
    assert chart["points"] == len(stamps) >= 3
    legend = browser.execute_script(
        "return [...document.querySelectorAll('#selected-memory .u-legend .u-label')].map(l => l.textContent)"
    )
    assert [c["name"] for c in chart["hist"]["containers"]] == legend[2:]  # after "Time" and "pod total"


def test_custom_and_external_metrics_listed_with_values(demo, browser):
    discovered = {r["name"] for r in demo.api("/apis/custom.metrics.k8s.io/v1beta2")["resources"]}
    # The demo's node agents give node_load1 a new point every 5 s and the page reads every 10 s, at a
    # fixed phase to each other: a page drawn just before a new point never shows what the API shows
    # next. So each try loads the page afresh (its snapshot is read then) and reads the API right after.
    for _ in range(20):
        open_page(browser, demo.url)
        page = browser.execute_script(
            "const s = window.kcmsDashboard.snapshot;"
            "return {custom: s.custom, external: s.external,"
            " details: [...document.querySelectorAll('#custom-list details')].map(d => d.dataset.resource + '/' + d.dataset.metric),"
            " load: [...document.querySelectorAll('#custom-list tr[data-metric=\"node_load1\"]')].map(tr => [...tr.cells].map(c => c.textContent)),"
            " rps: [...document.querySelectorAll('#custom-list tr[data-metric=\"http_requests_per_second\"]')].map(tr => [...tr.cells].map(c => c.textContent)),"
            " external_rows: [...document.querySelectorAll('#external-table tbody tr[data-metric=\"queue_backlog\"]')].map(tr => [...tr.cells].map(c => c.textContent))}"
        )
        load_api = demo.api("/apis/custom.metrics.k8s.io/v1beta2/nodes/*/node_load1")["items"]
        load_page = next(m for m in page["custom"]["metrics"] if m["metric"] == "node_load1")["items"]
        if same_moment(load_page, load_api, lambda i: i["describedObject"]["name"]):
            break
        time.sleep(1)
    else:
        pytest.fail("the page and the API never showed the same node_load1 values")
    assert set(page["details"]) == discovered
    # Values as the API gives them (the quantity, then its plain number when it has a suffix).
    cells = {r[0]: r for r in page["load"]}
    assert set(cells) == {i["describedObject"]["name"] for i in load_api}
    for item in load_api:
        value = cells[item["describedObject"]["name"]][2]
        assert value.split(" ")[0] == item["value"]
        assert (
            value == item["value"] or value == f"{item['value']} ({float(parse_quantity(item['value'])):g})"
        )
    # Windows: a rate over 1 s is shown as such.
    rps = demo.api("/apis/custom.metrics.k8s.io/v1beta2/namespaces/team-b/pods/*/http_requests_per_second")[
        "items"
    ]
    assert rps and all(i.get("windowSeconds") == 1 for i in rps)
    assert page["rps"] and all(r[3] == "1s" for r in page["rps"])
    # External: every label set the API serves, with its value.
    ext = demo.api("/apis/external.metrics.k8s.io/v1beta1/namespaces/default/queue_backlog")["items"]
    shown = {r[2] for r in page["external_rows"]}
    assert {f"queue={i['metricLabels']['queue']}" for i in ext} <= shown
    assert any("default" in r[1].split(", ") for r in page["external_rows"])


def test_stale_node_is_shown(demo, browser):
    def stale_in_api():
        items = demo.api("/apis/history.kcms.io/v1alpha1/scrapes")["items"]
        return [s["metadata"]["name"] for s in items if s["stale"]]

    assert wait_for("the downed kubelet to be stale", stale_in_api, every=2) == ["sim-node-0004"]
    browser.get(demo.url)

    def shown():
        return browser.execute_script(
            "const r = document.querySelector('#nodes-table tr[data-node=\"sim-node-0004\"]');"
            "const s = document.querySelector('#scrapes-table tr[data-node=\"sim-node-0004\"]');"
            "return r && s && {row: r.textContent, cls: r.className, scrape: [...s.cells].map(c => c.textContent),"
            " scrapeCls: s.className, card: document.querySelector('#summary .card').textContent}"
        )

    page = wait_for("the stale node on the page", lambda: (p := shown()) and "stale" in p["row"] and p)
    assert page["cls"] == "missing"  # absent from metrics.k8s.io: no frozen old value
    assert "—" in page["row"]
    assert page["scrapeCls"] == "stale"
    assert page["scrape"][1] == "stale" and page["scrape"][3] == "connection"
    assert int(page["scrape"][4]) >= 1
    assert "1 stale" in page["card"]

    # metrics.k8s.io keeps serving a stale node's last reading until it is dropped (two
    # resolutions); in that window the summary must not count it either. The window is short in
    # the demo, so draw it: the page's own snapshot (sim-node-0004 stale in it) with that node's
    # frozen reading put back among the nodes, at 7 cores and 7 GiB so a total that took it in
    # would show.
    cards = browser.execute_script(
        "const d = window.kcmsDashboard, snap = structuredClone(d.snapshot);"
        "const cards = () => [...document.querySelectorAll('#summary .card')].map(c => c.textContent);"
        "snap.nodes = snap.nodes.filter(n => n.metadata.name !== 'sim-node-0004');"
        "d.render(snap, []);"
        "const without = cards();"
        "const frozen = structuredClone(snap.nodes[0]);"
        "frozen.metadata.name = 'sim-node-0004'; frozen.usage = {cpu: '7', memory: '7Gi'};"
        "snap.nodes.push(frozen);"
        "d.render(snap, []);"
        "const row = document.querySelector('#nodes-table tr[data-node=\"sim-node-0004\"]');"
        "return {without, with: cards(), cls: row.className, served: snap.nodes.length};"
    )
    assert cards["cls"] == "missing"
    assert cards["with"] == cards["without"]
    nodes_card, _, cpu_card, memory_card = cards["with"][:4]
    assert f"{cards['served'] - 1} with metrics" in nodes_card and "1 stale" in nodes_card
    assert cpu_card.startswith("CPU") and memory_card.startswith("Memory")


def test_hostile_label_renders_as_text(demo, browser):
    answer = demo.post(
        "/push/v1/samples",
        {
            "samples": [
                {
                    "metric": "dashboard_probe",
                    "resource": "",
                    "namespace": "default",
                    "name": "",
                    "labels": {"note": HOSTILE},
                    "value": 7,
                }
            ]
        },  # fmt: skip
    )
    assert answer["accepted"] == 1, answer
    browser.get(demo.url)
    row = wait_for(
        "the probe metric on the page",
        lambda: browser.execute_script(
            "const r = document.querySelector('#external-table tr[data-metric=\"dashboard_probe\"]');"
            "return r && [...r.cells].map(c => c.textContent)"
        ),
    )
    assert row[2] == f"note={HOSTILE}"  # shown literally
    assert row[3] == "7"
    assert browser.execute_script("return window.__pwned === undefined")
    assert browser.execute_script("return document.querySelectorAll('main img, main script').length") == 0
    # The label is visible as text on screen too.
    from selenium.webdriver.common.by import By

    cell = browser.find_element(
        By.CSS_SELECTOR, '#external-table tr[data-metric="dashboard_probe"] td.labels'
    )
    assert "<script>" in cell.text


def test_no_content_security_policy_violation(demo, browser):
    open_page(browser, demo.url)
    logs = browser.get_log("browser")
    assert not [
        e for e in logs if "Content Security Policy" in e["message"] or "Refused to" in e["message"]
    ], logs
    # Nothing but the page's own server was contacted (the CSP would block it; none is attempted).
    origins = browser.execute_script(
        "return [...new Set(performance.getEntriesByType('resource').map(e => new URL(e.name).origin))]"
    )
    assert origins == [demo.url.rsplit("/", 2)[0]]


async def test_local_server_refusals_leave_the_demo_ready(demo):
    base, token = demo.url.rstrip("/").rsplit("/", 1)
    async with aiohttp.ClientSession() as s:

        async def status(url: str, **headers: str) -> int:
            async with s.get(url, headers=headers, allow_redirects=False) as r:
                return r.status

        assert await status(base + "/") == 403
        assert await status(base + "/k8s/apis/metrics.k8s.io/v1beta1/nodes") == 403
        assert await status(demo.url, Host="evil.example") == 403
        assert await status(demo.url + "k8s/api/v1/namespaces/default/secrets") == 403
        assert await status(demo.url + "k8s/apis/metrics.k8s.io/v1beta1/nodes") == 200
    ready = await _get(demo.kubeconfig, "/apis/metrics.k8s.io/v1beta1/nodes", {})
    assert ready["items"]
    async with await KubeClient.load(demo.kubeconfig) as kube:
        assert (await kube.get_raw("/readyz")).strip() == b"ok"
    log = demo.stderr.read_text()
    assert "refused 'GET' '/<token>/k8s/api/v1/namespaces/default/secrets'" in log
    assert token not in log


def test_without_history(demo_without_history, browser):
    demo = demo_without_history
    snap = open_page(browser, demo.url)
    assert snap["history"] is False
    page = browser.execute_script(READ_TABLES)
    api_nodes = demo.api("/apis/metrics.k8s.io/v1beta1/nodes")["items"]
    assert {r[0] for r in page["nodes"]} == {n["metadata"]["name"] for n in api_nodes}
    assert "CPU history" not in page["nodeHead"] and "CPU history" not in page["podHead"]
    assert len(page["pods"]) > 10
    assert browser.execute_script("return document.querySelectorAll('canvas').length") == 0
    texts = browser.execute_script(
        "return {pods: document.getElementById('pods-note').textContent,"
        " scrapes: document.getElementById('scrapes-note').textContent,"
        " selected: document.getElementById('selected-note').textContent,"
        " errors: window.kcmsDashboard.errors}"
    )
    assert (
        "no history API" in texts["pods"]
        and "history" in texts["scrapes"]
        and "No charts" in texts["selected"]
    )
    assert texts["errors"] == []
    # The custom and external metrics are there all the same.
    assert browser.execute_script("return document.querySelectorAll('#custom-list details').length") >= 3


def test_screenshot(demo, browser, tmp_path):
    """The documentation's screenshot, 1280x900 (KCMS_WRITE_SCREENSHOT=1 writes docs/images/dashboard.png)."""
    open_page(browser, demo.url, min_points=4)
    pod = browser.execute_script(
        "const p = window.kcmsDashboard.snapshot.podHistory.find(h => h.containers.length >= 3);"
        "return p && [p.metadata.namespace, p.metadata.name]"
    )
    if pod:
        browser.execute_script(
            'document.querySelector(`#pods-table tr[data-namespace="${arguments[0]}"][data-pod="${arguments[1]}"]`).click();'
            "window.scrollTo(0, 0);",
            *pod,
        )
    time.sleep(0.5)  # let the chart paint before the capture (not a timing assertion)
    path = tmp_path / "dashboard.png"
    browser.save_screenshot(str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (1280, 900)
    if os.environ.get("KCMS_WRITE_SCREENSHOT") == "1":
        out = ROOT / "docs" / "images" / "dashboard.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)


def test_namespace_choice_and_name_filter(demo, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    open_page(browser, demo.url)
    Select(browser.find_element(By.ID, "namespace")).select_by_value("team-b")
    snap = wait_for(
        "the team-b refresh",
        lambda: (
            (s := browser.execute_script("return window.kcmsDashboard.snapshot"))
            and s["namespacesRead"] == ["team-b"]
            and s
        ),
    )
    # Pods, their metrics and the custom metrics are read in that namespace only.
    assert {p["metadata"]["namespace"] for p in snap["pods"]} == {"team-b"}
    api = demo.api("/apis/metrics.k8s.io/v1beta1/namespaces/team-b/pods")["items"]
    assert {p["metadata"]["name"] for p in snap["pods"]} == {p["metadata"]["name"] for p in api}
    for metric in snap["custom"]["metrics"]:
        for item in metric["items"]:
            assert item["describedObject"].get("namespace", "team-b") == "team-b"
    rows = browser.execute_script(
        "return [...document.querySelectorAll('#pods-table tbody tr')].map(tr => tr.dataset.namespace)"
    )
    assert rows and set(rows) == {"team-b"}
    # The name filter narrows the tables without a new read.
    box = browser.find_element(By.ID, "filter")
    box.send_keys("sim-node-0001")
    names = wait_for(
        "the filtered node table",
        lambda: (n := browser.execute_script(
            "return [...document.querySelectorAll('#nodes-table tbody tr')].map(tr => tr.dataset.node)"
        )) == ["sim-node-0001"] and n,
    )  # fmt: skip
    assert names == ["sim-node-0001"]


def test_missing_chromium_is_a_failure_naming_the_fix(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(pytest.fail.Exception, match=r"sh tests/system-deps.sh"):
        _chromium_driver()
