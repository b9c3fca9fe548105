"""Decoders of kubelet responses: /metrics/resource (Prometheus text) and /stats/summary (JSON)."""

from __future__ import annotations

import math
import pathlib
import sys

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kcms.model import DecodeError, NodeBatch, ResourcePoint
from kcms.sources.kubelet_decode import decode_resource_metrics, decode_summary, seconds_to_ns
from kcms.sources.promtext import LineError, parse_sample_line
from kcms.sources.summary_decode import parse_rfc3339

DATA = pathlib.Path(__file__).parent / "data" / "kubelet"
RESOURCE = (DATA / "resource_metrics.txt").read_bytes()
SUMMARY = (DATA / "summary.json").read_bytes()

sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "bench"))
from decode import build_resource_body, build_summary_body  # noqa: E402

CPU = "container_cpu_usage_seconds_total"
MEM = "container_memory_working_set_bytes"
START = "container_start_time_seconds"


def line(name: str, container: str, ns: str, pod: str, value: str, ts: str | None = "1700000000123") -> str:
    tail = f" {ts}" if ts is not None else ""
    return f'{name}{{container="{container}",namespace="{ns}",pod="{pod}"}} {value}{tail}\n'


def body(*lines: str, node: bool = True, error: str | None = "0") -> bytes:
    text = "".join(lines)
    if node:
        text += "node_cpu_usage_seconds_total 357.35491 1700000000123\n"
        text += "node_memory_working_set_bytes 1.616273408e+09 1700000000123\n"
    if error is not None:
        text += f"resource_scrape_error {error}\n"
    return text.encode()


def container(
    ns: str = "default",
    pod: str = "p",
    c: str = "c",
    cpu: str = "1.5",
    mem: str = "1024",
    start: str | None = "1.6999e+09",
    ts: str | None = "1700000000123",
) -> list[str]:
    out = [line(CPU, c, ns, pod, cpu, ts), line(MEM, c, ns, pod, mem, ts)]
    if start is not None:
        out.append(line(START, c, ns, pod, start, ts))
    return out


# ------------------------------------------------------------------ /metrics/resource


def test_real_body() -> None:
    b = decode_resource_metrics("kind-worker", RESOURCE, now=1.0)
    assert b.node == "kind-worker"
    assert b.rejected == {}
    assert b.node_point == ResourcePoint(0.0, 1700000000.123, 357_354_910_000, 1_616_273_408)
    assert set(b.pods) == {
        ("kube-system", "coredns-55cb58b774-6vb7p"),
        ("kube-system", "etcd-kind-control-plane"),
        ("kube-system", "kindnet-x2v7q"),
        ("default", "web-7d4b9c8f5-abcde"),
    }
    assert b.pods[("kube-system", "coredns-55cb58b774-6vb7p")] == {
        "coredns": ResourcePoint(1.6999e9, 1700000000.123, 10_059_659_000, 16_547_840)
    }
    etcd = b.pods[("kube-system", "etcd-kind-control-plane")]["etcd"]
    assert etcd.cpu_ns == 1_234_567_890_123 and etcd.timestamp == 1700000000.456
    assert b.pods[("kube-system", "kindnet-x2v7q")]["kindnet-cni"].cpu_ns == 23_000
    web = b.pods[("default", "web-7d4b9c8f5-abcde")]
    assert web["nginx"].cpu_ns == 500_000_000 and web["sidecar"].cpu_ns == 1_250_000_000
    assert web["sidecar"].memory == 1_048_576


def test_real_body_slow_path_agrees() -> None:
    """The same body with labels in another order takes the general parser and gives the same batch."""
    text = RESOURCE.decode()
    swapped = text.replace('{container="', '{zz="1",container="')
    assert swapped != text
    assert decode_resource_metrics("n", swapped.encode(), now=1.0) == decode_resource_metrics(
        "n", RESOURCE, now=1.0
    )


def test_without_timestamps_uses_now() -> None:
    b = decode_resource_metrics("n", body(*container(ts=None)), now=1234.5)
    assert b.pods[("default", "p")]["c"].timestamp == 1234.5
    text = RESOURCE.decode().replace(" 1700000000123\n", "\n").replace(" 1700000000456\n", "\n")
    text = text.replace(" 1700000000111\n", "\n").replace(" 1700000000222\n", "\n")
    b = decode_resource_metrics("n", text.encode(), now=99.0)
    assert b.node_point is not None and b.node_point.timestamp == 99.0
    assert all(p.timestamp == 99.0 for cs in b.pods.values() for p in cs.values())
    assert len(b.pods) == 4 and b.rejected == {}


def test_default_now_is_current_time() -> None:
    import time

    before = time.time()
    b = decode_resource_metrics("n", body(*container(ts=None)))
    assert before <= b.pods[("default", "p")]["c"].timestamp <= time.time()


def test_node_only_and_pod_only() -> None:
    b = decode_resource_metrics("n", body())
    assert b.node_point is not None and b.pods == {} and b.rejected == {}
    b = decode_resource_metrics("n", body(*container(), node=False))
    assert b.node_point is None and list(b.pods) == [("default", "p")] and b.rejected == {}


def test_restarted_container_start_time() -> None:
    before = decode_resource_metrics("n", body(*container(cpu="100", start="1.6999e+09")), now=0)
    after = decode_resource_metrics("n", body(*container(cpu="0.5", start="1.7e+09")), now=0)
    assert before.pods[("default", "p")]["c"].start_time == 1.6999e9
    assert after.pods[("default", "p")]["c"].start_time == 1.7e9
    assert after.pods[("default", "p")]["c"].cpu_ns == 500_000_000


def test_missing_start_time_is_zero() -> None:
    b = decode_resource_metrics("n", body(*container(start=None)), now=0)
    assert b.pods[("default", "p")]["c"].start_time == 0.0


def test_escaped_labels() -> None:
    lines = [
        f'{CPU}{{container="a\\"b",namespace="ns\\\\x",pod="p\\nq"}} 1 1700000000123\n',
        f'{MEM}{{pod="p\\nq",namespace="ns\\\\x",container="a\\"b"}} 2048 1700000000123\n',
    ]
    b = decode_resource_metrics("n", body(*lines), now=0)
    assert b.pods == {("ns\\x", "p\nq"): {'a"b': ResourcePoint(0.0, 1700000000.123, 10**9, 2048)}}
    assert b.rejected == {}


def test_crlf_line_endings() -> None:
    crlf = RESOURCE.replace(b"\n", b"\r\n")
    assert decode_resource_metrics("n", crlf, now=1.0) == decode_resource_metrics("n", RESOURCE, now=1.0)


def test_older_scrape_error_name_and_kubelet_error() -> None:
    ok = body(*container(), error=None) + b"scrape_error 0\n"
    assert decode_resource_metrics("n", ok, now=0).rejected == {}
    with pytest.raises(DecodeError) as e:
        decode_resource_metrics("n", b"scrape_error 1\n")
    assert e.value.reason == "kubelet_error"
    with pytest.raises(DecodeError) as e:
        decode_resource_metrics("n", b"# HELP resource_scrape_error x\nresource_scrape_error 1\n")
    assert e.value.reason == "kubelet_error"
    partial = decode_resource_metrics("n", body(*container(), error="1"), now=0)
    assert partial.rejected == {"kubelet_error": 1} and partial.node_point is not None


def test_malformed_lines_mixed_with_good_ones() -> None:
    lines = [
        *container(pod="good"),
        "this is not a metric line\n",
        f'{CPU}{{container="x",namespace="default",pod="bad"}}\n',  # no value
        f'{CPU}{{container="x",namespace="default",pod="bad" 1\n',  # unterminated labels
        f'{CPU}{{container="x\\q",namespace="default",pod="bad"}} 1\n',  # bad escape
        "# a comment is fine\n",
        "\n",
        'other_family{a="b"} 17\n',
    ]
    b = decode_resource_metrics("n", body(*lines), now=0)
    assert list(b.pods) == [("default", "good")]
    assert b.rejected == {"malformed": 4}


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("NaN", "non_finite"),
        ("+Inf", "non_finite"),
        ("-Inf", "non_finite"),
        ("1e999", "non_finite"),
        ("-1", "negative"),
        ("abc", "bad_value"),
        ("1_000", "bad_value"),
        ("0x10", "bad_value"),
        ("١", "bad_value"),
    ],
)
def test_bad_values_are_counted(value: str, reason: str) -> None:
    lines = [
        *container(pod="good"),
        line(CPU, "c", "default", "bad", value),
        line(MEM, "c", "default", "bad", "10"),
    ]
    b = decode_resource_metrics("n", body(*lines), now=0)
    assert list(b.pods) == [("default", "good")]
    assert b.rejected == {reason: 1, "incomplete_container": 1}


@pytest.mark.parametrize("ts", ["abc", "1.5", "0", "-5", "99999999999999999999999"])
def test_bad_timestamps_are_counted(ts: str) -> None:
    lines = [*container(pod="good"), line(MEM, "c", "default", "bad", "10", ts)]
    b = decode_resource_metrics("n", body(*lines), now=0)
    assert list(b.pods) == [("default", "good")]
    assert b.rejected == {"bad_value": 1}


def test_missing_labels_duplicates_and_incomplete() -> None:
    lines = [
        *container(pod="good"),
        f'{CPU}{{namespace="default",pod="nolabel"}} 1 5\n',
        f'{MEM}{{container="",namespace="default",pod="nolabel"}} 1 5\n',
        line(CPU, "c", "default", "good", "99"),  # duplicate: the first wins
        line(CPU, "only-cpu", "default", "good", "1"),
        line(MEM, "only-mem", "default", "good", "1"),
        line(START, "only-start", "default", "good", "1"),
    ]
    b = decode_resource_metrics("n", body(*lines), now=0)
    assert b.pods == {
        ("default", "good"): {"c": ResourcePoint(1.6999e9, 1700000000.123, 1_500_000_000, 1024)}
    }
    assert b.rejected == {"missing_label": 2, "duplicate": 1, "incomplete_container": 3}


def test_duplicates_within_a_fast_block() -> None:
    lines = [line(CPU, "c", "d", "p", "1"), line(CPU, "c", "d", "p", "2"), line(MEM, "c", "d", "p", "5")]
    b = decode_resource_metrics("n", body(*lines), now=0)
    assert b.pods[("d", "p")]["c"].cpu_ns == 10**9
    assert b.rejected == {"duplicate": 1}


def test_interleaved_families() -> None:
    lines = [
        line(CPU, "a", "d", "p", "1"),
        line(MEM, "a", "d", "p", "2"),
        line(CPU, "b", "d", "p", "3"),
        line(MEM, "b", "d", "p", "4"),
    ]
    b = decode_resource_metrics("n", body(*lines), now=0)
    assert {c: p.cpu_ns for c, p in b.pods[("d", "p")].items()} == {"a": 10**9, "b": 3 * 10**9}


def test_zero_values_follow_metrics_server() -> None:
    # a zero node value drops the node point
    zero_node = b"node_cpu_usage_seconds_total 0 5\nnode_memory_working_set_bytes 100 5\n"
    b = decode_resource_metrics("n", zero_node + body(*container(), node=False), now=0)
    assert b.node_point is None and b.rejected == {"zero_value": 1} and b.pods
    # a zero container value drops its whole pod
    lines = [*container(pod="p1", c="a"), *container(pod="p1", c="b", mem="0"), *container(pod="p2")]
    b = decode_resource_metrics("n", body(*lines), now=0)
    assert list(b.pods) == [("default", "p2")] and b.rejected == {"zero_value": 1}


def test_incomplete_node() -> None:
    b = decode_resource_metrics(
        "n", b"node_cpu_usage_seconds_total 5 5\n" + body(*container(), node=False), now=0
    )
    assert b.node_point is None and b.rejected == {"incomplete_node": 1}


def test_whole_response_failures() -> None:
    with pytest.raises(DecodeError) as e:
        decode_resource_metrics("n", RESOURCE, max_bytes=100)
    assert e.value.reason == "too_large"
    for bad in (b"\xff\xfe\x00garbage", b"", b"  \n\n", b"<html><body>502 Bad Gateway</body></html>\n"):
        with pytest.raises(DecodeError) as e:
            decode_resource_metrics("n", bad)
        assert e.value.reason == "malformed", bad


def test_only_other_families_is_empty_batch() -> None:
    b = decode_resource_metrics("n", b"# HELP x y\nsome_metric 1\n", now=0)
    assert b == NodeBatch(node="n")


def test_cpu_rounding_is_exact() -> None:
    assert seconds_to_ns("10.059659", 10.059659) == 10_059_659_000
    assert seconds_to_ns("0.0000000005", 5e-10) == 0  # half to even
    assert seconds_to_ns("0.0000000015", 1.5e-9) == 2
    big = "123456789.123456789"
    assert seconds_to_ns(big, float(big)) == 123_456_789_123_456_789
    b = decode_resource_metrics(
        "n", body(line(CPU, "c", "d", "p", big), line(MEM, "c", "d", "p", "1")), now=0
    )
    assert b.pods[("d", "p")]["c"].cpu_ns == 123_456_789_123_456_789


@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_cpu_rounding_matches_go_float_text(ns: int) -> None:
    """Whatever the kubelet printed (Go's shortest float text of ns/1e9), we recover the nearest ns."""
    from decimal import Decimal

    value = ns / 1e9
    text = repr(value)
    want = int(Decimal(text).scaleb(9).to_integral_value())
    assert seconds_to_ns(text, value) == want


def test_big_realistic_body() -> None:
    raw = build_resource_body(30, 2)
    b = decode_resource_metrics("n", raw, now=0)
    assert sum(len(c) for c in b.pods.values()) == 60 and b.rejected == {}
    # the general parser gives the same answer
    slow = raw.replace(b'{container="', b'{a="b",container="')
    assert decode_resource_metrics("n", slow, now=0) == b


def test_parse_sample_line() -> None:
    assert parse_sample_line('a{b="x\\"y\\\\",c = "2",} 1 2') == ("a", {"b": 'x"y\\', "c": "2"}, "1", "2")
    assert parse_sample_line("a 1") == ("a", {}, "1", None)
    assert parse_sample_line("  a{}\t1e3 5 ") == ("a", {}, "1e3", "5")
    for bad in (
        "a",
        'a{b="x} 1',
        'a{b="x"',
        'a{b="\\q"} 1',
        "a 1 2 3",
        'a{b="1",b="2"} 1',
        "1a 1",
        'a{b="1"}1',
    ):
        with pytest.raises(LineError):
            parse_sample_line(bad)


def _assert_sane(batch: NodeBatch) -> None:
    points = [batch.node_point] if batch.node_point else []
    points += [p for cs in batch.pods.values() for p in cs.values()]
    for p in points:
        assert isinstance(p.cpu_ns, int) and isinstance(p.memory, int)
        assert p.cpu_ns > 0 and p.memory > 0
        assert math.isfinite(p.timestamp) and math.isfinite(p.start_time) and p.start_time >= 0
    for (ns, pod), cs in batch.pods.items():
        assert ns and pod and all(cs)
    assert all(isinstance(v, int) and v > 0 for v in batch.rejected.values())


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


def test_duplicate_when_all_three_families_align() -> None:
    lines = [
        line(f, "c", "d", "p", v)
        for f, v in ((CPU, "1"), (CPU, "2"), (MEM, "5"), (MEM, "6"), (START, "7"), (START, "8"))
    ]
    b = decode_resource_metrics("n", body(*lines), now=0)
    assert b.pods == {("d", "p"): {"c": ResourcePoint(7.0, 1700000000.123, 10**9, 5)}}
    assert b.rejected == {"duplicate": 3}


def test_unusual_blanks_in_node_lines() -> None:
    text = "node_cpu_usage_seconds_total  357.5\t1700000000123\n  node_memory_working_set_bytes 1e9 \n"
    b = decode_resource_metrics("n", text.encode(), now=5.0)
    assert b.node_point == ResourcePoint(0.0, 1700000000.123, 357_500_000_000, 10**9)
    assert b.rejected == {}


def test_fast_blocks_that_do_not_align() -> None:
    raw = build_resource_body(5, 2).decode()
    lines = raw.split("\n")
    start_lines = [i for i, ln in enumerate(lines) if ln.startswith(START + "{")]
    mem_lines = [i for i, ln in enumerate(lines) if ln.startswith(MEM + "{")]
    gone_start = lines[start_lines[3]]
    gone_mem = lines[mem_lines[7]]
    text = "\n".join(ln for ln in lines if ln not in (gone_start, gone_mem))
    b = decode_resource_metrics("n", text.encode(), now=0)
    full = decode_resource_metrics("n", raw.encode(), now=0)

    def key(ln: str) -> tuple[str, str, str]:
        labels = parse_sample_line(ln)[1]
        return labels["namespace"], labels["pod"], labels["container"]

    ns, pod, c = key(gone_start)
    assert b.pods[(ns, pod)][c].start_time == 0.0
    assert b.pods[(ns, pod)][c].cpu_ns == full.pods[(ns, pod)][c].cpu_ns
    ns, pod, c = key(gone_mem)
    assert c not in b.pods.get((ns, pod), {})
    assert b.rejected == {"incomplete_container": 1}
    assert sum(len(cs) for cs in b.pods.values()) == 9
