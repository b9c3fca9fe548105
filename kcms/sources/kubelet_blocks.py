"""The kubelet's ``/metrics/resource`` layout, a family at a time: the fast paths of
:mod:`kcms.sources.kubelet_decode` (finding one family's block of lines, reading it whole as
columns when it is exactly in the kubelet's layout) and the exact seconds -> nanoseconds rule
every CPU counter goes through."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_EVEN, Context, Decimal
from itertools import repeat
from operator import mul, sub, truediv
from typing import Any

CPU_FAMILY = "container_cpu_usage_seconds_total"
MEM_FAMILY = "container_memory_working_set_bytes"
_NUMBER_CHARACTERS = "0123456789.eE+-"  # all a sample value may hold on the fast paths
NUM_CHARS = str.maketrans("", "", _NUMBER_CHARACTERS)  # for str.translate
NUM_BYTES = _NUMBER_CHARACTERS.encode()  # for bytes.translate(None, NUM_BYTES)
# 2**20 s: below it float arithmetic rounds to the exact nanosecond (see seconds_to_ns)
NS_FAST_LIMIT = 1048576.0
CTX = Context(prec=80, rounding=ROUND_HALF_EVEN)

# namespaces, pods, containers, values, times (CPU only), signature (the label values joined)
Columns = tuple[list[str], list[str], list[str], list[Any], Any, str]


def _exact_ns(text: str | bytes) -> int:
    """``text`` seconds in integer nanoseconds, evaluated in decimal (bytes: ASCII, as the body
    templates hand them over)."""
    return int(CTX.to_integral_value(CTX.scaleb(Decimal(text if type(text) is str else text.decode()), 9)))


def seconds_to_ns(text: str | bytes, value: float) -> int:
    """Seconds (decimal text and its float value, finite and >= 0) to integer nanoseconds, rounded half-even.

    Below 2**20 s the float product is within 0.12 ns of the exact decimal product, so when it is within
    0.25 of an integer that integer is the exactly rounded answer; otherwise the text is evaluated in decimal.
    """
    if value < NS_FAST_LIMIT:
        x = value * 1e9
        n = round(x)
        if abs(x - n) < 0.25:
            return n
    return _exact_ns(text)


def seconds_to_ns_each(texts: list[str] | list[bytes], values: list[float]) -> list[int]:
    """:func:`seconds_to_ns` of every value, the float test inlined.

    Used for a block where some counter is past 2**20 s (12 core-days: common for long-running
    containers; 38 % of the simulator's bodies) or not exact as a float product: only those values
    are read from their text in decimal, the others without a function call each (~0.3 us less
    per container, ~15 us for such a body).
    """
    out = []
    add = out.append
    for text, value in zip(texts, values, strict=True):
        if value < NS_FAST_LIMIT:
            x = value * 1e9
            n = round(x)
            if abs(x - n) < 0.25:
                add(n)
                continue
        add(_exact_ns(text))
    return out


def find_block(text: str, head: str, hint: int) -> tuple[int, int] | None:
    """The span from the first to the end of the last line that starts with ``head``.

    The first line is looked for from ``hint`` on (families usually come in a known order), then from the
    start. In well-formed exposition a family's samples are contiguous, so the span is exactly the
    family's lines; otherwise the fast path rejects the span and the general parser reads it.
    """
    if text.startswith(head, hint):
        s = hint
    else:
        s = text.find("\n" + head, hint)
        if s < 0 and hint:
            s = -1 if text.startswith(head) else text.find("\n" + head)
        s += 1
        if s == 0 and not text.startswith(head):
            return None
    last = text.rfind("\n" + head, s)
    last = s if last < s else last + 1
    e = text.find("\n", last)
    return s, (len(text) if e < 0 else e)


def fast_block(block: str, fam: str, now: float) -> Columns | None:
    """Decode a block of lines of one container family in the kubelet's exact layout, all or nothing.

    Every line must be ``fam{container="C",namespace="N",pod="P"} V[ T]`` with non-empty C/N/P free of
    quotes, backslashes and newlines, V a finite non-negative number, T (on all lines or none) a positive
    integer without leading zeros. Anything else returns None and the caller parses the block line by line.
    Duplicates are left to the caller. Only the CPU family's timestamps are converted (the others are unused).
    """
    if "\\" in block:
        return None
    segs = block.split('"')
    n = len(segs) // 6
    head = fam + "{container="
    if n == 0 or len(segs) != 6 * n + 1 or segs[0] != head:
        return None
    if segs[2::6].count(",namespace=") != n or segs[4::6].count(",pod=") != n:
        return None
    containers, namespaces, pods = segs[1::6], segs[3::6], segs[5::6]
    signature = '"'.join(segs[1::2])  # all label values in order; values contain no quote
    if "" in containers or "" in namespaces or "" in pods or "\n" in signature:
        return None
    # "} V T\nfam{container=} V T\n...} V T": tokens "}", then V, T, "fam{container=}" repeated
    tail = "".join(segs[6::6])
    if not tail.isascii() or tail.count("\n") != n - 1:
        return None
    flat = tail.split()
    spaces = tail.count(" ")
    if len(tail) != sum(map(len, flat)) + spaces + n - 1:
        return None  # some other blank (tab, CR, ...) is in there
    if spaces == 2 * n and len(flat) == 3 * n:
        vals = flat[1::3]
        tss = flat[2::3]
        heads = flat[3::3]
    elif spaces == n and len(flat) == 2 * n:
        vals = flat[1::2]
        tss = None
        heads = flat[2::2]
    else:
        return None
    if flat[0] != "}" or heads.count(head + "}") != n - 1:
        return None
    if "".join(vals).translate(NUM_CHARS):
        return None
    try:
        floats = list(map(float, vals))
    except ValueError:
        return None
    if not (0.0 <= min(floats) and max(floats) < math.inf):  # also false for NaN
        return None
    if tss is not None:
        if not "".join(tss).encode().isdigit() or max(map(len, tss)) > 18 or min(tss)[0] == "0":
            return None
    if fam == CPU_FAMILY:
        if max(floats) < NS_FAST_LIMIT:
            xs = list(map(mul, floats, repeat(1e9)))
            values: list[Any] = list(map(round, xs))
            if max(map(abs, map(sub, xs, values))) >= 0.25:
                values = seconds_to_ns_each(vals, floats)
        else:
            values = seconds_to_ns_each(vals, floats)
        times: Any = [now] * n if tss is None else list(map(truediv, map(float, tss), repeat(1000.0)))
    elif fam == MEM_FAMILY:
        values = list(map(round, floats))
        times = None
    else:
        values = floats
        times = None
    return namespaces, pods, containers, values, times, signature
