"""kcms/sources/_bodyscan.c on its own, against a reference written here in plain Python: random
token lists with random numbers (the kubelet's spellings and hostile ones) in random places, and
random edits of the constant text. What it reads must be the reference's to the bit; None must
mean exactly that the constant part differs; False (left to the Python reader) is always allowed,
but must be rare for ordinary numbers. Wrong arguments raise instead of reading out of bounds.
(tests/test_decode_template.py checks it end to end, against the full decoder.)"""

from __future__ import annotations

import math
import re
from array import array
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kcms.sources import _bodyscan

_NUMBER = re.compile(rb"[0-9.eE+-]+")
_STAMP = re.compile(rb"[1-9][0-9]{0,17}")
OTHER, CPU, CPU_TS, MEM, TS, NODE_CPU, NODE_TS, NODE_MEM = range(8)
_FLOAT_KINDS = (OTHER, CPU, MEM, NODE_CPU, NODE_MEM)


def join(tokens: list[bytes]) -> bytes:
    """The body whose tokens (``body.replace(b"\\n", b" \\n").split(b" ")``) are ``tokens``."""
    return b" ".join(tokens).replace(b" \n", b"\n")


def constant_part(tokens: list[bytes], positions: list[int]) -> bytes:
    """The body without the bytes of the tokens at ``positions``."""
    out, places = [], set(positions)
    for k, tok in enumerate(tokens):
        if k and not tok.startswith(b"\n"):
            out.append(b" ")
        if k not in places:
            out.append(tok)
    return b"".join(out)


def runs(tokens: list[bytes], positions: list[int]) -> list[int]:
    """The lengths of the constant runs of bytes before each token at ``positions`` and after the
    last (what ``_bodyscan.layout`` gives as uint16)."""
    offsets, at = [], 0
    for k, tok in enumerate(tokens):
        if k and not tok.startswith(b"\n"):
            at += 1
        offsets.append((at, at + len(tok)))
        at += len(tok)
    out, prev = [], 0
    for p in positions:
        out.append(offsets[p][0] - prev)
        prev = offsets[p][1]
    return [*out, at - prev]


def laid_out(body: bytes, ntok: int, positions: list[int]) -> tuple[bytes, int] | None:
    return _bodyscan.layout(body, ntok, array("I", positions).tobytes())


def reference(body: bytes, positions: list[int], kinds: list[int], ntok: int, want: bytes):
    """What ``_bodyscan.read`` must give, False for "refused" (the C reader may also leave a
    number it could read: only a value is compared)."""
    tokens = body.replace(b"\n", b" \n").split(b" ")
    if len(tokens) != ntok or constant_part(tokens, positions) != want:
        return None
    cpu, times, memory, node = [], [], [], [None, None, None]
    for p, kind in zip(positions, kinds, strict=True):
        tok = tokens[p]
        if kind in _FLOAT_KINDS:
            if not _NUMBER.fullmatch(tok):
                return False
            try:
                value = float(tok)
            except ValueError:
                return False
            if kind != OTHER and not 0.0 <= value < math.inf:
                return False
            if kind in (CPU, NODE_CPU):
                try:
                    ns = int((Decimal(tok.decode()) * 10**9).to_integral_value(ROUND_HALF_EVEN))
                except InvalidOperation:
                    return False
                (cpu.append(ns) if kind == CPU else node.__setitem__(0, ns))
            elif kind in (MEM, NODE_MEM):
                (memory.append(round(value)) if kind == MEM else node.__setitem__(2, round(value)))
        else:
            if not _STAMP.fullmatch(tok):
                return False
            if kind == CPU_TS:
                times.append(int(tok) / 1000.0)
            elif kind == NODE_TS:
                node[1] = int(tok) / 1000.0
    bounds = tuple(f(column) if column else None for column in (cpu, memory, times) for f in (min, max))
    return cpu, times, memory, (None if node[0] is None else node), bounds


_SPELLINGS = ["{!r}", "{:.6f}", "{:.7e}", "{:.9e}", "{:.17g}", "{:.0f}", "{:.3f}", "{:.12f}", "{:g}"]
_HOSTILE = [b"NaN", b"+Inf", b"-1", b"-0", b"+5", b"1e999", b"1e-999", b"1.2.3", b"", b"1_0", b"0x10",
            b"1e", b".", b"e5", b"\xff", b"1\r", b"5e-10", b"2.5e-09", b"1e17", b"1e+0001", b"1" * 70,
            b"0." + b"0" * 70 + b"1", b"999999999.9999999995", b"0123", b"1,5", b"9999999999.5",
            # ties (to the even byte) and 17-18 digits (a double's rounding must happen once)
            b"2.5", b"3.5", b"0.5", b"1234568.5", b"71817221.4999999927", b"28865562.5000000025"]  # fmt: skip

numbers = st.one_of(
    st.builds(
        lambda v, f: f.format(v).encode(),
        st.floats(min_value=0.0, max_value=1e12, allow_nan=False, allow_infinity=False),
        st.sampled_from(_SPELLINGS),
    ),
    st.integers(min_value=0, max_value=10**19).map(lambda i: str(i).encode()),
    st.sampled_from(_HOSTILE),
)
constants = st.one_of(
    st.sampled_from([b"#", b"HELP", b"\n#", b'\nname{a="b"}', b"}", b"", b"\n", b"x" * 40]),
    st.binary(max_size=12).map(lambda b: b.replace(b" ", b"_").replace(b"\n", b"_")),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_read_is_the_references_reading_to_the_bit(data) -> None:
    layout = data.draw(st.lists(st.tuples(st.booleans(), st.integers(0, 7)), min_size=1, max_size=40))
    tokens = [data.draw(constants) for _ in layout]
    tokens[0] = tokens[0].lstrip(b"\n")  # a body's first token never starts a line of its own
    positions = [k for k, (variable, _) in enumerate(layout) if variable]
    kinds = [kind for variable, kind in layout if variable]
    if NODE_CPU in kinds or NODE_MEM in kinds:  # the node's CPU and memory come together, once each
        kinds = [OTHER if k in (NODE_CPU, NODE_MEM, NODE_TS) else k for k in kinds]
        if len(kinds) >= 2:
            kinds[0], kinds[-1] = NODE_CPU, NODE_MEM
    for p in positions:  # a token that starts a line may be variable too (a kubelet's never is)
        tokens[p] = data.draw(st.sampled_from([b"1", b"1", b"1", b"1", b"\n1"]))
    tokens[0] = tokens[0].lstrip(b"\n")
    template = join(tokens)
    want = constant_part(tokens, positions)
    laid = laid_out(template, len(tokens), positions)
    # C takes only templates whose numbers do not start a line (the kubelet's): others are Python's
    if any(tokens[p].startswith(b"\n") for p in positions):
        assert laid is None
        return
    assert laid is not None
    segments, h = laid
    assert array("H", segments).tolist() == runs(tokens, positions)
    assert _bodyscan.read(template, segments, bytes(kinds), h) is not None  # its own constant part
    for p in positions:  # the next body: other numbers in the variable places
        tokens[p] = data.draw(numbers)
    if data.draw(st.booleans()) and tokens:  # and sometimes an edited constant
        at = data.draw(st.integers(0, len(tokens) - 1))
        tokens[at] = data.draw(constants)
    tokens[0] = tokens[0].lstrip(b"\n")
    body = join(tokens)
    assert body.replace(b"\n", b" \n").split(b" ") == tokens
    got = _bodyscan.read(body, segments, bytes(kinds), h)
    expected = reference(body, positions, kinds, len(tokens), want)
    assert (got is None) == (expected is None)
    if got is not None and got is not False:
        assert got == expected


def test_the_cut_is_the_same_wherever_the_delimiters_lie() -> None:
    """A newline starts the token after it; a blank does not. Cut both ways at every offset of a
    long body (C compares 16 bytes at a time, then walks the last few one by one; the hash reads
    8 and 16 bytes at a time, then the last 1 to 16)."""
    for pad in range(40):
        tokens = [b"a" * pad, b"7", b"8", b"\nb" + b"c" * pad, b"\n", b"9", b"\nc"]
        body = join(tokens)
        laid = laid_out(body, len(tokens), [1, 2, 5])
        assert laid is not None and array("H", laid[0]).tolist() == runs(tokens, [1, 2, 5]), pad
        assert _bodyscan.read(body, laid[0], bytes([MEM, MEM, MEM]), laid[1])[2] == [7, 8, 9], pad
        for at in range(len(body)):  # any one byte of the constant part changed: another one
            if body[at : at + 1] not in b"789":
                edited = body[:at] + (b"_" if body[at : at + 1] != b"_" else b"-") + body[at + 1 :]
                assert _bodyscan.read(edited, laid[0], bytes([MEM, MEM, MEM]), laid[1]) is None, (pad, at)
        # a variable token that starts a line (never a kubelet's number): the Python reader's
        tokens[2] = b"\n8"
        assert laid_out(join(tokens), len(tokens), [1, 2, 5]) is None, pad
        assert _bodyscan.read(join(tokens), laid[0], bytes([MEM, MEM, MEM]), laid[1]) is None, pad


def test_ordinary_numbers_are_read_in_c_not_left_to_python() -> None:
    """The kubelet's spellings (exponents from 1e6 up, timestamps in ms) are read by C."""
    tokens = [b"#HELP", b"\ncontainer_cpu_usage_seconds_total{}", b"7.461718043847824e+06", b"1795810156113",
              b"\ncontainer_memory_working_set_bytes{}", b"5.3180416e+08", b"1795810156113",
              b"\nnode_cpu_usage_seconds_total", b"2858.731628547", b"1795810156114",
              b"\nnode_memory_working_set_bytes", b"283717632", b"1795810156114", b"\n"]  # fmt: skip
    kinds = bytes([CPU, CPU_TS, MEM, TS, NODE_CPU, NODE_TS, NODE_MEM, TS])
    body = join(tokens)
    segments, h = laid_out(body, len(tokens), [2, 3, 5, 6, 8, 9, 11, 12])
    assert _bodyscan.read(body, segments, kinds, h) == (
        [7461718043847824],
        [1795810156.113],
        [531804160],
        [2858731628547, 1795810156.114, 283717632],
        (7461718043847824, 7461718043847824, 531804160, 531804160, 1795810156.113, 1795810156.113),
    )


def test_wrong_arguments_raise_and_misfits_are_none() -> None:
    tokens = [b"a", b"1", b"\nb", b"2", b"c"]
    body = join(tokens)
    segments, h = laid_out(body, 5, [1, 3])
    assert _bodyscan.read(body, segments, bytes([MEM, MEM]), h) == ([], [], [1, 2], None, (None, None, 1, 2, None, None))
    for bad in ((body, segments[:-2], b"\x03\x03", h), (body, segments, b"\x03", h),
                (body, segments, b"\x03\x09", h), ("text", segments, b"\x03\x03", h),
                (body, segments, b"\x05\x03", h), (body, segments + b"\x00", b"\x03\x03", h),
                (body, segments, b"\x03\x03", -1)):  # fmt: skip
        with pytest.raises((ValueError, TypeError, OverflowError)):
            _bodyscan.read(*bad)
    assert _bodyscan.read(body + b" 1", segments, bytes([MEM, MEM]), h) is None  # a token more
    assert _bodyscan.read(body[:-1], segments, bytes([MEM, MEM]), h) is None  # a byte less
    assert _bodyscan.read(body.replace(b"c", b"d"), segments, bytes([MEM, MEM]), h) is None
    assert _bodyscan.read(body, segments, bytes([MEM, MEM]), h ^ 1) is None  # another template's hash
    for runs_ in ([60000, 0, 0], [2, 60000, 1], [0, 0, 0], [65535] * 3):  # lengths past the body: no read
        assert _bodyscan.read(body, array("H", runs_).tobytes(), bytes([MEM, MEM]), h) is None
    assert _bodyscan.read(body.replace(b"2", b"NaN"), segments, bytes([MEM, MEM]), h) is False
    assert laid_out(body, 4, [1, 3]) is None  # not that many tokens
    assert laid_out(body, 6, [1, 3]) is None
    assert laid_out(body, 5, [3, 1]) is None  # not ascending
    assert laid_out(body, 5, [1, 9]) is None  # past the end
    first = laid_out(body, 5, [0, 3])  # the first token, variable too
    assert first is not None and _bodyscan.read(b"7" + body[1:], first[0], bytes([MEM, MEM]), first[1])[2] == [7, 2]
    assert laid_out(body, 5, [1, 2]) is None  # "\nb" starts a line
    assert laid_out(join([b"x", b"", b"\n1", b"y"]), 4, [2]) is None  # so does "\n1", after a blank
    long = join([b"a", b"1", b"b" * 70000, b"2"])
    assert laid_out(long, 4, [1, 3]) is None  # a run of 64 KiB or more
    with pytest.raises(ValueError):
        _bodyscan.layout(body, 5, b"\x01\x00\x00")
    empty = laid_out(b"", 1, [])
    assert _bodyscan.read(b"", empty[0], b"", empty[1]) == ([], [], [], None, (None,) * 6)
    assert _bodyscan.read(b"x", empty[0], b"", empty[1]) is None


_ORDINARY = [b"2.5", b"3.5", b"0.5", b"1234568.5", b"71817221.4999999927", b"28865562.5000000025", b"0",
             b"5.3180416e+08", b"7.461718043847824e+06", b"1.5e-09", b"2.5e-09", b"0.0000000005", b"1e9",
             b"999999999.9999999995", b"2858.731628547", b"283717632", b"1795810156113"]  # fmt: skip


@pytest.mark.parametrize("kind", [OTHER, CPU, CPU_TS, MEM, TS])
@pytest.mark.parametrize("token", _ORDINARY + _HOSTILE)
def test_each_number_alone_reads_as_the_reference(token, kind) -> None:
    """Every spelling in every role, one at a time (no other refusal in the body to hide it);
    the ordinary ones are read by C, not left to Python."""
    tokens = [b"x", token, b"\ny"]
    segments, h = laid_out(join([b"x", b"1", b"\ny"]), 3, [1])
    got = _bodyscan.read(join(tokens), segments, bytes([kind]), h)
    expected = reference(join(tokens), [1], [kind], 3, constant_part(tokens, [1]))
    if got is not False:
        assert got == expected
    if token in _ORDINARY and kind in (CPU_TS, TS):
        ordinary = token.isdigit() and token != b"0"
    else:  # CPU counters from 1e9 s (1e18 ns) on are left to Python
        ordinary = token in _ORDINARY and (kind != CPU or float(token) < 1e9)
    if ordinary:
        assert got is not False
