"""One server, many sources, one routing rule (kcms/apis/routing.py): each metric (custom:
``<resource>/<metric>``, external: ``<metric>``) is served by the first source in ``--metric-sources``
order that lists it, never a mix; discovery lists it once; ``GET /debug/metric-sources`` says which
source serves it and is authorized like any non-resource URL.

The router is exercised over two real series stores, then through the standalone pipeline with a
real Prometheus and pushes to the store naming the same metric.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from _bridge_helpers import exporter_objects, promql, write_config
from _pipeline import Env, start_env, stop_env, wait_ready
from _prometheus_helpers import prom_fixture  # noqa: F401 (the module's real Prometheus: `prom`)

from kcms.apis.provider import EVERYTHING, MetricInfo, StoreProvider
from kcms.apis.routing import MetricRouter, parse_metric_sources, route
from kcms.cmd.main import build_parser
from kcms.model import ObjectRef
from kcms.sim import SimulatedCluster
from kcms.store.series import SeriesStore


def _store(points: list[tuple[str, ObjectRef, float]]) -> StoreProvider:
    series = SeriesStore(retention=600, stale_after=300, default_window=60)
    now = time.time()  # at the call: a time taken at import is stale when the suite runs long
    for metric, obj, value in points:
        series.append(metric, obj, (), now, value)
    return StoreProvider(series, lambda resource: resource != "nodes")


POD = ObjectRef("pods", "default", "web-0")


def _router(order: tuple[str, ...], **sources: StoreProvider) -> MetricRouter:
    return route(order, sources)


async def test_a_metric_in_two_sources_is_served_by_the_first_in_order_only():
    a = _store([("shared", POD, 1.0), ("only_a", POD, 10.0), ("ext", ObjectRef("", "default", ""), 5.0)])
    b = _store([("shared", POD, 2.0), ("only_b", POD, 20.0), ("ext", ObjectRef("", "default", ""), 6.0)])
    for order, winner, value in (
        (("store", "prometheus"), "store", 1.0),
        (("prometheus", "store"), "prometheus", 2.0),
    ):
        r = _router(order, store=a, prometheus=b)
        infos = list(r.list_metrics())
        assert sorted((i.resource, i.metric) for i in infos) == [
            ("pods", "only_a"),
            ("pods", "only_b"),
            ("pods", "shared"),
        ]  # once each
        assert r.custom_source("pods", "shared") == winner
        assert r.custom_source("pods", "only_b") == "prometheus"
        values = await r.get_metrics("pods", "default", ["web-0"], "shared", EVERYTHING)
        assert [v.value for v in values] == [value]
        assert [v.value for v in await r.get_metrics("pods", "default", ["web-0"], "only_b", EVERYTHING)] == [
            20.0
        ]
        assert list(r.list_external_metrics()) == ["ext"] and r.external_source("ext") == winner
        ext = await r.get_external_metrics("default", "ext", EVERYTHING)
        assert [v.value for v in ext] == [5.0 if winner == "store" else 6.0]
        doc = r.describe()
        shared = next(e for e in doc["custom"] if e["metric"] == "shared")
        assert shared["source"] == winner and shared["alsoListedBy"] == [n for n in order if n != winner]
        assert doc["order"] == list(order)


async def test_the_owner_answering_nothing_is_the_answer_never_another_sources_values():
    a = _store([("shared", POD, 1.0)])
    b = _store([("shared", POD, 2.0), ("shared", ObjectRef("pods", "default", "web-1"), 3.0)])
    r = _router(("store", "prometheus"), store=a, prometheus=b)
    # web-1 has the metric only in the second source: the first owns the metric, so nothing
    assert await r.get_metrics("pods", "default", ["web-1"], "shared", EVERYTHING) == []


async def test_unlisted_names_fall_through_in_order_and_malformed_names_stay_400():
    a = _store([("jobs_total", POD, 1.0)])
    b = _store([])
    r = _router(("prometheus", "store"), store=a, prometheus=b)
    # the store derives aggregates it does not list; asked in order, the store answers
    values = await r.get_metrics("pods", "default", ["web-0"], "jobs_total_agg_max_1m", EVERYTHING)
    assert [v.value for v in values] == [1.0]
    assert r.custom_source("pods", "jobs_total_agg_max_1m") is None
    with pytest.raises(ValueError):
        await r.get_metrics("pods", "default", ["web-0"], "jobs_total_agg_bogus_1m", EVERYTHING)


class _Broken:
    """A source whose listing starts failing (a provider with a bug): its last entries are kept."""

    def __init__(self, infos: list[MetricInfo]) -> None:
        self.infos = infos
        self.fail = False

    def list_metrics(self):
        if self.fail:
            raise RuntimeError("listing failed")
        return self.infos


async def test_a_source_whose_listing_fails_keeps_its_routes_and_others_are_unaffected(caplog):
    broken = _Broken([MetricInfo("pods", "from_broken", True)])
    store = _store([("from_store", POD, 1.0)])
    clock = [0.0]
    r = MetricRouter([("prometheus", broken), ("store", store)], ttl=1.0, clock=lambda: clock[0])
    assert r.custom_source("pods", "from_broken") == "prometheus"
    broken.fail = True
    clock[0] = 5.0
    assert r.custom_source("pods", "from_broken") == "prometheus"
    assert r.custom_source("pods", "from_store") == "store"
    assert "listing failed" in caplog.text and "Traceback" not in caplog.text


def test_metric_sources_flag_is_checked():
    assert parse_metric_sources("prometheus, store") == ("prometheus", "store")
    for bad in ("", "store,store", "store,graphite"):
        with pytest.raises(ValueError):
            parse_metric_sources(bad)
    parser = build_parser("standalone")
    with pytest.raises(SystemExit):
        parser.parse_args(["standalone", "--metric-sources", "store,graphite"])
    assert parser.parse_args(["standalone"]).metric_sources == ("store", "prometheus")


# ---- through the standalone pipeline, with a real Prometheus ------------------------------------


async def _env(ca, fake_kube, tmp_path, prom, order: tuple[str, ...]) -> tuple[Env, SimulatedCluster]:
    exporter_objects(fake_kube, prom.exporter)
    sim = SimulatedCluster(
        nodes=1, pods_per_node=1, containers_per_pod=1, seed=8, ca=ca, one_port_per_node=True
    )
    await sim.start()
    env = await start_env(
        ca,
        fake_kube,
        tmp_path,
        sim,
        prometheus_url=prom.url,
        config=write_config(tmp_path),
        metrics_relist_interval=1.0,
        metrics_max_age=600.0,
        metric_sources=order,
    )
    return env, sim


async def _push_in_flight(env: Env, fake_kube) -> None:
    """The store gets pods/http_requests_in_flight for default/web-0 too (999; Prometheus has 1)."""
    fake_kube.tokens["pusher"] = {"username": "pusher", "groups": ["pushers"]}
    sample = {
        "metric": "http_requests_in_flight",
        "resource": "pods",
        "namespace": "default",
        "name": "web-0",
        "value": 999,
        "timestamp": time.time(),
    }
    async with aiohttp.ClientSession() as s:
        headers = {"Authorization": "Bearer pusher"}
        async with s.post(
            env.url + "/push/v1/samples", json={"samples": [sample]}, headers=headers, ssl=env.ssl
        ) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["accepted"] == 1


PATH = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/default/pods/web-0/http_requests_in_flight"


@pytest.mark.parametrize("order", [("store", "prometheus"), ("prometheus", "store")])
async def test_served_by_exactly_one_source_per_the_order_and_the_debug_endpoint_says_so(
    ca,
    fake_kube,
    tmp_path,
    prom,
    order,  # noqa: F811
):
    env, sim = await _env(ca, fake_kube, tmp_path, prom, order)
    try:
        await wait_ready(env)
        await _push_in_flight(env, fake_kube)
        await asyncio.sleep(1.1)  # the router's table is rebuilt at most once a second
        status, body = await env.get(PATH)
        assert status == 200, body
        (item,) = body["items"]
        from_prometheus = next(
            iter(promql(prom, 'http_requests_in_flight{namespace="default",pod="web-0"}').values())
        )
        expected = "999" if order[0] == "store" else str(int(from_prometheus))
        assert item["value"] == expected
        status, disc = await env.get("/apis/custom.metrics.k8s.io/v1beta2")
        names = [r["name"] for r in disc["resources"]]
        assert names.count("pods/http_requests_in_flight") == 1
        status, doc = await env.get("/debug/metric-sources")
        assert status == 200 and doc["order"] == list(order)
        entry = next(
            e for e in doc["custom"] if (e["resource"], e["metric"]) == ("pods", "http_requests_in_flight")
        )
        assert entry["source"] == order[0] and entry["alsoListedBy"] == [order[1]]
        only_prom = next(e for e in doc["custom"] if e["metric"] == "messages_waiting")
        assert only_prom["source"] == "prometheus" and "alsoListedBy" not in only_prom
        assert {e["metric"]: e["source"] for e in doc["external"]}["queue_depth"] == "prometheus"
    finally:
        await stop_env(env)
        await sim.stop()


async def test_debug_endpoint_is_authorized_as_a_non_resource_url(ca, fake_kube, tmp_path, prom):  # noqa: F811
    env, sim = await _env(ca, fake_kube, tmp_path, prom, ("store", "prometheus"))
    try:
        await wait_ready(env)
        fake_kube.authorize = lambda spec: (
            (False, "no debug for you")
            if spec.get("nonResourceAttributes", {}).get("path") == "/debug/metric-sources"
            else (True, "")
        )
        status, body = await env.get("/debug/metric-sources")
        assert status == 403 and body["reason"] == "Forbidden"
        review = fake_kube.access_reviews[-1]["spec"]
        assert review["nonResourceAttributes"] == {"path": "/debug/metric-sources", "verb": "get"}
        status, body = await env.get("/debug/metric-sources", token=None)
        assert status == 401
        status, body = await env.get("/apis/custom.metrics.k8s.io/v1beta2")  # the rest is unaffected
        assert status == 200
    finally:
        await stop_env(env)
        await sim.stop()
