"""Every input bounded and sane: hostile kubelets and agents on loopback against the real pipeline.

* A hostile kubelet (a real HTTPS server in this file, registered as a node in the fake API server)
  serves, next to one honest pod, readings from the far future and from year 10000, negative memory,
  NaN CPU, an exabyte working set, a counter that runs backwards, a counter that jumps by 1e8
  core-seconds a scrape, a 300-character pod name, a malformed line and a line with a 1 MB metric
  name; on ``/metrics/resource`` and on ``/stats/summary``. Each bad reading is refused alone and
  counted; the hostile node's own reading, its honest pod and the simulated nodes are all served;
  every served timestamp is RFC 3339 with a four-digit year (a strict regular expression of what
  Go's ``time.RFC3339`` parser takes, which fails a whole list for ``kubectl top`` and the HPA on
  any other, and the official ``kubernetes`` client's deserializer); the server stays ready; no
  traceback is logged.
* A hostile agent whose ``X-KCMS-Agent-Time`` header and samples claim the far future cannot move
  the collector's ``since=`` cursor past real time: its later real points are still fetched.
* A store write (``kcms store`` as a process) with far-future, oversized-name and oversized-label
  samples keeps the rest and counts each refusal by reason.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import json
import logging
import math
import re
import time

import pytest
from _http_helpers import serve_app
from _pipeline import BASE, Env, start_env, stop_env, wait_ready
from _stores import TOKEN, Stores
from aiohttp import web
from prometheus_client import REGISTRY

from kcms.collector.agents import AgentAccess, AgentCollector
from kcms.quantity import parse_quantity
from kcms.sim import SimulatedCluster
from kcms.store import wire
from kcms.store.series import SeriesStore

# RFC 3339 as Go's time.Parse(time.RFC3339, ...) takes it: a four-digit year, nothing else.
RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})"
)
NS = "hostile"
NODE = "hostile-node"
GOOD = "good"
# pods the inventory places on the hostile node; only GOOD is ever served
BAD_PODS = ("future", "y10k", "negmem", "nan", "hugemem", "backwards", "jump")
LONG_POD = "p" * 300


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class HostileKubelet:
    """A kubelet that serves one honest pod among hostile readings, over HTTPS on 127.0.0.1."""

    def __init__(self, ca, endpoint: str) -> None:
        self.ca = ca
        self.endpoint = endpoint
        self.t0 = time.time()
        self.requests = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        import ssl

        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert("127.0.0.1", "localhost", NODE).configure_cert(ctx)
        app = web.Application()
        app.router.add_get("/metrics/resource", self._resource)
        app.router.add_get("/stats/summary", self._summary)
        self._runner, self.port = await serve_app(app, ssl_context=ctx, access_log=None)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # values every request: honest ones grow with time, hostile ones are what their names say
    def _values(self, now: float) -> dict[str, tuple[float, float, float]]:
        """pod -> (cpu core-seconds, memory bytes, timestamp seconds) of its one container "app"."""
        self.requests += 1
        dt = now - self.t0
        good = (10 + 0.25 * dt, 64 * 2**20, now)
        return {
            GOOD: good,
            "future": (10 + 0.25 * dt, 64 * 2**20, now + 3600),
            "y10k": (10 + 0.25 * dt, 64 * 2**20, 253402300800.0),
            "negmem": (10 + 0.25 * dt, -4096, now),
            "nan": (math.nan, 64 * 2**20, now),
            "hugemem": (10 + 0.25 * dt, 1e30, now),
            "backwards": (1e6 - dt, 64 * 2**20, now),  # same start time, counter goes down
            "jump": (10 + self.requests * 1e8, 64 * 2**20, now),  # ~1e7 cores between two scrapes
            LONG_POD: good,
        }

    async def _resource(self, request: web.Request) -> web.Response:
        now = time.time()
        values = self._values(now)
        ms = int(now * 1000)
        start = self.t0 - 100
        cpu, mem, st = [], [], []
        for pod, (c, m, ts) in sorted(values.items()):
            labels = f'{{container="app",namespace="{NS}",pod="{pod}"}}'
            tail = f" {int(ts * 1000)}\n"
            cpu.append(f"container_cpu_usage_seconds_total{labels} {c!r}{tail}".replace("nan", "NaN"))
            mem.append(f"container_memory_working_set_bytes{labels} {m!r}{tail}")
            st.append(f"container_start_time_seconds{labels} {start!r}{tail}")
        body = (
            "# TYPE container_cpu_usage_seconds_total counter\n"
            + "".join(cpu)
            + "".join(mem)
            + "".join(st)
            + f"node_cpu_usage_seconds_total {100 + 2 * (now - self.t0)!r} {ms}\n"
            + f"node_memory_working_set_bytes {2 * 2**30} {ms}\n"
            + "not a sample line {{{\n"
            + "x" * 1_000_000
            + f" 1 {ms}\n"
            + "resource_scrape_error 0\n"
        )
        return web.Response(body=body.encode(), content_type="text/plain")

    async def _summary(self, request: web.Request) -> web.Response:
        now = float(int(time.time()))
        values = self._values(now)

        def rfc(t: float) -> str:
            if t >= 253402300800.0:
                return "10000-01-01T00:00:00Z"  # what a year-10000 time looks like: not RFC 3339
            return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

        pods = []
        for pod, (c, m, ts) in values.items():
            if c != c:
                continue  # JSON has no NaN: the whole body would be refused, and that is not the test
            pods.append(
                {
                    "podRef": {"namespace": NS, "name": pod},
                    "containers": [
                        {
                            "name": "app",
                            "startTime": rfc(self.t0 - 100),
                            "cpu": {"time": rfc(ts), "usageCoreNanoSeconds": int(c * 1e9)},
                            "memory": {"time": rfc(ts), "workingSetBytes": int(m)},
                        }
                    ],
                }
            )
        node = {
            "nodeName": NODE,
            "startTime": rfc(self.t0 - 1000),
            "cpu": {"time": rfc(now), "usageCoreNanoSeconds": int((100 + 2 * (now - self.t0)) * 1e9)},
            "memory": {"time": rfc(now), "workingSetBytes": 2 * 2**30},
        }
        return web.Response(body=json.dumps({"node": node, "pods": pods}), content_type="application/json")


def _register(fake, sim: SimulatedCluster, port: int) -> None:
    """The hostile node and its pods in the fake API server, shaped as the simulated ones."""
    objs = sim.inventory_objects()
    node = copy.deepcopy(next(o for o in objs if o["kind"] == "Node"))
    node["metadata"]["name"] = NODE
    node["metadata"]["uid"] = "hostile-node-uid"
    node["metadata"]["labels"]["kubernetes.io/hostname"] = NODE
    node["status"]["addresses"] = [{"type": "InternalIP", "address": "127.0.0.1"}]
    node["status"]["daemonEndpoints"] = {"kubeletEndpoint": {"Port": port}}
    fake.upsert(node)
    template = next(o for o in objs if o["kind"] == "Pod")
    for name in (GOOD, *BAD_PODS):
        pod = copy.deepcopy(template)
        pod["metadata"].update(name=name, namespace=NS, uid=f"uid-{name}", labels={"app": name})
        pod["spec"]["nodeName"] = NODE
        pod["spec"]["containers"][0]["name"] = "app"
        fake.upsert(pod)


def _check_times(body: dict) -> None:
    """Every time in a metrics list is RFC 3339 with a four-digit year, as Go parses it."""
    import kubernetes

    api = kubernetes.client.ApiClient()

    for item in body["items"]:
        for ts in (item["timestamp"], item["metadata"]["creationTimestamp"]):
            assert RFC3339.fullmatch(ts), ts
            # the official client's own deserializer of metav1.Time fields
            meta = api.deserialize(json.dumps({"creationTimestamp": ts}), "V1ObjectMeta", "application/json")
            assert 1 <= meta.creation_timestamp.year <= 9999


@pytest.mark.parametrize("endpoint", ["resource", "summary"])
async def test_hostile_kubelet_readings_refused_alone_and_the_rest_served(
    ca, fake_kube, tmp_path, caplog, endpoint
):
    caplog.set_level(logging.INFO)
    hostile = HostileKubelet(ca, endpoint)
    await hostile.start()
    sim = SimulatedCluster(
        nodes=2, pods_per_node=3, containers_per_pod=(1, 2), seed=5, ca=ca, one_port_per_node=True
    )
    await sim.start()
    reasons = ("future_timestamp", "negative", "absurd_value", "label_value_too_long")
    if endpoint == "resource":
        reasons += ("non_finite", "metric_name_too_long", "malformed")
    else:
        reasons += ("bad_value",)  # the year-10000 time is not RFC 3339
    before = {r: counter("kcms_kubelet_rejected_samples_total", reason=r) for r in reasons}
    store_before = {
        r: counter("kcms_store_refused_readings_total", reason=r)
        for r in ("absurd_rate", "counter_backwards")
    }
    _register(fake_kube, sim, hostile.port)
    env: Env = await start_env(ca, fake_kube, tmp_path, sim, kubelet_endpoint=endpoint)
    try:
        await wait_ready(env)
        deadline = time.monotonic() + 60
        while True:  # the honest pod needs two scrapes of the hostile node; a few more for the counters
            status, body = await env.get(f"{BASE}/namespaces/{NS}/pods/{GOOD}")
            if status == 200 and hostile.requests >= 4:
                break
            assert time.monotonic() < deadline, (status, body)
            await asyncio.sleep(0.2)
        assert float(parse_quantity(body["containers"][0]["usage"]["cpu"])) == pytest.approx(0.25, rel=0.05)
        assert parse_quantity(body["containers"][0]["usage"]["memory"]) == 64 * 2**20

        status, nodes = await env.get(f"{BASE}/nodes")
        assert status == 200
        served = {i["metadata"]["name"]: i for i in nodes["items"]}
        assert set(served) == {NODE, *sim.node_names()}  # the hostile node's own reading is good
        assert float(parse_quantity(served[NODE]["usage"]["cpu"])) == pytest.approx(2.0, rel=0.05)
        _check_times(nodes)

        status, pods = await env.get(f"{BASE}/pods")
        assert status == 200
        names = {(i["metadata"]["namespace"], i["metadata"]["name"]) for i in pods["items"]}
        assert (NS, GOOD) in names
        assert not names & {(NS, p) for p in BAD_PODS}
        assert len([n for n in names if n[0] != NS]) == 6  # every simulated pod
        for item in pods["items"]:
            for c in item["containers"]:
                assert parse_quantity(c["usage"]["cpu"]) >= 0 and parse_quantity(c["usage"]["memory"]) >= 0
        _check_times(pods)
        for pod in BAD_PODS:
            status, _ = await env.get(f"{BASE}/namespaces/{NS}/pods/{pod}")
            assert status == 404, pod

        for r in reasons:
            assert counter("kcms_kubelet_rejected_samples_total", reason=r) > before[r], r
        for r, value in store_before.items():
            assert counter("kcms_store_refused_readings_total", reason=r) > value, r
        status, _ = await env.get("/readyz", token=None, accept=None)
        assert status == 200
    finally:
        await stop_env(env)
        await sim.stop()
        await hostile.stop()
    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.exc_info]
    assert all(len(r.getMessage()) < 4000 for r in caplog.records)  # the 1 MB line is not logged


class HostileAgent:
    """An agent over plain HTTP that stamps some points (and its clock header) far in the future."""

    def __init__(self) -> None:
        self.sinces: list[int] = []
        self.header_ms = int((time.time() + 10 * 365 * 86400) * 1000)  # ten years ahead
        self.lines: list[str] = []
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner, self.port = await serve_app(app, access_log=None)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        since = int(request.query["since"])
        self.sinces.append(since)
        body = "".join(line for line in self.lines if int(line.rsplit(" ", 1)[1]) > since)
        return web.Response(body=body.encode(), headers={"X-KCMS-Agent-Time": str(self.header_ms)})


def _line(metric: str, pod: str, value: float, ts: float) -> str:
    return (
        f'{metric}{{kcms_resource="pods",kcms_namespace="{NS}",kcms_name="{pod}"}} {value} {int(ts * 1000)}\n'
    )


async def test_hostile_agent_cannot_push_the_since_cursor_past_real_time(caplog):
    caplog.set_level(logging.INFO)
    agent = HostileAgent()
    await agent.start()
    store = SeriesStore()
    name = "kube-system/hostile-agent"
    collector = AgentCollector(
        None, store, selector="", targets=lambda: [(name, f"127.0.0.1:{agent.port}")],
        access=AgentAccess(insecure_http=True),
    )  # fmt: skip
    future_before = counter("kcms_collector_agent_rejected_samples_total", reason="future_timestamp")
    try:
        now = time.time()
        agent.lines = [
            _line("requests", "a", 1, now - 1),
            _line("requests", "b", 5, now + 10 * 365 * 86400),  # ten years ahead: refused
            _line("requests", "c", 7, 253402300800.0),  # year 10000: refused
            _line("requests", "d", 9, now + 45),  # within the 60 s skew: taken, but no cursor past now
        ]
        assert await collector.run_cycle() == 0
        assert (
            counter("kcms_collector_agent_rejected_samples_total", reason="future_timestamp") - future_before
            == 2
        )
        cursor = collector._since[name]
        assert cursor <= time.time() * 1000  # not the header's ten years, not the +45 s point
        assert cursor >= int((now - 1) * 1000)
        # The agent's real later points (older than the +45 s one) still come in.
        later = time.time() + 0.5
        agent.lines.append(_line("requests", "a", 2, later))
        agent.lines.append(_line("requests", "e", 3, later))
        assert await collector.run_cycle() == 0
        assert agent.sinces[-1] <= int(later * 1000)
        got = {r.obj.name: r.value for r in store.query("pods", NS, None, "requests")}
        assert got == {"a": 2.0, "d": 9.0, "e": 3.0}
        assert collector._since[name] <= time.time() * 1000
    finally:
        await collector.stop()
        await agent.stop()
    assert "Traceback" not in caplog.text


async def test_store_write_refuses_bounds_per_sample_and_keeps_the_rest(tmp_path):
    import aiohttp

    stores = Stores(tmp_path, 1)
    stores.start_all()
    try:
        base = f"http://127.0.0.1:{stores.ports['s0']}"
        now = time.time()
        samples = [
            ("m", "pods", "default", "ok", (), now, 1.0),
            ("m", "pods", "default", "future", (), now + 3600, 1.0),
            ("m", "pods", "default", "y10k", (), 253402300800.0, 1.0),
            ("m", "pods", "default", "ancient", (), -62135596801.0, 1.0),
            ("m" * 254, "pods", "default", "ok", (), now, 1.0),
            ("m", "pods", "default", "n" * 254, (), now, 1.0),
            ("m", "pods", "default", "ok2", (("a" * 129, "x"),), now, 1.0),
            ("m", "pods", "default", "ok3", (("a", "v" * 1025),), now, 1.0),
            ("m", "pods", "default", "ok4", tuple((f"l{i:02d}", "x") for i in range(33)), now, 1.0),
            ("m", "pods", "default", "ok5", (("a", "b"),), now, 2.0),
        ]
        headers = {"Content-Type": wire.CONTENT_TYPE, "Authorization": "Bearer " + TOKEN}
        async with aiohttp.ClientSession() as s:
            async with s.post(
                base + "/store/v1/write", data=wire.encode(wire.Write(samples=samples)), headers=headers
            ) as r:
                assert r.status == 200
                ack = wire.decode(await r.read(), wire.WriteAck)
            assert (ack.samples, ack.refused) == (2, 8)
            q = wire.encode(wire.SeriesQuery("pods", "default", None, "m"))
            async with s.post(base + "/store/v1/query/series", data=q, headers=headers) as r:
                rows = wire.decode(await r.read(), list[wire.SeriesRow])
            assert sorted((row[0], row[2]) for row in rows) == [("ok", 1.0), ("ok5", 2.0)]
            async with s.get(base + "/metrics") as r:
                text = await r.text()
            async with s.get(base + "/readyz") as r:
                assert r.status == 200
        expected = {
            "future_timestamp": 2,
            "bad_timestamp": 1,
            "metric_name_too_long": 1,
            "label_value_too_long": 2,
            "label_name_too_long": 1,
            "too_many_labels": 1,
        }
        for reason, n in expected.items():
            assert f'kcms_store_refused_samples_total{{reason="{reason}"}} {float(n)}' in text, reason
    finally:
        stores.stop_all()
    log = stores.log("s0")
    assert "Traceback" not in log


def test_store_refuses_future_absurd_and_backwards_readings_it_is_given() -> None:
    """ResourceStore is where every path ends (collector, node push, peers' copies): it screens too."""
    from kcms.model import NodeBatch, ResourcePoint
    from kcms.store.resource import ResourceStore

    s = ResourceStore(resolution=10.0)
    now = time.time()

    def batch(t: float, cpu_good: float, **bad: ResourcePoint) -> NodeBatch:
        pods = {("d", "good"): {"c": ResourcePoint(1.0, t, int(cpu_good * 1e9), 4096)}}
        pods.update({("d", name): {"c": p} for name, p in bad.items()})
        return NodeBatch("n1", ResourcePoint(0.0, t, int(cpu_good * 1e9), 8192), pods)

    before = {
        r: counter("kcms_store_refused_readings_total", reason=r)
        for r in ("future_timestamp", "negative", "absurd_value", "absurd_rate")
    }
    s.store(batch(now - 20, 10.0, jump=ResourcePoint(1.0, now - 20, 10**9, 4096)), received=0.0)
    s.store(
        batch(
            now - 10, 12.0,
            future=ResourcePoint(1.0, now + 3600, 10**9, 4096),
            neg=ResourcePoint(1.0, now - 10, 10**9, -1),
            huge=ResourcePoint(1.0, now - 10, 10**9, 2**60),
            jump=ResourcePoint(1.0, now - 10, 10**9 + 10**17, 4096),  # 1e8 core-seconds in 10 s
        ),
        received=1.0,
    )  # fmt: skip
    assert s.pod_usage("d", "good", now=1.0) is not None
    for name in ("future", "neg", "huge", "jump"):
        assert s.pod_usage("d", name, now=1.0) is None, name
    assert (
        counter("kcms_store_refused_readings_total", reason="future_timestamp") - before["future_timestamp"]
        == 1
    )
    assert counter("kcms_store_refused_readings_total", reason="negative") - before["negative"] == 1
    assert counter("kcms_store_refused_readings_total", reason="absurd_value") - before["absurd_value"] == 1
    assert counter("kcms_store_refused_readings_total", reason="absurd_rate") - before["absurd_rate"] == 1
    node = s.node_usage("n1", now=1.0)
    assert node is not None and node.cpu_nanocores == 200_000_000


def test_store_trusts_a_decoders_screen_only_up_to_its_own_future_limit() -> None:
    """A kubelet decoder marks the batch it screened (NodeBatch.screened) and the store does not
    screen it again, unless the decoder's limit was later than the store's: a body decoded as of
    an hour ahead (its readings, without timestamps, stamped then) passes the decoder's own screen
    but is refused by the store. (Batches made anywhere else carry no mark and are screened: the
    test above.)"""
    from _kubelet_decode_helpers import build_resource_body

    from kcms.sources.kubelet_decode import decode_resource_metrics
    from kcms.store.resource import ResourceStore

    body = build_resource_body(3, 2, timestamps=False)
    ahead = time.time() + 3600
    late = decode_resource_metrics("n-ahead", body, now=ahead)
    assert late.screened >= ahead and len(late.pods) == 3  # within the decoder's (later) limit
    now = decode_resource_metrics("n-now", body)
    assert 0 < now.screened < ahead and len(now.pods) == 3

    s = ResourceStore(resolution=10.0)
    before = counter("kcms_store_refused_readings_total", reason="future_timestamp")
    s.store(late, received=0.0)
    assert late.pods == {} and late.node_point is None
    # each reading counted: 3 pods x 2 containers and the node
    assert counter("kcms_store_refused_readings_total", reason="future_timestamp") - before == 7
    s.store(now, received=0.0)
    assert len(now.pods) == 3 and now.node_point is not None
    assert s.pod_usage(*next(iter(now.pods)), now=0.0) is None  # stored (one reading: no rate yet)
    assert s.node_names() == ["n-ahead", "n-now"]


def test_served_times_always_have_four_digit_years() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from kcms.apis.metrics.convert import TimeFormatter

    @given(st.floats(allow_nan=True, allow_infinity=True))
    @settings(max_examples=500, deadline=None)
    def check(ts: float) -> None:
        text = TimeFormatter()(ts)
        assert RFC3339.fullmatch(text), text
        assert datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").year >= 1

    check()
    fmt = TimeFormatter()
    assert fmt(998 * 365.25 * 86400 - 62135596800).startswith("0999-")  # strftime would print "999"
    assert fmt(1e300) == "9999-12-31T23:59:59Z" and fmt(-1e300) == "0001-01-01T00:00:00Z"
