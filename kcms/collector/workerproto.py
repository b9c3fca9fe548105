"""Frames between `kcms standalone` and its scrape worker processes (``--scrape-workers``).

The parent writes to a worker's stdin, the worker to its stdout (its logs go to the inherited
stderr); nothing else connects them, so a worker listens on no socket and nothing outside the two
processes can reach it. A frame is a 4-byte big-endian length and a MessagePack body (msgspec), a
tagged union of array-like structs so each frame is its values and a short tag.

parent -> worker: :class:`Hello` (first, once), then :class:`Nodes` whenever the worker's shard of
the inventory changes and :class:`Token` whenever the kubelet bearer token changes.
worker -> parent: :class:`CycleStart`, one :class:`Batch` per node as soon as it is decoded,
:class:`CycleEnd` with the cycle's scrape results (for the parent's metrics).

A batch is a :class:`~kcms.model.NodeBatch`'s readings and refusals as one array-like struct
(:class:`Batch`), encoded and decoded by msgspec, typed and checked, in C (``bench/scrape_ipc.py``:
see its docstring for the figures). Nothing else of it is sent: not its decoder's columns, and not
its screening mark (``NodeBatch.screened``): a worker parses what kubelets send, so the parent's
store screens its batches as any from a wire (a hostile worker's mark let a reading days ahead
through, when batches were sent as dataclasses with every field).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import msgspec

from kcms.model import NodeBatch, PodKey, ResourcePoint

HEADER = struct.Struct(">I")
# A batch is bounded by the kubelet body it was decoded from (--kubelet-max-body-bytes, 10 MiB by
# default, the encoded batch is smaller than the text); a cycle summary of 10 000 nodes is ~0.5 MB.
MIN_MAX_FRAME = 16 << 20

# (name, [(address type, address)], kubelet port)
WireNodeInfo = tuple[str, list[tuple[str, str]], int]


class Hello(msgspec.Struct, array_like=True, tag="hello"):
    worker: int  # this worker's index, 0..workers-1 (for its log lines)
    workers: int
    kubelet: dict[str, Any]  # KubeletClientConfig fields but token_source
    dynamic_token: bool  # the token comes in Token frames (rotating); else kubelet["bearer_token"]
    token: str | None
    resolution: float
    timeout: float
    max_in_flight: int
    max_future_skew: float
    log_level: int
    max_frame: int  # the largest frame the parent accepts


class Nodes(msgspec.Struct, array_like=True, tag="nodes"):
    nodes: list[WireNodeInfo]


class Token(msgspec.Struct, array_like=True, tag="token"):
    token: str | None


class Batch(msgspec.Struct, array_like=True, tag="batch"):
    """One node's scrape (:meth:`of` a worker's :class:`NodeBatch`, :meth:`node_batch` in the parent)."""

    node: str
    node_point: ResourcePoint | None
    pods: dict[PodKey, dict[str, ResourcePoint]]
    rejected: dict[str, int]

    @classmethod
    def of(cls, batch: NodeBatch) -> Batch:
        return cls(batch.node, batch.node_point, batch.pods, batch.rejected)

    def node_batch(self) -> NodeBatch:
        return NodeBatch(self.node, self.node_point, self.pods, self.rejected)


class CycleStart(msgspec.Struct, array_like=True, tag="start"):
    started: float  # wall clock, seconds since the epoch


class CycleEnd(msgspec.Struct, array_like=True, tag="end"):
    started: float  # wall clock
    duration: float  # seconds
    nodes: int  # nodes scraped this cycle
    durations: list[float]  # seconds, one per successful scrape
    failed: list[tuple[str, str]]  # (node, reason) per failed scrape
    rejected: dict[str, int]  # samples dropped by the decoders, by reason
    dropped: int  # batches not sent because the parent had not read the pipe for too long


ToWorker = Hello | Nodes | Token
FromWorker = Batch | CycleStart | CycleEnd

_encoder = msgspec.msgpack.Encoder()


def frame(msg: ToWorker | FromWorker) -> bytes:
    """One length-prefixed frame."""
    buf = bytearray(HEADER.size)
    _encoder.encode_into(msg, buf, HEADER.size)
    HEADER.pack_into(buf, 0, len(buf) - HEADER.size)
    return bytes(buf)


class FrameError(ValueError):
    """A frame that is too large or does not decode: the peer is broken (or hostile)."""


class FrameReader:
    """Splits a byte stream into decoded frames; bounded: a length over ``max_frame`` is an error
    before anything of that size is buffered."""

    def __init__(self, typ: Any, max_frame: int) -> None:
        self._decoder = msgspec.msgpack.Decoder(typ)
        self._buf = bytearray()
        self.max_frame = max_frame

    def feed(self, data: bytes) -> Iterator[Any]:
        """The frames ``data`` completes, in order, each decoded as it is asked for (so that one is
        handled before the next exists); raises :class:`FrameError`. Consume it all before the
        next call."""
        buf = self._buf
        buf += data
        pos, end = 0, len(buf)
        view = memoryview(buf)
        try:
            while end - pos >= HEADER.size:
                (size,) = HEADER.unpack_from(buf, pos)
                if size > self.max_frame:
                    raise FrameError(f"a frame of {size} bytes; at most {self.max_frame}")
                if end - pos - HEADER.size < size:
                    break
                start = pos + HEADER.size
                try:
                    msg = self._decoder.decode(view[start : start + size])
                except (msgspec.DecodeError, msgspec.ValidationError) as e:
                    raise FrameError(f"a malformed frame: {e}") from None
                pos = start + size
                yield msg
        finally:
            view.release()
            if pos:
                del buf[:pos]

    @property
    def buffered(self) -> int:
        return len(self._buf)
