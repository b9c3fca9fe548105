"""The store service's wire format: MessagePack (msgspec) bodies for writes, queries and exports.

Every structure is an array on the wire (``array_like``), so a sample costs its values and no field
names. Measured with ``bench/wire.py`` (a write of 10 000 samples with 2-3 label pairs, one core):
MessagePack encodes and decodes it in ~0.9 µs a sample against ~4.1-5.0 µs for orjson JSON of the
same tuples (which must also be turned back into tuples), and it is 26% smaller (107 against 144
bytes a sample; 20% smaller after gzip). msgspec's typed JSON decodes as fast but is as large as
orjson's, so MessagePack it is.

Request and response types (``POST`` paths of :mod:`kcms.store.service`):

* ``/store/v1/write``: :class:`Write` -> :class:`WriteAck`
* ``/store/v1/query/series``: :class:`SeriesQuery` -> ``list[SeriesRow]``
* ``/store/v1/query/resource``: :class:`ResourceQuery` -> :class:`ResourceRows`
* ``/store/v1/metrics``: (empty) -> ``list[tuple[str, str]]`` (resource, metric)
* ``/store/v1/export``: :class:`ExportRequest` -> :class:`Write` (raw points, for refill and repair)

Bounds on what a query or an export may name (:func:`request_problem`; a store answers 400 beyond
them): the body itself is at most :data:`MAX_QUERY_BYTES` (an export :data:`MAX_EXPORT_BYTES`)
after decompression, 413 beyond; at most :data:`MAX_MEMBERS` members (an export's ring hashes each
key once per member, ~1 µs each, on the event loop), ``replicas`` at most that, at most
:data:`MAX_NAMES` object names and :data:`MAX_EXPORT_KEYS` keys or metric names, a selector of at
most :data:`MAX_SELECTOR_LENGTH` characters. Writes are bounded by the store's
``--max-request-bytes`` and checked sample by sample.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from kcms.model import Labels, NodeBatch, ObjectRef, ResourcePoint

CONTENT_TYPE = "application/vnd.kcms.store.v1+msgpack"

# (metric, resource, namespace, name, labels, timestamp, value)
WireSample = tuple[str, str, str, str, tuple[tuple[str, str], ...], float, float]
# (start_time, timestamp, cpu_ns, memory)
WirePoint = tuple[float, float, int, int]


class WirePod(msgspec.Struct, array_like=True, frozen=True):
    namespace: str
    name: str
    containers: list[tuple[str, WirePoint]]


class WireNode(msgspec.Struct, array_like=True, frozen=True):
    """One kubelet scrape (a :class:`~kcms.model.NodeBatch` without its rejection counts)."""

    node: str
    point: WirePoint | None
    pods: list[WirePod]


class SampleBlock(msgspec.Struct, array_like=True):
    """Samples with every distinct string and label set sent once: a row is ``(metric, resource,
    namespace, name, labels, timestamp, value)`` where the first four index ``strings`` and the
    fifth ``labels``. Against one tuple of strings per sample (``Write.samples``) a 10 000-sample
    write is 30 instead of 107 bytes a sample and decodes in 0.14 instead of 0.68 µs a sample; building
    the tables costs the writer 0.27 instead of 0.07 µs (bench/wire.py). The store then hashes each
    shared string once per write instead of once per sample."""

    strings: list[str] = []
    labels: list[tuple[tuple[str, str], ...]] = []
    rows: list[tuple[int, int, int, int, int, float, float]] = []


class Write(msgspec.Struct, array_like=True):
    """A batch: resource scrapes, custom-metric samples, and packed series (exports and repairs:
    ``(metric, resource, namespace, name, labels, packed native-double (timestamp, value) pairs)``)."""

    nodes: list[WireNode] = []
    samples: list[WireSample] = []
    series: list[tuple[str, str, str, str, tuple[tuple[str, str], ...], bytes]] = []
    history: list[tuple[WireNode, WireNode]] = []  # (previous, last) readings of a node, merged
    block: SampleBlock | None = None  # more samples, in the compact form writers use


class WriteAck(msgspec.Struct, array_like=True):
    nodes: int  # node scrapes stored
    samples: int  # samples accepted (newer than their series' last point)
    refused: int  # samples refused as malformed


class SeriesQuery(msgspec.Struct, array_like=True, frozen=True):
    resource: str
    namespace: str
    names: list[str] | None
    metric: str
    selector: str = ""  # metric-label selector, Kubernetes syntax


# (name, labels, value, timestamp, window or None)
SeriesRow = tuple[str, tuple[tuple[str, str], ...], float, float, float | None]
# (timestamp, window, cpu_nanocores, memory)
WireUsage = tuple[float, float, int, int]


class ResourceQuery(msgspec.Struct, array_like=True, frozen=True):
    kind: str  # "nodes" or "pods"
    namespace: str | None = None  # pods: None = every namespace
    names: list[str] | None = None  # None = all


class ResourceRows(msgspec.Struct, array_like=True):
    nodes: list[tuple[str, WireUsage]] = []
    # (namespace, name, node, timestamp, window, [(container, usage)])
    pods: list[tuple[str, str, str, float, float, list[tuple[str, WireUsage]]]] = []


class ExportRequest(msgspec.Struct, array_like=True, frozen=True):
    """Raw data to copy. ``owner``/``members``/``replicas``: only the keys the ring gives ``owner``
    (``replicas`` 0: everything). ``keys``: only these objects ``(resource, namespace, name)``."""

    owner: str = ""
    members: list[str] = []
    replicas: int = 0
    previous_members: list[str] | None = None  # only keys ``owner`` did not own with these members
    keys: list[tuple[str, str, str]] | None = None
    metrics: list[str] | None = None  # series names to export (None: all)
    resources: bool = True  # include node readings
    series: bool = True  # include custom-metric series


# Bodies are bounded before they are decoded, counts after: decoding a body of tiny items costs
# ~10-25 times its size in objects for a moment, so the body bounds keep that to tens of MB.
MAX_QUERY_BYTES = 4 << 20  # a query body, after decompression (413 beyond): ~100 000 names
MAX_EXPORT_BYTES = 1 << 20  # an export request (refill and repair requests are a few KB)
MAX_MEMBERS = 256  # members or previous members of an export's ring
MAX_NAMES = 100_000  # object names in one query
MAX_EXPORT_KEYS = 16_384  # keys or metric names in one export (read repair sends at most 256 keys)
MAX_SELECTOR_LENGTH = 16 << 10


def request_problem(req: SeriesQuery | ResourceQuery | ExportRequest) -> str | None:
    """What makes a decoded query or export too large to serve (a 400's message), or None."""
    if isinstance(req, ExportRequest):
        for what, items, limit in (
            ("members", req.members, MAX_MEMBERS),
            ("previous members", req.previous_members, MAX_MEMBERS),
            ("keys", req.keys, MAX_EXPORT_KEYS),
            ("metrics", req.metrics, MAX_EXPORT_KEYS),
        ):
            if items is not None and len(items) > limit:
                return f"an export names {len(items)} {what}; at most {limit}"
        if not 0 <= req.replicas <= MAX_MEMBERS:
            return f"replicas must be 0 (all) to {MAX_MEMBERS}, not {req.replicas}"
        return None
    if req.names is not None and len(req.names) > MAX_NAMES:
        return f"a query names {len(req.names)} objects; at most {MAX_NAMES}"
    if isinstance(req, SeriesQuery) and len(req.selector) > MAX_SELECTOR_LENGTH:
        return f"a selector of {len(req.selector)} characters; at most {MAX_SELECTOR_LENGTH}"
    return None


_encoder = msgspec.msgpack.Encoder()
encode = _encoder.encode

_decoders: dict[type, msgspec.msgpack.Decoder] = {}


def decode(data: bytes, typ: type):
    """Decode ``data`` as ``typ``; ``msgspec.ValidationError``/``DecodeError`` (both ``ValueError``)
    on a malformed body."""
    dec = _decoders.get(typ)
    if dec is None:
        dec = _decoders[typ] = msgspec.msgpack.Decoder(typ)
    return dec.decode(data)


def _point(p: ResourcePoint) -> WirePoint:
    return (p.start_time, p.timestamp, p.cpu_ns, p.memory)


def node_to_wire(batch: NodeBatch) -> WireNode:
    return WireNode(
        batch.node,
        None if batch.node_point is None else _point(batch.node_point),
        [
            WirePod(ns, name, [(c, _point(p)) for c, p in containers.items()])
            for (ns, name), containers in batch.pods.items()
        ],
    )


def node_from_wire(node: WireNode) -> NodeBatch:
    point = None if node.point is None else ResourcePoint(*node.point)
    pods = {(pod.namespace, pod.name): {c: ResourcePoint(*p) for c, p in pod.containers} for pod in node.pods}
    return NodeBatch(node.node, point, pods)


def samples_to_wire(samples: Iterable[tuple[str, ObjectRef, Labels, float, float]]) -> list[WireSample]:
    return [(m, o.resource, o.namespace, o.name, labels, ts, v) for m, o, labels, ts, v in samples]


def block_of(samples: Iterable[WireSample]) -> SampleBlock:
    """``(metric, resource, namespace, name, labels, timestamp, value)`` samples as a block."""
    strings: dict[str, int] = {}  # insertion-ordered: its keys are the table
    labelsets: dict[tuple[tuple[str, str], ...], int] = {}
    s, ls = strings.setdefault, labelsets.setdefault
    rows = [
        (
            s(m, len(strings)),
            s(r, len(strings)),
            s(ns, len(strings)),
            s(n, len(strings)),
            ls(lb, len(labelsets)),
            t,
            v,
        )
        for m, r, ns, n, lb, t, v in samples
    ]
    return SampleBlock(list(strings), list(labelsets), rows)


def block_of_samples(samples: Iterable[tuple[str, ObjectRef, Labels, float, float]]) -> SampleBlock:
    r"""Samples about :class:`~kcms.model.ObjectRef`\ s as a block."""
    return block_of((m, o.resource, o.namespace, o.name, labels, ts, v) for m, o, labels, ts, v in samples)
