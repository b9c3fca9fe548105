"""How fast the API server answers its probes while many clients list big collections.

    python bench/probe_under_load.py                       # 200 listing clients, 20 s
    python bench/probe_under_load.py --clients 200 --nodes 100 --pods-per-node 30 --duration 20

`kcms demo` (simulated kubelets and the standalone pipeline) runs in a child process; this process
opens ``--clients`` keep-alive connections that list ``/apis/metrics.k8s.io/v1beta1/pods`` (every
pod of the cluster, gzip accepted, as kubectl does; the bodies are read, not decoded) in a loop,
and a third process (so that the listers' own load does not delay it) asks ``/livez`` every 100 ms
on one keep-alive connection. Printed: the probe's latency p50/p99/max, how many lists were
answered, how many were refused with 429 (max-in-flight), and the server's CPU use.

A kubelet's liveness probe times out after 1 s by default: a p99 above that restarts the server.
Figures from the 2-core development machine are in the notes of issue 8 and in the README.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import re
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parent.parent
LIST_PATH = "/apis/metrics.k8s.io/v1beta1/pods"


def start_demo(nodes: int, pods: int, work_dir: str, extra: list[str]) -> tuple[subprocess.Popen, int]:
    cmd = [
        sys.executable,
        "-m",
        "kcms",
        "demo",
        "--secure-port=0",
        f"--nodes={nodes}",
        f"--pods-per-node={pods}",
        f"--work-dir={work_dir}",
        *extra,
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.search(r"served on https://127\.0\.0\.1:(\d+)", line)
        if m:
            return proc, int(m.group(1))
    proc.kill()
    raise SystemExit("kcms demo did not start")


async def wait_for_pods(port: int, ctx: ssl.SSLContext, expected: int) -> None:
    """Wait until the list holds (nearly) every pod: two scrapes are needed for a CPU rate."""
    async with aiohttp.ClientSession() as s:
        for _ in range(240):
            try:
                async with s.get(f"https://127.0.0.1:{port}{LIST_PATH}", ssl=ctx) as r:
                    if r.status == 200 and len((await r.json())["items"]) >= expected * 0.95:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.5)
    raise SystemExit("the pods never showed up in the list")


async def lister(port: int, ctx: ssl.SSLContext, stop: asyncio.Event, counts: dict[int, int]) -> None:
    conn = aiohttp.TCPConnector(limit=1, ssl=ctx)
    async with aiohttp.ClientSession(connector=conn, auto_decompress=False) as s:
        while not stop.is_set():
            try:
                async with s.get(f"https://127.0.0.1:{port}{LIST_PATH}") as r:
                    await r.read()
                    counts[r.status] = counts.get(r.status, 0) + 1
                    if r.status == 429:
                        await asyncio.sleep(float(r.headers.get("Retry-After", "1")))
            except (TimeoutError, aiohttp.ClientError):
                counts[-1] = counts.get(-1, 0) + 1
                await asyncio.sleep(0.1)


async def prober(port: int, cafile: str, duration: float) -> list[float]:
    latencies: list[float] = []
    conn = aiohttp.TCPConnector(limit=1, ssl=ssl.create_default_context(cafile=cafile))
    end = time.monotonic() + duration
    timeout = aiohttp.ClientTimeout(total=10.0)  # a kubelet gives up after 1 s (timeoutSeconds)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
        while time.monotonic() < end:
            t0 = time.perf_counter()
            try:
                async with s.get(f"https://127.0.0.1:{port}/livez") as r:
                    await r.read()
                    ok = r.status == 200
            except (TimeoutError, aiohttp.ClientError):
                ok = False
            # a failed probe counts as infinitely slow: the kubelet would count a failure
            latencies.append(time.perf_counter() - t0 if ok else float("inf"))
            await asyncio.sleep(0.1)
    return latencies


def probe_process(port: int, cafile: str, duration: float, out: multiprocessing.Queue) -> None:
    out.put(asyncio.run(prober(port, cafile, duration)))


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="kcms-bench-probe-") as work:
        proc, port = start_demo(args.nodes, args.pods_per_node, work, args.server_flag)
        try:
            cafile = os.path.join(work, "certs", "apiserver.crt")
            ctx = ssl.create_default_context(cafile=cafile)
            await wait_for_pods(port, ctx, args.nodes * args.pods_per_node)
            server = psutil.Process(proc.pid)
            for phase, clients in (("idle", 0), ("loaded", args.clients)):
                stop = asyncio.Event()
                counts: dict[int, int] = {}
                tasks = [asyncio.create_task(lister(port, ctx, stop, counts)) for _ in range(clients)]
                await asyncio.sleep(1.0 if clients else 0)  # let the listers connect and pile up
                cpu0 = server.cpu_times()
                t0 = time.monotonic()
                results: multiprocessing.Queue = multiprocessing.Queue()
                duration = args.duration if clients else 3.0
                probe = multiprocessing.Process(target=probe_process, args=(port, cafile, duration, results))
                probe.start()
                latencies: list[float] = await asyncio.to_thread(results.get, timeout=600)
                probe.join()
                stop.set()
                await asyncio.gather(*tasks)
                elapsed = time.monotonic() - t0
                cpu1 = server.cpu_times()
                cpu = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / elapsed
                lat = sorted(latencies)
                p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
                failed = sum(1 for x in lat if x == float("inf"))
                print(
                    f"{phase:6s} {clients:4d} listing clients: /livez p50 {statistics.median(lat) * 1e3:7.1f} ms"
                    f"  p99 {p99 * 1e3:7.1f} ms  max {lat[-1] * 1e3:7.1f} ms"
                    f"  ({len(lat)} probes, {failed} failed or over 10 s)"
                    f"  lists 200: {counts.get(200, 0)}  429: {counts.get(429, 0)}"
                    f"  errors: {sum(v for k, v in counts.items() if k not in (200, 429))}"
                    f"  server CPU {cpu:.2f} cores",
                    flush=True,
                )
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=200, help="concurrent listing clients (default 200)")
    p.add_argument("--nodes", type=int, default=100, help="simulated nodes (default 100)")
    p.add_argument("--pods-per-node", type=int, default=30, help="pods per node (default 30)")
    p.add_argument("--duration", type=float, default=20.0, help="seconds under load (default 20)")
    p.add_argument(
        "--server-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="an extra `kcms demo` flag (repeatable), e.g. --server-flag=--max-requests-inflight=50",
    )
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
