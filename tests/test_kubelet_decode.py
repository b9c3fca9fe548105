"""Decoder of the kubelet's /metrics/resource (Prometheus text) responses. See also
test_kubelet_decode_summary.py (/stats/summary) and test_kubelet_decode_properties.py (property tests)."""

from __future__ import annotations

import pytest
from _kubelet_decode_helpers import CPU, MEM, RESOURCE, START, body, build_resource_body, container, line

from kcms.model import DecodeError, NodeBatch, ResourcePoint
from kcms.sources.kubelet_decode import decode_resource_metrics, seconds_to_ns
from kcms.sources.promtext import LineError, parse_sample_line

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


def test_a_line_that_is_not_utf8_costs_only_that_line() -> None:
    """The kubelet's structure is checked strictly, but one bad line does not lose the node."""
    good = decode_resource_metrics("n", RESOURCE, now=1.0)
    text = RESOURCE.replace(b"# TYPE container_memory", b"# TYPE \xff\xfe container_memory", 1)
    b = decode_resource_metrics("n", text, now=1.0)
    assert b.pods == good.pods and b.node_point == good.node_point
    assert b.rejected == {**good.rejected, "malformed": good.rejected.get("malformed", 0) + 1}


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
