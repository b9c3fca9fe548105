"""Decoder of the kubelet's /stats/summary (JSON) responses, and its RFC 3339 timestamp parser."""

from __future__ import annotations

import orjson
import pytest
from _kubelet_decode_helpers import RESOURCE, SUMMARY, build_summary_body

from kcms.model import DecodeError, ResourcePoint
from kcms.sources.kubelet_decode import decode_resource_metrics, decode_summary
from kcms.sources.summary_decode import parse_rfc3339

# ------------------------------------------------------------------ /stats/summary


def test_summary_real_body() -> None:
    b = decode_summary("kind-worker", SUMMARY)
    assert b.node_point == ResourcePoint(
        parse_rfc3339("2023-11-14T19:59:30Z"), 1700000000.0, 357_354_910_000, 1_616_273_408
    )
    assert set(b.pods) == {("kube-system", "coredns-55cb58b774-6vb7p"), ("default", "web-7d4b9c8f5-abcde")}
    coredns = b.pods[("kube-system", "coredns-55cb58b774-6vb7p")]["coredns"]
    assert coredns == ResourcePoint(
        parse_rfc3339("2023-11-14T20:01:05.123456789Z"),
        parse_rfc3339("2023-11-14T22:13:19.456789123Z"),
        10_059_659_000,
        16_547_840,
    )
    web = b.pods[("default", "web-7d4b9c8f5-abcde")]
    assert web["sidecar"].start_time == web["nginx"].start_time  # 23:00:02+02:00 == 21:00:02Z
    assert b.rejected == {"incomplete_container": 1}  # the starting pod has no cpu stats yet


def test_summary_matches_resource_for_same_data() -> None:
    s = decode_summary("n", SUMMARY)
    r = decode_resource_metrics("n", RESOURCE, now=0)
    for key in s.pods:
        for c, p in s.pods[key].items():
            assert r.pods[key][c].cpu_ns == p.cpu_ns and r.pods[key][c].memory == p.memory


def test_rfc3339() -> None:
    assert parse_rfc3339("1970-01-01T00:00:00Z") == 0.0
    assert parse_rfc3339("2023-11-14T22:13:20Z") == 1700000000.0
    assert parse_rfc3339("2023-11-14T22:13:20.5+02:00") == 1700000000.5 - 7200
    assert parse_rfc3339("2023-11-14t22:13:20.000000001z") == 1700000000.000000001
    assert parse_rfc3339("2000-02-29T00:00:00-00:30") == 951782400.0 + 1800
    for bad in (
        "2023-02-29T00:00:00Z",
        "2023-13-01T00:00:00Z",
        "2023-11-14 22:13:20Z",
        "2023-11-14T22:13:20",
        "2023-11-14T24:00:00Z",
        "2023-11-14T22:13:20.1234567891Z",
        "2023-11-14T22:13:20+2:00",
        "",
    ):
        with pytest.raises(ValueError):
            parse_rfc3339(bad)


def _summary(**node_over) -> dict:  # type: ignore[no-untyped-def]
    doc = orjson.loads(SUMMARY)
    doc["node"].update(node_over)
    return doc


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda d: d["pods"][1]["containers"][0]["cpu"].update(usageCoreNanoSeconds="5"), "bad_value"),
        (lambda d: d["pods"][1]["containers"][0]["cpu"].update(usageCoreNanoSeconds=True), "bad_value"),
        (lambda d: d["pods"][1]["containers"][0]["cpu"].update(usageCoreNanoSeconds=1.5), "bad_value"),
        (lambda d: d["pods"][1]["containers"][0]["cpu"].update(usageCoreNanoSeconds=-5), "negative"),
        (
            lambda d: d["pods"][1]["containers"][0]["memory"].update(workingSetBytes=None),
            "incomplete_container",
        ),
        (lambda d: d["pods"][1]["containers"][0].update(cpu=[1, 2]), "bad_value"),
        (lambda d: d["pods"][1]["containers"][0]["cpu"].update(time="yesterday"), "bad_value"),
        (lambda d: d["pods"][1]["containers"][0]["cpu"].update(time=17), "bad_value"),
        (  # year 10000 is not RFC 3339 (a four-digit year): a time that cannot be read
            lambda d: d["pods"][1]["containers"][0]["cpu"].update(time="10000-01-01T00:00:00Z"),
            "bad_value",
        ),
        (lambda d: d["pods"][1]["containers"][0].update(name=""), "missing_label"),
        (lambda d: d["pods"][1]["containers"][0].update(name=7), "missing_label"),
        (lambda d: d["pods"][1]["containers"].append(d["pods"][1]["containers"][0]), "duplicate"),
        (lambda d: d["pods"][1]["containers"].append("x"), "bad_value"),
    ],
)
def test_summary_container_rejections(mutate, reason: str) -> None:  # type: ignore[no-untyped-def]
    doc = orjson.loads(SUMMARY)
    mutate(doc)
    b = decode_summary("n", orjson.dumps(doc))
    want = {"incomplete_container": 1}
    want[reason] = want.get(reason, 0) + 1
    assert b.rejected == want
    appended = len(doc["pods"][1]["containers"]) == 3
    assert len(b.pods[("default", "web-7d4b9c8f5-abcde")]) == (2 if appended else 1)
    assert b.node_point is not None


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda c: c["cpu"].update(time="2999-01-01T00:00:00Z"), "future_timestamp"),
        (lambda c: c["cpu"].update(time="0000-12-31T23:59:59Z"), "bad_value"),  # before the epoch
        (lambda c: c["cpu"].update(usageCoreNanoSeconds=2**64), "absurd_value"),
        (lambda c: c["cpu"].update(usageCoreNanoSeconds=1e30), "absurd_value"),
        (lambda c: c["memory"].update(workingSetBytes=2**60), "absurd_value"),
        (lambda c: c.update(name="c" * 254), "label_value_too_long"),
    ],
)
def test_summary_bounds_drop_the_pod_and_keep_the_rest(mutate, reason: str) -> None:  # type: ignore[no-untyped-def]
    """A reading outside kcms.sources.bounds drops its pod (never a partial pod sum), counted; the
    node and the other pod are kept."""
    doc = orjson.loads(SUMMARY)
    mutate(doc["pods"][1]["containers"][0])
    b = decode_summary("n", _dumps(doc))
    assert b.rejected == {"incomplete_container": 1, reason: 1}
    assert set(b.pods) == {("kube-system", "coredns-55cb58b774-6vb7p")}
    assert b.node_point is not None


def _dumps(doc: dict) -> bytes:
    """JSON of ``doc``; the standard library writes integers orjson refuses to (2**64)."""
    import json

    return json.dumps(doc).encode()


def test_summary_node_in_the_future_is_refused_and_pods_kept() -> None:
    b = decode_summary(
        "n", orjson.dumps(_summary(cpu={"time": "2999-01-01T00:00:00Z", "usageCoreNanoSeconds": 5}))
    )
    assert b.node_point is None and b.rejected["future_timestamp"] == 1
    assert len(b.pods) == 2


def test_summary_pod_level_problems() -> None:
    doc = orjson.loads(SUMMARY)
    doc["pods"].append(doc["pods"][0])  # duplicate pod
    doc["pods"].append({"podRef": {"name": "x"}})  # no namespace
    doc["pods"].append({"containers": []})  # no podRef
    doc["pods"].append({"podRef": "x"})
    doc["pods"].append(None)
    doc["pods"].append({"podRef": {"name": "y", "namespace": "d"}, "containers": {"a": 1}})
    b = decode_summary("n", orjson.dumps(doc))
    assert len(b.pods) == 2
    assert b.rejected == {"incomplete_container": 1, "duplicate": 1, "missing_label": 2, "bad_value": 3}


def test_summary_zero_and_bad_start_time() -> None:
    doc = orjson.loads(SUMMARY)
    doc["pods"][1]["containers"][1]["cpu"]["usageCoreNanoSeconds"] = 0
    doc["pods"][0]["containers"][0]["startTime"] = "not a time"
    doc["node"]["memory"]["workingSetBytes"] = 0
    b = decode_summary("n", orjson.dumps(doc))
    assert b.node_point is None
    assert list(b.pods) == [("kube-system", "coredns-55cb58b774-6vb7p")]
    assert b.pods[("kube-system", "coredns-55cb58b774-6vb7p")]["coredns"].start_time == 0.0
    assert b.rejected == {"zero_value": 2, "bad_value": 1, "incomplete_container": 1}


def test_summary_whole_response_failures() -> None:
    for bad in (b"", b"not json", b"[1,2]", b'"x"', b"\xff", b'{"node": '):
        with pytest.raises(DecodeError) as e:
            decode_summary("n", bad)
        assert e.value.reason == "malformed"
    with pytest.raises(DecodeError) as e:
        decode_summary("n", SUMMARY, max_bytes=10)
    assert e.value.reason == "too_large"
    b = decode_summary("n", b'{"node": 5, "pods": 7}')
    assert b.node_point is None and b.pods == {} and b.rejected == {"bad_value": 2}
    assert decode_summary("n", b"{}").rejected == {"incomplete_node": 1}


def test_summary_bench_body() -> None:
    b = decode_summary("n", build_summary_body(30, 2))
    assert sum(len(c) for c in b.pods.values()) == 60 and b.rejected == {}
