"""`kcms demo --prometheus URL` as a user runs it: a real subprocess against a REAL Prometheus
scraping the simulated exporter; the custom metrics it prints are read with the real kubectl and
equal Prometheus's own answer; bad flags stop it naming the flag."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest
from _kubectl import KUBECTL, get_raw
from _prometheus_helpers import PromEnv, prom_fixture  # noqa: F401  (pytest fixture)
from _stores import free_port

CUSTOM = "/apis/custom.metrics.k8s.io/v1beta2"


def _own(prom: PromEnv, expr: str) -> dict[str, float]:
    """Prometheus's own answer (urllib, not KCMS), by pod."""
    data = prom.api("query", query=expr)
    return {r["metric"]["pod"]: float(r["value"][1]) for r in data["result"]}


def _quantity(q: str) -> float:
    from kcms.quantity import parse_quantity

    return float(parse_quantity(q))


def test_demo_serves_custom_metrics_from_a_real_prometheus(prom: PromEnv, tmp_path) -> None:
    assert KUBECTL is not None, "kubectl is needed (tests/system-deps.sh does not install it)"
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kcms",
            "demo",
            "--secure-port",
            str(port),
            "--nodes",
            "1",
            "--pods-per-node",
            "2",
            "--work-dir",
            str(tmp_path),
            "--exit-after",
            "120s",
            "--no-dashboard",
            "--prometheus",
            prom.url,
        ],
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "demo.log", "w"),
        text=True,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip  (its log in a file: a pipe nobody reads could fill and block it)
    try:
        lines: list[str] = []
        assert proc.stdout is not None
        while True:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "curl" in line:
                break
        text = "".join(lines)
        commands = re.findall(r"kubectl --kubeconfig (\S+) get --raw '([^']+)'", text)
        assert commands, text + (tmp_path / "demo.log").read_text()
        kubeconfig = commands[0][0]
        raw = get_raw(kubeconfig)
        # the printed commands include the bridge's metrics for the exporter's pods
        bridge_paths = [p for _, p in commands if "team-a" in p or "/default/" in p]
        assert any("/pods/*/" in p for p in bridge_paths), text
        deadline = time.monotonic() + 60
        while True:
            ready = subprocess.run(
                [KUBECTL, "--kubeconfig", kubeconfig, "get", "--raw", "/readyz"],
                capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            if ready.returncode == 0:
                break
            assert time.monotonic() < deadline, ready.stderr
            time.sleep(0.5)
        for path in bridge_paths:
            body = raw(path)
            assert body["items"], path

        discovery = {r["name"] for r in raw(CUSTOM)["resources"]}
        assert {"pods/container_cpu_usage_seconds_per_second", "pods/http_requests_in_flight",
                "deployments.apps/queue_messages_ready"} <= discovery, discovery  # fmt: skip

        # a gauge: exactly Prometheus's own answer, for one pod and for all pods of a namespace
        exp = prom.exporter
        own = _own(prom, 'sum(http_requests_in_flight{namespace="team-a"}) by (pod)')
        one = raw(f"{CUSTOM}/namespaces/team-a/pods/web-1/http_requests_in_flight")["items"]
        assert [(i["describedObject"]["name"], _quantity(i["value"])) for i in one] == [
            ("web-1", own["web-1"])
        ]
        every = raw(f"{CUSTOM}/namespaces/team-a/pods/*/http_requests_in_flight")["items"]
        assert {i["describedObject"]["name"]: _quantity(i["value"]) for i in every} == own
        assert own == {p.name: exp.in_flight(p) for p in exp.pods if p.namespace == "team-a"}

        # a counter as a rate (the default rules' 1m window): Prometheus's own answer, the exporter's rate
        cpu = "container_cpu_usage_seconds_per_second"
        rates = raw(f"{CUSTOM}/namespaces/default/pods/*/{cpu}")["items"]
        own_rates = _own(
            prom, 'sum(rate(container_cpu_usage_seconds_total{namespace="default"}[1m])) by (pod)'
        )
        assert (
            {i["describedObject"]["name"] for i in rates}
            == set(own_rates)
            == {p.name for p in exp.pods if p.namespace == "default"}
        )
        for item in rates:
            assert _quantity(item["value"]) == pytest.approx(
                own_rates[item["describedObject"]["name"]], rel=0.05
            )

        # a deployment metric from the deployment label
        deps = raw(f"{CUSTOM}/namespaces/default/deployments.apps/web/queue_messages_ready")["items"]
        assert [_quantity(i["value"]) for i in deps] == [exp.deployment_queue("default", "web")]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    err = (tmp_path / "demo.log").read_text()
    assert "Traceback" not in err, err[-3000:]


def test_demo_with_prometheus_down_still_serves_and_reports_it(tmp_path) -> None:
    """Nothing listens at --prometheus: the demo starts, serves metrics.k8s.io and the store's
    custom metrics, reports the failing relist in /readyz?verbose, logs no traceback."""
    assert KUBECTL is not None, "kubectl is needed"
    port, down = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kcms", "demo", "--secure-port", str(port), "--nodes", "1", "--pods-per-node", "2",
         "--work-dir", str(tmp_path), "--exit-after", "90s", "--no-dashboard",
         "--prometheus", f"http://127.0.0.1:{down}/prometheus"],
        stdout=subprocess.PIPE, stderr=open(tmp_path / "demo.log", "w"), text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        text = ""
        while "curl" not in text:
            line = proc.stdout.readline()
            assert line, text + (tmp_path / "demo.log").read_text()
            text += line
        kubeconfig = re.findall(r"kubectl --kubeconfig (\S+) get --raw", text)[0]
        raw = get_raw(kubeconfig)
        deadline = time.monotonic() + 60
        while True:  # the simulated kubelets are scraped whatever Prometheus does
            nodes = subprocess.run(
                [KUBECTL, "--kubeconfig", kubeconfig, "get", "--raw", "/apis/metrics.k8s.io/v1beta1/nodes"],
                capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            if nodes.returncode == 0 and json.loads(nodes.stdout)["items"]:
                break
            assert time.monotonic() < deadline, nodes.stderr
            time.sleep(0.5)
        verbose = subprocess.run(
            [KUBECTL, "--kubeconfig", kubeconfig, "get", "--raw", "/readyz?verbose"],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        report = verbose.stdout + verbose.stderr
        assert "prometheus-discovery" in report and "unavailable" in report, report
        assert raw(CUSTOM)["kind"] == "APIResourceList"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    err = (tmp_path / "demo.log").read_text()
    assert "cannot list pods" in err and "Traceback" not in err, err[-3000:]


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--prometheus", "prometheus:9090"], "--prometheus"),
        (["--prometheus", "ftp://h/"], "--prometheus"),
        (["--prometheus-config", "/etc/hostname"], "--prometheus-config"),
        (
            ["--prometheus", "http://127.0.0.1:9", "--prometheus-config", "/nonexistent.yaml"],
            "--prometheus-config",
        ),
        (
            ["--prometheus", "http://127.0.0.1:9", "--prometheus-config", "/etc/hostname"],
            "--prometheus-config",
        ),
    ],
)
def test_demo_bad_prometheus_flags_stop_it_naming_the_flag(argv: list[str], flag: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kcms", "demo", "--no-dashboard", *argv],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert f"argument {flag}:" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_demo_default_config_loads_and_renders() -> None:
    """The default rules are prometheus-adapter's format as the bridge reads it."""
    from kcms.apis.prometheus.config import load_adapter_config
    from kcms.cmd.demo_prometheus import DEMO_ADAPTER_CONFIG

    config = load_adapter_config(DEMO_ADAPTER_CONFIG, "<demo>")
    assert len(config.rules) == 3 and not config.external_rules and config.resource_rules is None
