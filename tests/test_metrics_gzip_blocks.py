"""The gzip of the list of every pod, spliced from node blocks compressed once
(kcms.apis.metrics.gzblocks): whatever the blocks hold and whatever the timestamp, the member
inflates, under zlib's and the gzip module's CRC-32 and length checks, to exactly the text with the
timestamp in every placeholder's place; a block that cannot be spliced is refused, and a list with
it still comes out right."""

from __future__ import annotations

import gzip
import random
import zlib

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from isal import isal_zlib
from prometheus_client import REGISTRY

from kcms.apis.metrics import gzblocks

HEAD = b'{"kind":"PodMetricsList","apiVersion":"metrics.k8s.io/v1beta1","metadata":{},"items":['
TAIL = b"]}"
STAMP = b'"2026-11-28T08:30:00Z"'


@pytest.fixture(autouse=True, scope="module", params=["c", "python"])
def splicer(request):
    """Every test twice: runs spliced in C (kcms/apis/metrics/_gzsplice.c, as installed) and by
    GzipList.blocks' Python loop (what an install without a C compiler runs)."""
    with pytest.MonkeyPatch.context() as mp:
        if request.param == "python":
            mp.setattr(gzblocks, "_splice", None)
        yield request.param


def item(name: str, label: str, cpu: int) -> bytes:
    """One list item as a node block holds it: a leading comma, a NUL where the timestamp goes."""
    return (
        b',{"metadata":{"name":' + orjson.dumps(name) + b',"creationTimestamp":\0,"labels":'
        + orjson.dumps({"app": label}) + b'},"containers":[{"name":"c","usage":{"cpu":"'
        + str(cpu).encode() + b'n"}}]}'
    )  # fmt: skip


def spliced(blocks: list[bytes], stamp: bytes, compress: list[bool], runs: bool = False) -> bytes:
    """The gzip member of HEAD, ``blocks`` and TAIL as a list assembles it: the first block (its
    comma dropped) and those not in ``compress`` compressed now, the others spliced, one
    ``GzipList.blocks`` call each (``runs``: consecutive ones in one call, as the list does)."""
    member = gzblocks.GzipList(stamp)
    pieces = [member.start(HEAD)]
    run: list[gzblocks.CompressedBlock] = []
    for i, block in enumerate(blocks):
        made = gzblocks.compress_block(block) if i and compress[i] else None
        if made is not None and runs:
            run.append(made)
            continue
        member.blocks(run, pieces)
        run.clear()
        if made is None:
            text = block.replace(b"\0", stamp)
            pieces.append(member.text(text[1:] if i == 0 else text))
        else:
            member.blocks([made], pieces)
    member.blocks(run, pieces)
    pieces.append(member.finish(TAIL))
    return b"".join(pieces)


def expected(blocks: list[bytes], stamp: bytes) -> bytes:
    return HEAD + b"".join(blocks).replace(b"\0", stamp)[1:] + TAIL


names = st.text(min_size=0, max_size=40)
blocks_strategy = st.lists(
    st.lists(st.tuples(names, names, st.integers(0, 10**12)), min_size=1, max_size=40).map(
        lambda items: b"".join(item(*i) for i in items)
    ),
    min_size=0,
    max_size=12,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks_strategy, st.binary(min_size=22, max_size=22), st.data())
def test_a_spliced_list_inflates_to_the_text_with_its_timestamp(blocks, stamp, data):
    # any 22 bytes as the stamp, NULs and placeholder bytes included: it travels in a stored block
    compress = data.draw(st.lists(st.booleans(), min_size=len(blocks), max_size=len(blocks)))
    body = spliced(blocks, stamp, compress, runs=data.draw(st.booleans()))
    want = expected(blocks, stamp)
    assert zlib.decompress(body, 31) == want  # checks the CRC-32 and the length
    assert gzip.decompress(body) == want


def test_a_cluster_sized_list_is_spliced_whole_and_smaller_than_a_fifth():
    rng = random.Random(9)
    blocks = [
        b"".join(item(f"app-{rng.randint(0, 300)}-{rng.getrandbits(40):x}", f"web-{rng.randint(0, 9)}",
                      rng.getrandbits(30)) for _ in range(30))
        for _ in range(200)
    ]  # fmt: skip
    made = [gzblocks.compress_block(b) for b in blocks]
    assert all(m is not None for m in made)  # none refused by its check
    for stamp in (STAMP, b'"1999-12-31T23:59:59Z"'):
        body = spliced(blocks, stamp, [True] * len(blocks))
        want = expected(blocks, stamp)
        assert zlib.decompress(body, 31) == want
        # the blocks in one run make the same bytes as one at a time
        assert spliced(blocks, stamp, [True] * len(blocks), runs=True) == body
        assert len(body) < len(want) / 5
        assert (
            orjson.loads(zlib.decompress(body, 31))["items"][7]["metadata"]["creationTimestamp"]
            == stamp[1:-1].decode()
        )


def test_an_empty_list_is_a_whole_member():
    body = spliced([], STAMP, [])
    assert gzip.decompress(body) == HEAD + TAIL


def compressed_total(result: str) -> float:
    return REGISTRY.get_sample_value("kcms_metrics_pod_blocks_compressed_total", {"result": result}) or 0.0


def test_a_block_holding_the_placeholders_end_bytes_is_not_spliced_and_its_list_is_right():
    # orjson never writes raw control characters; a block that holds them anyway would be counted
    # as holding more timestamps than it does, and is refused
    for raw in (b"\x16", b"\x13", gzblocks.PLACEHOLDER):
        block = item("a", "b", 1) + b',{"x":"' + raw + b'"}' + item("c", "d", 2)
        before = compressed_total("placeholder_bytes")
        assert gzblocks.compress_block(block) is None
        assert compressed_total("placeholder_bytes") == before + 1
        blocks = [item("first", "x", 0), block]
        assert zlib.decompress(spliced(blocks, STAMP, [True, True]), 31) == expected(blocks, STAMP)
    before = compressed_total("no_stamp")
    assert gzblocks.compress_block(b"") is None
    assert gzblocks.compress_block(b',{"no":"timestamp"}') is None
    # more than a stored block's 65 535 bytes before the first timestamp
    assert gzblocks.compress_block(b',{"x":"' + b"y" * 70_000 + b'"}' + item("a", "b", 1)) is None
    assert compressed_total("no_stamp") == before + 3


def test_timestamps_further_apart_than_the_window_fail_the_check_and_their_list_is_right():
    # a pod whose labels hold more than deflate's 32 KiB window: the next timestamp cannot be coded
    # as a copy of the one before it, so the compressor codes it as literals, which would inflate to
    # the placeholder instead of the request's timestamp
    block = item("a", "x", 1) + item("b", "v" * 34_000, 2) + item("c", "y", 3)
    before = {r: compressed_total(r) for r in ("spliced", "check_failed")}
    assert gzblocks.compress_block(block) is None
    assert compressed_total("check_failed") == before["check_failed"] + 1
    small = item("a", "x", 1) + item("b", "v" * 20_000, 2) + item("c", "y", 3)
    assert gzblocks.compress_block(small) is not None
    assert compressed_total("spliced") == before["spliced"] + 1
    blocks = [item("first", "x", 0), block, small]
    body = spliced(blocks, STAMP, [True, True, True])
    assert gzip.decompress(body) == expected(blocks, STAMP)


def test_the_check_refuses_a_stream_with_a_placeholder_coded_as_literals():
    text = b"".join(item(f"p{i}", "web", i) for i in range(30)).replace(b"\0", gzblocks.PLACEHOLDER)
    first = text.index(gzblocks.PLACEHOLDER)
    after = first + gzblocks.STAMP_LENGTH
    lead, rest_text = text[:first], text[after:]
    with_dictionary = isal_zlib.compressobj(1, isal_zlib.DEFLATED, -15, zdict=text[:after])
    good = with_dictionary.compress(rest_text) + with_dictionary.flush(isal_zlib.Z_SYNC_FLUSH)
    assert gzblocks.splices(lead, good, rest_text)
    # without the dictionary the next placeholder can only be coded as literals
    without = isal_zlib.compressobj(1, isal_zlib.DEFLATED, -15)
    bad = without.compress(rest_text) + without.flush(isal_zlib.Z_SYNC_FLUSH)
    assert not gzblocks.splices(lead, bad, rest_text)


def test_the_crc_arithmetic_is_isals():
    rng = random.Random(3)
    for _ in range(200):
        a, b, n = rng.getrandbits(32), rng.getrandbits(32), rng.randint(0, 10**8)
        shift = gzblocks.shift_of(n)  # x^(8n)
        assert gzblocks._mulmod(shift, a) == isal_zlib.crc32_combine(a, 0, n)  # noqa: SLF001
        assert gzblocks._mulmod(shift, a) ^ b == isal_zlib.crc32_combine(a, b, n)  # noqa: SLF001
        assert gzblocks._mulmod(a, gzblocks._ONE) == a  # noqa: SLF001
    marks = bytes(gzblocks._STAMP_MARKS[b] for b in gzblocks.PLACEHOLDER[-4:])  # noqa: SLF001
    assert gzblocks._linear_crc(marks) == gzblocks._ONE  # noqa: SLF001


def test_a_stamp_of_another_length_is_refused():
    try:
        gzblocks.GzipList(b'"2026-11-28T08:30:00.5Z"')
    except ValueError as e:
        assert "24 bytes" in str(e)
    else:
        raise AssertionError("a 24-byte stamp was taken")


def test_the_c_splice_is_built_and_combines_as_isal(splicer):
    """CI compiles kcms/apis/metrics/_gzsplice.c: it must be there. Against crc32_combine, block by
    block, with CRCs at 0 and 2^32 - 1 and lengths up to 2^32 (a shift of every kind), it gives the
    same CRC, stamp positions and length, and appends each block's lead, the stamp and its rest."""
    from kcms.apis.metrics import _gzsplice

    assert (gzblocks._splice is not None) == (splicer == "c")  # noqa: SLF001
    rng = random.Random(11)
    edges = [0, 1, 0xFFFFFFFF, gzblocks._ONE]  # noqa: SLF001
    for _ in range(300):
        run = []
        for _ in range(rng.randint(0, 6)):
            n = rng.choice([0, 1, 22, rng.randint(0, 70_000), 2**32 - 1, 2**32])
            crc, stamps = rng.choice([*edges, rng.getrandbits(32)]), rng.choice([*edges, rng.getrandbits(32)])
            run.append(gzblocks.CompressedBlock(rng.randbytes(3), rng.randbytes(5), crc, stamps, n, gzblocks.shift_of(n)))
        crc, stamps = rng.choice([*edges, rng.getrandbits(32)]), rng.choice([*edges, rng.getrandbits(32)])
        want_crc, want_stamps, want_pieces = crc, stamps, [b"before"]
        for block in run:
            want_crc = isal_zlib.crc32_combine(want_crc, block.crc, block.length)
            want_stamps = isal_zlib.crc32_combine(want_stamps, block.stamps, block.length)
            want_pieces += [block.lead, STAMP, block.rest]
        pieces = [b"before"]
        got = _gzsplice.splice(run, pieces, STAMP, crc, stamps)
        assert got == (want_crc, want_stamps, sum(b.length for b in run))
        assert pieces == want_pieces


def test_the_c_splice_refuses_what_is_not_a_run_of_blocks():
    from kcms.apis.metrics import _gzsplice

    good = gzblocks.CompressedBlock(b"l", b"r", 1, 2, 3, gzblocks.shift_of(3))
    for run, error in [
        ([(b"l", b"r", 1, 2, 3)], TypeError),  # five fields
        ([good[:5] + (2**32,)], ValueError),  # a shift over 32 bits
        ([good._replace(crc=-1)], OverflowError),
        ([good._replace(stamps=1.5)], TypeError),
        ([good._replace(lead="l")], TypeError),
        ([good._replace(length=-1)], TypeError),
        ([good, None], TypeError),
    ]:
        with pytest.raises(error):
            _gzsplice.splice(run, [], STAMP, 0, 0)
    with pytest.raises(ValueError):
        _gzsplice.splice([good], [], STAMP, 2**32, 0)
    with pytest.raises(TypeError):
        _gzsplice.splice((good,), [], STAMP, 0, 0)  # a tuple, not a list
