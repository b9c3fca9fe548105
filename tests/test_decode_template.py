"""Body templates (kcms.sources.decode_template): a node's next body decoded from its template gives
exactly what the full decoder gives (batch, refusal counts, DecodeError), for good bodies, for
random numbers in the numbers' places (NaN, negative, huge, leading zeros, not numbers at all), for
random edits anywhere (labels, blanks, lines), and in sequences across nodes and cycles; the
template is really used for the kubelet's bodies, refused for layouts it does not cover, bounded,
and off (no memory) in clusters larger than its bound."""

from __future__ import annotations

import gc
import re
import time

import pytest
from _kubelet_decode_helpers import RESOURCE, build_resource_body
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kcms.model import DecodeError, NodeBatch
from kcms.sim.kubelet import render_resource_metrics
from kcms.sim.workload import generate_nodes, node_addresses
from kcms.sources import decode_template
from kcms.sources.kubelet_decode import DecodeReuse, decode_resource_metrics

NOW = 1.7e9
GOOD = build_resource_body(30, 2)  # stamped lines: " 1700000000123"
PLAIN = build_resource_body(30, 2, timestamps=False)
SMALL = build_resource_body(3, 1)


def _sim_bodies() -> list[bytes]:
    now = time.time()
    nodes = generate_nodes(nodes=1, pods_per_node=6, containers_per_pod=(1, 3), seed=3, now=now - 3600,
                           addresses=node_addresses("127.60.0.1", 1), ports=[10250],
                           restart_every=None)  # fmt: skip
    return [render_resource_metrics(nodes[0], now - 60 + 15 * k) for k in range(4)]


@pytest.fixture(autouse=True, scope="module", params=["c", "python"])
def reader(request):
    """Every test twice: templates read in C (kcms/sources/_bodyscan.c, as installed) and in Python
    (the reader an install without a C compiler has): both must give what the full decoder gives."""
    with pytest.MonkeyPatch.context() as mp:
        if request.param == "python":
            mp.setattr(decode_template, "_scan_layout", None)
        yield request.param


SIM = _sim_bodies()
BASES = [GOOD, PLAIN, SMALL, RESOURCE, *SIM]
# a sample line's value and optional timestamp: the numbers a template leaves out
_NUMBERS = re.compile(rb"(?m)^([^#\n][^ \n]*) ([^ \n]+)(?: ([^ \n]+))?$")


def primed(base: bytes, node: str = "n", max_templates: int = 4) -> DecodeReuse:
    """A reuse that has made ``node``'s template of ``base`` (at its third full decode)."""
    reuse = DecodeReuse(max_templates=max_templates)
    for _ in range(3):
        outcome(node, base, reuse)
    assert len(reuse.templates) == 1
    return reuse


def outcome(node: str, body: bytes, reuse: DecodeReuse | None = None) -> NodeBatch | str:
    try:
        return decode_resource_metrics(node, body, now=NOW, reuse=reuse)
    except DecodeError as e:
        return f"DecodeError:{e.reason}"


def with_numbers(body: bytes, pick) -> bytes:
    """``body`` with each sample line's value and timestamp replaced by ``pick(i, old)`` (or
    ``pick(i, old, name)`` when it takes three arguments: ``name`` is the line's first token)."""
    wants_name = pick.__code__.co_argcount == 3
    count = [0]

    def sub(m: re.Match[bytes]) -> bytes:
        parts = [m.group(1)]
        for g in (2, 3):
            if m.group(g) is not None:
                args = (count[0], m.group(g), m.group(1)) if wants_name else (count[0], m.group(g))
                parts.append(pick(*args))
                count[0] += 1
        return b" ".join(parts)

    return _NUMBERS.sub(sub, body)


def test_the_kubelets_next_bodies_are_decoded_from_the_template() -> None:
    for base in BASES:
        reuse = DecodeReuse(max_templates=8)
        assert isinstance(outcome("n", base, reuse), NodeBatch)
        assert outcome("n", base, reuse) == outcome("n", base)
        assert len(reuse.templates) == 0  # made at the node's third full decode
        assert outcome("n", base, reuse) == outcome("n", base)
        assert len(reuse.templates) == 1
        # other numbers in the same places (last digit changed), but start times and the error
        # gauge (a restart, a kubelet error: a new template)
        later = with_numbers(
            base,
            lambda i, old, name: (
                old
                if name.startswith((b"container_start", b"resource_scrape"))
                else old[:-1] + (b"7" if old[-1:] != b"7" else b"3")
            ),
        )
        for body in (base, later, base):
            want = outcome("n", body)
            assert outcome("n", body, reuse) == want
        assert reuse.templates.hits == 3 and reuse.templates.misses == 0
    # the simulator's bodies, cycle after cycle (new values and timestamps every time)
    reuse = DecodeReuse(max_templates=8)
    for body in SIM:
        reuse.new_cycle()
        assert outcome("n", body, reuse) == outcome("n", body)
    assert reuse.templates.hits == len(SIM) - 3


_HOSTILE_NUMBERS = [b"NaN", b"+Inf", b"-Inf", b"-1", b"0", b"-0", b"1e999", b"1e-999", b"1.2.3", b"0123",
                    b"0000000000000", b"99999999999999999999", b"9999999999999", b"1_0", b"0x10", b"1e",
                    b"+5", b".5", b"5.", b"1E+20", b"2.5e+06", b"1048576.000000001", b"18446744073.709551616",
                    b"\xd9\xa3", b"\xff", b"-", b"e", b"1e+308", b"4.9e-324", b"123456789012345678",
                    b"1234567890123456789", b"17000000154567", b"", b"1,5", b"[1]",
                    # spellings the C reader takes or leaves: exponents (the kubelet writes values
                    # from 1e6 up so), ties at half a nanosecond or a byte, carries, the 1e18 ns limit,
                    # tokens past its 64-byte buffer
                    b"5.3180416e+08", b"7.461718043847824e+06", b"1e-05", b"1E5", b"1.e5", b".e5",
                    b"1e5.5", b"1e+", b"1e+0001", b"1.5e-09", b"2.5e-09", b"5e-10", b"0.0000000005",
                    b"0.0000000015", b"999999999.9999999995", b"999999999.999999999", b"1e17", b"1e9",
                    b"2.5", b"3.5", b"0.5", b"1e-400", b"0." + b"0" * 70 + b"1", b"1" * 70]  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(range(len(BASES))),
    st.dictionaries(st.integers(min_value=0, max_value=400), st.sampled_from(_HOSTILE_NUMBERS), max_size=6),
)
# a comma in a CPU value: the numbers are read as one JSON array, where it makes an element of its own
@example(2, {0: b"1,5"})
@example(3, {2: b"1,5"})
@example(3, {2: b"[1]"})
def test_random_numbers_in_the_numbers_places_decode_as_without_template(base_index, changes) -> None:
    base = BASES[base_index]
    reuse = primed(base)
    body = with_numbers(base, lambda i, old: changes.get(i, old))
    assert outcome("n", body, reuse) == outcome("n", body)
    # and the good body again afterwards
    assert outcome("n", base, reuse) == outcome("n", base)


_VALUE_FORMATS = ["{!r}", "{:.6f}", "{:.7e}", "{:.9e}", "{:.17g}", "{:.0f}", "{:.3f}"]
_READ_FROM_TEMPLATE = (b"container_cpu_usage_seconds_total", b"container_memory_working_set_bytes",
                       b"node_cpu_usage_seconds_total", b"node_memory_working_set_bytes")  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(range(len(BASES))),
    st.lists(st.floats(min_value=0.0, max_value=1e7, allow_nan=False, allow_infinity=False), min_size=1),
    st.sampled_from(_VALUE_FORMATS),
)
def test_ordinary_values_read_from_the_template_round_as_the_full_decoder(base_index, values, fmt) -> None:
    """The template path reads a body's numbers in one call (msgspec's JSON number reader, not
    float() token by token): every finite value, as the kubelet and exporters print them, must come
    out exactly as the full decoder reads it, and the body must really be read from the template."""
    base = BASES[base_index]
    reuse = primed(base)
    count = [0]

    def value(m: re.Match[bytes]) -> bytes:
        if not m.group(1).startswith(_READ_FROM_TEMPLATE):
            return m.group(0)  # start times and the error gauge are part of the template
        count[0] += 1
        stamp = b"" if m.group(3) is None else b" " + m.group(3)
        return m.group(1) + b" " + fmt.format(values[count[0] % len(values)]).encode() + stamp

    body = _NUMBERS.sub(value, base)
    hits = reuse.templates.hits
    assert outcome("n", body, reuse) == outcome("n", body)
    assert reuse.templates.hits == hits + 1  # read from the template, not decoded in full


def test_the_c_reader_is_built_and_reads_the_kubelets_bodies(reader) -> None:
    """CI compiles kcms/sources/_bodyscan.c (gcc is on every machine the tests run on): the C
    reader must be there, and the simulator's bodies must be read by it, not left to Python."""
    from kcms.sources import _bodyscan

    for base, after in zip(SIM, SIM[1:], strict=False):
        reuse = primed(base)
        template = reuse.templates._current["n"]
        assert (template.scan is not None) == (reader == "c")
        if template.scan is not None:
            got = _bodyscan.read(after, *template.scan)
            assert got is not None and got is not False
            cpu_ns, times, memory, node, bounds = got
            assert len(cpu_ns) == len(times) == len(memory) == template.n and node is not None
            # each column's (min, max), which the screening then takes instead of min() and max()
            assert bounds == (min(cpu_ns), max(cpu_ns), min(memory), max(memory), min(times), max(times))


def test_a_templated_scrapes_columns_are_not_walked_by_the_cyclic_collector(reader) -> None:
    """The store keeps each scrape's columns for two resolutions. They hold numbers only, so the C
    reader takes them off the collector's lists (tracked, every young collection walked them until
    the cycle's heap freeze: 5-40 ms a gen-0 pass during a 5000-node cycle), and the struct that
    holds them is never tracked. No reading is made until one is read. The values are the full
    decoder's (the tests above)."""
    for base, after in zip(SIM, SIM[1:], strict=False):
        batch = decode_resource_metrics("n", after, now=NOW, reuse=primed(base))
        columns = batch.columns
        assert columns is not None and not gc.is_tracked(columns)
        assert columns._readings is None  # not made by the decoder
        assert len(columns.readings) == len(columns.cpu_ns) > 0
        assert columns.readings is columns.readings  # made once, kept
        lists = (columns.cpu_ns, columns.times, columns.memory)
        assert [gc.is_tracked(column) for column in lists] == [reader == "python"] * 3
        assert batch == decode_resource_metrics("n", after, now=NOW)


@pytest.mark.parametrize(
    ("token", "want"),
    [(b"71817221.4999999927", 71817222), (b"28865562.5000000025", 28865563), (b"1234568.5", 1234568), (b"1234569.5", 1234570),
     (b"5.3180416e+08", 531804160), (b"1.2345678901234567e+08", 123456789), (b"2.5e0", 2)],
)  # fmt: skip
def test_memory_values_round_to_the_byte_as_the_float_of_their_text(token, want) -> None:
    """17 significant digits are past a double's: the reader must not round twice (to a double,
    then to the byte); ties go to the even byte, as Python's round()."""
    base = SIM[0]
    reuse = primed(base)
    hits = reuse.templates.hits

    def memory(m: re.Match[bytes]) -> bytes:
        if not m.group(1).startswith(b"container_memory_working_set_bytes"):
            return m.group(0)
        return m.group(1) + b" " + token + (b"" if m.group(3) is None else b" " + m.group(3))

    body = _NUMBERS.sub(memory, base)
    got = outcome("n", body, reuse)
    assert got == outcome("n", body) and reuse.templates.hits == hits + 1
    assert {p.memory for c in got.pods.values() for p in c.values()} == {want}


def test_bytes_that_are_not_text_in_any_numbers_place_decode_as_without_template() -> None:
    """The template is checked on the body's bytes, before any UTF-8 decoding: a byte that is not
    UTF-8 text, or a carriage return, in any one numbers' place (those of families the decoder
    skips included) gives what the full decoder gives (a malformed line, say). So does an empty
    number (``V `` with no timestamp after the blank: the same token count), which used to raise
    IndexError out of the decoder."""
    for base in BASES:
        names = [m.group(1) for m in _NUMBERS.finditer(base) for g in (2, 3) if m.group(g) is not None]
        # every place of a family the decoder skips (their numbers have no role), every 7th other
        # (values and timestamps alike)
        places = [
            i for i, name in enumerate(names) if not name.startswith((b"container_", b"node_")) or i % 7 == 0
        ]
        for bad in (b"\xff", b"1\xff", b"1\r", b"\xd9", b""):
            for at in places:
                reuse = primed(base)
                body = with_numbers(base, lambda i, old, at=at, bad=bad: bad if i == at else old)
                assert outcome("n", body, reuse) == outcome("n", body), (at, bad)


_EDIT_CHARS = list(' \t\n"\\{}=,#-+.eE0123456789_') + ["\x00", "\u0663", "\r", "\x0b", "\xa0", "\u2028"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]),
            st.sampled_from(range(len(BASES))),
            st.lists(
                st.one_of(
                    st.tuples(st.just("insert"), st.integers(0, 40000), st.sampled_from(_EDIT_CHARS)),
                    st.tuples(st.just("delete"), st.integers(0, 40000), st.integers(1, 40)),
                    st.tuples(st.just("line"), st.integers(0, 400), st.sampled_from(["dup", "drop", "swap"])),
                    st.tuples(st.just("number"), st.integers(0, 400), st.sampled_from(_HOSTILE_NUMBERS)),
                ),
                max_size=3,
            ),
            st.booleans(),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_sequences_of_edited_bodies_decode_as_without_template(steps) -> None:
    reuse = DecodeReuse(max_nodes=4, max_templates=2)
    for node, index, edits, cycle in steps:
        body = BASES[index]
        for edit in edits:
            kind, at, arg = edit
            if kind == "insert":
                text = body.decode("utf-8", "surrogateescape")
                at = min(at, len(text))
                body = (text[:at] + arg + text[at:]).encode("utf-8", "surrogateescape")
            elif kind == "delete":
                at = min(at, len(body))
                body = body[:at] + body[at + arg :]
            elif kind == "line":
                lines = body.split(b"\n")
                at %= len(lines)
                if arg == "dup":
                    lines.insert(at, lines[at])
                elif arg == "drop":
                    del lines[at]
                elif at + 1 < len(lines):
                    lines[at], lines[at + 1] = lines[at + 1], lines[at]
                body = b"\n".join(lines)
            else:
                body = with_numbers(body, lambda i, old, at=at, arg=arg: arg if i == at else old)
        assert outcome(node, body, reuse) == outcome(node, body)
        if cycle:
            reuse.new_cycle()
        assert len(reuse.templates) <= 4


def test_layouts_not_covered_are_not_templated() -> None:
    lines = GOOD.split(b"\n")
    cpu = [i for i, ln in enumerate(lines) if ln.startswith(b"container_cpu")]
    variants = {
        "comment inside a block": b"\n".join(lines[: cpu[3]] + [b"# note"] + lines[cpu[3] :]),
        "other label order": GOOD.replace(b'{container="', b'{zz="1",container="', 1),
        "tab": GOOD.replace(b" 1700000000123\n", b"\t1700000000123\n", 1),
        "families not aligned": GOOD.replace(lines[cpu[0]] + b"\n", b"", 1) + lines[cpu[0]] + b"\n",
        "a refusal": GOOD.replace(b" 1700000000123\n", b" 9999999999999\n", 1),
    }
    for name, body in variants.items():
        reuse = DecodeReuse(max_templates=4)
        first = outcome("n", body, reuse)
        assert outcome("n", body, reuse) == first
        assert outcome("n", body, reuse) == first  # the third full decode: where a template is made
        assert len(reuse.templates) == 0, name
        assert outcome("n", body, reuse) == first == outcome("n", body), name


def test_bounded_and_off_in_a_large_cluster() -> None:
    reuse = DecodeReuse(max_templates=3)

    def cycle(count: int) -> None:
        reuse.new_cycle()
        for i in range(count):
            assert outcome(f"n{i}", SMALL, reuse) == outcome(f"n{i}", SMALL)

    cycle(2)
    cycle(2)
    assert len(reuse.templates) == 0  # not in the first two cycles (after start: the ones that serve)
    cycle(2)
    assert len(reuse.templates) == 2  # made at each node's third decode
    cycle(10)  # the cluster grew past the bound: no template made beyond it
    assert len(reuse.templates) <= 3
    cycle(10)  # after a cycle of 10 bodies templates are off, and freed
    assert len(reuse.templates) == 0 and not reuse.templates.enabled
    # a large cluster from the start never makes one (the first cycle is past the bound as well)
    fresh = DecodeReuse(max_templates=3)
    for _ in range(3):
        fresh.new_cycle()
        for i in range(10):
            outcome(f"n{i}", SMALL, fresh)
        assert len(fresh.templates) == 0
    cycle(2)  # it shrank to 2 nodes: on again (after a cycle of 2: two full decodes, then the template)
    cycle(2)
    cycle(2)
    assert len(reuse.templates) == 0
    cycle(2)
    assert reuse.templates.enabled and len(reuse.templates) == 2
    # a node not decoded for a whole cycle is forgotten; forget() drops one at once
    cycle(1)
    reuse.new_cycle()
    assert len(reuse.templates) == 1
    reuse.forget("n0")
    assert len(reuse.templates) == 0


def test_a_node_scraped_again_in_a_cycle_counts_once_against_the_bound() -> None:
    """The first cycle rescrapes every node (up to 3 times with a kubelet serving one reading): the
    bound is on nodes, so 3 nodes decoded 4 times each in a cycle keep templates on at a bound of 3
    (counted as decodes, 12 > 3 turned them off for a cycle, as the first cycle's rescrapes did in a
    cluster of 4097-16384 nodes at the bound of 16384)."""
    reuse = DecodeReuse(max_templates=3)
    for _ in range(3):
        reuse.new_cycle()
        for _ in range(4):
            for i in range(3):
                assert outcome(f"n{i}", SMALL, reuse) == outcome(f"n{i}", SMALL)
    assert reuse.templates.enabled and len(reuse.templates) == 3
    reuse.new_cycle()
    for i in range(4):  # a fourth node: over the bound, however the decodes are counted
        outcome(f"n{i}", SMALL, reuse)
    reuse.new_cycle()
    assert not reuse.templates.enabled and len(reuse.templates) == 0


def test_templates_made_in_one_cycle_are_bounded() -> None:
    # a large cluster makes its templates over several cycles, not all in one
    reuse = DecodeReuse(max_templates=16)
    reuse.templates.max_builds = 2
    made = []
    for _ in range(6):
        reuse.new_cycle()
        for i in range(5):
            assert outcome(f"n{i}", SMALL, reuse) == outcome(f"n{i}", SMALL)
        made.append(len(reuse.templates))
    assert made == [0, 0, 2, 4, 5, 5]


def test_a_node_whose_body_keeps_changing_is_templated_less_and_less() -> None:
    reuse = DecodeReuse(max_templates=4)
    builds = 0
    for k in range(40):
        # a new start time every scrape: every template is dropped at its first use
        body = GOOD.replace(b"} 1.6999", b"} 1.6998" if k % 2 else b"} 1.6997")
        before = len(reuse.templates)
        assert outcome("n", body, reuse) == outcome("n", body)
        builds += len(reuse.templates) > before
    assert builds <= 8  # 1, 2, 4, 8, 16 scrapes apart: not one build a scrape


def test_two_nodes_never_share_a_template() -> None:
    reuse = primed(GOOD, "a")
    other = build_resource_body(30, 2, seed=2)
    assert outcome("b", other, reuse) == outcome("b", other)
    assert reuse.templates.hits == 0
    assert outcome("a", other, reuse) == outcome("a", other)  # a's template does not fit b's body
    assert decode_template.build(GOOD.decode()) is not None


def test_a_templates_names_are_one_object_per_distinct_name() -> None:
    """Batches decoded from templates hold one string per pod name, and namespaces and container
    names shared across nodes (the store keeps these as its keys, every node every cycle)."""
    reuse = DecodeReuse(max_templates=8)
    for _ in range(3):  # a template is made at each node's third full decode
        for node in ("a", "b"):
            decode_resource_metrics(node, GOOD, now=NOW, reuse=reuse)
    batch_a = decode_resource_metrics("a", GOOD, now=NOW, reuse=reuse)
    batch_b = decode_resource_metrics("b", GOOD, now=NOW, reuse=reuse)
    assert reuse.templates.hits == 2
    assert batch_a == outcome("a", GOOD)
    for (ns_a, _), (ns_b, _) in zip(batch_a.pods, batch_b.pods, strict=True):
        assert ns_a is ns_b  # the same namespace name on two nodes: one object
    namespaces = {id(ns) for ns, _ in batch_a.pods}
    assert len(namespaces) == len({ns for ns, _ in batch_a.pods})
    containers = [c for cs in batch_a.pods.values() for c in cs] + [
        c for cs in batch_b.pods.values() for c in cs
    ]
    assert len({id(c) for c in containers}) == len(set(containers))


def test_whitespace_moved_between_numbers_and_lines_is_never_read_from_the_template() -> None:
    """The template keeps no text, only a hash of the constant tokens: a body whose tokens are
    all the same but whose blanks and newlines are moved, doubled or changed (a newline and a
    blank swapped, a timestamp pulled onto the next line, a tab, a CR, a trailing blank) is
    another text, and decodes exactly as without a template (mostly in full, with refusals)."""
    text = GOOD.decode()
    first = text.index("container_cpu_usage_seconds_total{")
    line_end = text.index("\n", first)
    value_gap = text.index(" ", text.index("}", first))  # the blank before the value
    stamp_gap = text.rindex(" ", first, line_end)  # the blank before the timestamp
    variants = [
        text[:line_end] + " " + text[line_end + 1 :],  # two lines joined
        text[:stamp_gap] + "\n" + text[stamp_gap + 1 :],  # the timestamp on a line of its own
        text[:stamp_gap] + "\n" + text[stamp_gap + 1 : line_end] + " " + text[line_end + 1 :],  # both
        text[:value_gap] + "  " + text[value_gap + 1 :],  # two blanks
        text[:value_gap] + "\t" + text[value_gap + 1 :],
        text[:stamp_gap] + "\r" + text[stamp_gap:],  # (a CR before a newline is a CRLF: read as one)
        text[:line_end] + " " + text[line_end:],
        text.rstrip("\n"),
        text + "\n",
    ]
    for variant in variants:
        assert variant != text
        body = variant.encode()
        reuse = primed(GOOD, max_templates=8)
        hits = reuse.templates.hits
        assert outcome("n", body, reuse) == outcome("n", body)
        assert reuse.templates.hits == hits, variants.index(variant)  # not read from the template
