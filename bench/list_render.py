"""How fast metrics.k8s.io lists are served, against the floor of writing the same bytes to the socket.

    python bench/list_render.py                     # 5000 nodes x 30 pods x 2 containers
    python bench/list_render.py --nodes 1000 --repeat 5

In this process: a simulated cluster's Nodes and Pods in a StaticInventory, a ResourceStore fed
two scrapes of every node (the kubelet ``/metrics/resource`` bodies of the simulator, decoded as
the collector decodes them), the MetricsAPI on a real AggregatedAPIServer (HTTPS on loopback,
anonymous reads allowed), and beside it a minimal aiohttp HTTPS handler with the same certificate
that answers a ready ``bytes`` body of a requested size: the floor, what writing that many bytes
over this TLS setup costs. A client in a child process (so that client and server each get a
core) fetches, keep-alive, without decompressing, and times each request to its last byte:

- pods: every pod (JSON; gzip);
- pods after a scrape: every pod, each node stored again just before (no usage is cached);
- nodes: every node;
- hpa: one namespace with a labelSelector (the HPA's query); after a scrape: each node stored again
  just before, as for pods;
- floor: the same number of bytes (for gzip: the compressed size) from the minimal handler.

Printed per case: median and best ms, MB on the wire, the ratio to its floor, the server
process's CPU ms per request, and the longest stall of the server's event loop during the
request (a 1 ms ticker: what a kubelet scrape sharing the loop would have waited) with the longest
cyclic garbage collection in it (``gc ms``: allocation-driven, not the handler's slicing). The heap is
frozen after each scrape, as ``kcms standalone`` does (:mod:`kcms.heap`).

Measured on the shared 2-core development machine (load 2-4), 150 000 pods, medians, before
(dict per item, orjson of the list, gzip level 4 in the loop) -> after (cached byte pieces,
streamed, gzip level 2 in a thread):
    all pods JSON (56 MB)   2217 -> 411 ms; floor 257 ms (8.6x -> 1.6x); loop stall 2815 -> 7 ms
    all pods gzip           1319 -> 653 ms; loop stall 2268 -> 14 ms
    after a scrape (JSON)   6831 -> 4118 ms (store usage computation + GC passes over it)
    nodes (5000)              53 -> 27 ms
    HPA query (3318 pods)     80 -> 71 ms
Then the list of every pod from node blocks (kcms/apis/metrics/blocks.py) and gzip by ISA-L in the
loop (same machine, 2026-11-23, medians of 3):
    all pods JSON           354 -> 87 ms (floor 185-216 ms: under the floor, as the floor server
                            writes one 56 MB buffer while the list is written as it is made)
    all pods gzip           427 -> 71 ms (8.4 -> 8.2 MB)
    after a scrape          1320 -> 1040-1860 ms (every node's pods rendered again: ~7 µs a pod)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = str(Path(__file__).resolve().parent.parent)
sys.path.insert(0, ROOT)

BASE = "/apis/metrics.k8s.io/v1beta1"

CLIENT = r"""
import asyncio, json, ssl, sys, time
import aiohttp

async def main(base, cafile):
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.check_hostname = False
    conn = aiohttp.TCPConnector(ssl=ctx, limit=1)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=conn, auto_decompress=False, timeout=timeout) as s:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            cmd = json.loads(line)
            headers = {"Accept": "application/json"}
            if cmd.get("gzip"):
                headers["Accept-Encoding"] = "gzip"
            else:
                headers["Accept-Encoding"] = "identity"
            t0 = time.perf_counter()
            async with s.get(cmd["url"], headers=headers) as r:
                body = await r.read()
                status, encoding = r.status, r.headers.get("Content-Encoding", "")
            ms = (time.perf_counter() - t0) * 1000
            out = {"ms": ms, "bytes": len(body), "status": status, "encoding": encoding}
            if cmd.get("check"):
                import gzip, orjson
                raw = gzip.decompress(body) if encoding == "gzip" else body
                doc = orjson.loads(raw)
                out["items"] = len(doc.get("items", []))
                out["raw_bytes"] = len(raw)
            print(json.dumps(out), flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


class StallMonitor:
    """The longest gap between 1 ms sleeps of a ticker task: how long the loop was kept busy."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._last = 0.0
        self._task: asyncio.Task | None = None
        # the longest cyclic-GC pass in the same window: a stall the handler's slicing cannot avoid
        self.gc_longest = 0.0
        self._gc_start = 0.0
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc_longest = max(self.gc_longest, time.perf_counter() - self._gc_start)

    async def _run(self) -> None:
        self._last = time.perf_counter()
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            self.longest = max(self.longest, now - self._last)
            self._last = now

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def reset(self) -> None:
        """Forget what came before (a rescrape in this loop is not the request's stall)."""
        self.longest = 0.0
        self.gc_longest = 0.0
        self._last = time.perf_counter()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


def build(nodes: int, pods: int, containers: int):
    """The inventory, the simulated cluster and a store holding two scrapes of every node."""
    from kcms.kube.inventory import StaticInventory
    from kcms.sim import SimulatedCluster
    from kcms.store.resource import ResourceStore

    t0 = time.perf_counter()
    cluster = SimulatedCluster(nodes=nodes, pods_per_node=pods, containers_per_pod=containers, seed=1)
    inventory = StaticInventory(cluster.inventory_objects())
    store = ResourceStore(15.0, max_age=24 * 3600.0)  # nothing expires while the bench runs
    now = time.time()
    for t in (now - 15.0, now):
        scrape(cluster, store, t)
    print(
        f"built {nodes} nodes, {store.stats_pods()} pods with readings in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    return cluster, inventory, store


def scrape(cluster, store, t: float) -> float:
    """Store one scrape of every node taken at ``t``; returns the seconds it took."""
    from kcms.sim import render_resource_metrics
    from kcms.sources.kubelet_decode import decode_resource_metrics

    t0 = time.perf_counter()
    for node in cluster.nodes:
        store.store(decode_resource_metrics(node.name, render_resource_metrics(node, t), now=t))
    gc.freeze()  # as kcms standalone's HeapFreezer does after each cycle (kcms.heap)
    return time.perf_counter() - t0


async def run(args: argparse.Namespace) -> None:
    from aiohttp import web

    from kcms.apis.metrics.api import MetricsAPI
    from kcms.apiserver import AggregatedAPIServer, AuthnOptions, AuthzOptions, ServingOptions
    from kcms.apiserver.serving import server_context

    cluster, inventory, store = build(args.nodes, args.pods_per_node, args.containers)
    tmp = Path(tempfile.mkdtemp(prefix="kcms-list-render-"))
    server = AggregatedAPIServer(
        ServingOptions(secure_port=0, bind_address="127.0.0.1", cert_dir=str(tmp / "certs")),
        AuthnOptions(skip_lookup=True, allow_anonymous=True),
        AuthzOptions(always_allow_paths=["/healthz", "/readyz", "/livez", "/apis/*"]),
    )
    server.install(MetricsAPI(inventory, store).group_version())
    await server.start()

    floor_bodies: dict[int, bytes] = {}

    async def floor(request: web.Request) -> web.Response:
        body = floor_bodies[int(request.query["n"])]
        headers = {"Content-Type": "application/json", "Cache-Control": "no-cache, private"}
        if request.query.get("gzip"):
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, headers=headers)

    app = web.Application()
    app.router.add_get("/floor", floor)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(
        runner,
        "127.0.0.1",
        0,
        ssl_context=server_context(server.serving_cert_file, server.serving_key_file, []),
    )
    await site.start()
    floor_port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001

    api = f"https://127.0.0.1:{server.port}{BASE}"
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT, api, server.serving_cert_file,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": ROOT},
    )  # fmt: skip
    assert client.stdin is not None and client.stdout is not None
    monitor = StallMonitor()
    monitor.start()

    async def fetch(url: str, gzip: bool, check: bool = False) -> dict:
        client.stdin.write(json.dumps({"url": url, "gzip": gzip, "check": check}).encode() + b"\n")
        await client.stdin.drain()
        monitor.reset()
        cpu0 = time.process_time()
        line = await client.stdout.readline()
        out = json.loads(line)
        out["cpu_ms"] = (time.process_time() - cpu0) * 1000
        out["stall_ms"] = monitor.longest * 1000
        out["gc_ms"] = monitor.gc_longest * 1000
        if out["status"] != 200:
            raise SystemExit(f"{url}: HTTP {out['status']}")
        return out

    cases = [
        ("pods", f"{api}/pods", False, False),
        ("pods gzip", f"{api}/pods", True, False),
        ("pods after a scrape", f"{api}/pods", False, True),
        ("pods gzip after a scrape", f"{api}/pods", True, True),
        ("nodes", f"{api}/nodes", False, False),
        ("nodes gzip", f"{api}/nodes", True, False),
        ("hpa: team-a app=web", f"{api}/namespaces/team-a/pods?labelSelector=app%3Dweb", True, False),
        ("hpa after a scrape", f"{api}/namespaces/team-a/pods?labelSelector=app%3Dweb", True, True),
    ]
    scrape_t = time.time()
    rows = []
    for name, url, gzip, rescrape in cases:
        first = await fetch(url, gzip, check=True)  # warm-up, and the size and item count
        results = []
        for _ in range(args.repeat):
            if rescrape:
                scrape_t = max(scrape_t + 0.001, time.time())  # never ahead of the clock
                scrape(cluster, store, scrape_t)
            results.append(await fetch(url, gzip))
        size = results[-1]["bytes"]
        if size not in floor_bodies:
            floor_bodies[size] = os.urandom(size)  # content does not matter to TLS; size does
        floor_url = f"https://127.0.0.1:{floor_port}/floor?n={size}" + ("&gzip=1" if gzip else "")
        await fetch(floor_url, gzip)
        floors = [await fetch(floor_url, gzip) for _ in range(args.repeat)]
        rows.append((name, first, results, floors))

    print(f"\n{args.nodes} nodes x {args.pods_per_node} pods x {args.containers} containers, "
          f"{args.repeat} requests per case (median / best); floor = same bytes from a ready body")  # fmt: skip
    print(
        f"{'case':26s} {'items':>7s} {'MB':>7s} {'ratio':>6s} {'ms med':>8s} {'ms best':>8s} "
        f"{'floor ms':>9s} {'x floor':>8s} {'cpu ms':>7s} {'stall ms':>9s} {'gc ms':>6s} {'floor stall':>11s}"
    )
    for name, first, results, floors in rows:
        ms = statistics.median(r["ms"] for r in results)
        best = min(r["ms"] for r in results)
        fms = statistics.median(r["ms"] for r in floors)
        cpu = statistics.median(r["cpu_ms"] for r in results)
        stall = max(r["stall_ms"] for r in results)
        fstall = max(r["stall_ms"] for r in floors)
        gc_ms = max(r["gc_ms"] for r in results)
        mb = results[-1]["bytes"] / 1e6
        ratio = first["raw_bytes"] / max(1, first["bytes"])
        print(
            f"{name:26s} {first['items']:7d} {mb:7.2f} {ratio:6.1f} {ms:8.1f} {best:8.1f} "
            f"{fms:9.1f} {ms / fms:8.2f} {cpu:7.0f} {stall:9.1f} {gc_ms:6.1f} {fstall:11.1f}"
        )
    await monitor.stop()
    client.stdin.close()
    await client.wait()
    await runner.cleanup()
    await server.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--pods-per-node", type=int, default=30)
    p.add_argument("--containers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3, help="timed requests per case (after one warm-up)")
    args = p.parse_args()
    if args.nodes < 1 or args.pods_per_node < 0 or args.containers < 1 or args.repeat < 1:
        p.error("argument --nodes/--pods-per-node/--containers/--repeat: must be positive")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
