"""An in-process standalone pipeline for end-to-end tests: simulated kubelets over TLS, nodes and
pods from the fake API server's list+watch, delegated authn/authz through its TokenReview and
SubjectAccessReview, and an HTTPS client for it."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import ssl
import time
from pathlib import Path

import aiohttp
import trustme
from _kubectl import KUBECTL  # noqa: F401 (re-exported to the tests)

from kcms.apiserver import AuthnOptions, AuthzOptions, ServingOptions
from kcms.cmd.main import build_parser
from kcms.cmd.standalone import build_pipeline, kubelet_config
from kcms.collector.kubelet import KubeletClient
from kcms.kube.client import KubeClient
from kcms.kube.inventory import KubeInventory
from kcms.kube.reviews import AccessReviewer, TokenReviewer
from kcms.sim import SimulatedCluster

BASE = "/apis/metrics.k8s.io/v1beta1"
READER = "reader-token"


def standalone_args(**over) -> argparse.Namespace:
    """`kcms standalone` flags as the real parser gives them, with test overrides."""
    args = build_parser().parse_args(
        ["standalone", "--kubelet-use-node-status-port", "--kubelet-preferred-address-types=InternalIP",
         "--metric-resolution=10s", "--kubelet-request-timeout=2s", "--kubelet-max-in-flight=50"]
    )  # fmt: skip
    for name, value in over.items():
        assert hasattr(args, name), name
        setattr(args, name, value)
    return args


class Env:
    """A running in-process pipeline and what the tests need to talk to it."""

    def __init__(self, sim, fake, pipeline, kube, inventory, tmp: Path) -> None:
        self.sim, self.fake, self.pipeline, self.kube, self.inventory = sim, fake, pipeline, kube, inventory
        self.port = pipeline.server.port
        self.url = f"https://127.0.0.1:{self.port}"
        self.ca_file = str(pipeline.server.serving_cert_file)
        self.kubeconfig = tmp / "kcms.kubeconfig"
        ca_data = base64.b64encode(Path(self.ca_file).read_bytes()).decode()
        self.kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "kcms",
                            "cluster": {"server": self.url, "certificate-authority-data": ca_data},
                        }
                    ],
                    "users": [{"name": "reader", "user": {"token": READER}}],
                    "contexts": [{"name": "kcms", "context": {"cluster": "kcms", "user": "reader"}}],
                    "current-context": "kcms",
                }
            )
        )
        self.ssl = ssl.create_default_context(cafile=self.ca_file)

    async def get(self, path: str, token: str | None = READER, accept: str | None = "application/json"):
        headers = {}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if accept:
            headers["Accept"] = accept
        async with aiohttp.ClientSession() as s:
            async with s.get(self.url + path, headers=headers, ssl=self.ssl) as r:
                text = await r.text()
                if r.content_type == "application/json":
                    return r.status, json.loads(text)
                return r.status, text


async def start_env(
    ca: trustme.CA, fake, tmp: Path, sim: SimulatedCluster, agent_targets=None, **args
) -> Env:
    for obj in sim.inventory_objects():
        fake.upsert(obj)
    fake.tokens[READER] = {"username": "reader", "uid": "42", "groups": ["readers"]}
    kube = await KubeClient.load(str(fake.kubeconfig))
    inventory = KubeInventory(kube)
    await inventory.start()
    settings = standalone_args(**args)
    kubelets = KubeletClient(kubelet_config(settings, extra_ca_pem=[ca.cert_pem.bytes().decode()]))
    pipeline = build_pipeline(
        settings,
        inventory,
        kubelets,
        ServingOptions(secure_port=0, bind_address="127.0.0.1", cert_dir=str(tmp / "certs")),
        AuthnOptions(skip_lookup=True, token_reviewer=TokenReviewer(kube)),
        AuthzOptions(access_reviewer=AccessReviewer(kube)),
        kube_client=kube,
        agent_targets=agent_targets,
    )
    await pipeline.start()
    env = Env(sim, fake, pipeline, kube, inventory, tmp)
    return env


async def stop_env(env: Env) -> None:
    await env.pipeline.stop()
    await env.inventory.stop()
    await env.kube.close()


async def wait_ready(env: Env, limit: float = 20.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        status, _ = await env.get("/readyz", token=None, accept=None)
        if status == 200:
            return time.monotonic() - t0
        await asyncio.sleep(0.1)
    raise AssertionError("pipeline not ready in time")
