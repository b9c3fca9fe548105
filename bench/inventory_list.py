"""Inventory benchmark: what a KubeInventory fetches and keeps for N realistic pods, and how fast.

    python bench/inventory_list.py --nodes 5000 --pods 150000
    python bench/inventory_list.py --nodes 5000 --pods 150000 --inventory-kwargs '{"pod_node_names": false}'

The fake API server of the test suite runs in another process (bench/fake_kube_apiserver.py
--realistic): NODES nodes (~7 KiB of JSON each, with an image list) and PODS Running pods of
~8 KiB each (managedFields, env, probes, volumes, conditions, container statuses), plus 2 % not
Running. This process measures, for `KubeInventory(client, **kwargs).start()` (first list of
nodes and pods): wall time, time until the nodes are listed, CPU seconds of this process, RSS
held afterwards (after a gc) and the peak during the list, the bytes and requests the server
sent; then the watch: K pods relabelled by the server, the wall time and this process's CPU
per event until the last one is in the cache. Then the floor: the same LIST pages fetched and
not decoded (transfer only), and the decode time of one page per pod.
It prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_kube_apiserver import realistic_pod  # noqa: E402

from kcms.kube.client import KubeClient  # noqa: E402
from kcms.kube.inventory import KubeInventory  # noqa: E402


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def rss_mib() -> float:
    return _status_kib("VmRSS") / 1024


def reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (Linux >= 4.0)
        return True
    except OSError:
        return False


def peak_mib() -> float:
    return _status_kib("VmHWM") / 1024


def _read_line(proc: subprocess.Popen, prefix: str, timeout: float = 900) -> str:
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise SystemExit(f"fake API server exited with {proc.returncode}")
        if line.startswith(prefix):
            return line.strip()
    raise SystemExit(f"timed out waiting for {prefix!r}")


def ask(proc: subprocess.Popen, command: str, prefix: str) -> str:
    assert proc.stdin is not None
    proc.stdin.write(command + "\n")
    proc.stdin.flush()
    return _read_line(proc, prefix)


async def first_list(client: KubeClient, kwargs: dict) -> tuple[KubeInventory, dict]:
    gc.collect()
    rss0 = rss_mib()
    peak_ok = reset_peak()
    cpu0, t0 = time.process_time(), time.monotonic()
    inv = KubeInventory(client, **kwargs)
    nodes_at = 0.0

    async def watch_nodes() -> None:
        nonlocal nodes_at
        while not inv.node_informer.has_synced():  # noqa: ASYNC110 (a probe, no event)
            await asyncio.sleep(0.005)
        nodes_at = time.monotonic() - t0

    poll = asyncio.create_task(watch_nodes())
    await inv.start()
    while not inv.has_synced():  # noqa: ASYNC110 (start() may return once the nodes are in)
        await asyncio.sleep(0.005)
    wall = time.monotonic() - t0
    cpu = time.process_time() - cpu0
    await poll
    peak = peak_mib() if peak_ok else float("nan")
    gc.collect()
    held = rss_mib() - rss0
    return inv, {"wall": wall, "nodes_at": nodes_at, "cpu": cpu, "held_mib": held, "peak_mib": peak - rss0}


async def floor(client: KubeClient, path: str, params: dict, accept: str) -> tuple[float, float, int, int, bytes]:
    """Fetch every page of a LIST without decoding more than the continue token: transfer cost."""
    import orjson

    session = client._get_session()
    headers = client._headers({"Accept": accept})
    t0, cpu0 = time.monotonic(), time.process_time()
    total = pages = 0
    first = b""
    params = dict(params)
    while True:
        async with session.get(client.host + path, params=params, headers=headers, ssl=client._ssl) as resp:
            raw = await resp.read()
        total += len(raw)
        pages += 1
        first = first or raw
        # the continue token sits near the start of the body: decode only the metadata
        tail = raw.find(b',"items"')
        meta = orjson.loads(raw[: tail] + b"}") if tail > 0 and raw.startswith(b'{"kind"') else orjson.loads(raw)
        token = (meta.get("metadata") or {}).get("continue")
        if not token:
            break
        params["continue"] = token
    return time.monotonic() - t0, time.process_time() - cpu0, total, pages, first


def decode_cost(page: bytes) -> dict[str, float]:
    """Seconds per pod to decode one LIST page: orjson -> dicts -> pod_from_json (the old way), and
    the wire decoder of kcms.kube.objects when there is one."""
    import orjson

    from kcms.kube import objects

    out = {}
    n = len(orjson.loads(page)["items"])
    reps = 5
    t0 = time.perf_counter()
    for _ in range(reps):
        for o in orjson.loads(page)["items"]:
            objects.pod_from_json(o)
    out["orjson+pod_from_json"] = (time.perf_counter() - t0) / reps / n
    decoder = getattr(objects, "POD_WIRE", None)
    if decoder is not None:
        t0 = time.perf_counter()
        for _ in range(reps):
            decoder.page(page)
        out["msgspec wire decoder"] = (time.perf_counter() - t0) / reps / n
    return out


async def run(args: argparse.Namespace, server: subprocess.Popen, kubeconfig: str) -> None:
    kwargs = json.loads(args.inventory_kwargs)
    client = await KubeClient.load(kubeconfig)
    try:
        inv, first = await first_list(client, kwargs)
        stats = json.loads(ask(server, "stats", "{"))
        n_pods, n_nodes = len(list(inv.pods())), len(list(inv.nodes()))
        print(f"inventory kwargs: {kwargs or '(defaults)'}")
        print(f"listed: {n_nodes} nodes, {n_pods} pods")
        print(
            f"first list: {first['wall']:.2f} s wall (nodes listed after {first['nodes_at']:.2f} s), "
            f"{first['cpu']:.2f} s CPU of this process"
        )
        print(
            f"bytes listed: {stats['list_bytes'] / 2**20:.1f} MiB in {stats['list_requests']} requests "
            f"({stats['list_bytes'] / max(1, n_pods + n_nodes):.0f} B per object)"
        )
        print(
            f"memory: {first['held_mib']:.1f} MiB held after the list "
            f"({first['held_mib'] * 2**20 / max(1, n_pods):.0f} B per pod), peak +{first['peak_mib']:.1f} MiB"
        )

        # watch throughput
        k = min(args.churn, n_pods)
        last = realistic_pod(k - 1, "x", "x")["metadata"]
        ns, name = last["namespace"], last["name"]
        cpu0, t0 = time.process_time(), time.monotonic()
        assert server.stdin is not None
        server.stdin.write(f"churn {k}\n")
        server.stdin.flush()
        while True:
            p = inv.pod(ns, name)
            if p is not None and p.labels.get("churn") == "1":
                break
            await asyncio.sleep(0.01)
        wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
        _read_line(server, "done")
        print(
            f"watch: {k} MODIFIED events in {wall:.2f} s wall ({k / wall:.0f}/s, server-bound), "
            f"{cpu / k * 1e6:.1f} us CPU per event in this process"
        )
        await inv.stop()

        # floor: the same pages, not decoded
        pod_inf = inv.pod_informer
        params = {k2: v for k2, v in pod_inf._params().items() if v}
        params["limit"] = str(pod_inf.page_size) if pod_inf.page_size else ""
        params = {k2: v for k2, v in params.items() if v}
        accept = getattr(pod_inf, "accept", None) or "application/json"
        fwall, fcpu, fbytes, fpages, page = await floor(client, "/api/v1/pods", params, accept)
        print(
            f"floor (pods LIST pages fetched, not decoded): {fwall:.2f} s wall, {fcpu:.2f} s CPU, "
            f"{fbytes / 2**20:.1f} MiB in {fpages} pages of {pod_inf.page_size or 'all'}"
        )
        if accept == "application/json":
            for what, sec in decode_cost(page).items():
                print(f"decode one page: {what}: {sec * 1e6:.1f} us per pod")
        else:
            for what, sec in decode_cost_meta(page).items():
                print(f"decode one page: {what}: {sec * 1e6:.1f} us per pod")
        del inv
    finally:
        await client.close()


def decode_cost_meta(page: bytes) -> dict[str, float]:
    import orjson

    from kcms.kube import objects

    n = len(orjson.loads(page)["items"])
    reps = 5
    t0 = time.perf_counter()
    for _ in range(reps):
        orjson.loads(page)
    out = {"orjson only (metadata page)": (time.perf_counter() - t0) / reps / n}
    decoder = getattr(objects, "POD_META_WIRE", None)
    if decoder is not None:
        t0 = time.perf_counter()
        for _ in range(reps):
            decoder.page(page)
        out["msgspec metadata decoder"] = (time.perf_counter() - t0) / reps / n
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=150_000)
    ap.add_argument("--churn", type=int, default=20_000, help="pods relabelled to time the watch")
    ap.add_argument("--inventory-kwargs", default="{}", help="JSON keyword arguments of KubeInventory")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kcms-inv-bench-"))
    kubeconfig = str(work / "kubeconfig")
    t0 = time.monotonic()
    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("fake_kube_apiserver.py")), "--realistic",
         str(args.nodes), str(args.pods), kubeconfig],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _read_line(server, "ready")
        print(f"fake API server ready in {time.monotonic() - t0:.0f} s (load {os.getloadavg()[0]:.2f})")
        asyncio.run(run(args, server, kubeconfig))
    finally:
        server.kill()
        server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
