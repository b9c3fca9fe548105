"""kcms/sources/_bodyscan.c on its own, against a reference written here in plain Python: random
token lists with random numbers (the kubelet's spellings and hostile ones) in random places, and
random edits of the constant text. What it reads must be the reference's to the bit; None must
mean the constant part differs; False (left to the Python reader) is always allowed, but must be
rare for ordinary numbers. Wrong arguments raise instead of reading out of bounds.
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
        tokens[p] = data.draw(st.sampled_from([b"1", b"1", b"\n1"]))
    tokens[0] = tokens[0].lstrip(b"\n")
    template = join(tokens)
    cpos = array("I", positions).tobytes()
    want = constant_part(tokens, positions)
    h = _bodyscan.constant_hash(template, len(tokens), cpos)
    assert h == hash(want)
    for p in positions:  # the next body: other numbers in the variable places
        tokens[p] = data.draw(numbers)
    if data.draw(st.booleans()) and tokens:  # and sometimes an edited constant
        at = data.draw(st.integers(0, len(tokens) - 1))
        tokens[at] = data.draw(constants)
    tokens[0] = tokens[0].lstrip(b"\n")
    body = join(tokens)
    assert body.replace(b"\n", b" \n").split(b" ") == tokens
    got = _bodyscan.read(body, len(tokens), cpos, bytes(kinds), h)
    expected = reference(body, positions, kinds, len(tokens), want)
    if got is None:
        assert expected is None
    elif got is not False:
        assert got == expected


def test_a_token_that_starts_a_line_is_cut_with_its_newline_wherever_it_lies() -> None:
    """A newline starts the token after it; a blank does not. Cut both ways at every offset of a
    long body (C compares 16 bytes at a time, then walks the last few one by one)."""
    for pad in range(40):
        tokens = [b"a" * pad, b"7", b"\n8", b"b", b"\n", b"9", b"\nc"]
        positions = [1, 2, 5]
        cpos = array("I", positions).tobytes()
        body = join(tokens)
        h = _bodyscan.constant_hash(body, len(tokens), cpos)
        assert h == hash(constant_part(tokens, positions)), pad
        # "\n8" is a variable token with its newline, not a number: left to the Python reader
        assert _bodyscan.read(body, len(tokens), cpos, bytes([MEM, MEM, MEM]), h) is False, pad
        tokens[2] = b"8"  # the same place without the newline: another constant part
        assert _bodyscan.constant_hash(join(tokens), len(tokens), cpos) != h, pad


def test_ordinary_numbers_are_read_in_c_not_left_to_python() -> None:
    """The kubelet's spellings (exponents from 1e6 up, timestamps in ms) are read by C."""
    tokens = [b"#HELP", b"\ncontainer_cpu_usage_seconds_total{}", b"7.461718043847824e+06", b"1795810156113",
              b"\ncontainer_memory_working_set_bytes{}", b"5.3180416e+08", b"1795810156113",
              b"\nnode_cpu_usage_seconds_total", b"2858.731628547", b"1795810156114",
              b"\nnode_memory_working_set_bytes", b"283717632", b"1795810156114", b"\n"]  # fmt: skip
    positions = [2, 3, 5, 6, 8, 9, 11, 12]
    kinds = bytes([CPU, CPU_TS, MEM, TS, NODE_CPU, NODE_TS, NODE_MEM, TS])
    body = join(tokens)
    cpos = array("I", positions).tobytes()
    got = _bodyscan.read(body, len(tokens), cpos, kinds, _bodyscan.constant_hash(body, len(tokens), cpos))
    assert got == (
        [7461718043847824],
        [1795810156.113],
        [531804160],
        [2858731628547, 1795810156.114, 283717632],
        (7461718043847824, 7461718043847824, 531804160, 531804160, 1795810156.113, 1795810156.113),
    )


def test_wrong_arguments_raise_and_misfits_are_none() -> None:
    tokens = [b"a", b"1", b"\nb", b"2", b"c"]
    body, positions = join(tokens), array("I", [1, 3]).tobytes()
    h = _bodyscan.constant_hash(body, 5, positions)
    assert _bodyscan.read(body, 5, positions, bytes([MEM, MEM]), h) == (
        [], [], [1, 2], None, (None, None, 1, 2, None, None)
    )
    for bad in ((body, 5, positions[:-1], b"\x03\x03", h), (body, 5, positions, b"\x03", h),
                (body, 5, positions, b"\x03\x09", h), ("text", 5, positions, b"\x03\x03", h),
                (body, 5, positions, b"\x05\x03", h)):  # fmt: skip
        with pytest.raises((ValueError, TypeError)):
            _bodyscan.read(*bad)
    assert _bodyscan.read(body + b" 1", 5, positions, bytes([MEM, MEM]), h) is None  # a token more
    assert _bodyscan.read(body, 4, positions, bytes([MEM, MEM]), h) is None
    assert (
        _bodyscan.read(body, 5, array("I", [3, 1]).tobytes(), bytes([MEM, MEM]), h) is None
    )  # not ascending
    assert _bodyscan.read(body, 5, array("I", [1, 9]).tobytes(), bytes([MEM, MEM]), h) is None  # past the end
    assert _bodyscan.read(body.replace(b"c", b"d"), 5, positions, bytes([MEM, MEM]), h) is None
    assert _bodyscan.read(body.replace(b"2", b"NaN"), 5, positions, bytes([MEM, MEM]), h) is False
    assert _bodyscan.constant_hash(body, 6, positions) is None
    assert _bodyscan.read(b"", 1, b"", b"", _bodyscan.constant_hash(b"", 1, b"")) == ([], [], [], None, (None,) * 6)


_ORDINARY = [b"2.5", b"3.5", b"0.5", b"1234568.5", b"71817221.4999999927", b"28865562.5000000025", b"0",
             b"5.3180416e+08", b"7.461718043847824e+06", b"1.5e-09", b"2.5e-09", b"0.0000000005", b"1e9",
             b"999999999.9999999995", b"2858.731628547", b"283717632", b"1795810156113"]  # fmt: skip


@pytest.mark.parametrize("kind", [OTHER, CPU, CPU_TS, MEM, TS])
@pytest.mark.parametrize("token", _ORDINARY + _HOSTILE)
def test_each_number_alone_reads_as_the_reference(token, kind) -> None:
    """Every spelling in every role, one at a time (no other refusal in the body to hide it);
    the ordinary ones are read by C, not left to Python."""
    tokens = [b"x", token, b"\ny"]
    cpos = array("I", [1]).tobytes()
    h = _bodyscan.constant_hash(join(tokens), 3, cpos)
    got = _bodyscan.read(join(tokens), 3, cpos, bytes([kind]), h)
    expected = reference(join(tokens), [1], [kind], 3, constant_part(tokens, [1]))
    if got is not False:
        assert got == expected
    if token in _ORDINARY and kind in (CPU_TS, TS):
        ordinary = token.isdigit() and token != b"0"
    else:  # CPU counters from 1e9 s (1e18 ns) on are left to Python
        ordinary = token in _ORDINARY and (kind != CPU or float(token) < 1e9)
    if ordinary:
        assert got is not False
