"""`kcms store` replicas as real subprocesses on loopback, and a client of them, for the HA tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from kcms.kube.members import Member, StaticMembers
from kcms.model import NodeBatch, ObjectRef, ResourcePoint
from kcms.store.cluster import StoreCluster

TOKEN = "store-token-for-tests"


# Every port free_port has handed out in this test process: a test that asks for two or more
# (stores, health and serving ports) must never get the same one twice.
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A free loopback port not handed out before in this process. The kernel may give the port
    just closed out again: two stores given one port fail at start (seen in CI:
    's2=http://127.0.0.1:56853 is also given for s0')."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


class Stores:
    """``n`` store processes named s0..s{n-1}, each told the whole static membership."""

    def __init__(self, tmp: Path, n: int, replicas: int = 0, extra: list[str] | None = None) -> None:
        self.tmp = tmp
        self.replicas = replicas
        self.extra = list(extra or [])
        self.token_file = tmp / "store-token"
        self.token_file.write_text(TOKEN + "\n")
        self.ports: dict[str, int] = {}
        self.procs: dict[str, subprocess.Popen] = {}
        for i in range(n):
            self.ports[f"s{i}"] = free_port()

    def members(self) -> list[Member]:
        return [Member(name, f"http://127.0.0.1:{port}") for name, port in sorted(self.ports.items())]

    def endpoints(self) -> str:
        return ",".join(f"{m.name}={m.url}" for m in self.members())

    def add(self, name: str) -> None:
        self.ports[name] = free_port()

    def start(self, name: str) -> None:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 (closed with the process)
        cmd = [
            sys.executable, "-m", "kcms", "store", "--bind-address=127.0.0.1", f"--port={self.ports[name]}",
            f"--token-file={self.token_file}", f"--store-name={name}", f"--store-endpoints={self.endpoints()}",
            f"--replicas={self.replicas}", "--refill-timeout=5s", *self.extra,
        ]  # fmt: skip
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def start_all(self) -> None:
        for name in self.ports:
            self.start(name)
        for name in self.ports:
            self.wait_ready(name)

    def ready(self, name: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[name]}/readyz", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_ready(self, name: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise AssertionError(f"store {name} exited: {self.log(name)}")
            if self.ready(name):
                return
            time.sleep(0.05)
        raise AssertionError(f"store {name} not ready within {timeout}s: {self.log(name)}")

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:]

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait(10)

    def pause(self, name: str) -> None:
        os.kill(self.procs[name].pid, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        os.kill(self.procs[name].pid, signal.SIGCONT)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()

    def cluster(self, **kw) -> StoreCluster:
        """A quorum client over the current membership (a fresh StaticMembers each call)."""
        kw.setdefault("timeout", 1.0)
        kw.setdefault("retries", 0)
        return StoreCluster(StaticMembers(self.members()), replicas=self.replicas, token=lambda: TOKEN, **kw)


def node_batch(node: str, t: float, pods: int = 2, cpu_rate: float = 0.5) -> NodeBatch:
    """A kubelet reading at time ``t`` whose CPU counters grow ``cpu_rate`` cores."""
    ns_cpu = int(t * cpu_rate * 1e9)
    batch = NodeBatch(node, ResourcePoint(1000.0, t, ns_cpu, 1 << 30))
    for i in range(pods):
        batch.pods[("default", f"{node}-p{i}")] = {"app": ResourcePoint(1000.0, t, ns_cpu // 4, 1 << 20)}
    return batch


def pod_ref(i: int) -> ObjectRef:
    return ObjectRef("pods", "default", f"pod-{i}")
