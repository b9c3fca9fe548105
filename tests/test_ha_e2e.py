"""Multi-store mode end to end, every component a real process: simulated kubelets (TLS) -> two
leader-elected `kcms collector`s -> three `kcms store`s -> `kcms server`, read with the real kubectl.
The Lease lives in the fake API server; the leader is killed with SIGKILL and the standby must take
over within the lease duration, with the Lease history showing one holder at a time."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import sys
import time
from datetime import datetime

import aiohttp
import pytest
from _kubectl import KUBECTL, get_raw
from _stores import Stores, free_port

LEASE = 3.0  # seconds; renew deadline 2 s, retry period 0.5 s
BASE = "/apis/metrics.k8s.io/v1beta1"


def _kubeconfig(path, port: int) -> str:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "k",
                        "cluster": {"server": f"https://127.0.0.1:{port}", "insecure-skip-tls-verify": True},
                    }
                ],
                "users": [{"name": "u", "user": {"token": "reader"}}],
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return str(path)


async def _spawn(tmp_path, name: str, *argv: str) -> asyncio.subprocess.Process:
    log = open(tmp_path / f"{name}.log", "wb")  # noqa: ASYNC230, SIM115 - the child writes to it
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kcms", *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    log.close()
    return proc


async def _wait(predicate, limit: float, what: str) -> float:
    t0 = time.monotonic()
    while True:
        got = await predicate()
        if got:
            return time.monotonic() - t0
        assert time.monotonic() - t0 < limit, f"{what}: not within {limit}s"
        await asyncio.sleep(0.1)


def _micro(ts: str) -> float:
    return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed")
async def test_multi_store_pipeline_survives_losing_the_leading_collector(fake_kube, ca, tmp_path) -> None:
    from kcms.sim import SimulatedCluster

    sim = SimulatedCluster(
        nodes=3, pods_per_node=2, containers_per_pod=1, seed=5, ca=ca, one_port_per_node=True
    )
    await sim.start()
    for obj in sim.inventory_objects():
        fake_kube.upsert(obj)
    fake_kube.tokens["reader"] = {"username": "reader", "groups": ["readers"]}
    kubelet_ca = tmp_path / "kubelet-ca.pem"
    kubelet_ca.write_bytes(ca.cert_pem.bytes())
    stores = Stores(tmp_path, 3)
    stores.start_all()
    store_flags = [f"--store-endpoints={stores.endpoints()}", f"--store-token-file={stores.token_file}"]
    kubeconfig = str(fake_kube.kubeconfig)
    health = {c: free_port() for c in ("c1", "c2")}
    procs: dict[str, asyncio.subprocess.Process] = {}
    server_port = free_port()
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        for c in ("c1", "c2"):
            procs[c] = await _spawn(
                tmp_path, c, "collector", "--kubeconfig", kubeconfig, *store_flags,
                "--kubelet-certificate-authority", str(kubelet_ca), "--kubelet-use-node-status-port",
                "--kubelet-preferred-address-types", "InternalIP", "--metric-resolution", "10s",
                f"--leader-elect-lease-duration={LEASE}s", "--leader-elect-renew-deadline=2s",
                "--leader-elect-retry-period=0.5s", "--leader-elect-resource-namespace=kube-system",
                f"--leader-elect-identity={c}", "--health-bind-address=127.0.0.1", f"--health-port={health[c]}",
            )  # fmt: skip
        procs["server"] = await _spawn(
            tmp_path, "server", "server", "--kubeconfig", kubeconfig, *store_flags,
            "--secure-port", str(server_port), "--bind-address", "127.0.0.1", "--cert-dir", str(tmp_path / "certs"),
            "--authentication-skip-lookup",
        )  # fmt: skip
        async with aiohttp.ClientSession() as s:

            async def ready() -> bool:
                for name, p in procs.items():
                    assert p.returncode is None, (
                        f"{name} exited: {(tmp_path / f'{name}.log').read_text()[-2000:]}"
                    )
                try:
                    async with s.get(f"https://127.0.0.1:{server_port}/readyz", ssl=ctx) as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

            await _wait(ready, 40, "server ready")
            raw = get_raw(_kubeconfig(tmp_path / "kcms.kubeconfig", server_port))

            async def all_nodes() -> bool:
                body = await asyncio.to_thread(raw, f"{BASE}/nodes")
                return len(body["items"]) == 3

            await _wait(all_nodes, 40, "three nodes served")
            pods = await asyncio.to_thread(raw, f"{BASE}/pods")
            assert len(pods["items"]) == 6

            lease = fake_kube.get("leases", "kube-system", "kcms-collector")
            leader = lease["spec"]["holderIdentity"]
            standby = "c2" if leader == "c1" else "c1"
            async with s.get(f"http://127.0.0.1:{health[standby]}/status") as r:
                assert (await r.json())["leader"] is False
            before = {
                i["metadata"]["name"]: i["timestamp"]
                for i in (await asyncio.to_thread(raw, f"{BASE}/nodes"))["items"]
            }

            procs[leader].send_signal(signal.SIGKILL)
            await procs[leader].wait()

            async def taken_over() -> bool:
                spec = fake_kube.get("leases", "kube-system", "kcms-collector")["spec"]
                return spec["holderIdentity"] == standby

            took = await _wait(taken_over, 3 * LEASE, "standby takes the lease")
            assert took <= LEASE + 2.0, f"takeover took {took:.1f}s"

            async def fresh() -> bool:  # the new leader scrapes: every node gets a newer reading
                items = (await asyncio.to_thread(raw, f"{BASE}/nodes"))["items"]
                return len(items) == 3 and all(i["timestamp"] > before[i["metadata"]["name"]] for i in items)

            await _wait(fresh, 30, "new leader's readings served")
            async with s.get(f"http://127.0.0.1:{health[standby]}/status") as r:
                status = await r.json()
            assert status["leader"] is True and status["ackedNodes"] > 0

        # one holder at a time: a write by a new holder comes only after the old holder's last
        # renewal plus the lease duration; transitions count exactly the holder changes
        writes = [w for w in fake_kube.lease_writes if w[1] == "kcms-collector"]
        holders = [w[3] for w in writes if w[3]]
        changes = sum(1 for a, b in zip(holders, holders[1:], strict=False) if a != b)
        assert changes == 1 and writes[-1][5] == 1
        for prev, cur in zip(writes, writes[1:], strict=False):
            if prev[3] and cur[3] and prev[3] != cur[3]:
                assert _micro(cur[4]) - _micro(prev[4]) >= LEASE - 0.05
    finally:
        for p in procs.values():
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        for name, p in procs.items():
            try:
                await asyncio.wait_for(p.wait(), 20)
            except TimeoutError:
                p.kill()
                print(name, "did not stop on SIGTERM")
        stores.stop_all()
        await sim.stop()
