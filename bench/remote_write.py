"""Remote-write ingestion rate: samples per second on one core, against the issue's 200 000.

    python bench/remote_write.py            # 10 000 series, 2 000 per request, 20 rounds
    python bench/remote_write.py --quick    # small sizes (the test suite's smoke run)

Bodies are built like Prometheus's: each series has ``__name__``, ``namespace``, ``pod``,
``instance``, ``job`` (5 labels, bound to a pod), one sample per series per round (the normal case:
one scrape's sample), or ``--samples-per-series`` samples. Rounds carry newer timestamps, so every
sample is stored. Figures (best and median of ``--repeat`` runs; in process: CPU seconds of this
process, ``time.process_time``, steadier than wall time on a shared machine):

* ``decode``: snappy + protobuf + fields into Python (kcms.sources.remote_write.decode);
* ``decode+bind+store``: the above, the binding (cached per label set after the first round), the
  per-sample checks, the quota and SeriesStore.append_many -- ``RemoteWriteAPI.ingest``, on one core;
* ``first round``: the same with a cold binding cache (every label set parsed and bound);
* ``HTTPS``: the same bodies POSTed by a client in another process to a real aggregated API server
  (TLS, bearer token reviewed by the fake Kubernetes API, per-target SubjectAccessReviews cached),
  as samples per second of wall time and per CPU second of the server process (its one core).

Each figure is also printed as a ratio of the 200 000 samples/s target.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import trustme

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import _rbac as rbac  # noqa: E402
from fakeapi import FakeKubeAPI  # noqa: E402

from kcms.apis.push import PushAPI  # noqa: E402
from kcms.apis.remote_write import REMOTE_WRITE_PATH, RemoteWriteAPI  # noqa: E402
from kcms.apiserver import AggregatedAPIServer, AuthnOptions, AuthzOptions, ServingOptions  # noqa: E402
from kcms.kube.client import KubeClient  # noqa: E402
from kcms.kube.reviews import AccessReviewer, TokenReviewer  # noqa: E402
from kcms.sources import remote_write as rw  # noqa: E402
from kcms.store.series import SeriesStore  # noqa: E402

TARGET = 200_000  # samples/s on one core (issue 10)
RBAC = [
    {
        "kind": "ClusterRole",
        "metadata": {"name": "writer"},
        "rules": [{"apiGroups": ["custom.metrics.k8s.io"], "resources": ["*"], "verbs": ["create"]}],
    },
    {
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "writer"},
        "roleRef": {"kind": "ClusterRole", "name": "writer"},
        "subjects": [{"kind": "ServiceAccount", "namespace": "monitoring", "name": "prometheus"}],
    },
]


def bodies(series: int, per_request: int, rounds: int, per_series: int, t0_ms: int) -> list[list[bytes]]:
    """``rounds`` lists of request bodies; round r's samples are r seconds after ``t0_ms``."""
    out = []
    for r in range(rounds):
        reqs = []
        for start in range(0, series, per_request):
            batch = []
            for i in range(start, min(series, start + per_request)):
                labels = [
                    ("__name__", f"app_metric_{i % 20}"),
                    ("instance", f"10.0.{i // 250 % 250}.{i % 250}:8080"),
                    ("job", "app"),
                    ("namespace", f"ns-{i % 10}"),
                    ("pod", f"pod-{i // 20}"),
                ]
                ts = t0_ms + r * 1000
                batch.append((labels, [(ts + k * 10, float(i + k)) for k in range(per_series)]))
            reqs.append(rw.encode(batch))
        out.append(reqs)
    return out


def figure(name: str, samples: int, seconds: list[float]) -> None:
    rates = sorted(samples / s for s in seconds)
    best, median = rates[-1], statistics.median(rates)
    print(
        f"  {name:<22} {median:>11,.0f} samples/s median, {best:>11,.0f} best"
        f"  ({median / TARGET:.2f}-{best / TARGET:.2f} x the {TARGET:,} target)"
    )


def in_process(args: argparse.Namespace) -> None:
    now_ms = int(time.time() * 1000) - 3_600_000  # an hour ago: inside a 2 h retention
    per_round = args.series * args.samples_per_series
    decode_s, ingest_s, cold_s = [], [], []
    for _ in range(args.repeat):
        rounds = bodies(args.series, args.per_request, args.rounds, args.samples_per_series, now_ms)
        store = SeriesStore(retention=7200, stale_after=7200)
        api = RemoteWriteAPI(store, rw.WriteLimits(max_series=10**6, max_samples=10**7))
        t = time.process_time()
        for reqs in rounds[1:]:
            for body in reqs:
                rw.decode(body, api.limits)
        decode_s.append(time.process_time() - t)
        t = time.process_time()
        for body in rounds[0]:
            accepted, rejected = api.ingest(rw.decode(body, api.limits), writer="bench")
            assert not rejected, rejected
        cold_s.append(time.process_time() - t)
        t = time.process_time()
        stored = 0
        for reqs in rounds[1:]:
            for body in reqs:
                accepted, rejected = api.ingest(rw.decode(body, api.limits), writer="bench")
                stored += accepted
        ingest_s.append(time.process_time() - t)
        assert stored == per_round * (args.rounds - 1), stored
    warm = per_round * (args.rounds - 1)
    print(
        f"in process, one core (CPU time): {args.series:,} series x {args.samples_per_series} samples, "
        f"{args.per_request:,} series per request, {args.rounds} rounds, {args.repeat} runs"
    )
    figure("decode", warm, decode_s)
    figure("decode+bind+store", warm, ingest_s)
    figure("first round (cold)", per_round, cold_s)


CLIENT = textwrap.dedent(
    """
    import asyncio, ssl, sys, time, aiohttp
    url, ca, n_files, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    paths = sys.argv[5:]
    async def main():
        ctx = ssl.create_default_context(cafile=ca)
        hdrs = {"Authorization": "Bearer bench-token", "Content-Type": "application/x-protobuf",
                "Content-Encoding": "snappy", "X-Prometheus-Remote-Write-Version": "0.1.0"}
        rounds = [[open(p, "rb").read() for p in r.split(",")] for r in paths]
        async with aiohttp.ClientSession(auto_decompress=False) as s:
            bad = 0
            async def post(body):
                nonlocal bad
                async with s.post(url, data=body, headers=hdrs, ssl=ctx) as r:
                    await r.read()
                    bad += r.status != 204
            await asyncio.gather(*(post(b) for b in rounds[0]))  # warm: token, reviews, binding cache
            t = time.perf_counter()
            for reqs in rounds[1:]:
                for i in range(0, len(reqs), concurrency):
                    await asyncio.gather(*(post(b) for b in reqs[i:i + concurrency]))
            print(time.perf_counter() - t, bad)
    asyncio.run(main())
    """
)


async def over_https(args: argparse.Namespace, tmp: Path) -> None:
    ca = trustme.CA()
    now_ms = int(time.time() * 1000) - 3_600_000
    async with FakeKubeAPI(ca) as fake:
        fake.write_kubeconfig(tmp / "kubeconfig")
        fake.tokens["bench-token"] = {"username": "system:serviceaccount:monitoring:prometheus", "uid": "1"}
        fake.authorize = rbac.authorizer(RBAC)
        kube = await KubeClient.load(str(tmp / "kubeconfig"))
        walls, cpus = [], []
        per_round = args.series * args.samples_per_series
        try:
            for run in range(args.repeat):
                store = SeriesStore(retention=7200, stale_after=7200)
                server = AggregatedAPIServer(
                    ServingOptions(
                        secure_port=0, bind_address="127.0.0.1", cert_dir=str(tmp / f"certs{run}")
                    ),
                    AuthnOptions(skip_lookup=True, token_reviewer=TokenReviewer(kube)),
                    AuthzOptions(access_reviewer=AccessReviewer(kube)),
                )
                push = PushAPI(store)
                push.install(server)
                api = RemoteWriteAPI(
                    store, rw.WriteLimits(max_series=10**6, max_samples=10**7), quota=push.quota
                )
                api.install(server)
                await server.start()
                try:
                    rounds = bodies(
                        args.series, args.per_request, args.rounds, args.samples_per_series, now_ms
                    )
                    files = []
                    for r, reqs in enumerate(rounds):
                        names = []
                        for i, body in enumerate(reqs):
                            p = tmp / f"b{run}-{r}-{i}"
                            p.write_bytes(body)
                            names.append(str(p))
                        files.append(",".join(names))
                    url = f"https://127.0.0.1:{server.port}{REMOTE_WRITE_PATH}"
                    proc = await asyncio.create_subprocess_exec(
                        sys.executable, "-c", CLIENT, url, server.serving_cert_file, "0", str(args.concurrency),
                        *files, stdout=asyncio.subprocess.PIPE,
                    )  # fmt: skip
                    # the server's CPU from the first timed request to the last: ours, minus the warm round
                    cpu0 = None
                    while cpu0 is None:
                        await asyncio.sleep(0.01)
                        if store.stats()["points"] >= per_round:
                            cpu0 = _cpu()
                    out, _ = await proc.communicate()
                    cpu = _cpu() - cpu0
                    wall, bad = out.decode().split()
                    assert int(bad) == 0, f"{bad} requests not answered 204"
                    walls.append(float(wall))
                    cpus.append(cpu)
                finally:
                    await server.stop()
        finally:
            await kube.close()
    warm = per_round * (args.rounds - 1)
    print(f"over HTTPS (client in another process, {args.concurrency} requests in flight):")
    figure("HTTPS, wall", warm, walls)
    figure("HTTPS, server CPU", warm, cpus)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--series", type=int, default=10_000)
    p.add_argument("--per-request", type=int, default=2_000, help="series per request (Prometheus: 2000 max)")
    p.add_argument("--samples-per-series", type=int, default=1)
    p.add_argument("--rounds", type=int, default=20, help="requests for every series; the first warms up")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--no-http", action="store_true")
    p.add_argument("--quick", action="store_true", help="small sizes: the test suite's smoke run")
    args = p.parse_args()
    if args.quick:
        args.series, args.per_request, args.rounds, args.repeat = 400, 100, 3, 1
    print(f"target: {TARGET:,} samples/s on one core")
    in_process(args)
    if not args.no_http:
        with tempfile.TemporaryDirectory(prefix="kcms-bench-rw-") as tmp:
            asyncio.run(over_https(args, Path(tmp)))


if __name__ == "__main__":
    main()
