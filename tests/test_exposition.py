"""The agent exposition parser: units for every rejection reason, and property tests (random bytes
never raise anything but ExpositionError; render-then-parse round trips)."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kcms.model import ObjectRef
from kcms.sources.exposition import REASONS, ExpositionError, object_problem, parse_exposition

POD = 'kcms_resource="pods",kcms_namespace="default",kcms_name="web-1"'


def parse(text: str):
    return parse_exposition(text.encode())


def test_the_spec_example():
    body = (
        "# TYPE http_requests_total counter\n"
        'http_requests_total{kcms_resource="pods",kcms_namespace="default",kcms_name="web-1",path="/"} 1234 1700000000123\n'
        "# TYPE node_load1 gauge\n"
        'node_load1{kcms_resource="nodes",kcms_namespace="",kcms_name="node-a"} 0.42 1700000000123\n'
        "# TYPE queue_backlog gauge\n"
        'queue_backlog{kcms_resource="",kcms_namespace="jobs",kcms_name="",queue="emails"} 42 1700000000123\n'
    )
    samples, rejected = parse(body)
    assert rejected == {}
    assert samples == [
        (
            "http_requests_total",
            ObjectRef("pods", "default", "web-1"),
            (("path", "/"),),
            1700000000.123,
            1234.0,
        ),
        ("node_load1", ObjectRef("nodes", "", "node-a"), (), 1700000000.123, 0.42),
        ("queue_backlog", ObjectRef("", "jobs", ""), (("queue", "emails"),), 1700000000.123, 42.0),
    ]


def test_general_path_escapes_blanks_and_any_label_order():
    body = (
        'm { b="x\\"y" , kcms_name="web-1", kcms_namespace="default",kcms_resource="pods", a="1\\n2",} 5 1000\n'
        f'm{{{POD},z="q"}}\t7e0   2000  \n'
        f"m{{{POD}}} +Inf 3000\n"
    )
    samples, rejected = parse(body)
    pod = ObjectRef("pods", "default", "web-1")
    assert samples == [
        ("m", pod, (("a", "1\n2"), ("b", 'x"y')), 1.0, 5.0),
        ("m", pod, (("z", "q"),), 2.0, 7.0),
    ]
    assert rejected == {"not_finite": 1}


def test_labels_come_out_sorted_and_empty_values_are_dropped():
    samples, rejected = parse(f'm{{{POD},zz="1",aa="2",mm=""}} 1 1\n')
    assert rejected == {} and samples[0][2] == (("aa", "2"), ("zz", "1"))


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("this is not a sample", "malformed"),
        ('m{kcms_resource="pods" 1 1', "malformed"),
        (f"m{{{POD}}}", "malformed"),
        ('m{kcms_resource="pods",kcms_name="web-1"} 1 1', "missing_kcms_labels"),
        ("m 1 1", "missing_kcms_labels"),
        ('m{kcms_resource="pods",kcms_namespace="default",kcms_name=""} 1 1', "invalid_kcms_labels"),
        ('m{kcms_resource="",kcms_namespace="",kcms_name=""} 1 1', "invalid_kcms_labels"),
        ('m{kcms_resource="",kcms_namespace="jobs",kcms_name="x"} 1 1', "invalid_kcms_labels"),
        ('m{kcms_resource="Pods!",kcms_namespace="default",kcms_name="a"} 1 1', "invalid_kcms_labels"),
        ('m{kcms_resource="pods",kcms_namespace="Default",kcms_name="a"} 1 1', "invalid_kcms_labels"),
        (f'm{{{POD},kcms_extra="1"}} 1 1', "invalid_kcms_labels"),
        (f'm{{{POD},kcms_extra=""}} 1 1', "invalid_kcms_labels"),
        (f'm{{{POD},a="1",a="2"}} 1 1', "invalid_kcms_labels"),
        (f'm{{{POD},a="1",a=""}} 1 1', "invalid_kcms_labels"),
        (f"m{{{POD}}} NaN 1", "not_finite"),
        (f"m{{{POD}}} -Inf 1", "not_finite"),
        (f"m{{{POD}}} nan 1", "not_finite"),
        (f"m{{{POD}}} 1e999 1", "not_finite"),
        (f"m{{{POD}}} 1e 1", "bad_value"),
        (f"m{{{POD}}} 1-2 1", "bad_value"),
        (f"m{{{POD}}} 1_000 1", "bad_value"),
        (f"m{{{POD}}} 1", "bad_timestamp"),
        (f"m{{{POD}}} 1 1.5", "bad_timestamp"),
        (f"m{{{POD}}} 1 99999999999999999999", "bad_timestamp"),
        (f"m{{{POD}}} 1 9223372036854775808", "bad_timestamp"),
        # the bounds every ingestion path shares (kcms.limits), on the fast and the general path
        (f"m{{{POD}}} 1 -62135596800001", "bad_timestamp"),  # before year 0001
        (f"m{{ {POD}}} 1 -62135596800001", "bad_timestamp"),
        (f"m{{{POD}}} 1 253402300800000", "future_timestamp"),  # year 10000
        (f"m{{ {POD}}} 1 253402300800000", "future_timestamp"),
        (f"m{{{POD}}} 1 {int(time.time() * 1000) + 3_600_000}", "future_timestamp"),
        (f"{'m' * 254}{{{POD}}} 1 1", "metric_name_too_long"),
        (f"{'m' * 254}{{ {POD}}} 1 1", "metric_name_too_long"),
        (f"{'m' * 1_000_000}{{{POD}}} 1 1", "metric_name_too_long"),
        (f'm{{{POD},{"a" * 129}="1"}} 1 1', "label_name_too_long"),
        (f'm{{{POD},a="{"v" * 1025}"}} 1 1', "label_value_too_long"),
        (f'm{{ {POD},a="{"v" * 1024}\\\\"}} 1 1', "label_value_too_long"),  # escaped: 1025 after unescaping
        ("m{" + POD + "".join(f',l{i}="x"' for i in range(33)) + "} 1 1", "too_many_labels"),
    ],
)
def test_rejections_are_counted_by_reason(line: str, reason: str):
    assert reason in REASONS
    good = f"m{{{POD}}} 1 1"
    samples, rejected = parse(f"{good}\n{line}\n{good}\n")
    assert rejected == {reason: 1}
    assert len(samples) == 2


def test_comments_type_lines_and_blanks_are_skipped():
    samples, rejected = parse(f"# HELP m help\n# TYPE m gauge\n\n  \n  # indented comment\r\nm{{{POD}}} 1 1")
    assert rejected == {} and len(samples) == 1


def test_whole_body_errors():
    with pytest.raises(ExpositionError) as e:
        parse_exposition(b"x" * 101, max_bytes=100)
    assert e.value.reason == "too_large"
    with pytest.raises(ExpositionError) as e:
        parse_exposition(b'm{kcms_resource="pods"} \xff 1')
    assert e.value.reason == "not_utf8"


def test_a_line_that_is_not_utf8_costs_only_that_line():
    good = f"m{{{POD}}} 1 1\n".encode()
    samples, rejected = parse_exposition(
        good + b"m{" + POD.encode() + b',a="\xff\xfe"} 2 2\n' + good.replace(b"} 1 1", b"} 3 3")
    )
    assert [s[4] for s in samples] == [1.0, 3.0]
    assert rejected == {"not_utf8": 1}


def test_object_rules():
    assert object_problem("pods", "default", "web-1") is None
    assert object_problem("deployments.apps", "default", "web") is None
    assert object_problem("nodes", "", "node-a") is None
    assert object_problem("", "jobs", "") is None
    assert object_problem("", "", "") is not None
    assert object_problem("pods", "a" * 64, "x") is not None


@given(st.binary(max_size=2000))
@settings(max_examples=300, deadline=None)
def test_random_bytes_never_raise_anything_but_exposition_error(body: bytes):
    try:
        samples, rejected = parse_exposition(body)
    except ExpositionError:
        return
    assert set(rejected) <= set(REASONS)
    for _, _, _, ts, value in samples:
        assert math.isfinite(ts) and math.isfinite(value)


_line_chars = st.sampled_from(
    '{}",=\\ \t#kcms_resource_namespace_name"pods"default"a1-.eE+InfNaN\n0123456789'
)


@given(st.lists(_line_chars, max_size=300).map("".join))
@settings(max_examples=300, deadline=None)
def test_near_miss_text_never_raises(text: str):
    samples, rejected = parse_exposition(text.encode())
    assert set(rejected) <= set(REASONS)


# ---- a tiny renderer of the format, for the round trip (the product's renderers live elsewhere)

_dns = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?", fullmatch=True)
_label_name = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True).filter(
    lambda k: not k.startswith("kcms_")
)
_objects = st.one_of(
    st.builds(lambda ns, n: ObjectRef("pods", ns, n), _dns, _dns),
    st.builds(lambda n: ObjectRef("nodes", "", n), _dns),
    st.builds(lambda ns: ObjectRef("", ns, ""), _dns),
    st.builds(lambda ns, n: ObjectRef("deployments.apps", ns, n), _dns, _dns),
)
_samples = st.tuples(
    st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,12}", fullmatch=True),
    _objects,
    st.dictionaries(_label_name, st.text(min_size=1, max_size=8), max_size=4).map(
        lambda d: tuple(sorted(d.items()))
    ),
    # from year 0001 to 2023 (later than now + --max-future-skew is refused: see the bounds tests)
    st.integers(min_value=-62135596800000, max_value=1_700_000_000_000),
    st.floats(allow_nan=False, allow_infinity=False),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(samples) -> str:
    out = []
    for metric, obj, labels, ms, value in samples:
        pairs = [("kcms_resource", obj.resource), ("kcms_namespace", obj.namespace), ("kcms_name", obj.name)]
        pairs += labels
        inner = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
        out.append(f"# TYPE {metric} gauge")
        out.append(f"{metric}{{{inner}}} {value!r} {ms}")
    return "\n".join(out) + "\n"


@given(st.lists(_samples, max_size=30))
@settings(max_examples=200, deadline=None)
def test_render_then_parse_round_trips(samples):
    parsed, rejected = parse_exposition(render(samples).encode())
    assert rejected == {}
    assert parsed == [(m, o, lb, ms / 1000.0, v) for m, o, lb, ms, v in samples]
