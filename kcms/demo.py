"""`kcms demo`: simulated kubelets plus the standalone pipeline on loopback, no cluster needed."""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import logging
import os
import signal
import tempfile
from types import SimpleNamespace

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kcms.apiserver import AuthnOptions, AuthzOptions, ServingOptions
from kcms.collector.kubelet import KubeletClient
from kcms.kube.inventory import StaticInventory
from kcms.sim import SimulatedCluster
from kcms.standalone import build_pipeline, kubelet_config

log = logging.getLogger(__name__)

EXAMPLES = (
    "/apis/metrics.k8s.io/v1beta1/nodes",
    "/apis/metrics.k8s.io/v1beta1/nodes/{node}",
    "/apis/metrics.k8s.io/v1beta1/pods",
    "/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods",
    "/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods?labelSelector=app%3D{app}",
    "/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods/{pod}",
)


def issue_client_certificate(work_dir: str, user: str = "demo-user") -> tuple[str, str, str]:
    """A client CA and a certificate for ``user`` signed by it; returns (ca, cert, key) file paths.

    kubectl prompts for a password when its kubeconfig names no credentials, so the demo hands
    it a client certificate instead of relying on anonymous access.
    """
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kcms-demo-client-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "demo"), x509.NameAttribute(NameOID.COMMON_NAME, user)]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = tuple(os.path.join(work_dir, n) for n in ("client-ca.crt", "client.crt", "client.key"))
    pem = serialization.Encoding.PEM
    with open(paths[0], "wb") as f:
        f.write(ca.public_bytes(pem))
    with open(paths[1], "wb") as f:
        f.write(cert.public_bytes(pem))
    fd = os.open(paths[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
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


def demo_args(args: argparse.Namespace) -> argparse.Namespace:
    """The standalone flags the demo runs with."""
    return SimpleNamespace(
        metric_resolution=args.metric_resolution,
        kubelet_port=10250,
        kubelet_use_node_status_port=True,  # every simulated kubelet has a port of its own
        kubelet_preferred_address_types=["InternalIP"],
        kubelet_insecure_tls=False,
        kubelet_certificate_authority="",
        kubelet_client_certificate="",
        kubelet_client_key="",
        kubelet_request_timeout=10.0,
        kubelet_endpoint="resource",
        kubelet_max_body_bytes=10 * 1024 * 1024,
        kubelet_max_in_flight=200,
        node_selector="",
    )  # type: ignore[return-value]


async def run_demo(args: argparse.Namespace) -> int:
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="kcms-demo-")
    os.makedirs(work_dir, exist_ok=True)
    client_ca, client_cert, client_key = issue_client_certificate(work_dir)
    cluster = SimulatedCluster(
        nodes=args.nodes, pods_per_node=args.pods_per_node, one_port_per_node=True, seed=1
    )
    await cluster.start()
    inventory = StaticInventory(cluster.inventory_objects())
    settings = demo_args(args)
    kubelets = KubeletClient(kubelet_config(settings, extra_ca_pem=[cluster.ca_pem.decode()]))
    serving = ServingOptions(
        secure_port=args.secure_port, bind_address="127.0.0.1", cert_dir=os.path.join(work_dir, "certs")
    )
    pipeline = build_pipeline(
        settings,
        inventory,
        kubelets,
        serving,
        AuthnOptions(skip_lookup=True, allow_anonymous=True, client_ca_file=client_ca),
        AuthzOptions(allow_all=True),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
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
        for path in EXAMPLES:
            path = path.format(
                node=next(iter(inventory.nodes())).name,
                namespace=pod.namespace,
                pod=pod.name,
                app=pod.labels.get("app", ""),
            )
            print(f"  kubectl --kubeconfig {kubeconfig} get --raw '{path}'", flush=True)
        print(
            f"  curl --cacert {pipeline.server.serving_cert_file} https://127.0.0.1:{port}/readyz?verbose",
            flush=True,
        )
        if args.exit_after:
            try:
                await asyncio.wait_for(stop.wait(), args.exit_after)
            except TimeoutError:
                pass
        else:
            await stop.wait()
    finally:
        await pipeline.stop()
        await cluster.stop()
    return 0
