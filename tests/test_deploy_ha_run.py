"""The multi-store overlay's stores, server and collector run for real from their own args (against the
fake API server), over TLS with a certificate shaped like the one cert-manager issues them."""

from __future__ import annotations

import asyncio
import ssl
import time
from pathlib import Path

import aiohttp
import trustme
from _deploy_helpers import (
    generated,
    kcms_containers,
    local_files,
    only,
    render,
    resolved_env,
    start_kcms,
)
from _stores import free_port
from fakeapi import make_endpointslice
from test_deploy_ha import MULTI, NS

# ---------------------------------------------------------------------------------------------------
# the manifests' own args, run: stores found through an EndpointSlice, TLS by a private CA, the token


async def test_multi_store_manifests_run_together(fake_kube, tmp_path: Path) -> None:
    """Three stores, a server and a collector started with the multi-store overlay's own args. Only what
    cannot work off-cluster is swapped: pod IPs (127.0.0.2-4), ports, the mounted files' paths, and
    --kubeconfig (the fake API server, which holds the EndpointSlice of kcms-store as the EndpointSlice
    controller writes it: pod IPs, port named "store"). The stores serve a certificate carrying exactly
    the Certificate's DNS names, from a private CA. The server is ready only when a read quorum of
    stores answers it over verified TLS with the token; the collector must take the Lease it names."""
    objects = render(MULTI)
    store_ca = trustme.CA()
    certificate = only(objects, "Certificate", "kcms-store-tls")["spec"]
    leaf = store_ca.issue_cert(*certificate["dnsNames"])
    secrets = {
        generated(objects, "Secret", "kcms-store-token")["metadata"]["name"]: {"token": b"e2e-token\n"},
        certificate["secretName"]: {
            "tls.crt": leaf.cert_chain_pems[0].bytes(),
            "tls.key": leaf.private_key_pem.bytes(),
            "ca.crt": store_ca.cert_pem.bytes(),
        },
    }
    kubeconfig = f"--kubeconfig={fake_kube.kubeconfig}"
    store_port, server_port, health_port = free_port(), free_port(), free_port()
    store = only(objects, "StatefulSet", "kcms-store")
    pods = {f"kcms-store-{i}": f"127.0.0.{i + 2}" for i in range(store["spec"]["replicas"])}
    endpoints = [(pod, ip, True) for pod, ip in pods.items()]
    fake_kube.upsert(make_endpointslice(NS, "kcms-store", endpoints, store_port, "store"))
    runs = [  # (log name, workload, POD_NAME or None, flags replaced, flags added)
        *((pod, store, pod, {"--port": store_port}, [f"--bind-address={ip}"]) for pod, ip in pods.items()),
        ("server", only(objects, "Deployment", "kcms"), None,
         {"--secure-port": server_port, "--cert-dir": tmp_path}, ["--bind-address=127.0.0.1", "--authentication-skip-lookup"]),
        ("collector", only(objects, "Deployment", "kcms-collector"), None,
         {"--health-port": health_port}, ["--health-bind-address=127.0.0.1"]),
    ]  # fmt: skip
    procs = {}
    try:
        for name, workload, pod, replace, extra in runs:
            [container] = kcms_containers(workload)
            env = resolved_env(workload, container, objects) | ({"POD_NAME": pod} if pod else {})
            procs[name] = await start_kcms(
                tmp_path / f"{name}.log", workload, objects, env=env, replace=replace, extra=[*extra, kubeconfig],
                mounts=local_files(tmp_path / name, workload, container, secrets),
            )  # fmt: skip

        def logs() -> str:
            return "\n".join(f"--- {n}\n{(tmp_path / f'{n}.log').read_text()[-1500:]}" for n in procs)

        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # as the kubelet probes
        deadline = time.monotonic() + 40
        async with aiohttp.ClientSession() as session:
            while True:
                assert all(p.returncode is None for p in procs.values()), f"a process exited:\n{logs()}"
                try:
                    async with session.get(f"https://127.0.0.1:{server_port}/readyz?verbose", ssl=ctx) as r:
                        answer, ready = await r.text(), r.status == 200
                except aiohttp.ClientError as e:
                    answer, ready = repr(e), False
                lease = fake_kube.get("leases", NS, "kcms-collector")
                if ready and lease:
                    break
                assert time.monotonic() < deadline, f"server /readyz: {answer}\nlease: {lease}\n{logs()}"
                await asyncio.sleep(0.2)
        assert lease["spec"]["holderIdentity"].startswith("kcms-collector-"), "--leader-elect-identity"
    finally:
        for proc in procs.values():
            if proc.returncode is None:
                proc.terminate()
        for proc in procs.values():
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
