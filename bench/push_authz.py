"""What per-target authorization costs a metric push: SubjectAccessReviews asked and time per push.

    python bench/push_authz.py

A real aggregated API server over TLS with the push endpoint; TokenReview and SubjectAccessReview
go to the test suite's fake Kubernetes API server over HTTPS on loopback, which decides reviews by
RBAC's rules from one namespaced Role (tests/_rbac.py). Scenarios, each from a cold review cache
and then again with the decisions cached (the reviewer keeps them 10 s):

  3 targets        10 000 samples about 3 objects (the bound: one review per distinct target)
  1 000 pods       1 000 pods of one resource and metric in one namespace (one "all names" review)
  100 externals    100 external metrics (one review each)
  forbidden 3 000  3 000 pods in a namespace the writer may not write (review budget: 1 000)

Prints reviews per push and milliseconds per push (median of 3 runs), beside the same push by a
system:masters user (no review at all: the cost of everything else); asserts nothing.
"""

from __future__ import annotations

import asyncio
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import trustme

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import _rbac as rbac  # noqa: E402
from fakeapi import FakeKubeAPI  # noqa: E402

from kcms.apis.push import PUSH_PATH, PushAPI, PushLimits  # noqa: E402
from kcms.apiserver import AggregatedAPIServer, AuthnOptions, AuthzOptions, ServingOptions  # noqa: E402
from kcms.kube.client import KubeClient  # noqa: E402
from kcms.kube.reviews import AccessReviewer, TokenReviewer  # noqa: E402
from kcms.store.series import SeriesStore  # noqa: E402

RBAC = [
    {
        "kind": "Role",
        "metadata": {"name": "pusher", "namespace": "a"},
        "rules": [
            {"apiGroups": ["custom.metrics.k8s.io"], "resources": ["pods/queue_depth"], "verbs": ["create"]},
            {"apiGroups": ["external.metrics.k8s.io"], "resources": ["*"], "verbs": ["create"]},
        ],
    },
    {
        "kind": "RoleBinding",
        "metadata": {"name": "pusher", "namespace": "a"},
        "roleRef": {"kind": "Role", "name": "pusher"},
        "subjects": [{"kind": "ServiceAccount", "namespace": "a", "name": "reporter"}],
    },
]


def scenarios(now: float) -> dict[str, list[dict[str, Any]]]:
    pod = {"metric": "queue_depth", "resource": "pods", "namespace": "a"}
    return {
        "3 targets": [
            {
                **pod,
                "name": f"w-{i % 3}",
                "labels": {"shard": str(i % 20)},
                "value": i,
                "timestamp": now + i * 1e-4,
            }
            for i in range(10_000)
        ],
        "1 000 pods": [{**pod, "name": f"p-{i}", "value": i, "timestamp": now} for i in range(1000)],
        "100 externals": [
            {"metric": f"m{i}", "namespace": "a", "value": i, "timestamp": now} for i in range(100)
        ],
        "forbidden 3 000": [
            {**pod, "namespace": "b", "name": f"p-{i}", "value": i, "timestamp": now} for i in range(3000)
        ],
    }


async def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="kcms-bench-push-"))
    fake = FakeKubeAPI(trustme.CA())
    await fake.start()
    fake.write_kubeconfig(tmp / "kubeconfig")
    fake.authorize = rbac.authorizer(RBAC)
    fake.tokens["t"] = {"username": "system:serviceaccount:a:reporter", "uid": "1"}
    fake.tokens["admin"] = {"username": "admin", "uid": "2", "groups": ["system:masters"]}
    kube = await KubeClient.load(str(tmp / "kubeconfig"))
    reviewer = AccessReviewer(kube)
    server = AggregatedAPIServer(
        ServingOptions(secure_port=0, bind_address="127.0.0.1", cert_dir=str(tmp / "certs")),
        AuthnOptions(skip_lookup=True, token_reviewer=TokenReviewer(kube)),
        AuthzOptions(access_reviewer=reviewer),
    )
    PushAPI(SeriesStore(), PushLimits(max_body_bytes=8 << 20, max_series_total=1_000_000)).install(server)
    await server.start()
    ctx = ssl.create_default_context(cafile=server.serving_cert_file)
    url = f"https://127.0.0.1:{server.port}{PUSH_PATH}"
    print(
        f"{'scenario':<17} {'samples':>7} {'reviews cold':>12} {'ms cold':>8} {'reviews warm':>12} {'ms warm':>8} {'ms no review':>12}"
    )
    async with aiohttp.ClientSession() as http:

        async def push(body: bytes, token: str = "t") -> tuple[dict, float]:
            t0 = time.perf_counter()
            async with http.post(url, data=body, headers={"Authorization": f"Bearer {token}"}, ssl=ctx) as r:
                answer = await r.json()
            return answer, (time.perf_counter() - t0) * 1000

        base = time.time() - 300
        for name in scenarios(base):
            cold_ms, warm_ms, cold_reviews, warm_reviews, admin_ms = [], [], [], [], []
            for run in range(3):
                reviewer._cache._data.clear()  # noqa: SLF001 - a cold cache for this run
                samples = scenarios(base + run * 50)[name]
                body = orjson.dumps({"samples": samples})
                n = len(fake.access_reviews)
                _, ms = await push(body)
                cold_ms.append(ms)
                cold_reviews.append(len(fake.access_reviews) - n)
                later = orjson.dumps({"samples": [{**s, "timestamp": s["timestamp"] + 20} for s in samples]})
                n = len(fake.access_reviews)
                _, ms = await push(later)
                warm_ms.append(ms)
                warm_reviews.append(len(fake.access_reviews) - n)
                again = orjson.dumps({"samples": [{**s, "timestamp": s["timestamp"] + 40} for s in samples]})
                _, ms = await push(again, "admin")  # system:masters: allowed without any review
                admin_ms.append(ms)
            print(
                f"{name:<17} {len(samples):>7} {max(cold_reviews):>12} {statistics.median(cold_ms):>8.1f} "
                f"{max(warm_reviews):>12} {statistics.median(warm_ms):>8.1f} {statistics.median(admin_ms):>12.1f}"
            )
    await server.stop()
    await kube.close()
    await fake.stop()


if __name__ == "__main__":
    asyncio.run(main())
