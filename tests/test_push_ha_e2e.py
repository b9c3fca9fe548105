"""Push mode end to end, every component a real process: a `kcms agent --push` scraping a simulated
kubelet pushes to two `kcms server --active-standby` processes sharing a Lease in the fake API
server. The active one serves and is ready, the standby is not; SIGKILL the active one: the standby
takes the Lease, the agent moves to it, and the node is served again. An agent that stops makes
its node stale."""

from __future__ import annotations

import asyncio
import signal
import ssl
import time

import aiohttp
from _stores import free_port
from test_ha_e2e import _spawn, _wait

LEASE = 3.0
BASE = "/apis/metrics.k8s.io/v1beta1"


async def test_agents_push_to_the_active_server_and_follow_a_failover(fake_kube, ca, tmp_path) -> None:
    from kcms.sim import SimulatedCluster

    sim = SimulatedCluster(
        nodes=1, pods_per_node=2, containers_per_pod=1, seed=7, ca=ca, one_port_per_node=True
    )
    await sim.start()
    for obj in sim.inventory_objects():
        fake_kube.upsert(obj)
    node = sim.nodes[0]
    # the agent pod's bound ServiceAccount token: TokenReview gives its node claim (Kubernetes >= 1.30),
    # and the servers accept its reports about that node and the pods the inventory places there
    fake_kube.tokens["agent"] = {
        "username": "system:serviceaccount:kcms:agent",
        "uid": "1",
        "extra": {"authentication.kubernetes.io/node-name": [node.name]},
    }
    fake_kube.tokens["reader"] = {"username": "reader", "uid": "2"}
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(ca.cert_pem.bytes())
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert_file.write_bytes(b"".join(b.bytes() for b in cert.cert_chain_pems))
    key_file.write_bytes(cert.private_key_pem.bytes())
    token_file = tmp_path / "agent-token"
    token_file.write_text("agent\n")
    ports = {s: free_port() for s in ("a", "b")}
    procs: dict[str, asyncio.subprocess.Process] = {}
    stopped: set[str] = set()  # killed or stopped on purpose
    ctx = ssl.create_default_context(cafile=str(ca_file))
    try:
        for s in ("a", "b"):
            procs[s] = await _spawn(
                tmp_path, s, "server", "--active-standby", "--kubeconfig", str(fake_kube.kubeconfig),
                "--secure-port", str(ports[s]), "--bind-address", "127.0.0.1",
                f"--tls-cert-file={cert_file}", f"--tls-private-key-file={key_file}", "--authentication-skip-lookup",
                f"--leader-elect-lease-duration={LEASE}s", "--leader-elect-renew-deadline=2s",
                "--leader-elect-retry-period=0.5s", "--leader-elect-resource-namespace=kube-system",
                f"--leader-elect-identity={s}", "--node-stale-after=3s",
            )  # fmt: skip
        urls = ",".join(f"https://127.0.0.1:{ports[s]}" for s in ("a", "b"))
        procs["agent"] = await _spawn(
            tmp_path, "agent", "agent", f"--node-name={node.name}", f"--kubeconfig={fake_kube.kubeconfig}",
            "--no-cgroups", "--no-apps", "--no-otlp", "--insecure-serving", f"--listen=127.0.0.1:{free_port()}",
            "--interval=500ms",
            f"--kubelet-address={node.address}", f"--kubelet-port={node.port}",
            f"--kubelet-certificate-authority={ca_file}", f"--push={urls}", "--push-interval=500ms",
            "--push-timeout=400ms", f"--push-token-file={token_file}", f"--push-ca-file={ca_file}",
        )  # fmt: skip
        reader = {"Authorization": "Bearer reader"}
        async with aiohttp.ClientSession() as http:

            async def ready(s: str) -> bool:
                try:
                    async with http.get(f"https://127.0.0.1:{ports[s]}/readyz", ssl=ctx) as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

            async def served(s: str) -> bool:
                for name, p in procs.items():
                    assert name in stopped or p.returncode is None, (
                        f"{name} exited: {(tmp_path / f'{name}.log').read_text()[-2000:]}"
                    )
                try:
                    async with http.get(
                        f"https://127.0.0.1:{ports[s]}{BASE}/nodes/{node.name}", ssl=ctx, headers=reader
                    ) as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

            async def holder() -> str:
                lease = fake_kube.get("leases", "kube-system", "kcms-server")
                return (lease or {}).get("spec", {}).get("holderIdentity", "")

            await _wait(holder, 20, "a server holds the lease")
            active = await holder()
            standby = "b" if active == "a" else "a"
            await _wait(lambda: served(active), 30, "the node served by the active server")
            assert await ready(active) and not await ready(standby)
            async with http.get(
                f"https://127.0.0.1:{ports[standby]}/push/v1/status", ssl=ctx, headers=reader
            ) as r:
                assert (await r.json())["active"] is False

            stopped.add(active)
            procs[active].send_signal(signal.SIGKILL)
            await procs[active].wait()
            t0 = time.monotonic()
            await _wait(lambda: ready(standby), 3 * LEASE, "the standby becomes ready")
            await _wait(lambda: served(standby), 20, "the node served after the failover")
            print(f"push failover: node served by the standby {time.monotonic() - t0:.2f}s after SIGKILL")
            assert time.monotonic() - t0 < LEASE + 10

            # the agent stops: the node turns stale, is not served, and is listed
            stopped.add("agent")
            procs["agent"].send_signal(signal.SIGTERM)
            await procs["agent"].wait()

            async def stale() -> bool:
                async with http.get(
                    f"https://127.0.0.1:{ports[standby]}/push/v1/status", ssl=ctx, headers=reader
                ) as r:
                    return (await r.json())["nodes"]["stale"] == [node.name]

            await _wait(stale, 15, "the silent node listed as stale")
            assert not await served(standby)
    finally:
        for p in procs.values():
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                await asyncio.wait_for(p.wait(), 20)
            except TimeoutError:
                p.kill()
        await sim.stop()
