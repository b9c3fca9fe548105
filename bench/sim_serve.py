"""How cheaply the kubelet simulator serves: body rendering, requests per server CPU-second, startup.

    python bench/sim_serve.py                      # all three parts, default sizes
    python bench/sim_serve.py --nodes 200 --duration 10 --concurrency 64
    python bench/sim_serve.py --startup-nodes 5000 # the benchmark's big cluster: start time and memory

1. render: microseconds to build one ``/metrics/resource`` (and ``/stats/summary``) body of a
   node with ``--pods`` pods x ``--containers`` containers, in this process.
2. serve: a simulator in a child process (pinned to one core when possible) serves HTTPS with
   keep-alive to an aiohttp client in this process (pinned to the other core); reports requests
   per second and requests per server CPU-second (= what one core sustains).
3. startup: time and resident memory to start ``--startup-nodes`` nodes on 127.x addresses.

Everything runs on loopback; request loops are bounded by ``--duration``.

Measured on the 2-core development machine (Python 3.11, shared and noisy), 30 pods x 2 containers:
    render /metrics/resource  67-98 us/body (32 KiB); /stats/summary 220-320 us/body (62 KiB)
    serve /metrics/resource   ~3,800 requests per server CPU-second over TLS keep-alive
                              (the Python client, on the other core, was the limit: ~2,000-2,500 req/s)
    serve /stats/summary      ~2,300 requests per server CPU-second
    startup 5000 nodes        ~5-6 s to generate, <1 s TLS + listen, ~470 MiB RSS
So 5000 nodes scraped every 15 s (333 req/s) cost the simulator about 9% of one core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kcms.sim import SimulatedCluster, render_resource_metrics, render_summary  # noqa: E402


def bench_render(pods: int, containers: int, iterations: int) -> None:
    cluster = SimulatedCluster(nodes=1, pods_per_node=pods, containers_per_pod=containers, seed=1)
    node = cluster.nodes[0]
    for name, fn in (("metrics/resource", render_resource_metrics), ("stats/summary", render_summary)):
        body = fn(node, time.time())
        t0 = time.perf_counter()
        for _ in range(iterations):
            fn(node, time.time())
        dt = (time.perf_counter() - t0) / iterations
        print(f"render {name:17s} {pods} pods x {containers}: {dt * 1e6:7.1f} us/body, {len(body)} bytes")


SERVE = """
import asyncio, json, os, signal, sys
from kcms.sim import SimulatedCluster
async def main():
    c = SimulatedCluster(nodes={nodes}, pods_per_node={pods}, containers_per_pod={containers}, seed=1,
                         one_port_per_node=True)
    await c.start()
    open({ca!r}, "wb").write(c.ca_pem)
    print(json.dumps([c.node_url(n) for n in c.node_names()]), flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await c.stop()
asyncio.run(main())
"""


async def bench_serve(args: argparse.Namespace) -> None:
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    with tempfile.TemporaryDirectory() as d:
        ca = os.path.join(d, "ca.pem")
        code = SERVE.format(nodes=args.nodes, pods=args.pods, containers=args.containers, ca=ca)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE, cwd=str(Path(__file__).parent.parent)
        )
        try:
            assert proc.stdout is not None
            urls = json.loads(await asyncio.wait_for(proc.stdout.readline(), 120))
            server = psutil.Process(proc.pid)
            if len(cpus) >= 2:
                server.cpu_affinity([cpus[0]])
                psutil.Process().cpu_affinity([cpus[1]])
            import ssl

            ctx = ssl.create_default_context(cafile=ca)
            conn = aiohttp.TCPConnector(ssl=ctx, limit=args.concurrency, limit_per_host=0)
            async with aiohttp.ClientSession(connector=conn) as s:
                count = 0
                nbytes = 0
                targets = [u + args.path for u in urls]

                async def worker(k: int, deadline: float) -> None:
                    nonlocal count, nbytes
                    i = k
                    while time.monotonic() < deadline:
                        async with s.get(targets[i % len(targets)]) as r:
                            body = await r.read()
                            assert r.status == 200
                        count += 1
                        nbytes += len(body)
                        i += args.concurrency

                # warm-up: open the connections (TLS handshakes are not what we measure)
                await asyncio.gather(*(worker(k, time.monotonic() + 1.0) for k in range(args.concurrency)))
                count = nbytes = 0
                c0 = server.cpu_times()
                t0 = time.monotonic()
                await asyncio.gather(*(worker(k, t0 + args.duration) for k in range(args.concurrency)))
                wall = time.monotonic() - t0
                c1 = server.cpu_times()
                cpu = (c1.user - c0.user) + (c1.system - c0.system)
                rss = server.memory_info().rss
            print(
                f"serve {args.path} over TLS keep-alive, {args.nodes} nodes x {args.pods} pods x {args.containers}, "
                f"{args.concurrency} connections, {wall:.1f} s: {count / wall:.0f} req/s, "
                f"server CPU {cpu / wall * 100:.0f}% of a core -> {count / cpu:.0f} req per server CPU-second; "
                f"{nbytes / count / 1024:.1f} KiB/body; server RSS {rss / 2**20:.0f} MiB"
            )
        finally:
            proc.terminate()
            await proc.wait()


async def bench_startup(args: argparse.Namespace) -> None:
    me = psutil.Process()
    rss0 = me.memory_info().rss
    t0 = time.perf_counter()
    c = SimulatedCluster(
        nodes=args.startup_nodes,
        pods_per_node=args.pods,
        containers_per_pod=args.containers,
        seed=1,
        address_base=args.address_base,
        port=args.port,
    )
    t1 = time.perf_counter()
    await c.start()
    t2 = time.perf_counter()
    rss = me.memory_info().rss - rss0
    ctx = c.client_ssl_context()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
        last = c.node_names()[-1]
        async with s.get(c.node_url(last) + "/metrics/resource") as r:
            assert r.status == 200
    t3 = time.perf_counter()
    await c.stop()
    t4 = time.perf_counter()
    print(
        f"startup {args.startup_nodes} nodes x {args.pods} pods x {args.containers}: generate {t1 - t0:.1f} s, "
        f"TLS + listen {t2 - t1:.1f} s, first scrape {t3 - t2:.2f} s, stop {t4 - t3:.1f} s, "
        f"+{rss / 2**20:.0f} MiB RSS"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", type=int, default=30)
    p.add_argument("--containers", type=int, default=2)
    p.add_argument("--iterations", type=int, default=2000)
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--path", default="/metrics/resource")
    p.add_argument("--startup-nodes", type=int, default=1000)
    p.add_argument("--address-base", default="127.200.0.1")
    p.add_argument("--port", type=int, default=10250)
    p.add_argument("--skip", action="append", default=[], choices=["render", "serve", "startup"])
    args = p.parse_args()
    if "render" not in args.skip:
        bench_render(args.pods, args.containers, args.iterations)
    if "serve" not in args.skip:
        asyncio.run(bench_serve(args))
    if "startup" not in args.skip:
        asyncio.run(bench_startup(args))


if __name__ == "__main__":
    main()
