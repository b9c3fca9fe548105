"""The monitoring assets in deploy/monitoring/: alerting rules, their promtool unit tests, the Grafana dashboard.

The rules are checked and unit-tested by the real ``promtool`` (a missing promtool fails, it never
skips). Every metric name the rules and the dashboard use must be one KCMS really exposes: read
from the live ``/metrics`` of a real ``kcms demo`` process (standalone mode) and of a real
``kcms store`` process (multi-store), plus, for the components not started here (agent, push
ingestion, collector with quorum writes), the registry a process holds after importing every
``kcms`` module — so a metric renamed or removed in the code fails this test, not an operator's
dashboard.
"""

from __future__ import annotations

import json
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests._stores import free_port

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "deploy" / "monitoring"
ALERTS = MONITORING / "alerts.yaml"
ALERT_TESTS = MONITORING / "alerts_test.yaml"
OPERATOR_RULE = MONITORING / "prometheus-rule.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"

# Names in PromQL that are metrics KCMS itself exposes (up, time(), ... are Prometheus's own).
OWN_METRIC = re.compile(r"\b(?:kcms|process|python)_[a-zA-Z0-9_]+\b")
START_WAIT_SECONDS = 90.0  # a generous bound for a process to start on a loaded machine, not a timing check


def promtool() -> str:
    path = shutil.which("promtool") or ("/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None)
    if path is None:
        pytest.fail("promtool is not installed: run `sh tests/system-deps.sh` (Debian package prometheus)")
    return path


def alert_rules() -> list[dict]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def metric_names(exposition: str) -> set[str]:
    """Every sample name an exposition can carry, from its families (a labelled family with no child
    yet has only HELP/TYPE lines: its names still count)."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "summary": ("_sum", "_count", "_created"),
        "gauge": ("",),
        "info": ("_info",),
    }
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def wait_for_metrics(url: str, proc: subprocess.Popen, context: ssl.SSLContext | None = None) -> str:
    deadline = time.monotonic() + START_WAIT_SECONDS
    while True:
        if proc.poll() is not None:
            pytest.fail(f"{proc.args} exited with {proc.returncode} before serving {url}")
        try:
            with urllib.request.urlopen(url, timeout=5, context=context) as response:
                return response.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail(f"{url} did not answer within {START_WAIT_SECONDS:g}s")
            time.sleep(0.5)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class Demo:
    port: int
    context: ssl.SSLContext
    cert: Path
    proc: subprocess.Popen


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Iterator[Demo]:
    """A real `kcms demo` process (collector, store and server in one process), up for the module."""
    work = tmp_path_factory.mktemp("demo")
    port = free_port()
    cmd = [sys.executable, "-m", "kcms", "demo", f"--secure-port={port}", "--nodes=2", "--pods-per-node=2",
           f"--work-dir={work}", "--exit-after=600s"]  # fmt: skip
    log_path = work / "demo.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        # The banner is printed once the server listens and its certificate is written.
        deadline = time.monotonic() + START_WAIT_SECONDS
        while b"KCMS demo:" not in log_path.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"kcms demo did not start; log: {log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        cert = work / "certs" / "apiserver.crt"
        yield Demo(port, ssl.create_default_context(cafile=str(cert)), cert, proc)
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def demo_metrics(demo: Demo) -> set[str]:
    """The /metrics of the real `kcms demo`."""
    return metric_names(wait_for_metrics(f"https://127.0.0.1:{demo.port}/metrics", demo.proc, demo.context))


@pytest.fixture(scope="module")
def store_metrics(tmp_path_factory) -> set[str]:
    """The /metrics of a real `kcms store` replica (the multi-store mode's store service)."""
    work = tmp_path_factory.mktemp("store")
    token = work / "token"
    token.write_text("monitoring-test-token\n")
    port = free_port()
    cmd = [sys.executable, "-m", "kcms", "store", "--bind-address=127.0.0.1", f"--port={port}",
           f"--token-file={token}", "--store-name=s0", f"--store-endpoints=s0=http://127.0.0.1:{port}",
           "--refill-timeout=1s"]  # fmt: skip
    with open(work / "store.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        text = wait_for_metrics(f"http://127.0.0.1:{port}/metrics", proc)
    finally:
        stop(proc)
    return metric_names(text)


@pytest.fixture(scope="module")
def component_metrics() -> set[str]:
    """The default registry of a process that imported every kcms module: the metrics of the
    components not started here (agent, push ingestion, the collector's quorum writes)."""
    script = (
        "import importlib, pathlib, sys\n"
        "from prometheus_client import REGISTRY, generate_latest\n"
        "for p in sorted(pathlib.Path('kcms').rglob('*.py')):\n"
        "    parts = list(p.with_suffix('').parts)\n"
        "    if parts[-1] == '__main__':\n"
        "        continue\n"
        "    if parts[-1] == '__init__':\n"
        "        parts.pop()\n"
        "    importlib.import_module('.'.join(parts))\n"
        "sys.stdout.write(generate_latest(REGISTRY).decode())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return metric_names(result.stdout)


def test_promtool_check_rules():
    result = subprocess.run([promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_promtool_unit_tests_pass_and_cover_every_alert():
    result = subprocess.run(
        [promtool(), "test", "rules", ALERT_TESTS.name], cwd=MONITORING, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    fired: dict[str, int] = {}
    quiet: set[str] = set()
    for group in tests:
        series = {s["series"] for s in group["input_series"]}
        for check in group["alert_rule_test"]:
            if check["exp_alerts"]:
                fired[check["alertname"]] = len(check["exp_alerts"])
                # Some input series must stay silent: every test pits series past the threshold
                # against series that are not (the not-firing half of the test).
                assert len(series) > len(check["exp_alerts"]), group["name"]
            else:
                quiet.add(check["alertname"])
    names = {r["alert"] for r in alert_rules()}
    assert names - set(fired) == set(), "alerts with no test that makes them fire"
    # Alerts with a `for` also have a check before it elapses.
    assert {r["alert"] for r in alert_rules() if "for" in r} - quiet == set()


def test_promtool_unit_tests_catch_a_broken_rule(tmp_path):
    """The unit tests can fail: the same tests against rules without their `for` and with looser
    thresholds report failures."""
    broken = re.sub(r"\n\s+for: \w+", "", ALERTS.read_text()).replace("> 0.05", "> 0.01")
    (tmp_path / "alerts.yaml").write_text(broken)
    shutil.copy(ALERT_TESTS, tmp_path / "alerts_test.yaml")
    result = subprocess.run(
        [promtool(), "test", "rules", "alerts_test.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "KCMSDown" in result.stdout + result.stderr
    assert "KCMSStoreQuorumWriteFailures" in result.stdout + result.stderr


def test_prometheus_rule_resource_carries_the_same_rules():
    rule = yaml.safe_load(OPERATOR_RULE.read_text())
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["kind"] == "PrometheusRule"
    assert rule["metadata"]["name"]
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]


def test_every_alert_is_documented():
    doc = (ROOT / "docs" / "monitoring.md").read_text()
    for rule in alert_rules():
        assert f"`{rule['alert']}`" in doc, rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_every_metric_used_is_exposed_by_kcms(demo_metrics, store_metrics, component_metrics):
    # The live processes really were read (not an empty set that everything would fail against).
    assert "kcms_apiserver_requests_total" in demo_metrics
    assert "kcms_kubelet_scrapes_total" in demo_metrics
    assert "kcms_store_series" in store_metrics
    exposed = demo_metrics | store_metrics | component_metrics
    used: dict[str, set[str]] = {}
    for rule in alert_rules():
        for name in OWN_METRIC.findall(rule["expr"]):
            used.setdefault(name, set()).add(f"alert {rule['alert']}")
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            for name in OWN_METRIC.findall(target["expr"]):
                used.setdefault(name, set()).add(f"panel {panel['title']!r}")
    assert len(used) > 30
    unknown = {name: sorted(where) for name, where in used.items() if name not in exposed}
    assert not unknown, f"metric names KCMS does not expose: {unknown}"


def test_every_metric_used_in_the_documentation_table_is_exposed(
    demo_metrics, store_metrics, component_metrics
):
    doc = (ROOT / "docs" / "monitoring.md").read_text()
    table = {m.group(1) for m in re.finditer(r"^\| `((?:kcms|process)_[a-z0-9_]+)`", doc, re.M)}
    assert len(table) > 30
    exposed = demo_metrics | store_metrics | component_metrics
    histograms = {n[: -len("_bucket")] for n in exposed if n.endswith("_bucket")}
    assert table - exposed - histograms == set(), "documented metrics KCMS does not expose"
    # Every kcms metric KCMS exposes is in the table (a new metric gets its line there).
    families = {
        n
        for n in exposed
        if n.startswith("kcms_") and not n.endswith(("_created", "_bucket", "_sum", "_count"))
    }
    kcms_histograms = {n for n in histograms if n.startswith("kcms_")}
    assert (families | kcms_histograms) - table == set(), (
        "exposed kcms metrics missing from docs/monitoring.md"
    )


def test_grafana_dashboard_is_a_valid_dashboard():
    d = dashboard()
    assert re.fullmatch(r"[a-z0-9-]{1,40}", d["uid"])
    assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 30
    assert d["title"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    panels = [p for p in d["panels"] if p["type"] != "row"]
    assert len(panels) >= 20
    for p in panels:
        assert p["title"] and p["description"], p
        assert p["type"] in ("timeseries", "stat")
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        g = p["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert t["expr"].strip(), p["title"]
    for name in ("job", "instance"):
        assert variables[name]["datasource"]["uid"] == "${datasource}"


def test_grafana_dashboard_promql_parses():
    """Every query of the dashboard, with its variables filled in, is valid PromQL: promtool
    parses it as a recording rule."""
    exprs = dashboard_exprs()
    d = dashboard()
    exprs += [v["definition"].replace("label_values(", "count by (x) (").rsplit(",", 1)[0] + ")"
              for v in d["templating"]["list"] if v["type"] == "query"]  # fmt: skip
    filled = [
        e.replace("$__rate_interval", "5m").replace('"$job"', '"kcms.*"').replace('"$instance"', '".*"')
        for e in exprs
    ]
    assert not any("$" in e for e in filled), [e for e in filled if "$" in e]
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"panel:q{i}", "expr": e} for i, e in enumerate(filled)],
            }
        ]
    }
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(rules, f)
        f.flush()
        result = subprocess.run([promtool(), "check", "rules", f.name], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_kustomization_renders_the_rule_and_the_dashboard():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not installed: run `sh tests/system-deps.sh`")
    result = subprocess.run([kubectl, "kustomize", str(MONITORING)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    objects = {d["kind"]: d for d in yaml.safe_load_all(result.stdout)}
    assert set(objects) == {"PrometheusRule", "ConfigMap"}
    assert objects["PrometheusRule"]["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]
    config_map = objects["ConfigMap"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["grafana-dashboard.json"]) == dashboard()


def _get_json(url: str, context: ssl.SSLContext | None = None) -> dict:
    with urllib.request.urlopen(url, timeout=10, context=context) as response:
        return json.loads(response.read())


# Panels that must show data for a healthy standalone KCMS (the demo) once it has been scraped a
# few times and served a few API requests; the others show multi-store, push, agent or bridge data.
STANDALONE_PANELS = (
    "Targets up",
    "Seconds since last scrape cycle",
    "Kubelet scrapes by result",
    "Nodes missing / stale",
    "Scrape durations",
    "Agent scrapes by result",
    "Store size",
    "API requests by code",
    "API latency",
    "In flight and throttled",
    "Authentication and authorization",
    "Process memory and CPU",
)


def test_rules_and_dashboard_work_on_a_real_prometheus_scraping_kcms(demo: Demo, tmp_path):
    """A real Prometheus scrapes the real `kcms demo` with the rules loaded: every rule evaluates
    without error, no alert is pending or firing for this healthy KCMS, and every dashboard query
    runs (the standalone panels with data)."""
    prometheus = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(prometheus).exists():
        pytest.fail("prometheus is not installed: run `sh tests/system-deps.sh` (Debian package prometheus)")
    shutil.copy(ALERTS, tmp_path / "alerts.yaml")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["alerts.yaml"],
        "scrape_configs": [
            {
                "job_name": "kcms-demo",
                "scheme": "https",
                "tls_config": {"ca_file": str(demo.cert)},
                "static_configs": [{"targets": [f"127.0.0.1:{demo.port}"]}],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    web = free_port()
    with open(tmp_path / "prometheus.log", "wb") as log:
        proc = subprocess.Popen(
            [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{web}"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    api = f"http://127.0.0.1:{web}/api/v1"

    def query(expr: str) -> list:
        body = _get_json(f"{api}/query?" + urllib.parse.urlencode({"query": expr}))
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    try:
        for _ in range(5):  # API requests for the API panels (the scrape's own /metrics is group "")
            _get_json(f"https://127.0.0.1:{demo.port}/apis/metrics.k8s.io/v1beta1/nodes", demo.context)
        deadline = time.monotonic() + START_WAIT_SECONDS
        while True:  # enough scrapes for rate() over the 30s the dashboard's $__rate_interval is given here
            try:
                scrapes = query('count_over_time(up{job="kcms-demo"}[1m])')
                if scrapes and float(scrapes[0]["value"][1]) >= 8:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"Prometheus did not scrape kcms demo: {(tmp_path / 'prometheus.log').read_text()[-3000:]}"
                )
            time.sleep(0.5)
        assert query('up{job="kcms-demo"}')[0]["value"][1] == "1"
        groups = _get_json(f"{api}/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        assert len(rules) == len(alert_rules())
        for rule in rules:
            assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
        assert _get_json(f"{api}/alerts")["data"]["alerts"] == []
        for panel in dashboard()["panels"]:
            for target in panel.get("targets", []):
                expr = (
                    target["expr"].replace("$__rate_interval", "30s")
                    .replace('"$job"', '"kcms.*"').replace('"$instance"', '".*"')
                )  # fmt: skip
                result = query(expr)
                if panel["title"] in STANDALONE_PANELS and target["refId"] == "A":
                    assert result, f"panel {panel['title']!r} shows nothing for kcms demo: {expr}"
    finally:
        stop(proc)
