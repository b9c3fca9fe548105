"""Convert Kubernetes Node and Pod objects to the slim kcms.model dataclasses.

Two ways in, one set of rules:

- ``node_from_json`` / ``pod_from_json``: from decoded JSON dicts (static inventory files, tests);
- ``NODE_WIRE``, ``POD_WIRE``, ``POD_META_WIRE`` (`WireCodec`): straight from the bytes of a LIST
  page or a WATCH event line. msgspec decodes them into typed Structs that name only the fields kept,
  so everything else (managedFields, spec.containers, status.conditions, a node's image list: ~95 %
  of a pod's bytes) is skipped by the parser without becoming Python objects: ~5 µs per 8 KiB pod,
  against ~150-400 µs for orjson dicts then conversion (bench/inventory_list.py).
  ``POD_META_WIRE`` reads ``PartialObjectMetadataList`` pages (metadata only, as metrics-server lists
  pods): no ``spec.nodeName``, and the phase is the one the field selector asked for.

Objects are checked one by one: one that does not decode (wrong types) or exceeds the bounds the
API server itself enforces (name and namespace lengths, label key and value lengths; plus
``MAX_LABELS`` labels) is skipped with a reason (``invalid`` / ``oversized``), and only it: a page is
decoded at once, and only when that fails item by item.

Memory matters (150 000 pods): repeated strings (label keys and values, namespaces, node names,
phases) are interned, identical label maps are shared between objects (label dicts returned here
must be treated as read-only), and nothing is kept that nobody reads (``creation_timestamp`` is
left empty).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import msgspec

from kcms.model import NodeInfo, PodInfo

_intern = sys.intern
_EMPTY: dict[str, str] = {}
_LABEL_CACHE_MAX = 50_000
_label_cache: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
_label_by_hash: dict[int, dict[str, str]] = {}  # hash of the items as received -> the shared map

# The API server's own validation bounds (metadata.name: DNS subdomain, namespace: DNS label,
# label key: optional DNS-subdomain prefix + "/" + 63-character name, label value: 63 characters);
# an object beyond them did not come from a conforming API server.
MAX_NAME = 253
MAX_NAMESPACE = 63
MAX_LABEL_KEY = 253 + 1 + 63
MAX_LABEL_VALUE = 63
MAX_LABELS = 256  # Kubernetes sets no count; real objects carry a handful. Bounds one object's cost.
MAX_ADDRESSES = 32
MAX_SHORT = 253  # address types and addresses, node names, phases

INVALID = "invalid"
OVERSIZED = "oversized"

METADATA_LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
METADATA_WATCH_ACCEPT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"


class Skip(ValueError):
    """An object that is not kept; ``reason`` is INVALID or OVERSIZED."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def shared_labels(labels: dict[str, Any] | None) -> dict[str, str]:
    """Return a read-only label dict with interned strings, shared with every equal label map seen."""
    if not labels:
        return _EMPTY
    # Fast path (~4× cheaper than interning and sorting): the API server writes label keys in one
    # (sorted) order, so equal maps have equal item tuples; a hash hit is confirmed by equality.
    try:
        h = hash(tuple(labels.items()))
    except TypeError:  # unhashable values (a malformed dict-path object): the slow path says more
        h = None
    if h is not None:
        hit = _label_by_hash.get(h)
        if hit is not None and hit == labels:
            return hit
    key = tuple(sorted((_intern(str(k)), _intern(str(v))) for k, v in labels.items()))
    found = _label_cache.get(key)
    if found is None:
        if len(_label_cache) >= _LABEL_CACHE_MAX:
            _label_cache.clear()  # bounded: objects keep their dicts, only sharing restarts
            _label_by_hash.clear()
        found = _label_cache[key] = dict(key)
    if h is not None:
        if len(_label_by_hash) >= 2 * _LABEL_CACHE_MAX:  # bounded too (orders may differ)
            _label_by_hash.clear()
        _label_by_hash[h] = found
    return found


# ---- the fields read (everything else is skipped by the parser) --------------------------------
class _Meta(msgspec.Struct):
    name: str = ""
    namespace: str = ""
    labels: dict[str, str] | None = None
    resourceVersion: str = ""


class _PodSpec(msgspec.Struct):
    nodeName: str = ""


class _PodStatus(msgspec.Struct):
    phase: str = ""


class _Pod(msgspec.Struct):
    metadata: _Meta | None = None
    spec: _PodSpec | None = None
    status: _PodStatus | None = None


class _Address(msgspec.Struct):
    type: str = ""
    address: str = ""


class _Endpoint(msgspec.Struct):
    Port: int = 0


class _DaemonEndpoints(msgspec.Struct):
    kubeletEndpoint: _Endpoint | None = None


class _NodeStatus(msgspec.Struct):
    addresses: list[_Address] | None = None
    daemonEndpoints: _DaemonEndpoints | None = None


class _Node(msgspec.Struct):
    metadata: _Meta | None = None
    status: _NodeStatus | None = None


class _ListMeta(msgspec.Struct):
    resourceVersion: str = ""
    continue_: str = msgspec.field(name="continue", default="")


class _AnyMeta(msgspec.Struct):
    """What can be read of any object, whatever its other fields hold: to find a bad one's key."""

    name: Any = None
    namespace: Any = None
    resourceVersion: Any = None


class _AnyObject(msgspec.Struct):
    metadata: _AnyMeta | None = None


class _RawList(msgspec.Struct):
    metadata: _ListMeta | None = None
    items: list[msgspec.Raw] | None = None


class _Event(msgspec.Struct):
    type: str = ""
    object: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"{}"))


def _check_labels(labels: dict[str, str] | None) -> dict[str, str]:
    if not labels:
        return _EMPTY
    if len(labels) > MAX_LABELS:
        raise Skip(OVERSIZED, f"{len(labels)} labels (at most {MAX_LABELS} are kept)")
    for k, v in labels.items():
        if len(k) > MAX_LABEL_KEY or len(v) > MAX_LABEL_VALUE or not k:
            raise Skip(OVERSIZED, "a label key or value beyond the API server's bounds")
    return shared_labels(labels)


def _meta(m: _Meta | None, namespaced: bool) -> tuple[str, str]:
    if m is None or not m.name:
        raise Skip(INVALID, "no metadata.name")
    if len(m.name) > MAX_NAME or len(m.namespace) > MAX_NAMESPACE:
        raise Skip(OVERSIZED, "metadata.name or namespace beyond the API server's bounds")
    if namespaced and not m.namespace:
        raise Skip(INVALID, "no metadata.namespace")
    return m.namespace, m.name


def _pod_info(p: _Pod) -> PodInfo:
    namespace, name = _meta(p.metadata, namespaced=True)
    node = p.spec.nodeName if p.spec is not None else ""
    phase = p.status.phase if p.status is not None else ""
    if len(node) > MAX_SHORT or len(phase) > MAX_SHORT:
        raise Skip(OVERSIZED, "spec.nodeName or status.phase beyond bounds")
    return PodInfo(
        namespace=_intern(namespace),
        name=name,
        labels=_check_labels(p.metadata.labels),  # type: ignore[union-attr]
        node_name=_intern(node),
        phase=_intern(phase),
        creation_timestamp="",  # not kept: nothing reads it (10 MB at 150 000 pods)
    )


def _running_pod_info(p: _Pod) -> PodInfo:
    """A pod listed as metadata only with ``status.phase=Running``: Running, node unknown."""
    namespace, name = _meta(p.metadata, namespaced=True)
    return PodInfo(_intern(namespace), name, _check_labels(p.metadata.labels), "", "Running", "")  # type: ignore[union-attr]


def _node_info(n: _Node) -> NodeInfo:
    _, name = _meta(n.metadata, namespaced=False)
    status = n.status or _NodeStatus()
    addresses = status.addresses or ()
    if len(addresses) > MAX_ADDRESSES:
        raise Skip(OVERSIZED, f"{len(addresses)} addresses")
    if any(len(a.type) > MAX_SHORT or len(a.address) > MAX_SHORT for a in addresses):
        raise Skip(OVERSIZED, "an address beyond bounds")
    endpoint = status.daemonEndpoints.kubeletEndpoint if status.daemonEndpoints is not None else None
    port = endpoint.Port if endpoint is not None else 0
    return NodeInfo(
        name=_intern(name),
        labels=_check_labels(n.metadata.labels),  # type: ignore[union-attr]
        addresses=[(_intern(a.type), a.address) for a in addresses],
        kubelet_port=port if 0 < port < 65536 else 0,
        creation_timestamp="",  # not kept: nothing reads it
    )


def node_from_json(obj: dict[str, Any]) -> NodeInfo:
    """A NodeInfo from a v1 Node object (as listed or watched); ValueError (`Skip`) if unusable."""
    try:
        wire = msgspec.convert(obj, _Node, strict=False)
    except msgspec.ValidationError as e:
        raise Skip(INVALID, str(e)) from None
    return _node_info(wire)


def pod_from_json(obj: dict[str, Any]) -> PodInfo:
    """A PodInfo from a v1 Pod object (as listed or watched); ValueError (`Skip`) if unusable."""
    try:
        wire = msgspec.convert(obj, _Pod, strict=False)
    except msgspec.ValidationError as e:
        raise Skip(INVALID, str(e)) from None
    return _pod_info(wire)


# ---- decoding LIST pages and WATCH lines ---------------------------------------------------------
T = TypeVar("T")


@dataclass(slots=True)
class Bad:
    """An object that was skipped: why, and its key when its metadata could still be read."""

    reason: str
    message: str
    key: Hashable | None
    name: str  # "namespace/name" or what could be read of it, for a log line


@dataclass(slots=True)
class Page(Generic[T]):
    items: list[T]
    bad: list[Bad]
    resource_version: str
    continue_token: str


@dataclass(slots=True)
class Event(Generic[T]):
    type: str
    value: T | None = None
    bad: Bad | None = None
    resource_version: str = ""
    status: dict[str, Any] = field(default_factory=dict)  # the Status of an ERROR event


class WireCodec(Generic[T]):
    """Decodes LIST pages and WATCH event lines of one kind into values of T, object by object.

    ``accept`` / ``watch_accept``: the Accept headers to send; ``key`` must be the key function the
    informer uses for T (it is applied to (namespace, name) of objects that could not be converted,
    so that a cached value whose object became unusable is dropped).
    """

    def __init__(
        self,
        wire_type: type,
        convert: Callable[[Any], T],
        *,
        bad_key: Callable[[str, str], Hashable],
        accept: str = "application/json",
        watch_accept: str = "application/json",
    ) -> None:
        self._convert = convert
        self._bad_key = bad_key
        self.accept = accept
        self.watch_accept = watch_accept

        _List = msgspec.defstruct(
            "_List", [("metadata", _ListMeta | None, None), ("items", list[wire_type] | None, None)]  # type: ignore[valid-type]
        )
        _TypedEvent = msgspec.defstruct("_TypedEvent", [("type", str, ""), ("object", wire_type | None, None)])  # type: ignore[operator]
        self._typed_event = msgspec.json.Decoder(_TypedEvent)  # one pass over the line when it decodes
        self._one = msgspec.json.Decoder(wire_type)
        self._page = msgspec.json.Decoder(_List)
        self._raw_page = msgspec.json.Decoder(_RawList)
        self._event = msgspec.json.Decoder(_Event)
        self._any = msgspec.json.Decoder(_AnyObject)

    def page(self, raw: bytes) -> Page[T]:
        """Decode one LIST page; raises ValueError if the page itself (not an item) is malformed."""
        try:
            doc = self._page.decode(raw)
            wires: list[Any] = doc.items or []
            meta = doc.metadata
            decoded = True
        except msgspec.ValidationError:  # some item has a wrong type: go item by item
            try:
                rdoc = self._raw_page.decode(raw)
            except msgspec.DecodeError as e:
                raise ValueError(f"undecodable list page: {e}") from None
            wires, meta, decoded = list(rdoc.items or ()), rdoc.metadata, False
        except msgspec.DecodeError as e:
            raise ValueError(f"undecodable list page: {e}") from None
        items: list[T] = []
        bad: list[Bad] = []
        for w in wires:
            value, problem = self._item(w, decoded)
            if problem is None:
                items.append(value)  # type: ignore[arg-type]
            else:
                bad.append(problem)
        meta = meta or _ListMeta()
        return Page(items, bad, meta.resourceVersion, meta.continue_)

    def _item(self, w: Any, decoded: bool) -> tuple[T | None, Bad | None]:
        raw = None if decoded else w
        try:
            if not decoded:
                w = self._one.decode(raw)
            return self._convert(w), None
        except msgspec.ValidationError as e:
            return None, self._bad(INVALID, str(e), raw, None)
        except Skip as e:
            return None, self._bad(e.reason, str(e), raw, w)

    def _bad(self, reason: str, message: str, raw: msgspec.Raw | None, wire: Any) -> Bad:
        name = namespace = None
        if wire is not None and wire.metadata is not None:
            name, namespace = wire.metadata.name, wire.metadata.namespace
        elif raw is not None:
            try:
                meta = self._any.decode(raw).metadata
            except msgspec.DecodeError:
                meta = None
            if meta is not None:
                name, namespace = meta.name, meta.namespace
        namespace = namespace or ""
        key = None
        if isinstance(name, str) and name and isinstance(namespace, str):
            key = self._bad_key(_intern(namespace) if len(namespace) <= MAX_NAMESPACE else namespace, name)
        shown = f"{namespace}/{name}" if namespace else str(name)
        return Bad(reason, message, key, shown)

    def event(self, line: bytes) -> Event[T]:
        """Decode one WATCH line; raises ValueError if the line is not a watch event at all."""
        try:
            typed = self._typed_event.decode(line)
        except msgspec.DecodeError:  # a wrong type somewhere, or not JSON: the careful way below
            typed = None
        if typed is not None and typed.type in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
            w = typed.object
            if typed.type == "BOOKMARK":
                return Event("BOOKMARK", resource_version=_wire_rv(w))
            if w is None:
                return Event(typed.type, None, Bad(INVALID, "no object", None, "?"), "")
            return self._object_event(typed.type, w)
        try:
            ev = self._event.decode(line)
        except msgspec.DecodeError as e:
            raise ValueError(f"undecodable watch event: {e}") from None
        raw = ev.object
        if ev.type == "ERROR":
            try:
                status = msgspec.json.decode(raw)
            except msgspec.DecodeError:
                status = {}
            return Event("ERROR", status=status if isinstance(status, dict) else {})
        if ev.type == "BOOKMARK":
            return Event("BOOKMARK", resource_version=self._rv(raw))
        try:
            w = self._one.decode(raw)
        except msgspec.ValidationError as e:
            return Event(ev.type, None, self._bad(INVALID, str(e), raw, None), self._rv(raw))
        except msgspec.DecodeError as e:
            raise ValueError(f"undecodable watch event: {e}") from None
        return self._object_event(ev.type, w)

    def _object_event(self, kind: str, w: Any) -> Event[T]:
        """An ADDED/MODIFIED/DELETED event of the decoded object ``w`` (or of its refusal)."""
        rv = _wire_rv(w)
        try:
            return Event(kind, self._convert(w), None, rv)
        except Skip as e:
            return Event(kind, None, self._bad(e.reason, str(e), None, w), rv)

    def _rv(self, raw: msgspec.Raw) -> str:
        try:
            meta = self._any.decode(raw).metadata
        except msgspec.DecodeError:
            return ""
        rv = meta.resourceVersion if meta is not None else None
        return rv if isinstance(rv, str) and len(rv) <= 64 else ""


def _wire_rv(w: Any) -> str:
    """The resourceVersion of a decoded object, "" when absent or longer than any kube-apiserver's."""
    rv = w.metadata.resourceVersion if w is not None and w.metadata is not None else ""
    return rv if len(rv) <= 64 else ""


def _pod_key(namespace: str, name: str) -> tuple[str, str]:
    return (namespace, name)


def _node_key(namespace: str, name: str) -> str:
    return name


NODE_WIRE: WireCodec[NodeInfo] = WireCodec(_Node, _node_info, bad_key=_node_key)
POD_WIRE: WireCodec[PodInfo] = WireCodec(_Pod, _pod_info, bad_key=_pod_key)
POD_META_WIRE: WireCodec[PodInfo] = WireCodec(
    _Pod,
    _running_pod_info,
    bad_key=_pod_key,
    accept=METADATA_LIST_ACCEPT,
    watch_accept=METADATA_WATCH_ACCEPT,
)
