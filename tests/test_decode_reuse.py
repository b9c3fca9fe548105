"""The kubelet decoder's per-node reuse of the container start-time block (kcms.sources.kubelet_decode
.DecodeReuse): a changed block is read again (a restart is visible), the same text (or the same text
with a new timestamp common to all its lines) reuses the parse, a hostile body after a good one is
refused exactly as without reuse, two nodes never share a parse, the memory is bounded and forgets
nodes that leave, and, over random sequences of bodies, decoding with reuse equals decoding without."""

from __future__ import annotations

import logging
import re
import time

import pytest
from _kubelet_decode_helpers import RESOURCE, START, build_resource_body
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kcms.collector.kubelet import KubeletClient, KubeletClientConfig
from kcms.collector.scheduler import Collector
from kcms.kube.inventory import StaticInventory
from kcms.model import DecodeError, NodeBatch
from kcms.sim import SimulatedCluster
from kcms.sources.kubelet_decode import DecodeReuse, decode_resource_metrics

NOW = 1.7e9
GOOD = build_resource_body(30, 2)  # stamped lines: " 1700000000123"
PLAIN = build_resource_body(30, 2, timestamps=False)


def outcome(node: str, body: bytes, reuse: DecodeReuse | None = None) -> NodeBatch | str:
    """The batch, or the DecodeError's reason."""
    try:
        return decode_resource_metrics(node, body, now=NOW, reuse=reuse)
    except DecodeError as e:
        return f"DecodeError:{e.reason}"


def start_lines(body: bytes) -> list[bytes]:
    return [ln for ln in body.split(b"\n") if ln.startswith(START.encode() + b"{")]


def replace_line(body: bytes, old: bytes, new: bytes) -> bytes:
    assert body.count(old) == 1
    return body.replace(old, new)


def restarted(body: bytes, index: int = 0, start: bytes = b"1.7000001e+09") -> bytes:
    """The body with one container's start time moved (a restart), its timestamp kept."""
    line = start_lines(body)[index]
    head, _, rest = line.partition(b"} ")
    parts = rest.split(b" ")
    return replace_line(body, line, head + b"} " + b" ".join([start, *parts[1:]]))


def restamped(body: bytes, stamp: bytes) -> bytes:
    """Every line's timestamp changed to ``stamp`` (the simulator's way: one scrape time everywhere)."""
    return body.replace(b" 1700000000123\n", b" " + stamp + b"\n")


def container_start(batch: NodeBatch, line: bytes) -> float:
    labels = dict(re.findall(rb'(\w+)="([^"]*)"', line))
    pod = batch.pods[(labels[b"namespace"].decode(), labels[b"pod"].decode())]
    return pod[labels[b"container"].decode()].start_time


def test_changed_start_block_is_read_again_and_a_restart_is_visible() -> None:
    reuse = DecodeReuse()
    first = outcome("n1", GOOD, reuse)
    assert isinstance(first, NodeBatch) and not first.rejected
    line = start_lines(GOOD)[3]
    body = restarted(GOOD, 3)
    second = outcome("n1", body, reuse)
    assert reuse.hits == 0 and reuse.misses == 2  # not reused: the block changed
    assert second == outcome("n1", body)  # the same as without reuse
    assert container_start(second, line) == 1.7000001e9 != container_start(first, line)
    # the new block is the one remembered now: the same body again reuses it, restart included
    third = outcome("n1", body, reuse)
    assert reuse.hits == 1 and third == second
    # and back to the old start time (another body) is read again as well
    assert outcome("n1", GOOD, reuse) == first and reuse.hits == 1


@pytest.mark.parametrize("body", [GOOD, PLAIN, RESOURCE], ids=["stamped", "plain", "recorded"])
def test_identical_text_reuses_the_parse(body: bytes) -> None:
    reuse = DecodeReuse()
    fresh = outcome("n1", body)
    assert isinstance(fresh, NodeBatch) and fresh.pods
    assert outcome("n1", body, reuse) == fresh and (reuse.hits, reuse.misses) == (0, 1)
    for i in range(3):
        assert outcome("n1", body, reuse) == fresh
        assert reuse.hits == i + 1


def test_a_new_timestamp_common_to_all_lines_reuses_the_parse() -> None:
    reuse = DecodeReuse()
    outcome("n1", GOOD, reuse)
    later = restamped(GOOD, b"1700000015456")
    assert outcome("n1", later, reuse) == outcome("n1", later) and reuse.hits == 1
    # a timestamp of another length, or one line stamped differently: parsed again, same result
    for body in (
        restamped(GOOD, b"17000000154567"),
        replace_line(later, start_lines(later)[5], start_lines(later)[5][:-13] + b"1700000015457"),
    ):
        hits = reuse.hits
        assert outcome("n1", body, reuse) == outcome("n1", body)
        assert reuse.hits == hits


def _hostile_variants(good: bytes) -> dict[str, bytes]:
    """Bodies that differ from ``good`` in ways the decoder refuses or counts."""
    lines = start_lines(good)
    first, last = lines[0], lines[-1]
    head, _, rest = first.partition(b"} ")
    value, stamp = rest.split(b" ")
    return {
        "nan-start": replace_line(good, first, head + b"} NaN " + stamp),
        "negative-start": replace_line(good, first, head + b"} -1 " + stamp),
        "inf-start": replace_line(good, first, head + b"} +Inf " + stamp),
        "bad-value": replace_line(good, first, head + b"} 1.2.3 " + stamp),
        "zero-stamp": restamped(good, b"0000000000000"),
        "leading-zero-stamp": restamped(good, b"0700000000123"),
        "unicode-digit-stamp": restamped(good, "170000000012\u0663".encode()),
        "negative-stamp": restamped(good, b"-700000000123"),
        "stamp-dropped-on-one-line": replace_line(good, last, last.rsplit(b" ", 1)[0]),
        "stamp-dropped-on-a-middle-line": replace_line(good, lines[2], lines[2].rsplit(b" ", 1)[0]),
        "future-stamp-everywhere": restamped(good, b"9999999999999"),
        "duplicate-start": replace_line(good, last, last + b"\n" + last),
        "missing-label": replace_line(good, first, first.replace(b'container="', b'container_x="')),
        "escaped-label": replace_line(good, first, first.replace(b'namespace="', b'namespace="a\\"b')),
        "long-name": replace_line(good, first, first.replace(b'pod="', b'pod="' + b"p" * 300)),
        "interleaved": good.replace(lines[1] + b"\n", b"") + lines[1] + b"\n",
        "not-utf8-line": replace_line(good, first, first + b"\xff\xfe"),
        "garbage": b'container_start_time_seconds{container="a" 12\n\xff{{{ NaN',
        "empty": b"   \n",
        "kubelet-error": b"resource_scrape_error 1\n",
        "too-large": good + b"#" * (10 * 1024 * 1024),
    }


@pytest.mark.parametrize("name", sorted(_hostile_variants(GOOD)))
@pytest.mark.parametrize("good", [GOOD, RESOURCE], ids=["bench", "recorded"])
def test_a_hostile_body_after_a_good_one_is_refused_exactly_as_before(name: str, good: bytes) -> None:
    hostile = _hostile_variants(good)[name]
    reuse = DecodeReuse()
    assert isinstance(outcome("n1", good, reuse), NodeBatch)
    assert outcome("n1", good, reuse) == outcome("n1", good) and reuse.hits == 1
    hits = reuse.hits
    want = outcome("n1", hostile)
    assert outcome("n1", hostile, reuse) == want
    if name == "future-stamp-everywhere":
        # the start-time block is the same but for a valid common timestamp (start lines' timestamps
        # are not used): its parse may be reused, the future CPU readings are refused all the same
        assert isinstance(want, NodeBatch) and want.rejected.get("future_timestamp")
    else:
        assert reuse.hits == hits  # nothing of the good parse was used for it
    # and the good body afterwards is still decoded right
    assert outcome("n1", good, reuse) == outcome("n1", good)


def test_two_nodes_never_share_a_parse() -> None:
    a = GOOD
    b = restarted(GOOD, 0, b"1.6e+09")  # node b: the same containers, another start time
    reuse = DecodeReuse()
    assert outcome("a", a, reuse) == outcome("a", a)
    assert outcome("b", b, reuse) == outcome("b", b)
    assert reuse.hits == 0 and len(reuse) == 2
    # each node's body again: its own parse
    assert outcome("a", a, reuse) == outcome("a", a) and reuse.hits == 1
    assert outcome("b", b, reuse) == outcome("b", b) and reuse.hits == 2
    # a's text sent as node b (or as an unknown node c) is not matched against a's parse
    assert outcome("b", a, reuse) == outcome("b", a) and reuse.hits == 2
    assert outcome("c", b, reuse) == outcome("c", b) and reuse.hits == 2
    got = outcome("a", b, reuse)
    assert isinstance(got, NodeBatch) and got.node == "a" and got == outcome("a", b)
    line = start_lines(b)[0]
    assert container_start(got, line) == 1.6e9


def test_memory_is_bounded_and_forgets_nodes_that_leave() -> None:
    reuse = DecodeReuse(max_nodes=4)
    for i in range(50):
        outcome(f"n{i}", GOOD, reuse)
        assert len(reuse) <= 8  # two generations of at most max_nodes
    reuse = DecodeReuse()
    for name in ("a", "b", "c"):
        outcome(name, GOOD, reuse)
    reuse.new_cycle()
    outcome("a", GOOD, reuse)  # a and b are scraped this cycle; c has left
    outcome("b", GOOD, reuse)
    assert reuse.hits == 2 and len(reuse) == 3
    reuse.new_cycle()
    assert len(reuse) == 2  # c forgotten after a whole cycle without it
    outcome("c", GOOD, reuse)
    assert reuse.hits == 2  # read afresh
    reuse.forget("a")
    outcome("a", GOOD, reuse)
    assert reuse.hits == 2


def _variant(draw_index: int, n: int) -> bytes:
    """A pool of bodies: the good ones, restarts, restamps and every hostile variant."""
    pool = [GOOD, PLAIN, RESOURCE, restarted(GOOD, 2), restarted(PLAIN, 7), restamped(GOOD, b"1700000030000"),
            restamped(restarted(GOOD, 2), b"1700000045000"), build_resource_body(30, 2, seed=2),
            build_resource_body(3, 1)]  # fmt: skip
    pool += list(_hostile_variants(GOOD).values())[:-1]  # all but the 10 MB one (slow to repeat)
    return pool[draw_index % len(pool)]


_POOL_SIZE = 9 + len(_hostile_variants(GOOD)) - 1
_MUTATION_CHARS = list(' \t\n"\\{}=,#-+.eE0123456789') + ["\x00", "\u0663"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.integers(min_value=0, max_value=_POOL_SIZE - 1),
            st.one_of(
                st.none(),
                st.tuples(st.integers(min_value=0, max_value=40000), st.sampled_from(_MUTATION_CHARS)),
            ),
            st.booleans(),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_decoding_with_reuse_equals_decoding_without(steps) -> None:
    reuse = DecodeReuse(max_nodes=2)
    for node, index, mutation, cycle in steps:
        body = _variant(index, 0)
        if mutation is not None:
            pos, ch = mutation
            text = body.decode("utf-8", "surrogateescape")
            pos = min(pos, len(text))
            body = (text[:pos] + ch + text[pos:]).encode("utf-8", "surrogateescape")
        assert outcome(node, body, reuse) == outcome(node, body)
        if cycle:
            reuse.new_cycle()
        assert len(reuse) <= 4


async def test_the_collector_reuses_start_times_and_sees_a_restart(ca, caplog) -> None:
    """Real simulated kubelets over TLS, scraped by the collector's own client, cycle after cycle."""
    caplog.set_level(logging.INFO)
    cluster = SimulatedCluster(nodes=3, pods_per_node=4, containers_per_pod=2, seed=5, ca=ca,
                               one_port_per_node=True, token="kubelet-token")  # fmt: skip
    await cluster.start()
    client = KubeletClient(
        KubeletClientConfig(
            use_node_status_port=True,
            preferred_address_types=("InternalIP",),
            extra_ca_pem=[ca.cert_pem.bytes().decode()],
            token_source=lambda: "kubelet-token",
        )
    )
    try:
        objects = cluster.inventory_objects()
        stored: list[NodeBatch] = []
        collector = Collector(StaticInventory(objects), client, stored.append, resolution=60.0, timeout=30.0)
        assert await collector.run_cycle() == 0
        assert client.decode_reuse.hits == 0 and len(client.decode_reuse) == 3
        # the cycle's decodes were spread over turns of the loop for a third of the resolution
        assert 0 < client.decode_turns.until - time.perf_counter() <= 60.0 / 3
        stored.clear()
        assert await collector.run_cycle() == 0
        assert client.decode_reuse.hits == 3  # every node's start times unchanged: reused
        # a container restarts on one node: that node's block is read again, the new start visible
        node = cluster.nodes[1]
        c = node.containers_sorted[0]
        c.restart(time.time() - 1.0)
        stored.clear()
        assert await collector.run_cycle() == 0
        assert client.decode_reuse.hits == 5
        batch = next(b for b in stored if b.node == node.name)
        pod = next(p for p in node.pods if c in p.containers)
        assert batch.pods[(pod.namespace, pod.name)][c.name].start_time == c.start_time
        # one node leaves the inventory: after a whole cycle without it, it is forgotten
        gone = cluster.nodes[2].name
        rest = [o for o in objects if not (o["kind"] == "Node" and o["metadata"]["name"] == gone)]
        collector = Collector(StaticInventory(rest), client, stored.append, resolution=60.0, timeout=30.0)
        for _ in range(2):
            assert await collector.run_cycle() == 0
        assert len(client.decode_reuse) == 2
    finally:
        await client.close()
        await cluster.stop()
    assert "Traceback" not in caplog.text


def _unaligned(body: bytes) -> bytes:
    """The same readings with the start-time block's first line moved to its end: the families no
    longer line up, so the decoder takes its general path (tables, then screen_batch point by point)."""
    lines = start_lines(body)
    return body.replace(lines[0] + b"\n", b"", 1).replace(
        lines[-1] + b"\n", lines[-1] + b"\n" + lines[0] + b"\n", 1
    )


def _cpu_mem_lines(body: bytes, family: bytes) -> list[bytes]:
    return [ln for ln in body.split(b"\n") if ln.startswith(family + b"{")]


def _bad_readings(good: bytes) -> dict[str, tuple[bytes, str]]:
    cpu = _cpu_mem_lines(good, b"container_cpu_usage_seconds_total")[4]
    mem = _cpu_mem_lines(good, b"container_memory_working_set_bytes")[9]
    head, _, rest = cpu.partition(b"} ")
    value, stamp = rest.split(b" ")
    mhead, _, mrest = mem.partition(b"} ")
    _, mstamp = mrest.split(b" ")
    labels = cpu.partition(b"{")[2].partition(b"}")[0]  # the same in the three families
    renamed = re.sub(rb'^container="[^"]*"', b'container="' + b"c" * 254 + b'"', labels)
    long_name = good.replace(b"{" + labels + b"}", b"{" + renamed + b"}")
    assert long_name.count(renamed) == 3
    return {
        "future": (replace_line(good, cpu, head + b"} " + value + b" 9999999999999"), "future_timestamp"),
        "absurd-cpu": (replace_line(good, cpu, head + b"} 2e10 " + stamp), "absurd_value"),
        "absurd-memory": (replace_line(good, mem, mhead + b"} 1e17 " + mstamp), "absurd_value"),
        "long-container": (long_name, "label_value_too_long"),
    }


@pytest.mark.parametrize("name", ["future", "absurd-cpu", "absurd-memory", "long-container"])
def test_the_column_screen_refuses_what_screen_batch_refuses(name: str) -> None:
    """The aligned path screens a column at a time; it must refuse exactly what the point-by-point
    screen of the general path refuses: the one pod, counted once, everything else kept."""
    good = build_resource_body(30, 2, seed=3)
    body, reason = _bad_readings(good)[name]
    aligned, general = outcome("n1", body), outcome("n1", _unaligned(body))
    assert isinstance(aligned, NodeBatch) and isinstance(general, NodeBatch)
    assert aligned == general
    assert aligned.rejected == {reason: 1}
    assert aligned.node_point is not None and len(aligned.pods) == 29
    fine = outcome("n1", good)
    assert isinstance(fine, NodeBatch) and fine == outcome("n1", _unaligned(good)) and len(fine.pods) == 30
    reuse = DecodeReuse()
    for _ in range(2):  # parsed, then reused (the names checked when remembered): refused both times
        assert outcome("n1", body, reuse) == aligned
    assert reuse.hits == 1
    assert outcome("n1", good, reuse) == fine and outcome("n1", body, reuse) == aligned
