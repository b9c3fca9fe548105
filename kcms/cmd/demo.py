"""`kcms demo`: simulated kubelets plus the standalone pipeline on loopback, no cluster needed."""

from __future__ import annotations

import argparse
import asyncio
import base64
import logging
import os
import signal
import tempfile

from kcms import certs
from kcms.apiserver import AuthnOptions, AuthzOptions, ServingOptions
from kcms.cmd.demo_prometheus import examples as prometheus_examples
from kcms.cmd.demo_prometheus import found_pods, standalone_flags
from kcms.cmd.standalone import build_pipeline, kubelet_config
from kcms.collector.kubelet import KubeletClient
from kcms.kube.inventory import StaticInventory
from kcms.sim import SimulatedCluster
from kcms.sim.agents import SimulatedAgents

log = logging.getLogger(__name__)

EXAMPLES = (
    "/apis/metrics.k8s.io/v1beta1/nodes",
    "/apis/metrics.k8s.io/v1beta1/nodes/{node}",
    "/apis/metrics.k8s.io/v1beta1/pods",
    "/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods?labelSelector=app%3D{app}",
    "/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods/{pod}",
    "/apis/custom.metrics.k8s.io/v1beta2",
    "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/*/http_requests_per_second",
    "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/deployments.apps/{app}/queue_backlog",
    "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/deployments.apps/{app}/queue_backlog_agg_max_5m",
    "/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/queue_backlog?labelSelector=queue%3Demails",
)
HISTORY_EXAMPLES = (
    "/apis/history.kcms.io/v1alpha1/nodes/{node}?since=5m",
    "/apis/history.kcms.io/v1alpha1/namespaces/{namespace}/pods/{pod}",
    "/apis/history.kcms.io/v1alpha1/scrapes",
)


def issue_client_certificate(work_dir: str, user: str = "demo-user") -> tuple[str, str, str]:
    """A client CA and a certificate for ``user`` signed by it; returns (ca, cert, key) file paths.

    kubectl prompts for a password when its kubeconfig names no credentials, so the demo hands
    it a client certificate instead of relying on anonymous access.
    """
    ca_key, ca = certs.new_ca("kcms-demo-client-ca", days=30)
    key, cert = certs.issue(ca_key, ca, user, organizations=("demo",), client=True, days=30)
    paths = tuple(os.path.join(work_dir, n) for n in ("client-ca.crt", "client.crt", "client.key"))
    for path, data in zip(paths[:2], (certs.cert_pem(ca), certs.cert_pem(cert)), strict=True):
        with open(path, "wb") as f:
            f.write(data)
    certs.write_private(paths[2], certs.key_pem(key))
    return paths  # type: ignore[return-value]


def _b64(path: str) -> str:
    with open(path, "rb") as f:
        return base64.b64encode(f.read()).decode()


def write_kubeconfig(path: str, server: str, ca_file: str, cert_file: str, key_file: str) -> None:
    """A kubeconfig for kubectl: trusts the demo's serving certificate, authenticates by client cert."""
    ca_data = _b64(ca_file)
    text = f"""apiVersion: v1
kind: Config
clusters:
- name: kcms-demo
  cluster:
    server: {server}
    certificate-authority-data: {ca_data}
users:
- name: demo-user
  user:
    client-certificate-data: {_b64(cert_file)}
    client-key-data: {_b64(key_file)}
contexts:
- name: kcms-demo
  context:
    cluster: kcms-demo
    user: demo-user
current-context: kcms-demo
"""
    with open(path, "w") as f:
        f.write(text)


def demo_args(
    args: argparse.Namespace, parser: argparse.ArgumentParser, extra: list[str] | None = None
) -> argparse.Namespace:
    """The `kcms standalone` flags the demo runs with (every other flag at its default).

    ``parser`` is `kcms`'s own (``kcms.cmd.main.build_parser("standalone")``), passed in by the caller:
    the CLI imports this module, so importing the CLI back would be a cycle (tests/test_layout.py).
    """
    return parser.parse_args(
        [
            "standalone",
            "--kubelet-use-node-status-port",  # every simulated kubelet has a port of its own
            "--kubelet-preferred-address-types=InternalIP",
            f"--metric-resolution={args.metric_resolution}s",
            "--agent-insecure-http",  # the simulated agents serve plain HTTP on loopback
            f"--history={args.history}s",  # 0: off (history.kcms.io absent)
            *(extra or []),  # --prometheus: the bridge's flags (kcms/cmd/demo_prometheus.py)
        ]
    )


async def _take_down(cluster: SimulatedCluster, names: list[str], after: float) -> None:
    """--down-nodes: these kubelets refuse connections from ``after`` seconds on (stale nodes)."""
    await asyncio.sleep(after)
    for name in names:
        cluster.set_node_mode(name, "down")
    log.info("demo: simulated kubelets %s are down now (--down-nodes)", ", ".join(names))


async def run_demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="kcms-demo-")
    os.makedirs(work_dir, exist_ok=True)
    client_ca, client_cert, client_key = issue_client_certificate(work_dir)
    cluster = SimulatedCluster(
        nodes=args.nodes, pods_per_node=args.pods_per_node, one_port_per_node=True, seed=1
    )
    await cluster.start()
    objects = cluster.inventory_objects()
    simulated = [
        (o["metadata"]["namespace"], o["metadata"]["name"]) for o in objects if o.get("kind") == "Pod"
    ]
    prometheus_pods = await found_pods(args, simulated)  # --prometheus: the pods its series name
    inventory = StaticInventory(objects + prometheus_pods)
    settings = demo_args(args, parser, standalone_flags(args, work_dir))
    kubelets = KubeletClient(kubelet_config(settings, extra_ca_pem=[cluster.ca_pem.decode()]))
    serving = ServingOptions(
        secure_port=args.secure_port, bind_address="127.0.0.1", cert_dir=os.path.join(work_dir, "certs")
    )
    # Simulated node agents serve the pods' application metrics; the pipeline's agent collector
    # scrapes them into the series store, as it scrapes `kcms agent` pods in a cluster.
    agents = SimulatedAgents(cluster, history=10.0)
    await agents.start()
    pipeline = build_pipeline(
        settings,
        inventory,
        kubelets,
        serving,
        AuthnOptions(skip_lookup=True, allow_anonymous=True, client_ca_file=client_ca),
        AuthzOptions(allow_all=True),
        agent_targets=agents.bound_targets,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    dashboard = None
    tasks: list[asyncio.Task] = []
    try:
        await pipeline.start()
        port = pipeline.server.port
        kubeconfig = os.path.join(work_dir, "kubeconfig")
        write_kubeconfig(
            kubeconfig,
            f"https://127.0.0.1:{port}",
            pipeline.server.serving_cert_file,
            client_cert,
            client_key,
        )
        pod = next(iter(inventory.pods()))
        print(
            f"KCMS demo: {args.nodes} simulated kubelets x {args.pods_per_node} pods on loopback; "
            f"metrics.k8s.io served on https://127.0.0.1:{port}\n"
            "Anonymous reads are allowed and only 127.0.0.1 is bound: a demo, not a deployment.\n"
            "Metrics are ready a few seconds after start. Try:",
            flush=True,
        )
        for path in EXAMPLES + (HISTORY_EXAMPLES if settings.history > 0 else ()):
            path = path.format(
                node=next(iter(inventory.nodes())).name,
                namespace=pod.namespace,
                pod=pod.name,
                app=pod.labels.get("app", ""),
            )
            print(f"  kubectl --kubeconfig {kubeconfig} get --raw '{path}'", flush=True)
        taken = {p.split("?")[0].rsplit("/", 1)[1] for p in EXAMPLES}  # the store's names win
        for path in prometheus_examples(pipeline.bridge, prometheus_pods, taken):  # from --prometheus
            print(f"  kubectl --kubeconfig {kubeconfig} get --raw '{path}'", flush=True)
        print(
            f"  curl --cacert {pipeline.server.serving_cert_file} https://127.0.0.1:{port}/readyz?verbose",
            flush=True,
        )
        if args.down_nodes:
            names = sorted(cluster.node_names())[-args.down_nodes :]
            tasks.append(asyncio.create_task(_take_down(cluster, names, 2 * args.metric_resolution + 1)))
        if not args.no_dashboard:
            from kcms.dashboard import open_dashboard

            dashboard = await open_dashboard(kubeconfig, port=args.dashboard_port, context="kcms-demo")
            print(
                f"Dashboard (127.0.0.1 only; the URL holds this run's token):\n  {dashboard.url}", flush=True
            )
        if args.exit_after:
            try:
                await asyncio.wait_for(stop.wait(), args.exit_after)
            except TimeoutError:
                pass
        else:
            await stop.wait()
    finally:
        for task in tasks:
            task.cancel()
        if dashboard is not None:
            await dashboard.stop()
        await pipeline.stop()
        await agents.stop()
        await cluster.stop()
    return 0
