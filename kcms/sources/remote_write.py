"""Decoding of Prometheus remote write 1.0 bodies: snappy block-compressed protobuf ``WriteRequest``.

The wire format (https://prometheus.io/docs/concepts/remote_write_spec/, proto in
prometheus/prompb/{remote,types}.proto)::

    WriteRequest { repeated TimeSeries timeseries = 1; repeated MetricMetadata metadata = 3; }
    TimeSeries   { repeated Label labels = 1; repeated Sample samples = 2;
                   repeated Exemplar exemplars = 3; repeated Histogram histograms = 4; }
    Label        { string name = 1; string value = 2; }
    Sample       { double value = 1; int64 timestamp = 2; }   // timestamp: milliseconds since the epoch

The message types are built here in code with ``descriptor_pb2`` (no protoc, no generated file) and
parsed by the ``protobuf`` runtime (upb, C). ``metadata`` is not declared, so it is skipped as an
unknown field. ``exemplars`` and ``histograms`` are declared as ``bytes``: histograms are counted
without being decoded (native histograms are not stored by KCMS), exemplars are ignored. Labels are kept as
serialized ``Label`` messages (see :func:`_build_types`). No hand-written decoder: the upb parser
takes ~0.3 ms for a 2 000-series request, less than the Python work of reading its fields.

Bounds, all checked before the expensive step they protect:

* the compressed body (``max_compressed_bytes``; the caller reads at most that many bytes);
* the decompressed size, read from the snappy block's length header (a varint) *before*
  decompressing, so a small body declaring gigabytes (a "snappy bomb") costs nothing: over
  ``max_decompressed_bytes`` is :class:`TooLarge`, more than the body could hold (snappy expands at
  most 64/3 times) is :class:`Malformed`; the output buffer is allocated at exactly the declared
  size and decompression into it fails on a body that does not fill it exactly;
* the number of series and of samples in the request (the whole request: :class:`TooLarge`);
* per series (counted refusals, by the caller): labels per series, label name and value sizes,
  metric name, samples per series, timestamps beyond :func:`kcms.limits.future_limit`.

:class:`Malformed` (HTTP 400, not retried by senders) and :class:`TooLarge` (HTTP 413) are the only
exceptions :func:`decode` raises.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

# cramjam and google.protobuf are imported on the first request, not with the module: every
# `kcms standalone` and `kcms server` installs this endpoint, and most never receive a remote
# write; the two cost ~6 MB of RSS (about 0.12 MB a node at 50 nodes).

__all__ = [
    "Malformed",
    "RemoteWriteError",
    "LabelKey",
    "RawSeries",
    "TooLarge",
    "WriteLimits",
    "decode",
    "decompress",
    "encode",
    "parse_labels",
    "snappy_length",
]


@dataclass(slots=True)
class WriteLimits:
    """What one remote-write request may hold (defaults fit Prometheus's and vmagent's batches)."""

    max_compressed_bytes: int = 8 << 20  # body as received; more: 413
    max_decompressed_bytes: int = 64 << 20  # the snappy header's declared size; more: 413
    # samples (series) in one request; more: 413. Decoding runs on the event loop: 100 000 samples
    # take ~0.17 s of it (bench/remote_write.py: ~600 000 samples/s); Prometheus sends a few thousand
    # per request (max_samples_per_send), vmagent 10 000 (-remoteWrite.maxRowsPerBlock)
    max_series: int = 100_000
    max_samples: int = 100_000
    max_samples_per_series: int = 10_000  # more: that series' samples refused (too_many_samples)
    max_labels: int = 32  # labels of one series, __name__ included; more: that series refused


class RemoteWriteError(ValueError):
    """A request refused whole: ``code`` is the HTTP status, ``reason`` a bounded metric label."""

    code = 400
    reason = "malformed"


class Malformed(RemoteWriteError):
    """Not a snappy-compressed ``WriteRequest`` (400: the sender must not retry it)."""

    code = 400

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class TooLarge(RemoteWriteError):
    """Over a size bound (413)."""

    code = 413

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# ---- the message types, built in code -----------------------------------------------------------


@cache
def _types() -> tuple[Any, Any, type[Exception]]:
    """``(WriteRequest, Label, DecodeError)``, built on first use."""
    from google.protobuf.message import DecodeError

    write_request, label = _build_types()
    return write_request, label, DecodeError


def __getattr__(name: str) -> Any:
    """``WriteRequest`` and ``Label``, the message types (not in ``__all__``: made when first
    asked for)."""
    if name == "WriteRequest":
        return _types()[0]
    if name == "Label":
        return _types()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _build_types() -> tuple[type, type]:
    """``(WriteRequest, Label)``. ``TimeSeries.labels`` is declared ``repeated bytes`` in the
    request's type: each label arrives as its serialized ``Label`` message, so a series' label set is
    a tuple of ``bytes`` -- hashable, the key under which the API caches what the series is bound to
    -- and is decoded (:func:`parse_labels`) only for a series not seen before. Measured on 2 000
    series of 5 labels and one sample: 0.67 us a series to get labels and samples this way, against
    5.5 us with ``Label`` messages whose ``name`` and ``value`` are read one by one."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    f = descriptor_pb2.FileDescriptorProto(
        name="kcms/remote_write.proto", package="kcms.prometheus", syntax="proto3"
    )
    T = descriptor_pb2.FieldDescriptorProto  # noqa: N806 - the protobuf type, read like the .proto

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = f.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            fd = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                fd.type_name = type_name

    opt, rep = T.LABEL_OPTIONAL, T.LABEL_REPEATED
    message("Label", ("name", 1, T.TYPE_STRING, opt, ""), ("value", 2, T.TYPE_STRING, opt, ""))
    message("Sample", ("value", 1, T.TYPE_DOUBLE, opt, ""), ("timestamp", 2, T.TYPE_INT64, opt, ""))
    message(
        "TimeSeries",
        ("labels", 1, T.TYPE_BYTES, rep, ""),  # serialized Label messages (see above)
        ("samples", 2, T.TYPE_MESSAGE, rep, ".kcms.prometheus.Sample"),
        ("exemplars", 3, T.TYPE_BYTES, rep, ""),  # counted, not decoded
        ("histograms", 4, T.TYPE_BYTES, rep, ""),  # counted, not decoded
    )
    message("WriteRequest", ("timeseries", 1, T.TYPE_MESSAGE, rep, ".kcms.prometheus.TimeSeries"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    get = message_factory.GetMessageClass
    return (
        get(pool.FindMessageTypeByName("kcms.prometheus.WriteRequest")),
        get(pool.FindMessageTypeByName("kcms.prometheus.Label")),
    )


LabelKey = tuple[bytes, ...]  # a series' labels as sent: serialized Label messages
# One decoded series: (label key, samples as (timestamp_ms, value), native histogram samples) -- a
# plain tuple, not a dataclass: built once per series per request on the ingestion path.
RawSeries = tuple[LabelKey, list[tuple[int, float]], int]


def parse_labels(key: LabelKey) -> list[tuple[str, str]]:
    """The ``(name, value)`` pairs of a label key; ``ValueError`` for a label that is not a valid
    ``Label`` message (bad wire format, invalid UTF-8)."""
    out = []
    _, label_type, decode_error = _types()
    label = label_type()
    for raw in key:
        try:
            label.ParseFromString(raw)
        except (decode_error, RuntimeError) as e:
            raise ValueError(f"malformed label: {str(e)[:120]}") from None
        out.append((label.name, label.value))
    return out


# ---- snappy --------------------------------------------------------------------------------------


def snappy_length(body: bytes | bytearray | memoryview) -> int:
    """The decompressed length a snappy block declares (its leading varint, at most 32 bits);
    :class:`Malformed` when the header is truncated or too long."""
    result = shift = 0
    for i in range(min(len(body), 5)):
        byte = body[i]
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if result >= 1 << 32:
                break
            return result
        shift += 7
    raise Malformed("malformed_snappy", "the body does not start with a snappy block length")


def _varint_size(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


def decompress(body: bytes | bytearray | memoryview, limits: WriteLimits) -> bytearray:
    """Decompress a snappy block, refusing one that declares more than ``max_decompressed_bytes``
    before allocating or decompressing anything."""
    declared = snappy_length(body)
    if declared > limits.max_decompressed_bytes:
        raise TooLarge(
            "decompressed_too_large",
            f"the body declares {declared} bytes decompressed; at most {limits.max_decompressed_bytes} are accepted",
        )
    # Snappy's densest element is a 3-byte copy of 64 bytes: a block of n bytes (after the header)
    # holds at most n * 64 / 3. A small body declaring more (a bomb within the size limit) is refused
    # before the output buffer is allocated: memory per request stays ~21x the body read.
    payload = len(body) - _varint_size(declared)
    if declared * 3 > payload * 64:
        raise Malformed(
            "malformed_snappy",
            f"a snappy block of {len(body)} bytes cannot hold the {declared} bytes it declares",
        )
    import cramjam

    out = bytearray(declared)
    try:
        written = cramjam.snappy.decompress_raw_into(bytes(body), out)
    except Exception as e:  # noqa: BLE001 - cramjam raises its own DecompressionError (and ValueError)
        raise Malformed("malformed_snappy", f"not a valid snappy block: {str(e)[:200]}") from None
    if written != declared:
        raise Malformed("malformed_snappy", f"the snappy block declares {declared} bytes but holds {written}")
    return out


# ---- the request ---------------------------------------------------------------------------------


def decode(body: bytes | bytearray | memoryview, limits: WriteLimits | None = None) -> list[RawSeries]:
    """A remote-write body (snappy-compressed ``WriteRequest``) as :data:`RawSeries`; raises
    :class:`Malformed` or :class:`TooLarge` for a request refused whole."""
    lim = limits or WriteLimits()
    if len(body) > lim.max_compressed_bytes:
        raise TooLarge(
            "body_too_large", f"a body of {len(body)} bytes; at most {lim.max_compressed_bytes} are accepted"
        )
    raw = decompress(body, lim)
    write_request, _, decode_error = _types()
    req = write_request()
    try:
        req.ParseFromString(bytes(raw))
    except (decode_error, RuntimeError, ValueError) as e:  # upb: DecodeError; invalid UTF-8 strings too
        raise Malformed("malformed_protobuf", f"not a prometheus.WriteRequest: {str(e)[:200]}") from None
    timeseries = req.timeseries
    if len(timeseries) > lim.max_series:
        raise TooLarge(
            "too_many_series",
            f"{len(timeseries)} series in one request; at most {lim.max_series} are accepted",
        )
    # One pass, the cheapest reads first (figures: 2 000 series of 5 labels and one sample, per
    # series): labels as bytes (0.5 us); one sample read by index (0.4 us, against 0.7 us for a loop
    # over one); the histogram count only for a series without samples -- Prometheus sends a series'
    # floats and its native histograms apart -- (a length read costs 0.17 us); exemplars not at all.
    out: list[RawSeries] = []
    append = out.append
    total = 0
    max_samples = lim.max_samples
    for ts in timeseries:
        samples = ts.samples
        n = len(samples)
        total += n
        if total > max_samples:  # counted as read: at most max_samples become Python objects
            raise TooLarge(
                "too_many_samples",
                f"more than {max_samples} samples in one request ({total} in its first {len(out) + 1} series)",
            )
        if n == 1:
            s = samples[0]
            append((tuple(ts.labels), [(s.timestamp, s.value)], 0))
        elif n:
            append((tuple(ts.labels), [(s.timestamp, s.value) for s in samples], 0))
        else:
            append((tuple(ts.labels), [], len(ts.histograms)))
    return out


def encode(series: Iterable[tuple[Sequence[tuple[str, str]], Sequence[tuple[int, float]]]]) -> bytes:
    """The snappy-compressed ``WriteRequest`` of ``(labels, samples)`` pairs, samples as
    ``(timestamp_ms, value)`` (for tests, benchmarks and demos)."""
    import cramjam

    write_request, label_type, _ = _types()
    req = write_request()
    label = label_type()
    for labels, samples in series:
        ts = req.timeseries.add()
        for name, value in labels:
            label.name, label.value = name, value
            ts.labels.append(label.SerializeToString())
        for t, v in samples:
            ts.samples.add(timestamp=t, value=v)
    return bytes(cramjam.snappy.compress_raw(req.SerializeToString()))
