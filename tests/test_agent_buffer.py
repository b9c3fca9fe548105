"""The agent's sample buffer: the exposition format it renders, since=, limits, refusals, expiry."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from kcms.agent.buffer import SampleBuffer
from kcms.model import ObjectRef
from kcms.sources.promtext import parse_sample_line, parse_timestamp, parse_value

RESERVED = ("kcms_resource", "kcms_namespace", "kcms_name")
T0 = 1_700_000_000.0
POD = ObjectRef("pods", "default", "web-1")
NODE = ObjectRef("nodes", "", "node-a")


def parse_agent_text(text: str) -> tuple[dict[str, str], list[tuple[str, ObjectRef, tuple, float, int]]]:
    """Parse the agent exposition format strictly: types by family, samples (metric, obj, labels, value, ms).

    Checks what the format promises: one TYPE line per family before its samples, the three reserved
    labels first and in order, metric labels sorted and never kcms_, every sample with a timestamp.
    """
    types: dict[str, str] = {}
    samples = []
    family = None
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name not in types, f"second TYPE line for {name}"
            assert kind in ("gauge", "counter", "untyped")
            types[name] = kind
            family = name
            continue
        assert not line.startswith("#") and line, f"unexpected line {line!r}"
        name, labels, value_text, ts_text = parse_sample_line(line)
        assert name == family, f"{name} outside its family block"
        keys = list(labels)
        assert keys[:3] == list(RESERVED), line
        rest = keys[3:]
        assert rest == sorted(rest) and not any(k.startswith("kcms_") for k in rest), line
        assert ts_text is not None, line
        obj = ObjectRef(labels["kcms_resource"], labels["kcms_namespace"], labels["kcms_name"])
        metric_labels = tuple((k, labels[k]) for k in rest)
        samples.append((name, obj, metric_labels, parse_value(value_text), parse_timestamp(ts_text)))
    return types, samples


def rejected_total(reason: str) -> float:
    return REGISTRY.get_sample_value("kcms_agent_rejected_samples_total", {"reason": reason}) or 0.0


def test_render_newest_point_of_every_series_in_the_documented_format() -> None:
    b = SampleBuffer()
    assert b.add("http_requests_total", POD, (("path", "/"),), T0 + 0.123, 1230)
    assert b.add("http_requests_total", POD, (("path", "/"),), T0 + 1.123, 1234)
    assert b.add("node_load1", NODE, (), T0 + 1.123, 0.42)
    assert b.add("queue_backlog", ObjectRef("", "jobs", ""), (("queue", "emails"),), T0 + 1.123, 42)
    text = b.render().decode()
    assert text == (
        "# TYPE http_requests_total counter\n"
        'http_requests_total{kcms_resource="pods",kcms_namespace="default",kcms_name="web-1",path="/"}'
        " 1234 1700000001123\n"
        "# TYPE node_load1 gauge\n"
        'node_load1{kcms_resource="nodes",kcms_namespace="",kcms_name="node-a"} 0.42 1700000001123\n'
        "# TYPE queue_backlog gauge\n"
        'queue_backlog{kcms_resource="",kcms_namespace="jobs",kcms_name="",queue="emails"} 42 1700000001123\n'
    )
    types, samples = parse_agent_text(text)
    assert types == {"http_requests_total": "counter", "node_load1": "gauge", "queue_backlog": "gauge"}
    assert len(samples) == 3


def test_since_returns_every_newer_point_oldest_first() -> None:
    b = SampleBuffer()
    for i in range(5):
        b.add("requests_total", POD, (), T0 + i, float(i))
        b.add("temp", NODE, (("sensor", "a"),), T0 + i + 0.5, 10.0 + i)
    _, samples = parse_agent_text(b.render(int(T0 * 1000) + 2000).decode())  # strictly newer than T0+2
    got = [(m, v, ms) for m, _, _, v, ms in samples]
    assert got == [
        ("requests_total", 3.0, 1700000003000),
        ("requests_total", 4.0, 1700000004000),
        ("temp", 12.0, 1700000002500),
        ("temp", 13.0, 1700000003500),
        ("temp", 14.0, 1700000004500),
    ]
    # since equal to the newest point: nothing, and no dangling TYPE line
    assert b.render(int(T0 * 1000) + 4500) == b""
    # since before everything: every point
    assert len(parse_agent_text(b.render(0).decode())[1]) == 10


def test_label_values_are_escaped_and_parse_back() -> None:
    b = SampleBuffer()
    nasty = 'a "quoted" \\ back\nslash'
    b.add("x", ObjectRef("deployments.apps", "ns-1", 'we"ird'), (("b", nasty), ("a", "")), T0, -1.5e-7)
    _, samples = parse_agent_text(b.render().decode())
    [(metric, obj, labels, value, ms)] = samples
    assert obj == ObjectRef("deployments.apps", "ns-1", 'we"ird')
    assert labels == (("a", ""), ("b", nasty))
    assert value == -1.5e-7 and ms == 1_700_000_000_000


def test_unsorted_labels_are_the_same_series() -> None:
    b = SampleBuffer()
    assert b.add("m", POD, (("b", "2"), ("a", "1")), T0, 1)
    assert b.add("m", POD, (("a", "1"), ("b", "2")), T0 + 1, 2)
    assert not b.add("m", POD, (("b", "2"), ("a", "1")), T0 + 1, 3)
    assert b.stats()["series"] == 1 and b.stats()["points"] == 2


def test_refusals_are_counted_by_reason() -> None:
    b = SampleBuffer()
    before = {
        r: rejected_total(r) for r in ("out_of_order", "invalid_name", "invalid_value", "invalid_labels")
    }
    assert b.add("m", POD, (), T0, 1)
    assert not b.add("m", POD, (), T0, 2)  # same timestamp
    assert not b.add("m", POD, (), T0 - 5, 2)  # older
    assert not b.add("m", POD, (), T0 + 0.0004, 2)  # newer, but the same millisecond
    assert not b.add("1bad-name", POD, (), T0, 1)
    assert not b.add("m", POD, (), T0 + 1, math.nan)
    assert not b.add("m", POD, (), T0 + 1, math.inf)
    assert not b.add("m", POD, (), math.nan, 1)
    assert not b.add("m", POD, (), T0 + 1, "x")  # type: ignore[arg-type]
    assert not b.add("m", POD, (("kcms_name", "x"),), T0, 1)
    assert not b.add("m", POD, (("bad-label", "x"),), T0, 1)
    assert not b.add("m", POD, (("a", "1"), ("a", "2")), T0, 1)
    assert not b.add("m", POD, (("a", 1),), T0, 1)  # type: ignore[arg-type]
    assert not b.add("m", ("pods", "ns", "x"), (), T0, 1)  # type: ignore[arg-type]
    rejected = b.stats()["rejected"]
    assert rejected["out_of_order"] == 3
    assert rejected["invalid_name"] == 1
    assert rejected["invalid_value"] == 4
    assert rejected["invalid_labels"] == 5
    for reason, count in before.items():
        assert rejected_total(reason) - count == rejected[reason]
    assert b.stats()["series"] == 1  # no refused sample left an empty series behind
    assert parse_agent_text(b.render().decode())[1] == [("m", POD, (), 1.0, 1_700_000_000_000)]


def test_bounds_shared_by_every_ingestion_path_are_refused_and_counted(caplog) -> None:
    """A far-future point would make every later real point of its series out_of_order; huge names
    and labels would grow the buffer and the collector's store. Each is refused alone and counted."""
    b = SampleBuffer()
    reasons = (
        "future_timestamp",
        "metric_name_too_long",
        "label_name_too_long",
        "label_value_too_long",
        "too_many_labels",
        "invalid_value",
    )
    before = {r: rejected_total(r) for r in reasons}
    now = time.time()
    assert not b.add("m", POD, (), now + 3600, 1)  # an hour ahead (the default skew is 60 s)
    assert not b.add("m", POD, (), 253402300800.0, 1)  # year 10000
    assert not b.add("m", POD, (), -62135596801.0, 1)  # before year 0001
    assert not b.add("m" * 254, POD, (), now, 1)
    assert not b.add("m" * 1_000_000, POD, (), now, 1)
    assert not b.add("m", POD, (("a" * 129, "x"),), now, 1)
    assert not b.add("m", POD, (("a", "v" * 1025),), now, 1)
    assert not b.add("m", ObjectRef("pods", "default", "p" * 1025), (), now, 1)
    assert not b.add("m", POD, tuple((f"l{i:02d}", "x") for i in range(33)), now, 1)
    # the limits themselves are allowed, and a point within the skew is taken
    assert b.add("m" * 253, POD, tuple((f"l{i:02d}", "v" * 1024) for i in range(32)), now + 30, 1)
    assert b.add("m", POD, (), now, 1) and b.add("m", POD, (), now + 1, 2)  # nothing stalled the series
    rejected = b.stats()["rejected"]
    assert {r: rejected[r] for r in reasons} == {
        "future_timestamp": 2,
        "metric_name_too_long": 2,
        "label_name_too_long": 1,
        "label_value_too_long": 2,
        "too_many_labels": 1,
        "invalid_value": 1,
    }
    for reason, count in before.items():
        assert rejected_total(reason) - count == rejected[reason]
    assert b.stats()["series"] == 2
    # the log lines are bounded and escaped: no megabyte name, one line each
    for record in caplog.records:
        assert len(record.getMessage()) < 500 and "\n" not in record.getMessage()


def test_per_pod_and_per_node_series_limits() -> None:
    b = SampleBuffer(max_series_per_pod=3, max_series_per_node=8)
    for i in range(3):
        assert b.add(f"m{i}", POD, (), T0, i)
    assert not b.add("m3", POD, (), T0, 3)
    assert not b.add("m0", POD, (("extra", "label"),), T0, 3)  # a new series of the same pod
    assert b.add("m0", POD, (), T0 + 1, 5)  # existing series still take points
    other = ObjectRef("pods", "other-ns", "web-1")  # same name, other namespace: another pod
    for i in range(3):
        assert b.add(f"m{i}", other, (), T0, i)
    # a node's series do not count against any pod, but do against the node total
    assert b.add("n0", NODE, (), T0, 0)
    assert b.add("n1", ObjectRef("deployments.apps", "default", "web-1"), (), T0, 0)
    assert b.stats()["series"] == 8
    assert not b.add("n2", NODE, (), T0, 0)
    rejected = b.stats()["rejected"]
    assert rejected["pod_limit"] == 2 and rejected["node_limit"] == 1
    assert b.stats()["pods"] == 2


def test_expire_drops_old_points_and_empty_series_and_frees_limits() -> None:
    b = SampleBuffer(retention=60, max_series_per_pod=1)
    for i in range(10):
        b.add("m", POD, (), T0 + i * 10, float(i))  # T0 .. T0+90
    b.add("old", NODE, (), T0, 1)
    assert b.expire(now=T0 + 120) == 6 + 1  # cutoff T0+60: points at T0..T0+50 go, T0+60 stays
    _, samples = parse_agent_text(b.render(0).decode())
    assert [ms for _, _, _, _, ms in samples] == [int((T0 + s) * 1000) for s in (60, 70, 80, 90)]
    assert b.stats() == {
        "series": 1,
        "points": 4,
        "metrics": 1,
        "pods": 1,
        "rejected": b.stats()["rejected"],
    }
    assert not b.add("other", POD, (), T0 + 100, 1)  # pod limit of 1 reached
    assert b.expire(now=T0 + 200) == 4
    assert b.stats()["series"] == 0 and b.stats()["pods"] == 0 and b.render() == b""
    assert b.add("other", POD, (), T0 + 200, 1)  # the pod's series slot was freed


def test_types_default_by_name_and_can_be_declared() -> None:
    b = SampleBuffer()
    for name in ("a_total", "b", "c_total", "d"):
        b.add(name, NODE, (), T0, 1)
    b.declare("c_total", "gauge")
    b.declare("d", "untyped")
    with pytest.raises(ValueError):
        b.declare("b", "histogram")
    types, _ = parse_agent_text(b.render().decode())
    assert types == {"a_total": "counter", "b": "gauge", "c_total": "gauge", "d": "untyped"}


def test_add_many_counts_accepted() -> None:
    b = SampleBuffer()
    samples = [("m", POD, (), T0 + i, float(i)) for i in range(5)] + [("m", POD, (), T0, 0.0)]
    assert b.add_many(samples) == 5
    assert b.add_many(iter(())) == 0


def test_invalid_construction() -> None:
    with pytest.raises(ValueError):
        SampleBuffer(retention=0)
    with pytest.raises(ValueError):
        SampleBuffer(max_series_per_pod=0)


_names = st.sampled_from(["a", "b_total", "c:d"])
_objs = st.sampled_from([POD, NODE, ObjectRef("", "", ""), ObjectRef("pods", "x", "y")])
_labels = st.sampled_from([(), (("k", "v"),), (("k", "w"), ("z", 'q"\\'))])
_values = st.floats(allow_nan=False, allow_infinity=False, width=64)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_names, _objs, _labels, st.integers(0, 50), _values), max_size=60))
def test_render_agrees_with_a_model(points: list) -> None:
    """Whatever is added, render() parses back to the last accepted point of each series."""
    b = SampleBuffer()
    model: dict = {}
    for metric, obj, labels, step, value in points:
        ts = T0 + step * 0.25
        key = (metric, obj, labels)
        expect = key not in model or int(round(ts * 1000)) > model[key][1]
        assert b.add(metric, obj, labels, ts, value) == expect
        if expect:
            model[key] = (value, int(round(ts * 1000)))
    _, samples = parse_agent_text(b.render().decode())
    got = {(m, o, lb): (v, ms) for m, o, lb, v, ms in samples}
    assert got == model


def test_the_collectors_parser_reads_what_the_buffer_renders() -> None:
    """The other end of the format: kcms.sources.exposition (the collector of agents) parses it back."""
    exposition = pytest.importorskip("kcms.sources.exposition")
    b = SampleBuffer()
    sent = [
        ("http_requests_total", POD, (("code", "200"), ("path", '/a"b\\c\nd')), T0 + 0.001, 1234.0),
        ("node_load1", NODE, (), T0 + 0.002, 0.42),
        ("queue_backlog", ObjectRef("", "jobs", ""), (("queue", "emails"),), T0 + 0.003, -7.25e-3),
    ]
    assert b.add_many(sent) == 3
    samples, rejected = exposition.parse_exposition(b.render(0))
    assert not rejected
    assert sorted(samples) == sorted(sent)
