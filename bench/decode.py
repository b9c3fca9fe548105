"""Micro-benchmark of the kubelet decoders.

Builds a realistic ``/metrics/resource`` body (30 pods x 2 containers, with timestamps) and a matching
``/stats/summary`` JSON body, then prints microseconds per line and per body, samples per second, and the
ratio against ``prometheus_client.parser.text_string_to_metric_families`` on the same text body.

Run: ``python bench/decode.py [--pods 30] [--containers 2] [--seconds 2]``
"""

from __future__ import annotations

import argparse
import random
import time

import orjson
from prometheus_client.parser import text_string_to_metric_families

from kcms.sources.kubelet_decode import DecodeReuse, decode_resource_metrics, decode_summary

_FAMILIES = [
    (
        "container_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the container in core-seconds",
    ),
    ("container_memory_working_set_bytes", "gauge", "Current working set of the container in bytes"),
    ("container_start_time_seconds", "gauge", "Start time of the container since unix epoch in seconds"),
]


def build_resource_body(pods: int, containers: int, *, timestamps: bool = True, seed: int = 1) -> bytes:
    """A kubelet /metrics/resource body in the real layout (families sorted, labels sorted)."""
    rnd = random.Random(seed)
    ts = " 1700000000123" if timestamps else ""
    series = []
    for p in range(pods):
        ns = ("kube-system", "default", "monitoring", "team-a-prod")[p % 4]
        pod = f"app-{p:03d}-{rnd.getrandbits(32):08x}-{rnd.getrandbits(20):05x}"
        for c in range(containers):
            cname = ("main", "sidecar", "istio-proxy", "init")[c % 4]
            series.append((cname, ns, pod))
    series.sort(key=lambda s: (s[1], s[2], s[0]))
    out = []
    values = {
        "container_cpu_usage_seconds_total": lambda: f"{rnd.uniform(0.01, 50000):.6f}",
        "container_memory_working_set_bytes": lambda: f"{rnd.randint(1 << 20, 4 << 30):.7e}",
        "container_start_time_seconds": lambda: f"{1.6999e9 + rnd.randint(0, 10**6):.9e}",
    }
    for name, typ, help_text in _FAMILIES:
        out.append(f"# HELP {name} [STABLE] {help_text}")
        out.append(f"# TYPE {name} {typ}")
        for cname, ns, pod in series:
            out.append(f'{name}{{container="{cname}",namespace="{ns}",pod="{pod}"}} {values[name]()}{ts}')
    out.append(
        "# HELP node_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the node in core-seconds"
    )
    out.append("# TYPE node_cpu_usage_seconds_total counter")
    out.append(f"node_cpu_usage_seconds_total 357354.91{ts}")
    out.append("# HELP node_memory_working_set_bytes [STABLE] Current working set of the node in bytes")
    out.append("# TYPE node_memory_working_set_bytes gauge")
    out.append(f"node_memory_working_set_bytes 1.616273408e+09{ts}")
    pod_keys = sorted({(ns, pod) for _, ns, pod in series})
    for name, typ in (("pod_cpu_usage_seconds_total", "counter"), ("pod_memory_working_set_bytes", "gauge")):
        out.append(f"# HELP {name} [STABLE] pod level")
        out.append(f"# TYPE {name} {typ}")
        for ns, pod in pod_keys:
            out.append(f'{name}{{namespace="{ns}",pod="{pod}"}} {rnd.uniform(1, 9):.6f}{ts}')
    out.append(
        "# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics"
    )
    out.append("# TYPE resource_scrape_error gauge")
    out.append("resource_scrape_error 0")
    return ("\n".join(out) + "\n").encode()


def build_summary_body(pods: int, containers: int, seed: int = 1) -> bytes:
    """A kubelet /stats/summary body with the fields KCMS reads and the usual others."""
    rnd = random.Random(seed)
    t = "2023-11-14T22:13:20.123456789Z"

    def cpu() -> dict:
        return {
            "time": t,
            "usageNanoCores": rnd.randint(0, 10**9),
            "usageCoreNanoSeconds": rnd.randint(1, 10**14),
        }

    def memory() -> dict:
        ws = rnd.randint(1 << 20, 1 << 32)
        return {
            "time": t,
            "availableBytes": 1 << 33,
            "usageBytes": ws * 2,
            "workingSetBytes": ws,
            "rssBytes": ws // 2,
            "pageFaults": 1000,
            "majorPageFaults": 3,
        }

    pod_list = []
    for p in range(pods):
        pod_list.append(
            {
                "podRef": {"name": f"app-{p:03d}", "namespace": "default", "uid": f"uid-{p}"},
                "startTime": "2023-11-14T20:00:00Z",
                "containers": [
                    {
                        "name": f"c{c}",
                        "startTime": "2023-11-14T20:00:01Z",
                        "cpu": cpu(),
                        "memory": memory(),
                        "rootfs": {"time": t, "usedBytes": 1234},
                        "logs": {"time": t, "usedBytes": 55},
                    }
                    for c in range(containers)
                ],
                "cpu": cpu(),
                "memory": memory(),
                "network": {"time": t, "name": "eth0", "rxBytes": 1, "txBytes": 2},
                "volume": [{"time": t, "name": "kube-api-access", "usedBytes": 12288}],
                "ephemeral-storage": {"time": t, "usedBytes": 1},
            }
        )
    body = {
        "node": {
            "nodeName": "node-1",
            "startTime": "2023-11-01T00:00:00Z",
            "cpu": cpu(),
            "memory": memory(),
            "systemContainers": [{"name": "kubelet", "startTime": t, "cpu": cpu(), "memory": memory()}],
        },
        "pods": pod_list,
    }
    return orjson.dumps(body)


def timeit(fn, seconds: float) -> float:
    """Seconds per call of fn, best of a few rounds lasting ``seconds`` in total."""
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if dt > 0.05:
            break
        n *= 2
    rounds = max(3, int(seconds / dt))
    best = dt / n
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pods", type=int, default=30)
    ap.add_argument("--containers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()

    for ts in (True, False):
        body = build_resource_body(args.pods, args.containers, timestamps=ts)
        text = body.decode()
        lines = text.count("\n")
        samples = sum(1 for ln in text.splitlines() if ln and not ln.startswith("#"))
        batch = decode_resource_metrics("node-1", body, now=1.7e9)
        assert (
            batch.node_point is not None
            and sum(len(c) for c in batch.pods.values()) == args.pods * args.containers
        )
        assert not batch.rejected, batch.rejected
        ours = timeit(lambda body=body: decode_resource_metrics("node-1", body, now=1.7e9), args.seconds)
        ref = timeit(lambda text=text: list(text_string_to_metric_families(text)), args.seconds / 2)
        # the collector's way: the node's start-time block unchanged since its last scrape is not re-read
        reuse = DecodeReuse()
        assert decode_resource_metrics("node-1", body, now=1.7e9, reuse=reuse) == batch
        again = timeit(
            lambda body=body, reuse=reuse: decode_resource_metrics("node-1", body, now=1.7e9, reuse=reuse),
            args.seconds,
        )
        assert reuse.hits > 0
        print(
            f"/metrics/resource timestamps={ts}: {len(body)} bytes, {lines} lines, {samples} samples: "
            f"{ours * 1e6:.1f} us/body, {ours * 1e6 / lines:.3f} us/line, {samples / ours:,.0f} samples/s; "
            f"prometheus_client {ref * 1e6:.1f} us/body ({ref / ours:.1f}x slower); "
            f"start times reused (DecodeReuse): {again * 1e6:.1f} us/body"
        )

    sbody = build_summary_body(args.pods, args.containers)
    sb = decode_summary("node-1", sbody)
    assert sb.node_point is not None and sum(len(c) for c in sb.pods.values()) == args.pods * args.containers
    s_t = timeit(lambda: decode_summary("node-1", sbody), args.seconds)
    j_t = timeit(lambda: orjson.loads(sbody), args.seconds / 2)
    print(
        f"/stats/summary: {len(sbody)} bytes: {s_t * 1e6:.1f} us/body "
        f"(of which orjson.loads {j_t * 1e6:.1f} us), {args.pods * args.containers / s_t:,.0f} containers/s"
    )


if __name__ == "__main__":
    main()
