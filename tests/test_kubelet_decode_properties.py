"""Property tests (hypothesis) of the kubelet decoders: CPU rounding, RFC 3339 parsing, and random or
mutated bodies that may only ever give a sane batch or a DecodeError."""

from __future__ import annotations

import time

import orjson
import pytest
from _kubelet_decode_helpers import CPU, MEM, RESOURCE, START, SUMMARY, _assert_sane, body, line
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kcms.model import DecodeError
from kcms.sources.kubelet_decode import decode_resource_metrics, decode_summary, seconds_to_ns
from kcms.sources.summary_decode import parse_rfc3339


@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_cpu_rounding_matches_go_float_text(ns: int) -> None:
    """Whatever the kubelet printed (Go's shortest float text of ns/1e9), we recover the nearest ns."""
    from decimal import Decimal

    value = ns / 1e9
    text = repr(value)
    want = int(Decimal(text).scaleb(9).to_integral_value())
    assert seconds_to_ns(text, value) == want


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_random_bytes_only_decode_error(raw: bytes) -> None:
    try:
        _assert_sane(decode_resource_metrics("n", raw, now=0))
    except DecodeError:
        pass


_MUTATION_CHARS = list(' \t\n\r"\\{}=,#-+.eE0123456789abcNaIf_') + ["\x00", "é", "\u2028"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=len(RESOURCE)),
            st.sampled_from(["insert", "delete", "replace"]),
            st.sampled_from(_MUTATION_CHARS),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_mutated_real_body_only_decode_error(mutations: list[tuple[int, str, str]]) -> None:
    text = RESOURCE.decode()
    for pos, op, ch in mutations:
        pos = min(pos, len(text))
        if op == "insert":
            text = text[:pos] + ch + text[pos:]
        elif op == "delete":
            text = text[:pos] + text[pos + 1 :]
        else:
            text = text[:pos] + ch + text[pos + 1 :]
    raw = text.encode()
    try:
        batch = decode_resource_metrics("n", raw, now=0)
    except DecodeError:
        return
    _assert_sane(batch)
    # the fast path never disagrees with the general parser
    slow = text.replace('{container="', '{a="b",container="').encode()
    try:
        other = decode_resource_metrics("n", slow, now=0)
    except DecodeError:
        return
    assert other.pods == batch.pods and other.node_point == batch.node_point


@given(st.datetimes(timezones=st.timezones()))
def test_rfc3339_agrees_with_datetime(dt) -> None:  # type: ignore[no-untyped-def]
    text = dt.isoformat()
    if (
        dt.utcoffset() is None
        or dt.utcoffset().seconds % 60
        or dt.year < 1
        or "+" not in text[10:]
        and "-" not in text[10:]
    ):
        return
    assert parse_rfc3339(text) == pytest.approx(dt.timestamp(), abs=1e-6)


_JSON_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=30)
)


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        _JSON_LEAVES,
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "node",
                        "pods",
                        "podRef",
                        "name",
                        "namespace",
                        "containers",
                        "cpu",
                        "memory",
                        "usageCoreNanoSeconds",
                        "workingSetBytes",
                        "time",
                        "startTime",
                    ]
                ),
                children,
                max_size=6,
            )
        ),
        max_leaves=40,
    )
)
def test_summary_random_json_only_decode_error(doc) -> None:  # type: ignore[no-untyped-def]
    try:
        raw = orjson.dumps(doc)
    except (TypeError, orjson.JSONEncodeError):
        return
    try:
        _assert_sane(decode_summary("n", raw))
    except DecodeError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=len(SUMMARY) - 1), st.binary(min_size=1, max_size=4))
def test_summary_mutated_bytes_only_decode_error(pos: int, junk: bytes) -> None:
    raw = SUMMARY[:pos] + junk + SUMMARY[pos + len(junk) :]
    try:
        _assert_sane(decode_summary("n", raw))
    except DecodeError:
        pass


# ---- hostile values among honest ones: each refused alone, counted, the rest kept ----------------

_FAR = str(int((time.time() + 86400) * 1000))
_HOSTILE = [  # (which value, its text, the reason it is counted under)
    ("cpu", "NaN", "non_finite"),
    ("cpu", "-1", "negative"),
    ("cpu", "1e20", "absurd_value"),  # 1e29 ns: over the kubelet's uint64 counter
    ("mem", "-4096", "negative"),
    ("mem", "+Inf", "non_finite"),
    ("mem", "1e30", "absurd_value"),  # over 8 PiB
    ("ts", _FAR, "future_timestamp"),
    ("ts", "253402300800000", "future_timestamp"),  # year 10000
    ("pod", "p" * 254, "label_value_too_long"),
    ("container", "c" * 254, "label_value_too_long"),
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.none(), st.sampled_from(_HOSTILE)), min_size=1, max_size=12), st.booleans())
def test_hostile_values_are_refused_alone_and_counted(plan: list, long_line: bool) -> None:
    cpu_lines, mem_lines, start_lines = [], [], []
    for i, bad in enumerate(plan):
        what, text, _ = bad if bad is not None else ("", "", "")
        pod = f"p{i:02d}" + (text if what == "pod" else "")  # unique: not duplicates of each other
        c = "c" + (text if what == "container" else "")
        ts = text if what == "ts" else "1700000000123"
        cpu_lines.append(line(CPU, c, "d", pod, text if what == "cpu" else f"{i + 1}.5", ts))
        mem_lines.append(line(MEM, c, "d", pod, text if what == "mem" else str(4096 * (i + 1))))
        start_lines.append(line(START, c, "d", pod, "1.6999e+09"))
    extra = ["x" * 100_000 + " 1 1700000000123\n"] if long_line else []
    b = decode_resource_metrics("n", body(*cpu_lines, *mem_lines, *start_lines, *extra))
    _assert_sane(b)
    good = {("d", f"p{i:02d}") for i, bad in enumerate(plan) if bad is None}
    assert set(b.pods) == good  # every honest pod kept, no hostile one
    assert b.node_point is not None  # and the node's own reading
    for reason in {bad[2] for bad in plan if bad is not None}:
        assert b.rejected.get(reason, 0) >= sum(1 for bad in plan if bad is not None and bad[2] == reason)
    if long_line:
        assert b.rejected["metric_name_too_long"] == 1
