"""The list of every pod (no namespace, no selector: ``kubectl top pods -A``, the VPA recommender,
dashboards) made of *node blocks*.

Per node, its pods' items are kept already joined into one byte string with a NUL byte where each
request-time ``creationTimestamp`` goes (``text.replace(b"\\0", created)``), made of
:mod:`.render`'s pieces. A block is valid while the store's token for the node is unchanged
(:meth:`kcms.store.resource.ResourceStore.pod_blocks`: a new one per scrape of the node, or when
one of its pods moves to another node's scrape) and none of its pods changed in the inventory:
an inventory with a change log (:class:`kcms.model.PodChangeLog`, the Kubernetes informers) says
which pods did, and only their nodes' blocks are dropped; another is checked pod by pod (one
C-level ``starmap`` per node). A list then costs a few microseconds per node rather than per pod:
at 150 000 pods the per-pod loop alone took ~300 ms, more than writing the 56 MB to the socket
(bench/list_render.py: 354 -> 144 ms for the whole list, cached).

While such lists come at least once a resolution, blocks are rendered ahead, in the background
after each scrape; a list that finds a node's block superseded by a scrape not rendered yet serves
that block (the node's previous scrape, rendered within two resolutions) and leaves the node to
rendering ahead. So a list during a scrape cycle renders little itself, and some of its items are
a scrape older than the newest (their ``timestamp`` says so): metrics-server serves a whole cycle
older until its cycle ends.

A gzipped list (what kubectl and the aggregator ask for) is spliced from blocks compressed once
(:mod:`.gzblocks`): blocks are compressed as they are rendered, by rendering ahead or by the
gzipped list that renders them (so the list right after a cold one is spliced too), and those a
gzipped list sent uncompressed (rendered by an identity list, say) are compressed after it, in
rendering ahead's steps. A list never compresses for later lists a block it did not render: it
compresses those as one stream, as every gzipped list did before (compressing a block for
splicing costs about twice its share of the stream, and lists further apart find every block stale
anyway).

Items come node by node, in the store's order, each node's pods in its kubelet's order; lists by
namespace or selector keep :class:`~kcms.apis.metrics.render.ListRenderer`'s per-pod path and the
inventory's order (Kubernetes lists of aggregated resources promise no order; metrics-server's
follow its informer's map).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from itertools import starmap
from time import perf_counter
from typing import Protocol

import orjson
from prometheus_client import Counter

from kcms.apis.metrics import gzblocks
from kcms.apis.metrics.convert import TimeFormatter
from kcms.apis.metrics.render import ListRenderer, ListTurn, UsageText
from kcms.heap import trim_heap
from kcms.model import Inventory, PodChangeLog, PodInfo, PodKey
from kcms.tasks import STREAMS

# The list of every pod is sent in chunks of about this size (node blocks joined): big enough that
# each write and compression call costs little, small enough to overlap rendering and the socket.
BLOCK_CHUNK_BYTES = 1 << 20
# ... and of a gzipped list spliced from compressed blocks, in compressed bytes (~20 MB of JSON):
# a chunk is then mostly joining bytes and encrypting them (~5 ms), and the fewer there are, the
# fewer times the list waits for its turn of the event loop during a scrape cycle.
GZIP_CHUNK_BYTES = 3 << 20
# Blocks are rendered ahead while all-pods lists come at most this many seconds apart (the
# resolution: rendering a node once per scrape then costs what the lists would spend anyway),
# looking for stale ones every PRERENDER_PERIOD seconds while scrapes come, backing off to
# PRERENDER_IDLE_PERIOD between cycles (see NodeBlocks._keep_rendering). A look costs only the
# nodes scraped since the last (the store's change log), so it can come often: blocks are then
# ready soon after each scrape, and a list during a 5000-node cycle finds fewer to render itself
# (lists during a cycle p50 456 and 497 ms, against 661-800 ms looking every 0.5 s: seven runs of
# bench/resource_pipeline.py --nodes 5000, 27 Nov).
PRERENDER_WITHIN = 15.0
PRERENDER_PERIOD = 0.05
PRERENDER_IDLE_PERIOD = 0.5
# Seconds a step of rendering ahead runs (at least one node), and while a long response streams
# (kcms.tasks.STREAMS): a list of every pod during a cycle waits behind less (its chunks come from
# blocks already rendered, or previous ones: see items()). Time, not pods: steps of 500 pods,
# ~3.5 ms in a loop, took 7.9 ms (p50) and up to 17 ms in a live 1000-node cycle (29 Nov).
PRERENDER_TURN_SECONDS = 0.002
PRERENDER_STREAMING_TURN_SECONDS = 0.0007
# Resolutions within which a block must have been rendered to stand in for a newer scrape of its
# node (NodeBlocks.items): the age the store serves a node's readings for when its scrape fails
# (ResourceStore.max_age). One resolution was too tight: a block is rendered a little after each
# scrape, and scrapes of a node come a resolution apart give or take the cycle's spread, so at
# 5000 nodes five lists during cycles still rendered 292 nodes (427 stood in); with two, 62 (672).
STAND_IN_FOR = 2
# Blocks of nodes no longer in the store are dropped once they are this many beyond twice the
# nodes listed.
BLOCKS_SLACK = 100
# A list of every pod checks whether to hand the event loop back (render.ListTurn, as every other
# list does, drawing on the one share) every YIELD_CHECK pods rendered or blocks taken as they
# were (~0.2-0.7 ms of work).
YIELD_CHECK = 100
# Every block is dropped once no list of every pod has come for this many resolutions (and none
# is rendered ahead): by then each node has been scraped again, so a block is only memory (57 MB
# at 150 000 pods, held after one `kubectl top pods -A`) that the next list would render anew.
RELEASE_AFTER_RESOLUTIONS = 2
_dumps = orjson.dumps
# _NodeBlock.gz of a block gzblocks.compress_block refused (compared by identity)
NO_SPLICE = gzblocks.CompressedBlock(b"", b"", 0, 0, 0, 0)
# Compressing a node block (gzblocks.compress_block) costs about what rendering a fifth of its pods
# does (~30 µs a 30-pod block, in a loop, against ~5 µs a pod): the budgets count it so.
COMPRESS_PODS = 5

BLOCKS_RENDERED = Counter(
    "kcms_metrics_pod_blocks_rendered",
    "Nodes whose pods were rendered for the list of every pod, by when: ahead (in the background, "
    "after the node's scrape, while lists come) or on_list (by the list that needed them).",
    ["when"],
)
_AHEAD = BLOCKS_RENDERED.labels("ahead")
_ON_LIST = BLOCKS_RENDERED.labels("on_list")
BLOCKS_PREVIOUS = Counter(
    "kcms_metrics_pod_blocks_previous",
    "Nodes whose pods a list of every pod served as of the node's previous scrape, its latest not "
    "being rendered yet (only while rendering ahead, and rendered within two resolutions).",
)


class PodBlocks(Protocol):
    """What :meth:`NodeBlocks.items` reads: :class:`kcms.store.resource.ResourceStore`."""

    def pod_blocks(self, now: float | None = None) -> list[tuple[str, object]]: ...

    def pod_block(self, node: str, now: float) -> object | None: ...

    def pod_block_changes(self, since: int) -> tuple[int, list[str] | None]: ...

    def pod_node(self, namespace: str, name: str) -> str: ...

    def node_claims(self, node: str) -> int | None: ...

    def node_pod_rates(
        self,
        node: str,
        container: Callable[[str, float, float, int, int], str],
        pod: Callable[[float, float, list[str]], bytes],
    ) -> list[tuple[PodKey, bytes | None]]: ...


class _NodeBlock:
    """One node's pods as list items: ``text`` is their JSON (with a leading comma) with a NUL byte
    where each ``creationTimestamp`` goes (JSON from orjson never holds a raw NUL: it escapes
    control characters), valid while the store's token for the node is ``token`` and the
    inventory still holds exactly ``infos`` (None: absent) under ``keys``; ``rendered`` (monotonic)
    says whether it may stand in for a newer scrape of the node (:meth:`NodeBlocks.items`).

    One byte string and two tuples a node, none of them tracked by the cyclic collector where
    ``_gzsplice`` is built: nothing a block refers to (keys, PodInfos, the store's token, bytes)
    refers back to it, and tracked, every young collection walked each block's ~60 references
    until the cycle's heap freeze (at 150 000 pods, four lists a node cost a full render's first
    pass 24 ms; during a 5000-node cycle, gen-1 passes inside a list walked ~2800 blocks)."""

    __slots__ = ("claims", "gz", "infos", "keys", "rendered", "text", "token")

    def __init__(
        self,
        token: object,
        keys: tuple[PodKey, ...],
        infos: tuple[PodInfo | None, ...],
        text: bytes,
        claims: int | None = None,
    ) -> None:
        self.token = token
        self.claims = claims  # the store's node_claims() as ``keys`` were read: None never stands in
        self.keys = gzblocks.acyclic(keys)
        self.infos = gzblocks.acyclic(infos)
        self.text = text
        self.rendered = time.monotonic()
        # ``text`` compressed for gzipped lists (gzblocks.py): None until made, NO_SPLICE if it cannot be
        self.gz: gzblocks.CompressedBlock | None = None
        gzblocks.acyclic(self)

    def compressed(self) -> gzblocks.CompressedBlock | None:
        """``text`` compressed for :class:`~kcms.apis.metrics.gzblocks.GzipList`, made on first use;
        None when it cannot be spliced."""
        gz = self.gz
        if gz is None:
            gz = self.gz = gzblocks.compress_block(self.text) or NO_SPLICE
        return None if gz is NO_SPLICE else gz

    def unchanged_in(self, pod: Callable[[str, str], PodInfo | None]) -> bool:
        """Whether the inventory (``pod``: its lookup) still holds exactly this block's pods (one
        C-level ``starmap``)."""
        return tuple(starmap(pod, self.keys)) == self.infos


class NodeBlocks:
    """Every node's pods rendered as list items, for :meth:`items`, and rendered ahead while such
    lists come often (:meth:`_keep_rendering`)."""

    def __init__(self, renderer: ListRenderer, *, prerender_within: float = PRERENDER_WITHIN) -> None:
        self.renderer = renderer  # its pod cache holds the metadata pieces; its texts are shared
        self.inventory: Inventory = renderer.inventory
        self.prerender_within = prerender_within  # 0: never render ahead
        self._blocks: dict[str, _NodeBlock] = {}  # node name -> its pods rendered
        self._inventory_version = -1  # the inventory's pod_changes() version the blocks reflect
        # The inventory's relists (its log could not say what changed) so far, and up to which of
        # them a completed list has checked every block pod by pod against the inventory.
        self._relists = 0
        self._checked_relists = -1
        # Rendering ahead looks only at the nodes the store says changed (pod_block_changes) since
        # this version, and at those whose blocks the inventory's changes dropped: ``_pending``.
        self._changes_seen = -1
        self._pending: dict[str, None] = {}
        self._last_all_pods = -1e9  # monotonic time the last list started
        self._prerender_until = 0.0  # render ahead until then (monotonic)
        self._prerender_store: PodBlocks | None = None
        self._prerender_handle: asyncio.TimerHandle | None = None
        self._prerender_period = PRERENDER_PERIOD  # doubled after each look that found nothing
        self.gzip_ahead = False  # the latest list was gzipped: blocks rendered ahead are compressed too
        # nodes whose blocks a gzipped list sent uncompressed: rendering ahead compresses them
        self._to_compress: dict[str, None] = {}
        # seconds without a list after which the blocks are dropped (RELEASE_AFTER_RESOLUTIONS)
        self.release_after = RELEASE_AFTER_RESOLUTIONS * (prerender_within or PRERENDER_WITHIN)
        self._release_handle: asyncio.TimerHandle | None = None
        self._list_started = -1e9  # monotonic time the latest list started
        self.releases = 0  # times every block was dropped

    def cached(self) -> int:
        """How many node blocks are held."""
        return len(self._blocks)

    async def items(
        self, store: PodBlocks, now: float, created: str, *, gzip_head: bytes | None = None
    ) -> AsyncIterator[bytes]:
        """The items (in chunks of about :data:`BLOCK_CHUNK_BYTES`) of every Running pod that has
        usage in ``store``, node by node (see the module docstring). With ``gzip_head``: the whole
        list instead, ``gzip_head``, the items and ``]}``, as one gzip member spliced from blocks
        compressed once (:mod:`.gzblocks`; needs :data:`gzblocks.AVAILABLE` and a 22-byte
        ``created`` in JSON)."""
        started = self._list_started = time.monotonic()
        changes_at_start, _ = store.pod_block_changes(self._changes_seen)  # this list checks every node
        blocks = self._blocks
        lookup = self.inventory.pod
        self._apply_inventory_changes(store)
        relists = self._relists
        check_all = self._checked_relists != relists or not isinstance(self.inventory, PodChangeLog)
        created_json = _dumps(created)
        gz = None if gzip_head is None else gzblocks.GzipList(created_json)
        self.gzip_ahead = gz is not None  # blocks rendered ahead are compressed while lists are gzipped
        usage_text = UsageText(self.renderer.texts, TimeFormatter())
        # While rendering ahead (lists come at least once a resolution), a block that a newer scrape
        # of its node superseded stands in for it if it was rendered within STAND_IN_FOR, the
        # inventory still holds its pods as they were (with a change log, _apply_inventory_changes
        # dropped above the blocks holding a changed pod, as for a current block; without one, each
        # block is checked pod by pod), and the store still has each from this node (not from
        # another's scrape: it would be listed twice), which the node's claims number
        # (ResourceStore.node_claims) says in one lookup: the node is left to rendering ahead, which
        # replaces the block soon. So a list during a cycle renders little, and serves some nodes as
        # of their previous scrape (each item's timestamp says so), as metrics-server serves a whole
        # cycle older until its cycle ends.
        stand_in = self._prerender_handle is not None and started <= self._prerender_until
        claims = store.node_claims
        rendered_since = started - STAND_IN_FOR * self.prerender_within
        pending = self._pending
        to_compress = self._to_compress
        seen: list[str] = []
        pieces: list[bytes] = [] if gz is None else [gz.start(gzip_head or b"")]
        size = work = 0
        first = True
        turn = ListTurn()
        chunk_bytes = BLOCK_CHUNK_BYTES if gz is None else GZIP_CHUNK_BYTES
        run: list[gzblocks.CompressedBlock] = []  # spliced blocks not in ``pieces`` yet
        for node, token in store.pod_blocks(now):
            seen.append(node)
            block = blocks.get(node)
            compressed = None  # the node's block, to be spliced
            if (
                gz is not None
                and not first
                and block is not None
                and block.token is token
                and block.gz is not None
                and block.gz is not NO_SPLICE
                and block.text
                and (not check_all or block.unchanged_in(lookup))
            ):
                # The usual case, a node as the last list had it, compressed: its block joins the
                # run that GzipList.blocks splices in one call (bench/list_render.py, 5000 nodes,
                # two runs each, alternated: a gzipped list 39 and 36 -> 32 and 29 ms, its CPU
                # 39 and 33 -> 31 and 28 ms).
                work += 1
                compressed = block.gz
            else:
                if block is None:
                    pass
                elif block.token is token:
                    work += 1
                    if check_all and not block.unchanged_in(lookup):
                        block = None  # a pod of the node changed (labels, phase) or left the inventory
                elif (
                    stand_in
                    and block.text  # a node with no pod served yet (a first scrape) is rendered now
                    and block.rendered >= rendered_since
                    and block.claims == claims(node)
                    and (not check_all or block.unchanged_in(lookup))
                ):
                    work += 1
                    pending[node] = None
                    BLOCKS_PREVIOUS.inc()
                else:
                    block = None
                if block is None:
                    block = blocks[node] = self._node_block(node, token, store, usage_text)
                    work += len(block.infos)
                    _ON_LIST.inc()
                    if gz is not None and not first and block.text:
                        # compressed as it is rendered (~30 µs a 30-pod block), so that the next
                        # gzipped list splices it: in process at 5000 nodes, the lists right after a
                        # cold one compressed all 57 MB whole, 108-160 ms, against 37-74 ms spliced
                        block.compressed()
                        work += len(block.infos) // COMPRESS_PODS
                if block.text:
                    if gz is not None and not first:  # the first item goes without its comma: not spliced
                        if block.gz is None:  # compressed later, if rendering ahead goes on
                            to_compress[node] = None
                        elif block.gz is not NO_SPLICE:
                            compressed = block.gz
                    if compressed is None:
                        text = block.text.replace(b"\0", created_json)
                        if first:
                            text = text[1:]  # no separator before the first item
                            first = False
                        if gz is not None:
                            gz.blocks(run, pieces)  # the blocks before it, then its text
                            run.clear()
                        piece = text if gz is None else gz.text(text)
                        pieces.append(piece)
                        size += len(piece)
            if compressed is not None:
                run.append(compressed)
                size += len(compressed.lead) + len(compressed.rest)
            if size >= chunk_bytes:
                if gz is not None:
                    gz.blocks(run, pieces)
                    run.clear()
                chunk = b"".join(pieces)
                pieces = []
                size = 0
                turn.end()
                yield chunk  # written, and drained: the loop runs other work meanwhile
                turn.begin()
            if work >= YIELD_CHECK:  # pods rendered or blocks taken as they were
                work = 0
                await turn.check()
        if gz is not None:
            gz.blocks(run, pieces)
            pieces.append(gz.finish(b"]}"))
        turn.end()
        if pieces:
            yield b"".join(pieces)
        # Every block was checked (a list cut short, or a relist meanwhile, leaves the next to it),
        # and rendered as of the store's changes at the start.
        self._checked_relists = relists
        self._changes_seen = changes_at_start
        if len(blocks) > 2 * len(seen) + BLOCKS_SLACK:
            for node in blocks.keys() - set(seen):
                del blocks[node]
        await self.renderer.sweep_if_grown()
        self._keep_rendering(store, started)

    def _apply_inventory_changes(self, store: PodBlocks) -> None:
        """Drop the blocks holding a pod the inventory changed since the last call. When it cannot
        tell (its log no longer reaches back: a relist), the next list checks every block, as it
        always does with an inventory without a change log."""
        if not isinstance(self.inventory, PodChangeLog):
            return
        version, changed = self.inventory.pod_changes(self._inventory_version)
        self._inventory_version = version
        if changed is None:
            self._relists += 1
            return
        blocks = self._blocks
        owner = store.pod_node
        pending = self._pending
        for namespace, name in changed:
            node = owner(namespace, name)
            if blocks.pop(node, None) is not None:
                pending[node] = None  # rendered again ahead (or by the next list)

    # -- rendering ahead -----------------------------------------------------------------------
    # At 15 s resolution a node's readings change every 15 s, so a list a scrape cycle after the
    # last one renders every pod again (~7 µs a pod in process: 1.0-1.9 s at 150 000 pods). When lists of every
    # pod come at least once a resolution (a `watch kubectl top pods -A`, a dashboard), each node
    # is rendered once per scrape whoever does it: then it is done in the background right after
    # the scrape, a slice at a time between other work (loop callbacks: no task to cancel at
    # shutdown), and the next list finds it ready. It goes on for twice the last gap between two
    # such lists (at most ``prerender_within``), so it stops soon after the lists do; a shorter gap
    # never ends it sooner: two clients listing at once start lists milliseconds apart between
    # longer gaps, and at 5000 nodes such a short window let 56 lists under two clients render
    # 11 379 nodes themselves (lists up to 1479 ms), against 501 (up to 603 ms) once it could not
    # shrink. Lists further apart (the VPA recommender's every minute, someone's occasional `kubectl
    # top`) never start it: rendering ahead would then cost more than rendering on demand.

    def _keep_rendering(self, store: PodBlocks, started: float) -> None:
        """Called as a list of every pod that started at ``started`` ends."""
        loop = asyncio.get_running_loop()
        if self._release_handle is not None:
            self._release_handle.cancel()
        self._release_handle = loop.call_later(self.release_after, self._release)
        gap = started - self._last_all_pods
        self._last_all_pods = started
        if gap > self.prerender_within:
            return
        until = time.monotonic() + min(2 * gap, self.prerender_within)
        self._prerender_until = max(self._prerender_until, until)
        self._prerender_store = store
        if self._prerender_handle is None:
            self._prerender_handle = loop.call_later(PRERENDER_PERIOD, self._prerender_step)

    def _release(self) -> None:
        """No list for ``release_after`` seconds: drop every block (they are stale) and hand the
        freed memory back (:func:`kcms.heap.trim_heap`); later while rendering ahead."""
        self._release_handle = None
        # still rendering ahead (lists may come again), or a list is under way
        if self._prerender_handle is not None or time.monotonic() - self._list_started < self.release_after:
            loop = asyncio.get_running_loop()
            self._release_handle = loop.call_later(self.release_after, self._release)
            return
        self._pending.clear()
        self._to_compress.clear()
        if self._blocks:
            self._blocks = {}
            self.releases += 1
            trim_heap()

    def _prerender_step(self) -> None:
        """Render stale blocks for about :data:`PRERENDER_TURN_SECONDS`, of the nodes changed since
        the last step; come back at once while there are more, after :data:`PRERENDER_PERIOD` when
        none are left, and twice as late each time a step found none changed (up to
        :data:`PRERENDER_IDLE_PERIOD`: between scrape cycles)."""
        self._prerender_handle = None
        store = self._prerender_store
        now = time.monotonic()
        if store is None or now > self._prerender_until:
            self._prerender_store = None
            return
        self._apply_inventory_changes(store)  # the dropped blocks are rendered again below
        version, changed = store.pod_block_changes(self._changes_seen)
        self._changes_seen = version
        if changed is None:  # the store's log no longer reaches back: check every node
            changed = [node for node, _ in store.pod_blocks(now)]
        pending = self._pending
        pending.update(dict.fromkeys(changed))
        blocks = self._blocks
        token_of = store.pod_block
        usage_text = UsageText(self.renderer.texts, TimeFormatter())
        step = PRERENDER_STREAMING_TURN_SECONDS if STREAMS.count else PRERENDER_TURN_SECONDS
        end = perf_counter() + step
        period = PRERENDER_PERIOD if pending else min(2 * self._prerender_period, PRERENDER_IDLE_PERIOD)
        self._prerender_period = period
        while pending and perf_counter() < end:
            node = pending.popitem()[0]  # the newest first: O(1), where the oldest would not be
            token = token_of(node, now)
            block = blocks.get(node)
            if token is not None and (block is None or block.token is not token):
                block = blocks[node] = self._node_block(node, token, store, usage_text)
                _AHEAD.inc()
                if self.gzip_ahead and block.text:
                    block.compressed()
        to_compress = self._to_compress
        if not self.gzip_ahead:
            to_compress.clear()
        while to_compress and perf_counter() < end:
            block = blocks.get(to_compress.popitem()[0])
            if block is not None and block.gz is None and block.text:
                block.compressed()
        loop = asyncio.get_running_loop()
        more = pending or to_compress
        self._prerender_handle = loop.call_later(0 if more else period, self._prerender_step)

    def _node_block(self, node: str, token: object, store: PodBlocks, text: UsageText) -> _NodeBlock:
        """Render one node's pods as a :class:`_NodeBlock` (metadata pieces from the renderer's
        pod cache; the usage rendered straight from the readings: no PodUsage is made or kept)."""
        lookup = self.inventory.pod
        pieces_of = self.renderer.pod_pieces
        keys: list[PodKey] = []
        infos: list[PodInfo | None] = []
        parts: list[bytes] = []
        pending = b""  # the previous item's body, joined with the next item's head
        # The pods whose readings are this node's (not those that moved to another node's scrape).
        claims = store.node_claims(node)
        for key, usage in store.node_pod_rates(node, text.container, text.pod):
            pod = lookup(*key)
            keys.append(key)
            infos.append(pod)
            if pod is None or pod.phase != "Running" or usage is None:
                continue
            entry = pieces_of(pod)
            parts.append(pending + entry[1])
            pending = entry[2] + usage
        if parts:
            parts.append(pending)
        return _NodeBlock(token, tuple(keys), tuple(infos), b"\0".join(parts), claims)
