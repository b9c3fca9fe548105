"""NodeMetricsList and PodMetricsList bodies made of cached JSON byte pieces, sent as they are made.

Listing 150 000 pods by building a dict per pod and serializing the whole list kept the event loop
busy for seconds. Here each item is three byte strings::

    head     ,{"metadata":{"name":"web-1","namespace":"team-a","creationTimestamp":
    created  "2026-05-01T10:00:00Z"                     (the request time, shared by all items)
    body     ,"labels":{"app":"web"}},"timestamp":"...","window":"15s","containers":[...]}

``head`` and the metadata part of ``body`` depend only on the object's metadata and are cached by
the identity of its :class:`~kcms.model.PodInfo` / :class:`~kcms.model.NodeInfo` (the inventories
never change one in place: a changed object is a new one); the usage part depends only on the
readings and is cached by the identity of the store's :class:`~kcms.store.resource.PodUsage`
(the same object until the pod's node is scraped again) or by the usage's values (nodes, whose
usage is computed per call, and pods read from store replicas, a new snapshot per request). A
list is then a loop that filters, looks usage up and appends pieces.

The output is byte for byte what ``orjson.dumps`` of :mod:`.convert`'s dicts gives (same keys,
order, escaping): strings that could need escaping (names, labels, container names) go through
``orjson.dumps``; the rest (timestamps, durations, quantities) are ASCII letters, digits and ``.:-``
(and ``µ``, which orjson writes as UTF-8 too).

The items are produced in chunks of :data:`SLICE`, handing the event loop back in between (the
process also scrapes kubelets). A list of at most :data:`STREAM_BYTES` is joined and sent with a
``Content-Length``; a larger one is streamed (chunked transfer encoding, gzip in a worker thread
when accepted: :func:`kcms.apiserver.responses.stream_response`), so that rendering overlaps the
socket and no whole 56 MB body is held. The caches are bounded: an entry whose object left the
inventory is dropped by a sweep that runs when the cache has doubled since the last one
(amortized constant work per entry).

The list of every pod (no namespace, no selector: ``kubectl top pods -A``, dashboards) is made of
*node blocks* instead (:meth:`ListRenderer.all_pods`): per node, its pods' items already joined
into a few byte strings around the request-time ``creationTimestamp``, cached under the store's
token for the node (:meth:`kcms.store.resource.ResourceStore.pod_blocks`, a new one per scrape of
the node) and dropped when the inventory reports one of its pods changed
(:class:`kcms.model.PodChangeLog`; an inventory without that log is checked pod by pod, one
C-level ``map`` per node). A list then costs a few microseconds per node rather than per pod: at 150 000 pods the
per-pod loop alone took ~300 ms, more than writing the 56 MB to the socket (bench/list_render.py).
Items come node by node, in the store's order, not in the inventory's (Kubernetes lists of
aggregated resources promise no order; metrics-server's follows its informer's map).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Protocol

import orjson
from aiohttp import web
from prometheus_client import Counter

from kcms.apis.metrics.convert import API_VERSION, TimeFormatter, go_duration
from kcms.apiserver.responses import list_body_response
from kcms.model import Inventory, NodeInfo, PodChangeLog, PodInfo, PodKey
from kcms.quantity import format_bytes, format_cpu_nanocores
from kcms.store.resource import PodUsage, Usage

# Items rendered between two yields to the event loop, and the items of one chunk of a streamed
# body (~190 KB of pods): ~1 ms of work from the cache, ~8 ms when every usage is new.
SLICE = 500
# A list whose items exceed this many bytes is streamed (chunked) rather than joined and sent.
STREAM_BYTES = 1 << 20
# The list of every pod is sent in chunks of about this size (node blocks joined): big enough that
# handing each to the gzip thread costs little, small enough to overlap rendering and the socket.
BLOCK_CHUNK_BYTES = 1 << 20
# Blocks are rendered ahead while all-pods lists come at most this many seconds apart (the
# resolution: rendering a node once per scrape then costs what the lists would spend anyway),
# looking for stale ones every PRERENDER_PERIOD seconds (see ListRenderer._keep_rendering).
PRERENDER_WITHIN = 15.0
PRERENDER_PERIOD = 0.5
# A sweep runs when the cache holds more than 2x the entries it kept at the last one, plus this.
SWEEP_SLACK = 1000

BLOCKS_RENDERED = Counter(
    "kcms_metrics_pod_blocks_rendered",
    "Nodes whose pods were rendered for the list of every pod, by when: ahead (in the background, "
    "after the node's scrape, while lists come) or on_list (by the list that needed them).",
    ["when"],
)
_AHEAD = BLOCKS_RENDERED.labels("ahead")
_ON_LIST = BLOCKS_RENDERED.labels("on_list")

_POD_LIST_HEAD = (
    b'{"kind":"PodMetricsList","apiVersion":"' + API_VERSION.encode() + b'","metadata":{},"items":['
)
_NODE_LIST_HEAD = (
    b'{"kind":"NodeMetricsList","apiVersion":"' + API_VERSION.encode() + b'","metadata":{},"items":['
)

_dumps = orjson.dumps


def cpu_text(nanocores: int) -> str:
    """``format_cpu_nanocores``, with its common case (not a multiple of ten: ``<n>n``) inline."""
    return f"{nanocores}n" if nanocores % 10 else format_cpu_nanocores(nanocores)


def memory_text(n: int) -> str:
    """``format_bytes``, with its common cases inline: not a multiple of 1024 (plain digits), or a
    multiple of 1024 but not of 1024² (``<n>Ki``; working sets are whole pages)."""
    if n % 1024:
        return str(n)
    if n >= 1024 and (n >> 10) % 1024:
        return f"{n >> 10}Ki"
    return format_bytes(n)


def _head(name: str, namespace: str) -> bytes:
    """The start of an item, with the separator before it (removed from a list's first item)."""
    ns = b',"namespace":' + _dumps(namespace) if namespace else b""
    return b',{"metadata":{"name":' + _dumps(name) + ns + b',"creationTimestamp":'


def _meta_tail(labels: dict[str, str]) -> bytes:
    if labels:  # omitted when empty, as ObjectMeta's omitempty does
        return b',"labels":' + _dumps(labels) + b"},"
    return b"},"


class _Texts:
    """Memo of the JSON text of container names and of windows, bounded (names come from kubelets)."""

    __slots__ = ("names", "windows")

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.windows: dict[float, str] = {}

    def name(self, name: str) -> str:
        text = self.names.get(name)
        if text is None:
            if len(self.names) > 4096:
                self.names.clear()
            text = self.names[name] = _dumps(name).decode()
        return text

    def window(self, seconds: float) -> str:
        text = self.windows.get(seconds)
        if text is None:
            if len(self.windows) > 4096:
                self.windows.clear()
            text = self.windows[seconds] = go_duration(seconds)
        return text


def pod_usage_fragment(usage: PodUsage, texts: _Texts, fmt: TimeFormatter) -> bytes:
    """``"timestamp":..,"window":..,"containers":[..]}`` - the rest of a PodMetrics after its metadata."""
    containers = []
    for name, u in usage.containers:
        containers.append(
            f'{{"name":{texts.name(name)},"usage":{{"cpu":"{cpu_text(u.cpu_nanocores)}",'
            f'"memory":"{memory_text(u.memory)}"}}}}'
        )
    return (
        f'"timestamp":"{fmt(usage.timestamp)}","window":"{texts.window(usage.window)}",'
        f'"containers":[{",".join(containers)}]}}'
    ).encode()


def node_usage_fragment(usage: Usage, texts: _Texts, fmt: TimeFormatter) -> bytes:
    """``"timestamp":..,"window":..,"usage":{..}}`` - the rest of a NodeMetrics after its metadata."""
    return (
        f'"timestamp":"{fmt(usage.timestamp)}","window":"{texts.window(usage.window)}",'
        f'"usage":{{"cpu":"{cpu_text(usage.cpu_nanocores)}","memory":"{memory_text(usage.memory)}"}}}}'
    ).encode()


async def list_response(request: web.Request, kind: str, chunks: AsyncIterator[bytes]) -> web.StreamResponse:
    """The ``<kind>`` list of the items in ``chunks``: joined and sent when small, streamed when not."""
    head = _POD_LIST_HEAD if kind == "PodMetricsList" else _NODE_LIST_HEAD
    return await list_body_response(request, head, chunks, stream_above=STREAM_BYTES)


class PodBlocks(Protocol):
    """What :meth:`ListRenderer.all_pods` reads: :class:`kcms.store.resource.ResourceStore`."""

    def pod_blocks(self, now: float | None = None) -> list[tuple[str, object]]: ...

    def pod_node(self, namespace: str, name: str) -> str: ...

    def node_pod_usages(self, node: str) -> list[tuple[PodKey, PodUsage | None]]: ...


class _NodeBlock:
    """One node's pods as list items: ``created.join(parts)`` is their JSON (with a leading comma),
    valid while the store's token for the node is ``token`` and the inventory still holds exactly
    ``infos`` (None: absent) under ``namespaces``/``names``."""

    __slots__ = ("infos", "names", "namespaces", "parts", "token")

    def __init__(
        self,
        token: object,
        namespaces: list[str],
        names: list[str],
        infos: list[PodInfo | None],
        parts: list[bytes],
    ) -> None:
        self.token = token
        self.namespaces = namespaces
        self.names = names
        self.infos = infos
        self.parts = parts


class ListRenderer:
    """Pre-rendered pieces of every listed node and pod, and the list items made of them."""

    def __init__(self, inventory: Inventory, *, prerender_within: float = PRERENDER_WITHIN) -> None:
        self.inventory = inventory
        self.prerender_within = prerender_within  # 0: never render ahead
        # id(PodInfo) -> [pod, head, meta tail, usage, body]; the entry holds the PodInfo, so its id
        # cannot be reused by another object while the entry exists.
        self._pods: dict[int, list[Any]] = {}
        # id(NodeInfo) -> [node, head, meta tail, (timestamp, window, cpu, memory), body]
        self._nodes: dict[int, list[Any]] = {}
        # node name -> its pods rendered for the list of every pod (all_pods)
        self._blocks: dict[str, _NodeBlock] = {}
        self._inventory_version = -1  # the inventory's pod_changes() version the blocks reflect
        self._unverified = True  # blocks must be checked pod by pod against the inventory
        self._last_all_pods = -1e9  # monotonic time the last all_pods list started
        self._prerender_until = 0.0  # render ahead until then (monotonic)
        self._prerender_store: PodBlocks | None = None
        self._prerender_handle: asyncio.TimerHandle | None = None
        self._texts = _Texts()
        self._pods_kept = 0
        self._nodes_kept = 0
        self._sweeping = False

    def cached(self) -> tuple[int, int]:
        """How many pod and node entries the caches hold."""
        return len(self._pods), len(self._nodes)

    async def pods(
        self,
        pods: Iterable[PodInfo],
        usage_of: Callable[..., PodUsage | None],
        now: float,
        keep: Callable[[PodInfo], bool] | None,
        created: str,
        by_value: bool = False,
    ) -> AsyncIterator[bytes]:
        """The items (comma-separated JSON, in chunks of up to :data:`SLICE`) of the Running pods of
        ``pods`` that ``keep`` accepts (all when None) and that have usage (``usage_of(namespace,
        name, now)``). ``by_value``: the usages are new objects on every request (a replica
        snapshot), so a cached rendering is reused when the values are equal."""
        pods = list(pods)  # a snapshot: the inventory may change while this yields
        cache = self._pods
        texts = self._texts
        fmt = TimeFormatter()
        created_json = _dumps(created)
        first = True
        for start in range(0, len(pods), SLICE):
            if start:
                await asyncio.sleep(0)
            pieces: list[bytes] = []
            append = pieces.append
            for pod in pods[start : start + SLICE]:
                if pod.phase != "Running":
                    continue
                if keep is not None and not keep(pod):
                    continue
                usage = usage_of(pod.namespace, pod.name, now)
                if usage is None:
                    continue
                entry = cache.get(id(pod))
                if entry is None:
                    tail = _meta_tail(pod.labels)
                    body = tail + pod_usage_fragment(usage, texts, fmt)
                    entry = cache[id(pod)] = [pod, _head(pod.name, pod.namespace), tail, usage, body]
                elif entry[3] is not usage:
                    if not (by_value and entry[3] == usage):
                        entry[4] = entry[2] + pod_usage_fragment(usage, texts, fmt)
                    entry[3] = usage
                append(entry[1])
                append(created_json)
                append(entry[4])
            if pieces:
                if first:
                    pieces[0] = pieces[0][1:]  # no separator before the first item
                    first = False
                yield b"".join(pieces)
        if len(cache) > 2 * self._pods_kept + SWEEP_SLACK:
            await self._sweep_pods()

    async def nodes(
        self,
        nodes: Iterable[NodeInfo],
        usage_of: Callable[..., Usage | None],
        now: float,
        keep: Callable[[NodeInfo], bool] | None,
        created: str,
    ) -> AsyncIterator[bytes]:
        """The items (in chunks) of ``nodes`` that ``keep`` accepts and that have usage."""
        nodes = list(nodes)
        cache = self._nodes
        texts = self._texts
        fmt = TimeFormatter()
        created_json = _dumps(created)
        first = True
        for start in range(0, len(nodes), SLICE):
            if start:
                await asyncio.sleep(0)
            pieces: list[bytes] = []
            append = pieces.append
            for node in nodes[start : start + SLICE]:
                if keep is not None and not keep(node):
                    continue
                usage = usage_of(node.name, now)
                if usage is None:
                    continue
                # node_usage computes a new Usage per call: compare the values instead.
                values = (usage.timestamp, usage.window, usage.cpu_nanocores, usage.memory)
                entry = cache.get(id(node))
                if entry is None:
                    tail = _meta_tail(node.labels)
                    body = tail + node_usage_fragment(usage, texts, fmt)
                    entry = cache[id(node)] = [node, _head(node.name, ""), tail, values, body]
                elif entry[3] != values:
                    entry[3] = values
                    entry[4] = entry[2] + node_usage_fragment(usage, texts, fmt)
                append(entry[1])
                append(created_json)
                append(entry[4])
            if pieces:
                if first:
                    pieces[0] = pieces[0][1:]
                    first = False
                yield b"".join(pieces)
        if len(cache) > 2 * self._nodes_kept + SWEEP_SLACK:
            self._sweep_nodes()

    async def all_pods(self, store: PodBlocks, now: float, created: str) -> AsyncIterator[bytes]:
        """The items (in chunks of about :data:`BLOCK_CHUNK_BYTES`) of every Running pod that has
        usage in ``store``, node by node (see the module docstring)."""
        started = time.monotonic()
        blocks = self._blocks
        lookup = self.inventory.pod
        self._apply_inventory_changes(store)
        check_all = self._unverified or not isinstance(self.inventory, PodChangeLog)
        self._unverified = False  # this pass checks every block it serves
        created_json = _dumps(created)
        texts = self._texts
        fmt = TimeFormatter()
        seen: list[str] = []
        pieces: list[bytes] = []
        size = work = 0
        first = True
        for node, token in store.pod_blocks(now):
            seen.append(node)
            block = blocks.get(node)
            if block is not None and block.token is token:
                work += 1
                if check_all and list(map(lookup, block.namespaces, block.names)) != block.infos:
                    block = None  # a pod of the node changed (labels, phase) or left the inventory
            else:
                block = None
            if block is None:
                block = blocks[node] = self._node_block(node, token, store, texts, fmt)
                work += len(block.infos)
                _ON_LIST.inc()
            if block.parts:
                text = created_json.join(block.parts)
                pieces.append(text)
                size += len(text)
            if size >= BLOCK_CHUNK_BYTES:
                if first:
                    pieces[0] = pieces[0][1:]  # no separator before the first item
                    first = False
                yield b"".join(pieces)
                pieces = []
                size = 0
            if work >= SLICE:
                work = 0
                await asyncio.sleep(0)
        if pieces:
            if first:
                pieces[0] = pieces[0][1:]
            yield b"".join(pieces)
        if len(blocks) > 2 * len(seen) + SWEEP_SLACK // 10:
            for node in blocks.keys() - set(seen):
                del blocks[node]
        if len(self._pods) > 2 * self._pods_kept + SWEEP_SLACK:
            await self._sweep_pods()
        self._keep_rendering(store, started)

    def _apply_inventory_changes(self, store: PodBlocks) -> None:
        """Drop the blocks holding a pod the inventory changed since the last call. When it cannot
        tell (its log no longer reaches back), the next list checks every block
        (``_unverified``); an inventory without a change log is always checked so."""
        if not isinstance(self.inventory, PodChangeLog):
            return
        version, changed = self.inventory.pod_changes(self._inventory_version)
        self._inventory_version = version
        if changed is None:
            self._unverified = True
            return
        blocks = self._blocks
        owner = store.pod_node
        for namespace, name in changed:
            blocks.pop(owner(namespace, name), None)

    # -- rendering ahead -----------------------------------------------------------------------
    # At 15 s resolution a node's readings change every 15 s, so a list a scrape cycle after the
    # last one renders every pod again (~9 µs a pod: 1.4 s at 150 000 pods). When lists of every
    # pod come at least once a resolution (a `watch kubectl top pods -A`, a dashboard), each node
    # is rendered once per scrape whoever does it: then it is done in the background right after
    # the scrape, a slice at a time between other work (loop callbacks: no task to cancel at
    # shutdown), and the next list finds it ready. It goes on for twice the last gap between two
    # such lists (at most ``prerender_within``), so it stops soon after the lists do; lists further
    # apart (the VPA recommender's every minute, someone's occasional `kubectl top`) never start
    # it: rendering ahead would then cost more than rendering on demand.

    def _keep_rendering(self, store: PodBlocks, started: float) -> None:
        """Called as a list of every pod that started at ``started`` ends."""
        gap = started - self._last_all_pods
        self._last_all_pods = started
        if gap > self.prerender_within:
            return
        self._prerender_until = time.monotonic() + min(2 * gap, self.prerender_within)
        self._prerender_store = store
        if self._prerender_handle is None:
            loop = asyncio.get_running_loop()
            self._prerender_handle = loop.call_later(PRERENDER_PERIOD, self._prerender_step)

    def _prerender_step(self) -> None:
        """Render stale blocks worth about :data:`SLICE` pods; come back at once while there are
        more, after :data:`PRERENDER_PERIOD` when none are left."""
        self._prerender_handle = None
        store = self._prerender_store
        now = time.monotonic()
        if store is None or now > self._prerender_until:
            self._prerender_store = None
            return
        self._apply_inventory_changes(store)  # the dropped blocks are rendered again below
        blocks = self._blocks
        texts = self._texts
        fmt = TimeFormatter()
        budget = SLICE
        for node, token in store.pod_blocks(now):
            block = blocks.get(node)
            if block is None or block.token is not token:
                block = blocks[node] = self._node_block(node, token, store, texts, fmt)
                _AHEAD.inc()
                budget -= len(block.infos) + 1
                if budget <= 0:
                    break
        loop = asyncio.get_running_loop()
        self._prerender_handle = loop.call_later(0 if budget <= 0 else PRERENDER_PERIOD, self._prerender_step)

    def _node_block(
        self, node: str, token: object, store: PodBlocks, texts: _Texts, fmt: TimeFormatter
    ) -> _NodeBlock:
        """Render one node's pods as a :class:`_NodeBlock` (metadata pieces from the pod cache)."""
        lookup = self.inventory.pod
        cache = self._pods
        namespaces: list[str] = []
        names: list[str] = []
        infos: list[PodInfo | None] = []
        parts: list[bytes] = []
        pending = b""  # the previous item's body, joined with the next item's head
        # The pods whose readings are this node's (not those that moved to another node's scrape).
        for (namespace, name), usage in store.node_pod_usages(node):
            pod = lookup(namespace, name)
            namespaces.append(namespace)
            names.append(name)
            infos.append(pod)
            if pod is None or pod.phase != "Running" or usage is None:
                continue
            entry = cache.get(id(pod))
            if entry is None:
                # The block holds the rendered usage: the pod cache keeps only the metadata pieces.
                entry = cache[id(pod)] = [pod, _head(name, namespace), _meta_tail(pod.labels), None, b""]
            parts.append(pending + entry[1])
            pending = entry[2] + pod_usage_fragment(usage, texts, fmt)
        if parts:
            parts.append(pending)
        return _NodeBlock(token, namespaces, names, infos, parts)

    async def _sweep_pods(self) -> None:
        """Drop the entries of pods the inventory no longer holds (deleted, or replaced by a newer
        object), in slices; concurrent requests may add entries meanwhile."""
        if self._sweeping:
            return
        self._sweeping = True
        try:
            cache = self._pods
            lookup = self.inventory.pod
            items = list(cache.items())
            for start in range(0, len(items), SLICE):
                if start:
                    await asyncio.sleep(0)
                for key, entry in items[start : start + SLICE]:
                    pod = entry[0]
                    if lookup(pod.namespace, pod.name) is not pod and cache.get(key) is entry:
                        del cache[key]
            self._pods_kept = len(cache)
        finally:
            self._sweeping = False

    def _sweep_nodes(self) -> None:
        cache = self._nodes
        lookup = self.inventory.node
        for key, entry in list(cache.items()):
            if lookup(entry[0].name) is not entry[0]:
                del cache[key]
        self._nodes_kept = len(cache)
