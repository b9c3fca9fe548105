"""`kcms store` as a process: authentication, the wire format, bad input, and a quorum client over it."""

from __future__ import annotations

import gzip
import time

import aiohttp
import msgspec
import pytest
from _stores import TOKEN, Stores, node_batch, pod_ref

from kcms.store import wire
from kcms.store.cluster import default_quorum


@pytest.fixture
def one_store(tmp_path):
    stores = Stores(tmp_path, 1, extra=["--max-request-bytes=200000"])
    stores.start_all()
    yield stores
    stores.stop_all()


def test_default_quorum() -> None:
    assert default_quorum(1) == (1, 1)
    assert default_quorum(2) == (1, 2)
    assert default_quorum(3) == (2, 2)
    assert default_quorum(4) == (2, 3)
    assert default_quorum(5) == (3, 3)
    for n in range(1, 12):
        r, w = default_quorum(n)
        assert r + w > n


async def _post(url: str, body: bytes, token: str | None = TOKEN, **headers) -> tuple[int, bytes, str]:
    h = {"Content-Type": wire.CONTENT_TYPE, **headers}
    if token:
        h["Authorization"] = "Bearer " + token
    async with aiohttp.ClientSession() as s, s.post(url, data=body, headers=h) as r:
        return r.status, await r.read(), r.headers.get("Content-Type", "")


async def test_bad_requests_get_status_and_lose_nothing(one_store) -> None:
    base = f"http://127.0.0.1:{one_store.ports['s0']}"
    now = time.time()
    good = wire.encode(wire.Write(samples=[("m", "pods", "default", "p", (), now, 1.0)]))
    assert (await _post(base + "/store/v1/write", good, token=None))[0] == 401
    assert (await _post(base + "/store/v1/write", good, token="wrong"))[0] == 401
    code, body, ctype = await _post(base + "/store/v1/write", b"\xc1garbage")
    assert code == 400 and ctype == "application/json"
    assert msgspec.json.decode(body)["reason"] == "BadRequest"
    code, _, _ = await _post(base + "/store/v1/write", good, **{"Content-Type": "application/json"})
    assert code == 415
    big = wire.encode(
        wire.Write(samples=[("m", "pods", "default", f"p{i}", (), now, 1.0) for i in range(20000)])
    )
    assert (await _post(base + "/store/v1/write", big))[0] == 413
    # a gzip body is accepted, and one bad sample (NaN) is refused alone
    mixed = wire.Write(
        samples=[
            ("m", "pods", "default", "p", (), now, 1.0),
            ("m", "pods", "default", "q", (), now, float("nan")),
        ]
    )
    code, body, _ = await _post(
        base + "/store/v1/write", gzip.compress(wire.encode(mixed)), **{"Content-Encoding": "gzip"}
    )
    assert code == 200
    ack = wire.decode(body, wire.WriteAck)
    assert (ack.samples, ack.refused) == (1, 1)
    q = wire.encode(wire.SeriesQuery("pods", "default", None, "m"))
    code, body, _ = await _post(base + "/store/v1/query/series", q)
    rows = wire.decode(body, list[wire.SeriesRow])
    assert [(r[0], r[2]) for r in rows] == [("p", 1.0)]
    bad_sel = wire.encode(wire.SeriesQuery("pods", "default", None, "m", "a in (b"))
    assert (await _post(base + "/store/v1/query/series", bad_sel))[0] == 400
    async with aiohttp.ClientSession() as s, s.get(base + "/readyz") as r:
        assert r.status == 200  # probes need no token


async def test_quorum_client_round_trip(tmp_path) -> None:
    stores = Stores(tmp_path, 3)
    stores.start_all()
    cluster = stores.cluster()
    try:
        now = time.time()
        samples = [
            ("requests_total", pod_ref(i), (("code", "200"),), now - 10 + k, float(k * 10))
            for i in range(5)
            for k in range(3)
        ]
        result = await cluster.write([node_batch("n1", now - 10), node_batch("n1", now)], samples)
        assert result.ok and result.acked_samples == 15 and result.acked_nodes == 2
        rows = await cluster.query_series("pods", "default", ["pod-1", "pod-3"], "requests_per_second")
        assert [r.obj.name for r in rows] == ["pod-1", "pod-3"]
        assert rows[0].value == pytest.approx(10.0) and rows[0].labels == (("code", "200"),)
        agg = await cluster.query_series("pods", "default", None, "requests_total_agg_max")
        assert sorted(r.value for r in agg) == [20.0] * 5
        # the window aggregation of a rate is computed by the stores and merged like any value
        p99 = await cluster.query_series("pods", "default", ["pod-2"], "requests_per_second_agg_p99_5m")
        assert [(r.obj.name, r.value, r.timestamp, r.window) for r in p99] == [("pod-2", 10.0, now - 8, 2.0)]
        nodes = await cluster.query_nodes(None)
        assert nodes["n1"][2] == pytest.approx(0.5e9, rel=1e-6)  # cpu nanocores
        pods = await cluster.query_pods("default", None)
        assert set(pods) == {("default", "n1-p0"), ("default", "n1-p1")}
        assert ("pods", "requests_total") in await cluster.metrics()
        # each replica holds everything (multi-store mode)
        for name in stores.ports:
            one = await cluster.client(name).query_series(
                wire.SeriesQuery("pods", "default", None, "requests_total")
            )
            assert len(one) == 5
    finally:
        await cluster.close()
        stores.stop_all()
