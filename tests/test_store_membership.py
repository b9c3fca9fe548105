"""Stores that find each other through a headless Service's EndpointSlices (watched from the fake
API server), as in a cluster: one port, one loopback address per store, as pods have."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator

from _stores import TOKEN, Stores, pod_ref
from fakeobjects import make_endpointslice

from kcms.kube.client import KubeClient
from kcms.kube.members import EndpointSliceMembers
from kcms.store import wire
from kcms.store.cluster import StoreCluster
from kcms.store.ring import Ring


class SliceStores:
    def __init__(self, fake, tmp_path, n: int, replicas: int = 0) -> None:
        self.fake = fake
        self.stores = Stores(tmp_path, n, replicas=replicas)
        self.port = self.stores.ports["s0"]
        self.address = {name: f"127.0.5.{i + 1}" for i, name in enumerate(sorted(self.stores.ports))}
        self.replicas = replicas

    def publish(self, ready: dict[str, bool]) -> None:
        """The EndpointSlice as the controller writes it (absent names: no endpoint)."""
        endpoints = [(name, self.address[name], ok) for name, ok in sorted(ready.items())]
        self.fake.upsert(
            make_endpointslice("kcms", "kcms-store", endpoints, self.port, "store", name="kcms-store-x")
        )

    def start(self, name: str) -> None:
        log = open(self.stores.tmp / f"{name}.log", "ab")  # noqa: SIM115
        cmd = [
            sys.executable, "-m", "kcms", "store", f"--bind-address={self.address[name]}", f"--port={self.port}",
            f"--token-file={self.stores.token_file}", f"--store-name={name}", "--store-service=kcms/kcms-store",
            "--store-port-name=store", "--store-scheme=http", f"--kubeconfig={self.fake.kubeconfig}",
            "--refill-timeout=20s", f"--replicas={self.replicas}",
        ]  # fmt: skip
        self.stores.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def ready(self, name: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.address[name]}:{self.port}/readyz", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    async def wait_ready(self, name: str) -> None:
        for _ in range(400):
            assert self.stores.procs[name].poll() is None, self.stores.log(name)
            if self.ready(name):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{name} not ready: {self.stores.log(name)}")

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[StoreCluster]:
        """Every store listed ready and started; a quorum client watching the same slice."""
        self.publish(dict.fromkeys(self.address, True))
        kube = await KubeClient.load(str(self.fake.kubeconfig))
        members = EndpointSliceMembers(kube, "kcms", "kcms-store", port_name="store", scheme="http")
        await members.start()
        cluster = StoreCluster(members, replicas=self.replicas, token=lambda: TOKEN, timeout=1.0, retries=0)
        try:
            for name in self.address:
                self.start(name)
            for name in self.address:
                await self.wait_ready(name)
            yield cluster
        finally:
            await cluster.close()
            await members.stop()
            await kube.close()
            self.stores.stop_all()


async def _held(cluster: StoreCluster, name: str) -> set[str]:
    data = await cluster.client(name).export(wire.ExportRequest(resources=False))
    return {pod for _m, _r, _ns, pod, _l, _p in data.series}


async def test_a_restarting_store_refills_before_it_is_listed(fake_kube, tmp_path) -> None:
    """A store that restarts is not in the slice until it is ready, and must refill first."""
    env = SliceStores(fake_kube, tmp_path, 3)
    async with env.running() as cluster:
        now = time.time()
        assert (await cluster.write((), [("m", pod_ref(i), (), now, float(i)) for i in range(10)])).ok
        env.stores.kill("s1")
        env.publish({"s0": True, "s1": False, "s2": True})
        env.start("s1")
        await env.wait_ready("s1")
        got = await cluster.client("s1").query_series(wire.SeriesQuery("pods", "default", None, "m"))
        assert sorted(r[2] for r in got) == [float(i) for i in range(10)]
        assert "copied" in env.stores.log("s1")


async def test_when_a_shard_leaves_the_others_copy_the_keys_they_now_own(fake_kube, tmp_path) -> None:
    env = SliceStores(fake_kube, tmp_path, 4, replicas=2)
    async with env.running() as cluster:
        now = time.time()
        pods = 60
        result = await cluster.write((), [("m", pod_ref(i), (), now, float(i)) for i in range(pods)])
        assert result.ok
        env.stores.kill("s3")
        env.publish({"s0": True, "s1": True, "s2": True})  # s3 is gone from the Service
        ring3 = Ring(["s0", "s1", "s2"], 2)
        want = {
            name: {f"pod-{i}" for i in range(pods) if ring3.owns(name, ("pods", "default", f"pod-{i}"))}
            for name in ring3.members
        }
        for _ in range(100):
            held = {name: await _held(cluster, name) for name in ring3.members}
            if all(want[n] <= held[n] for n in ring3.members):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"survivors did not copy their new keys: want {want}, hold {held}")
        # both copies of every key are back, and every value reads the same through the new ring
        rows = await cluster.query_series("pods", "default", None, "m")
        assert sorted(r.value for r in rows) == [float(i) for i in range(pods)]
        assert cluster.ring.members == ("s0", "s1", "s2")
