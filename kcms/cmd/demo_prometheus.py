"""`kcms demo --prometheus URL`: the demo's pipeline also serves custom metrics from a real
Prometheus (or Thanos, Mimir, VictoriaMetrics) through the Prometheus bridge (docs/prometheus.md).

The bridge is given ``URL`` and an adapter configuration: ``--prometheus-config FILE`` (any
prometheus-adapter config), else :data:`DEMO_ADAPTER_CONFIG`, which matches what most
Prometheus servers hold: every series with ``namespace`` and ``pod`` labels is a pod metric
(counters ``*_total`` as ``*_per_second`` rates over 1m, the rest as they are), and those that
also have a ``deployment`` label are ``deployments.apps`` metrics too. Before it starts, the demo
lists those series once and adds the pods they name (at most :data:`MAX_FOUND_PODS`) to its
inventory beside the simulated ones, so wildcard reads (``pods/*``) find them as they would
find a cluster's pods (Deployments are not listed: read them by name). After the first relist it prints ``kubectl get --raw`` commands for the
metrics the bridge discovered. Routing is standalone's default (``--metric-sources store,prometheus``):
a name both Prometheus and the demo's simulated apps have (``http_requests_per_second``, say) is the
simulated apps', so the printed examples name only metrics the apps do not have.
metrics.k8s.io stays on the simulated kubelets.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Iterable
from typing import Any

from kcms.limits import DNS_LABEL_RE, DNS_SUBDOMAIN_RE, printable

log = logging.getLogger(__name__)

MAX_FOUND_PODS = 10_000  # pods taken from Prometheus's series into the demo's inventory
FIND_WINDOW = 600.0  # seconds of series history looked at for those pods
RELIST_INTERVAL = "10s"  # the demo's discovery refresh (a deployment's default is 1m)
POD_SERIES = '{namespace!="",pod!=""}'

DEMO_ADAPTER_CONFIG = """\
# kcms demo --prometheus: the default rules (give your own with --prometheus-config FILE)
rules:
- seriesQuery: '{__name__=~"^.+_total$",namespace!="",pod!=""}'
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
  name:
    matches: "^(.*)_total$"
    as: "${1}_per_second"
  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[1m])) by (<<.GroupBy>>)'
- seriesQuery: '{__name__!~"^.+_total$",namespace!="",pod!=""}'
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
- seriesQuery: '{__name__!~"^.+_total$",namespace!="",deployment!=""}'
  resources:
    overrides:
      namespace: {resource: namespace}
      deployment: {group: apps, resource: deployment}
  metricsQuery: 'max(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
"""


def flag_problem(args: argparse.Namespace) -> str | None:
    """The first bad ``--prometheus``/``--prometheus-config`` as ``argument --x: ...``, or None."""
    from kcms.sources.prometheus_api import api_url

    url = getattr(args, "prometheus", "")
    config = getattr(args, "prometheus_config", "")
    if config and not url:
        return "argument --prometheus-config: give it with --prometheus URL"
    if not url:
        return None
    try:
        api_url(url, "api/v1/query")
    except ValueError as e:
        return f"argument --prometheus: {e}"
    if config:
        from kcms.apis.prometheus.config import ConfigError, read_adapter_config

        try:
            read_adapter_config(config)
        except ConfigError as e:
            return f"argument --prometheus-config: {e}"
    return None


def standalone_flags(args: argparse.Namespace, work_dir: str) -> list[str]:
    """The `kcms standalone` flags of the bridge for this demo ([] without ``--prometheus``);
    the default config is written into ``work_dir``."""
    if not getattr(args, "prometheus", ""):
        return []
    config = args.prometheus_config
    if not config:
        config = os.path.join(work_dir, "prometheus-adapter.yaml")
        with open(config, "w") as f:
            f.write(DEMO_ADAPTER_CONFIG)
    return [
        f"--prometheus-url={args.prometheus}",
        f"--config={config}",
        f"--metrics-relist-interval={RELIST_INTERVAL}",
    ]


DEPLOYMENT_NOTE = "kcms.demo/deployment"  # the series' deployment label, kept for the printed examples


def _pod_object(namespace: str, name: str, node: str, deployment: str) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "namespace": namespace,
            "name": name,
            "uid": f"prometheus-{namespace}-{name}"[:63],
            "annotations": {DEPLOYMENT_NOTE: deployment} if deployment else {},
        },
        "spec": {"nodeName": node, "containers": []},
        "status": {"phase": "Running"},
    }


async def found_pods(args: argparse.Namespace, known: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
    """Pod objects for the pods Prometheus's series name (``namespace`` + ``pod`` labels, seen in
    the last 10 minutes) that the demo does not simulate; [] (logged) when Prometheus cannot be
    read: the bridge then reports its failing relist in /readyz?verbose."""
    if not getattr(args, "prometheus", ""):
        return []
    from kcms.sources.prometheus_api import PrometheusClient, PrometheusError

    have = set(known)
    out: list[dict[str, Any]] = []
    now = time.time()
    try:
        async with PrometheusClient(args.prometheus) as client:
            series = await client.series([POD_SERIES], start=now - FIND_WINDOW, end=now)
    except PrometheusError as e:
        log.warning("demo: cannot list pods from %s: %s", printable(args.prometheus), e)
        return []
    for labels in series:
        ns, pod = labels.get("namespace", ""), labels.get("pod", "")
        if (ns, pod) in have or not DNS_LABEL_RE.fullmatch(ns) or not DNS_SUBDOMAIN_RE.fullmatch(pod):
            continue
        node, deployment = labels.get("node", ""), labels.get("deployment", "")
        have.add((ns, pod))
        ok = DNS_SUBDOMAIN_RE.fullmatch
        out.append(_pod_object(ns, pod, node if ok(node) else "", deployment if ok(deployment) else ""))
        if len(out) >= MAX_FOUND_PODS:
            break
    log.info("demo: %d pods found in Prometheus's series join the inventory", len(out))
    return out


def examples(bridge: Any, pods: list[dict[str, Any]], taken: Iterable[str] = ()) -> list[str]:
    """``get --raw`` paths for what the bridge discovered: a pod metric for one found pod and for
    all pods of its namespace, and a deployment metric of that pod's deployment label (named: the
    demo has no Deployments to list for ``deployments.apps/*``). Metric names in ``taken`` (the
    demo's own examples: the store serves those names) are left out."""
    if bridge is None or not pods:
        return []
    first = pods[0]["metadata"]
    ns, pod = first["namespace"], first["name"]
    taken = set(taken)
    infos = [i for i in bridge.provider.list_metrics() if i.metric not in taken]
    pod_metrics = sorted(i.metric for i in infos if str(i.resource) == "pods")
    deployment_metrics = sorted(i.metric for i in infos if str(i.resource) == "deployments.apps")
    base = "/apis/custom.metrics.k8s.io/v1beta2"
    paths = []
    for metric in pod_metrics[:2]:
        paths.append(f"{base}/namespaces/{ns}/pods/{pod}/{metric}")
        paths.append(f"{base}/namespaces/{ns}/pods/*/{metric}")
    deployment = first.get("annotations", {}).get(DEPLOYMENT_NOTE, "")
    if deployment_metrics and deployment:
        paths.append(f"{base}/namespaces/{ns}/deployments.apps/{deployment}/{deployment_metrics[0]}")
    return paths
