"""The gzip of the list of every pod, spliced from node blocks compressed once.

A gzipped list of every pod compressed its 57 MB of JSON on every request (150 000 pods: ~60 ms of
ISA-L in the event loop, and a copy of each block to stamp its ``creationTimestamp``s). Here each
node block (:mod:`.blocks`) is compressed once (while such lists come often, in the background)
and a list joins the compressed pieces: a gzip member may hold any number of deflate blocks, and a piece that ends with
a sync flush ends on a byte boundary, so pieces made apart follow one another.

What varies per request is the ``creationTimestamp`` (the request's time, as in metrics-server),
22 bytes (``"2026-11-28T08:30:00Z"``) in every item. A block is compressed with each timestamp
replaced by :data:`PLACEHOLDER` (22 bytes that JSON from orjson never holds: raw control
characters), the text up to its first placeholder left out, and that text plus the placeholder
given to the compressor as its preset dictionary. The list sends the left-out text and the real
timestamp as a *stored* deflate block (copied, not coded), then the compressed rest: the inflater's
window then holds the real timestamp exactly where the compressor assumed the placeholder, so every
later placeholder the compressor coded as a copy of an earlier one comes out as the real timestamp.
A placeholder byte coded as a literal would come out as itself, so each compressed block is checked
once, by inflating it with other bytes in the dictionary's place; a block that fails (one with two
timestamps further apart than deflate's 32 KiB window: a pod with that much in its labels) is
compressed per request, as before. ``kcms_metrics_pod_blocks_compressed_total`` counts blocks by
result.

The gzip trailer's CRC-32 covers the bytes as sent. CRC-32 is affine in the message, so a block's
CRC with placeholders and its *stamp positions* (the sum of x^(8d) over its placeholders, d the
bytes after each) are kept; a list combines them block by block (``crc32_combine``, linear), and
adds, once, the stamp positions of the whole list times the linear CRC of (timestamp XOR
placeholder).

Needs ISA-L's ``crc32_combine`` (the ``isal`` package, a dependency): without it,
:data:`AVAILABLE` is False and lists are compressed per request. Where ``_gzsplice.c`` is built, a
run of blocks is spliced in C: each block keeps x^(8 * its length) (:func:`shift_of`), so that
combining it is one product modulo the polynomial, not ``crc32_combine``'s powers of x each time.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeVar

from prometheus_client import Counter

_T = TypeVar("_T")

try:
    from isal import isal_zlib as _isal
except ImportError:  # pragma: no cover - platforms without isal wheels compress per request
    _isal = None
try:
    from kcms.apis.metrics._gzsplice import acyclic
    from kcms.apis.metrics._gzsplice import splice as _splice
except ImportError:  # no C compiler at install: GzipList.blocks combines in Python
    _splice = None

    def acyclic(obj: _T) -> _T:
        """``obj``: without ``_gzsplice``, node blocks stay tracked by the cyclic collector."""
        return obj


AVAILABLE = _isal is not None
STAMP_LENGTH = 22  # len(orjson.dumps("2026-11-28T08:30:00Z"))
# Bytes orjson never writes raw (it escapes control characters); all different, so no stretch of a
# placeholder can be coded as a copy of another stretch of the same placeholder.
PLACEHOLDER = bytes(range(1, 1 + STAMP_LENGTH))
# What a check inflates in the placeholder's place: differs from it at every position.
_PROBE = bytes(range(0x80, 0x80 + STAMP_LENGTH))
_LEVEL = 1  # ISA-L's level 1, as the per-request compression (kcms.apiserver.responses)
_POLY = 0xEDB88320  # CRC-32, bit-reflected
_ONE = 0x80000000  # the polynomial 1 in that representation
_ZEROS = bytes(STAMP_LENGTH)
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, mtime 0, OS unknown
_MAX_STORED = 0xFFFF

BLOCKS_COMPRESSED = Counter(
    "kcms_metrics_pod_blocks_compressed",
    "Node blocks compressed for splicing into gzipped lists of every pod, by result: spliced, or "
    "why not (no_stamp, placeholder_bytes, check_failed); a block not spliced is compressed by "
    "each list that sends it.",
    ["result"],
)
_SPLICED = BLOCKS_COMPRESSED.labels("spliced")
# no timestamp, or more than a stored block's 65 535 bytes before the first one
_NO_STAMP = BLOCKS_COMPRESSED.labels("no_stamp")
# the block holds bytes of the placeholder's end outside placeholders (orjson never writes one)
_PLACEHOLDER_BYTES = BLOCKS_COMPRESSED.labels("placeholder_bytes")
# the compressor coded a placeholder as literals (e.g. the one before it >32 KiB back)
_CHECK_FAILED = BLOCKS_COMPRESSED.labels("check_failed")


def _mulmod(a: int, b: int) -> int:
    """a * b modulo the CRC-32 polynomial, both bit-reflected (x^0 is the top bit)."""
    product = 0
    bit = _ONE
    while a:
        if a & bit:
            product ^= b
            a ^= bit
        bit >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return product


def _linear_crc(data: bytes) -> int:
    """The CRC-32 of ``data`` without its pre- and post-conditioning: linear in ``data``."""
    assert _isal is not None
    return _isal.crc32(data) ^ _isal.crc32(bytes(len(data)))


def _unit_bytes() -> bytes:
    """Four bytes whose linear CRC is the polynomial 1 (solved over GF(2): for four bytes the map is
    one-to-one), so that a message holding them where each placeholder ends has, as its linear CRC,
    the sum of x^(8d) over its placeholders."""
    columns = []  # (image of one input bit, that bit)
    for i in range(32):
        message = bytearray(4)
        message[i // 8] = 1 << (i % 8)
        columns.append((_linear_crc(bytes(message)), 1 << i))
    rows: list[tuple[int, int]] = []  # reduced: (image, combination of input bits), distinct pivots
    for image, bits in columns:
        for pivot_image, pivot_bits in rows:
            if image ^ pivot_image < image:  # the pivot's top bit is set in image
                image, bits = image ^ pivot_image, bits ^ pivot_bits
        if image:
            rows.append((image, bits))
            rows.sort(reverse=True)
    target, solution = _ONE, 0
    for image, bits in rows:
        if target ^ image < target:
            target, solution = target ^ image, solution ^ bits
    assert target == 0, "four bytes span every CRC"
    return solution.to_bytes(4, "little")


def _stamp_marks(unit: bytes) -> bytes:
    """The ``bytes.translate`` table that makes a text's stamp-position message: the placeholder's
    last four bytes become ``unit``, every other byte 0. ``unit`` holds no 0 (a check counts them)."""
    assert len(unit) == 4 and 0 not in unit
    table = bytearray(256)
    for byte, mark in zip(PLACEHOLDER[-4:], unit, strict=True):
        table[byte] = mark
    return bytes(table)


_STAMP_MARKS = _stamp_marks(_unit_bytes()) if AVAILABLE else b""
# The bytes _STAMP_MARKS marks: a block holding one raw would have a stamp where no placeholder is.
_END_BYTES = tuple(bytes((byte,)) for byte in PLACEHOLDER[-4:])


def stored(data: bytes, final: bool = False) -> bytes:
    """``data`` (at most 65 535 bytes) as one stored deflate block, starting on a byte boundary."""
    header = stored_header(len(data))
    return (b"\x01" + header[1:] if final else header) + data


class CompressedBlock(NamedTuple):
    """A node block compressed for splicing: ``lead`` is the stored block header and the text up to
    the first timestamp (the timestamp follows it on the wire), ``rest`` the compressed remainder,
    ``crc`` the CRC-32 and ``stamps`` the stamp positions of the whole text with placeholders,
    ``length`` its length, ``shift`` x^(8 * length) modulo the CRC-32 polynomial (what a CRC before
    the block is multiplied by to combine it with the block's). A tuple: the C splice
    (``_gzsplice.c``) reads its fields by position."""

    lead: bytes
    rest: bytes
    crc: int
    stamps: int
    length: int
    shift: int


def compress_block(text: bytes) -> CompressedBlock | None:
    """``text`` (a node block: items with a leading comma each, and a NUL byte where each
    ``creationTimestamp`` goes) compressed for :class:`GzipList`, or None when it cannot be spliced
    (it holds placeholder bytes of its own, has no timestamp within a stored block's reach, or its
    check failed): the list then compresses it. Each result is counted (:data:`BLOCKS_COMPRESSED`)."""
    assert _isal is not None
    # Four scans for one byte each: counting the marks' zeros and the text's NULs instead cost
    # 18 of a 30-pod block's 39 µs (measured in a loop).
    if any(byte in text for byte in _END_BYTES):
        _PLACEHOLDER_BYTES.inc()
        return None
    expanded = text.replace(b"\0", PLACEHOLDER)
    first = expanded.find(PLACEHOLDER)
    if first < 1 or first + STAMP_LENGTH > _MAX_STORED:
        _NO_STAMP.inc()
        return None
    after = first + STAMP_LENGTH
    compressor = _isal.compressobj(_LEVEL, _isal.DEFLATED, -15, zdict=expanded[:after])
    rest = compressor.compress(expanded[after:]) + compressor.flush(_isal.Z_SYNC_FLUSH)
    if not splices(expanded[:first], rest, expanded[after:]):
        _CHECK_FAILED.inc()
        return None
    _SPLICED.inc()
    crc = _isal.crc32(expanded)
    marks = expanded.translate(_STAMP_MARKS)
    stamps = _isal.crc32(marks) ^ _isal.crc32(bytes(len(marks)))
    length = len(expanded)
    return CompressedBlock(
        stored_header(first + STAMP_LENGTH) + expanded[:first], rest, crc, stamps, length, shift_of(length)
    )


def shift_of(length: int) -> int:
    """x^(8 * ``length``) modulo the CRC-32 polynomial: ``crc32_combine`` of the polynomial 1 with
    the CRC of ``length`` bytes of nothing."""
    assert _isal is not None
    return _isal.crc32_combine(_ONE, 0, length)


def splices(lead: bytes, rest: bytes, text: bytes) -> bool:
    """Whether ``rest``, ``text`` compressed with ``lead`` and :data:`PLACEHOLDER` as its dictionary,
    gives ``text`` with other bytes in each placeholder's place when other bytes are in the
    dictionary's: false when the compressor coded a placeholder byte as a literal."""
    assert _isal is not None
    inflater = _isal.decompressobj(-15, zdict=lead + _PROBE)
    return inflater.decompress(rest) == text.replace(PLACEHOLDER, _PROBE)


def stored_header(n: int) -> bytes:
    """The five bytes that open a stored, not final, deflate block of ``n`` bytes."""
    return bytes((0, n & 0xFF, n >> 8, ~n & 0xFF, (~n >> 8) & 0xFF))


class GzipList:
    """One gzip member built piece by piece: :meth:`text` (bytes compressed now), :meth:`blocks`
    (:class:`CompressedBlock` objects with this list's timestamp, appended to a list of pieces),
    :meth:`finish`. The pieces go out in the order made."""

    __slots__ = ("crc", "length", "stamp", "stamps", "_compressor", "_stamp_crc")

    def __init__(self, stamp: bytes) -> None:
        assert _isal is not None
        if len(stamp) != STAMP_LENGTH:
            raise ValueError(f"a timestamp of {len(stamp)} bytes, not {STAMP_LENGTH}")
        self.stamp = stamp
        self.crc = 0  # CRC-32 of the text so far, with placeholders where stamps go
        self.stamps = 0  # stamp positions of the text so far
        self.length = 0
        # compresses the text pieces in a row between two blocks as one stream (as fast as one
        # compression of the whole list; a compressor a piece took ~20 µs each)
        self._compressor: Any = None
        # linear CRC of (stamp XOR placeholder): the change one stamp makes, before its shift
        self._stamp_crc = _linear_crc(bytes(a ^ b for a, b in zip(stamp, PLACEHOLDER, strict=True)))

    def start(self, head: bytes) -> bytes:
        """The gzip header and (some of) ``head``."""
        return GZIP_HEADER + self.text(head)

    def text(self, data: bytes) -> bytes:
        """``data`` (final bytes: timestamps already in), compressed with the text pieces before it
        back to the last block (part of it may come out with the next piece)."""
        assert _isal is not None
        if not data:
            return b""
        self.crc = _isal.crc32(data, self.crc)
        self.stamps = _isal.crc32_combine(self.stamps, 0, len(data))
        self.length += len(data)
        if self._compressor is None:
            self._compressor = _isal.compressobj(_LEVEL, _isal.DEFLATED, -15)
        return self._compressor.compress(data)

    def _flush(self) -> bytes:
        """The rest of the text pieces in a row, ending on a byte boundary; the next ones are
        compressed apart (a copy must never reach back across a block the compressor did not see)."""
        compressor, self._compressor = self._compressor, None
        return b"" if compressor is None else compressor.flush(_isal.Z_SYNC_FLUSH)  # type: ignore[union-attr]

    def blocks(self, run: list[CompressedBlock], pieces: list[bytes]) -> None:
        """Each of ``run`` with this list's timestamp, in turn, appended to ``pieces``: its lead
        (after what text was pending), the stamp, its compressed rest. One call for the blocks
        between two text pieces (the list's usual case: every node spliced)."""
        if not run:
            return
        assert _isal is not None
        if self._compressor is not None:
            pieces.append(self._flush())
        if _splice is not None:
            # in C (_gzsplice.c), each block's combine is one product by its shift: at 5000 nodes,
            # NodeBlocks.items of a gzipped list 21.2 -> 12.6 ms (medians of 21, alternated)
            self.crc, self.stamps, length = _splice(run, pieces, self.stamp, self.crc, self.stamps)
            self.length += length
            return
        combine = _isal.crc32_combine
        crc, stamps, length, stamp = self.crc, self.stamps, self.length, self.stamp
        for block in run:
            n = block.length
            crc = combine(crc, block.crc, n)
            stamps = combine(stamps, block.stamps, n)
            length += n
            pieces += (block.lead, stamp, block.rest)
        self.crc, self.stamps, self.length = crc, stamps, length

    def finish(self, tail: bytes) -> bytes:
        """``tail`` as the final (stored) block, and the gzip trailer."""
        assert _isal is not None
        self.crc = _isal.crc32(tail, self.crc)
        self.stamps = _isal.crc32_combine(self.stamps, 0, len(tail))
        self.length += len(tail)
        crc = self.crc ^ _mulmod(self._stamp_crc, self.stamps)
        return (
            self._flush()
            + stored(tail, final=True)
            + crc.to_bytes(4, "little")
            + (self.length & 0xFFFFFFFF).to_bytes(4, "little")
        )
