"""Resource metrics storage with metrics-server semantics.

Per node and per container we keep the last reading and the one before it. CPU usage is the
delta of the cumulative counter over the delta of the readings' timestamps, taken only between
two readings of the same container start, so a restart or a counter reset never yields a
negative or inflated rate. Readings are stored node by node as each scrape completes; a node
that stops answering keeps its readings until they are older than ``max_age`` and is then
dropped, so nothing is ever served frozen at an old value.

Every batch is screened on the way in (:func:`kcms.sources.bounds.screen_batch`: a reading more
than ``--max-future-skew`` ahead, negative, non-finite or absurd, or with an oversized name, is
refused, its pod with it), whoever wrote it: a collector, a node push, a peer's copy (a batch a
kubelet decoder of this process has just screened against the same or an earlier limit, as its
``screened`` field says, is not looked at twice; a batch read from any wire, a scrape worker's
included, is). A pair of
readings whose rate would be over :data:`kcms.sources.bounds.MAX_CPU_CORES` cores gives no rate
(``absurd_rate``), and a counter that went down within one container start is a new base, never a
negative rate (``counter_backwards``). All are counted in ``kcms_store_refused_readings_total{reason}``.

A batch a kubelet decoder built from aligned columns (``NodeBatch.columns``) whose series are the
node's last scrape's, each newer, of the same start, its counter not lower and its rate within
bounds (the usual scrape) is stored a column at a time, in C: a pod's pairs of readings are made
when it is read and not kept (:func:`_pod_readings`), and the history takes the columns too. Live
at 50 nodes (``bench/fixed_costs.py --per-scrape``) the store went from 217-282 to 125-152 us a
scrape; anything else goes container by container, and a property test holds the two paths to the
same reads, counts, refusals and history (tests/test_store_columns.py).

A pod's usage is computed on the first read after its node's readings were stored and kept until
the node's next write (lists by namespace or selector compute each pod once per scrape, not once
per request). The usage objects are made for the cyclic garbage collector to ignore: :class:`Usage`
and :class:`PodUsage` are ``msgspec`` structs with ``gc=False`` (never tracked: they hold numbers,
strings and tuples, so cannot be part of a cycle), and a pod's containers are a tuple of
``(name, Usage)`` tuples, which the collector untracks in its young passes (tuples holding only
untracked objects are dropped from tracking when a pass sees them). Listing 150 000 pods right
after a scrape used to leave ~900 000 tracked objects behind (per pod a dataclass and a list, per
container a dataclass and a tuple), and the full collections they triggered stalled the event loop
for up to 0.8 s. Even the tuples cost: made while as many objects are freed, they stay in the
youngest generation until a pass sees them all at once, so the list of every pod keeps no usage
object at all (:func:`pod_rates`, :meth:`ResourceStore.node_pod_rates`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from prometheus_client import Counter, Gauge

from kcms.changelog import ChangeLog
from kcms.model import ContainerColumns, NodeBatch, PodKey, ResourcePoint
from kcms.sources.bounds import MAX_NANOCORES, REASONS, screen_batch
from kcms.store.columns import column_pod_rates, column_rates
from kcms.store.usage import PodUsage, Usage

if TYPE_CHECKING:
    from kcms.store.history import HistoryStore

STORED = Gauge("kcms_store_objects", "What the resource store holds, by kind (nodes, pods, points).", ["kind"])
ABSURD_RATE = "absurd_rate"
COUNTER_BACKWARDS = "counter_backwards"
REFUSED = Counter(
    "kcms_store_refused_readings",
    "Resource readings (or rates from a pair of them) the store refused and never serves, by reason.",
    ["reason"],
)
for _reason in (*REASONS, ABSURD_RATE, COUNTER_BACKWARDS):
    REFUSED.labels(_reason)

# A container that started less than this long before its first reading gets no synthetic
# "zero at start time" previous point: its first rate would rest on too short a window.
FRESH_CONTAINER_MIN_AGE = 10.0
# Node writes the log of pod_block_changes keeps at least: a reader further behind checks every node.
NODE_CHANGE_LOG = 16384

_MISSING = object()

# Per container: (last reading, previous reading usable for a rate, or None)
_Pair = tuple[ResourcePoint, ResourcePoint | None]
_C = TypeVar("_C")
_P = TypeVar("_P")


def pod_rates(
    pairs: Iterable[tuple[str, _Pair]],
    container: Callable[[str, float, float, int, int], _C],
    pod: Callable[[float, float, list[_C]], _P],
) -> _P | None:
    """A pod's usage as ``pod(timestamp, window, [container(name, timestamp, window, nanocores,
    memory), ...])`` from its containers' ``(name, (last reading, reading before))``, or None
    unless there is a container and every container has a usable rate (two readings of one
    container start, a positive span, a counter that did not go down, at most MAX_NANOCORES). The
    pod's timestamp and window are its oldest container reading's: no part of it is newer. Pairs
    as an iterable, not a dict: a pod stored a column at a time has no dict of them
    (:func:`_pod_readings`).

    The one place these rules live: the store makes :class:`PodUsage` with it, and the list of
    every pod renders JSON text with it directly (:mod:`kcms.apis.metrics.blocks`), keeping no
    object per pod: at 150 000 pods the PodUsage tuples of a full render sat in the collector's
    youngest generation (~450 000 of them), and the next list paid 180-250 ms for the pass that
    untracked them."""
    parts: list[_C] = []
    timestamp = window = 0.0
    for cname, (last, prev) in pairs:
        if prev is None:
            return None
        at = last.timestamp
        span = at - prev.timestamp
        cpu = last.cpu_ns - prev.cpu_ns
        if span <= 0 or cpu < 0:
            return None
        rate = cpu / span
        if rate > MAX_NANOCORES:
            return None
        parts.append(container(cname, at, span, int(rate), last.memory))
        if timestamp == 0.0 or at < timestamp:
            timestamp, window = at, span
    if not parts:
        return None
    return pod(timestamp, window, parts)


def _container_usage(name: str, timestamp: float, window: float, nanocores: int, memory: int) -> tuple[str, Usage]:
    return name, Usage(timestamp, window, nanocores, memory)


def _pod_usage_of(timestamp: float, window: float, containers: list[tuple[str, Usage]]) -> PodUsage:
    return PodUsage(timestamp, window, tuple(containers))


@dataclass(slots=True)
class _NodeEntry:
    received: float  # monotonic time the newest scrape of this node was stored
    last: ResourcePoint | None = None
    prev: ResourcePoint | None = None
    # pod -> container -> (last, previous); None while ``columns`` and ``before`` hold them (_pairs())
    pods: dict[PodKey, dict[str, _Pair]] | None = field(default_factory=dict)
    # Pod usages computed since the last store() of this node: a list of all pods computes each
    # pod's usage once per scrape, not once per request.
    usage: dict[PodKey, PodUsage | None] = field(default_factory=dict)
    points: int = 0  # readings held (node and containers, last and previous): for stats()
    # -- the column path (ResourceStore._store_columns) --
    columns: ContainerColumns | None = None  # the newest scrape's, when every container came from them
    layout: object = None  # the same object while the node's series stay the same (for the history)
    moves: int = 0  # the store's count of pods moved between nodes when these pods were claimed
    claims: int = 0  # a new number (ResourceStore.node_claims) each time a pod left these readings
    # the scrape before ``columns``, the same series in the same order (its columns only: the
    # previous batch's dicts would keep its name strings alive)
    before: ContainerColumns | None = None


def _pairs(entry: _NodeEntry) -> dict[PodKey, dict[str, _Pair]]:
    """``entry``'s pairs of readings, made (and kept) from ``columns`` and ``before`` after a
    column store (both scrapes had the same series in the same order). For writes and copies
    only; reads use :func:`_pod_readings` and :meth:`ResourceStore.node_pod_rates`, which keep
    nothing: making and keeping every pod's pairs at the first read after a cycle took ~300 ms at
    90 000 pods, where the loop had made them scrape by scrape."""
    pods = entry.pods
    if pods is None:
        columns, before = entry.columns, entry.before
        assert columns is not None and before is not None
        last, earlier = columns.readings, before.readings
        pods = {
            key: dict(zip(names, zip(last[at : at + len(names)], earlier[at : at + len(names)], strict=True), strict=True))
            for key, (at, names) in columns.places.of.items()
        }
        entry.pods = pods
        entry.before = None
    return pods


def _pod_keys(entry: _NodeEntry) -> Iterable[PodKey]:
    """The pods of ``entry``'s newest scrape (some may be owned by another node's since)."""
    if entry.pods is not None:
        return entry.pods
    assert entry.columns is not None  # stored a column at a time
    return entry.columns.places.of


def _pod_readings(entry: _NodeEntry, key: PodKey) -> Iterable[tuple[str, _Pair]]:
    """One pod's ``(container, (last reading, reading before))`` for :func:`pod_rates` (empty: no
    such pod); no dict of pairs is made (nor kept) for a pod stored a column at a time."""
    if entry.pods is not None:
        pairs = entry.pods.get(key)
        return () if pairs is None else pairs.items()
    columns, before = entry.columns, entry.before
    assert columns is not None and before is not None
    place = columns.places.of.get(key)
    if place is None:
        return ()
    at, names = place
    # Only this pod's points, not its node's: a namespace's pods lie on many nodes, and a query of
    # one namespace would otherwise make every point of each of them (120 a node of 60 containers).
    series = columns.places.order[at : at + len(names)]
    return zip(names, zip(columns.points(series), before.points(series), strict=True), strict=True)


def _previous_for(new: ResourcePoint, old: _Pair | None, resolution: float) -> ResourcePoint | None:
    """Pick the reading to take a rate against for ``new``, given what was stored before."""
    if old is not None:
        last, prev = old
        same_start = new.start_time == last.start_time
        if same_start and new.cpu_ns >= last.cpu_ns:
            if new.timestamp > last.timestamp:
                return last
            # The kubelet served the same (or an older) reading again: keep the older pair.
            if prev is not None and prev.timestamp < new.timestamp and prev.cpu_ns <= new.cpu_ns:
                return prev
            return None
    # First reading of this container start (new container, restart or counter reset). A
    # container that started recently used all its CPU since its start: take the start as a
    # zero reading, so a fresh container is served after one scrape, not two.
    age = new.timestamp - new.start_time
    if new.start_time > 0 and FRESH_CONTAINER_MIN_AGE <= age < resolution:
        return ResourcePoint(new.start_time, new.start_time, 0, new.memory)
    return None


def _absurd(new: ResourcePoint, prev: ResourcePoint) -> bool:
    """True when the rate from ``prev`` to ``new`` would be over MAX_NANOCORES (a counter jump)."""
    return new.cpu_ns - prev.cpu_ns > MAX_NANOCORES * (new.timestamp - prev.timestamp)


def _usage(last: ResourcePoint, prev: ResourcePoint) -> Usage | None:
    window = last.timestamp - prev.timestamp
    if window <= 0 or last.cpu_ns < prev.cpu_ns:
        return None
    rate = (last.cpu_ns - prev.cpu_ns) / window
    if rate > MAX_NANOCORES:  # refused when stored; kept here so that no path can serve one
        return None
    return Usage(last.timestamp, window, int(rate), last.memory)


def _newest(entry: _NodeEntry) -> float:
    newest = entry.last.timestamp if entry.last is not None else 0.0
    if entry.pods is None:  # stored a column at a time: the newest readings' times, no pairs made
        assert entry.columns is not None
        return max(newest, *entry.columns.times)
    for pairs in entry.pods.values():
        for last, _ in pairs.values():
            if last.timestamp > newest:
                newest = last.timestamp
    return newest


def _batch_newest(batch: NodeBatch) -> float:
    newest = batch.node_point.timestamp if batch.node_point is not None else 0.0
    for containers in batch.pods.values():
        for p in containers.values():
            if p.timestamp > newest:
                newest = p.timestamp
    return newest


class ResourceStore:
    """Last and previous readings of every node and container, as metrics-server keeps them."""

    def __init__(self, resolution: float, max_age: float | None = None) -> None:
        self.resolution = resolution
        # Readings of a node that stopped answering are served for at most this long.
        self.max_age = max_age if max_age is not None else 2 * resolution
        self._nodes: dict[str, _NodeEntry] = {}
        self._pod_node: dict[PodKey, str] = {}
        self._moves = 0  # pods whose readings moved from one node's scrapes to another's, ever
        self._claims = itertools.count(1)  # node_claims()
        self._token_changes: ChangeLog[str] = ChangeLog(NODE_CHANGE_LOG)  # pod_block_changes()
        self._fresh: tuple[float, list[tuple[str, object]]] | None = None  # pod_blocks(): (oldest, list)
        # --history: every stored scrape is also recorded there (kcms/store/history.py)
        self.history: HistoryStore | None = None
        self._paired = False  # some reading was stored with one before it (a rate could be taken)
        self._ready = False  # a node or pod could be served (ready() latches it)

    # -- writing ----------------------------------------------------------------------------

    def store(self, batch: NodeBatch, received: float | None = None) -> None:
        """Store one node's scrape; its pods not in ``batch`` are forgotten. Readings outside the
        bounds are dropped from ``batch`` (see the module docstring) and counted. A batch with
        columns may be kept as it is (its ``pods`` dicts): the caller must not change it after."""
        received = time.monotonic() if received is None else received
        counts = screen_batch(batch)
        node = batch.node
        entry = self._nodes.get(node)
        if entry is None:
            entry = self._nodes[node] = _NodeEntry(received, claims=next(self._claims))
        entry.received = received

        point = batch.node_point
        if point is None:
            entry.last = entry.prev = None
        else:
            old = (entry.last, entry.prev) if entry.last is not None else None
            prev = _previous_for(point, old, 0.0)  # nodes have no fresh-start shortcut
            entry.prev = self._checked(point, old, prev, counts)
            entry.last = point
            self._paired = self._paired or entry.prev is not None

        columns = batch.columns
        if columns is None or entry.columns is None or not self._store_columns(entry, batch, columns):
            self._store_pods(entry, batch, counts)
        for reason, n in counts.items():
            REFUSED.labels(reason).inc(n)

    def _store_pods(self, entry: _NodeEntry, batch: NodeBatch, counts: dict[str, int]) -> None:
        """:meth:`store`'s pods, container by container (any batch :meth:`_store_columns` does not
        take); counts refusals into ``counts``."""
        node = batch.node
        resolution = self.resolution
        old_pods = _pairs(entry)
        new_pods: dict[PodKey, dict[str, _Pair]] = {}
        pod_node = self._pod_node
        moved_from: set[str] = set()
        containers_in = no_previous = 0  # for the points count (stats())
        for key, containers in batch.pods.items():
            old_containers = old_pods.get(key)
            pairs: dict[str, _Pair] = {}
            containers_in += len(containers)
            for name, new in containers.items():
                old = old_containers.get(name) if old_containers is not None else None
                if old is not None:
                    last = old[0]
                    # The common case, inlined (a third of the store's time at 60 containers a node).
                    if (
                        new.timestamp > last.timestamp
                        and new.start_time == last.start_time
                        and new.cpu_ns >= last.cpu_ns
                        and new.cpu_ns - last.cpu_ns <= MAX_NANOCORES * (new.timestamp - last.timestamp)
                    ):
                        pairs[name] = (new, last)
                        continue
                prev = self._checked(new, old, _previous_for(new, old, resolution), counts)
                pairs[name] = (new, prev)
                no_previous += prev is None
            new_pods[key] = pairs
            owner = pod_node.get(key)
            if owner != node:
                pod_node[key] = node
                if owner is not None:  # the pod moved here: the other node's view changed too
                    moved_from.add(owner)
        for key in old_pods.keys() - new_pods.keys():
            if pod_node.get(key) == node:
                del pod_node[key]
                entry.claims = next(self._claims)  # a new number per pod dropped: any new one will do
        entry.pods = new_pods
        self._new_token(node, entry)
        entry.points = 2 * containers_in - no_previous + (entry.last is not None) + (entry.prev is not None)
        self._paired = self._paired or containers_in > no_previous
        for other in moved_from:
            other_entry = self._nodes.get(other)
            if other_entry is not None:
                self._new_token(other, other_entry)
                other_entry.claims = next(self._claims)
        self._moves += len(moved_from)
        entry.moves = self._moves
        entry.columns = batch.columns  # None unless every container of the batch came from them
        entry.layout = object()
        if self.history is not None:
            self.history.record(node, entry.last, entry.prev, new_pods, entry.layout)

    def _store_columns(self, entry: _NodeEntry, batch: NodeBatch, columns: ContainerColumns) -> bool:
        """Store ``batch`` a column at a time when it holds the same series as the node's last
        scrape, each newer, of the same start, its counter not lower and its rate within
        MAX_NANOCORES: then every container's pair is (new reading, last one), as :meth:`store`
        would pair them one by one, and a pod's pairs are made when it is read (:func:`_pod_readings`).
        False (nothing changed) otherwise. A node of 60 containers, in process, with the history:
        159 -> 50 us (23 without the history, against 82 for the loop)."""
        old = entry.columns
        assert old is not None
        if (
            entry.moves != self._moves  # some pod changed nodes: ownership is checked pod by pod
            or columns.signature != old.signature
            or columns.start != old.start
        ):
            return False
        rates = column_rates(columns.times, old.times, columns.cpu_ns, old.cpu_ns)
        if rates is None:
            return False
        entry.before = old  # the last readings, the same series in the same order as the new ones
        self._paired = True
        entry.pods = None  # ``batch.pods`` is not made: reads find a pod by columns.places
        entry.columns = columns
        self._new_token(batch.node, entry)
        entry.points = 2 * len(columns.times) + (entry.last is not None) + (entry.prev is not None)
        history = self.history
        if history is not None and not history.record_columns(
            batch.node, entry.last, entry.prev, entry.layout, columns, rates
        ):
            history.record(batch.node, entry.last, entry.prev, _pairs(entry), entry.layout)
        return True

    def _new_token(self, node: str, entry: _NodeEntry) -> None:
        """``node``'s pods or readings changed: drop the usages computed from the old ones, which
        gives it a new :meth:`pod_blocks` token, and log it for :meth:`pod_block_changes`."""
        entry.usage = {}
        self._token_changes.add(node)
        self._fresh = None  # not kept: it would hold the old tokens' usages alive until the next list

    @staticmethod
    def _checked(
        new: ResourcePoint, old: _Pair | None, prev: ResourcePoint | None, counts: dict[str, int]
    ) -> ResourcePoint | None:
        """``prev`` unless the rate from it to ``new`` is absurd; counts that and a counter that
        went backwards within one container start (both leave ``new`` as a fresh base)."""
        if old is not None and new.start_time == old[0].start_time and new.cpu_ns < old[0].cpu_ns:
            counts[COUNTER_BACKWARDS] = counts.get(COUNTER_BACKWARDS, 0) + 1
        if prev is not None and _absurd(new, prev):
            counts[ABSURD_RATE] = counts.get(ABSURD_RATE, 0) + 1
            return None
        return prev

    def forget_node(self, node: str) -> None:
        entry = self._nodes.pop(node, None)
        if entry is None:
            return
        self._fresh = None
        for key in _pod_keys(entry):
            if self._pod_node.get(key) == node:
                del self._pod_node[key]

    def expire(self, now: float | None = None) -> list[str]:
        """Drop nodes whose newest readings are older than ``max_age``; return their names."""
        now = time.monotonic() if now is None else now
        stale = [n for n, e in self._nodes.items() if now - e.received > self.max_age]
        for node in stale:
            self.forget_node(node)
        return stale

    def export_nodes(self, select: Callable[[str], bool] | None = None) -> list[tuple[NodeBatch, NodeBatch]]:
        """Every node's readings as ``(previous, last)`` batches, for copying to another replica
        (refill, read repair); ``select(node)`` picks nodes. Containers with no previous reading are
        only in ``last``."""
        out = []
        for node, entry in self._nodes.items():
            if select is not None and not select(node):
                continue
            prev = NodeBatch(node, entry.prev)
            last = NodeBatch(node, entry.last)
            for key, pairs in _pairs(entry).items():
                last.pods[key] = {c: pair[0] for c, pair in pairs.items()}
                older = {c: pair[1] for c, pair in pairs.items() if pair[1] is not None}
                if older:
                    prev.pods[key] = older
            out.append((prev, last))
        return out

    def merge_node(self, prev: NodeBatch, last: NodeBatch) -> bool:
        """Take another replica's readings of a node (an :meth:`export_nodes` pair) unless ours are
        as new; True when taken."""
        entry = self._nodes.get(last.node)
        if entry is not None and _newest(entry) >= _batch_newest(last):
            return False
        self.store(prev)
        self.store(last)
        return True

    def newest(self, node: str) -> float:
        """Timestamp of the newest reading held for ``node`` (0.0: none)."""
        entry = self._nodes.get(node)
        return 0.0 if entry is None else _newest(entry)

    # -- reading ----------------------------------------------------------------------------

    def _fresh_entry(self, node: str, now: float) -> _NodeEntry | None:
        entry = self._nodes.get(node)
        if entry is None or now - entry.received > self.max_age:
            return None
        return entry

    def node_usage(self, node: str, now: float | None = None) -> Usage | None:
        entry = self._fresh_entry(node, time.monotonic() if now is None else now)
        if entry is None or entry.last is None or entry.prev is None:
            return None
        return _usage(entry.last, entry.prev)

    def pod_usage(self, namespace: str, name: str, now: float | None = None) -> PodUsage | None:
        """Usage of every container of a pod, or None unless every container has a usable rate."""
        # Called for every pod of a list: _fresh_entry() inlined.
        key = (namespace, name)
        node = self._pod_node.get(key)
        if node is None:
            return None
        entry = self._nodes.get(node)
        if entry is None or (time.monotonic() if now is None else now) - entry.received > self.max_age:
            return None
        usage = entry.usage.get(key, _MISSING)
        if usage is _MISSING:  # the first read since the node's last write
            usage = entry.usage[key] = pod_rates(_pod_readings(entry, key), _container_usage, _pod_usage_of)
        return usage  # type: ignore[return-value]

    def pod_blocks(self, now: float | None = None) -> list[tuple[str, object]]:
        """``(node, token)`` for every node whose readings are fresh, in store order. ``token`` is the
        same object until the node's pods or readings change (a new scrape of the node, or one of its
        pods moving to another node's scrape): a list renderer caches a node's rendered pods
        (:meth:`node_pod_usages`) under it. The same list while no token changed and every node is
        still fresh (making it took 2.8-5.0 ms of a 5000-node list's first chunk): callers must not
        change it."""
        now = time.monotonic() if now is None else now
        max_age, nodes, fresh = self.max_age, self._nodes, self._fresh
        if fresh is not None and now - fresh[0] <= max_age:  # every write drops it (_new_token)
            return fresh[1]
        listed = [(node, entry.usage) for node, entry in nodes.items() if now - entry.received <= max_age]
        if nodes and len(listed) == len(nodes):  # the oldest still fresh: each is
            self._fresh = (min(entry.received for entry in nodes.values()), listed)
        return listed

    def pod_block(self, node: str, now: float) -> object | None:
        """``node``'s token as :meth:`pod_blocks` gives it, or None when its readings are not fresh."""
        entry = self._nodes.get(node)
        return None if entry is None or now - entry.received > self.max_age else entry.usage

    def pod_block_changes(self, since: int) -> tuple[int, list[str] | None]:
        """``(version, nodes whose token changed after version ``since``)``, oldest first, a node
        possibly more than once; None instead of the nodes when that is no longer known (then any
        may have). A cache of rendered nodes checks these alone rather than every node: at 5000
        nodes, going through :meth:`pod_blocks` for each slice of rendering ahead took a quarter of
        the event loop during scrape cycles."""
        return self._token_changes.since(since)

    def node_claims(self, node: str) -> int | None:
        """A number that changes when a pod's readings stop being ``node``'s (another node's scrape
        has it, or its own no longer does) or the node is stored anew (None: not held); while it
        stays, every pod :meth:`node_pod_rates` gave for ``node`` is still its own (see blocks.py)."""
        entry = self._nodes.get(node)
        return None if entry is None else entry.claims

    def node_pod_rates(
        self,
        node: str,
        container: Callable[[str, float, float, int, int], _C],
        pod: Callable[[float, float, list[_C]], _P],
    ) -> list[tuple[PodKey, _P | None]]:
        """Each pod whose readings are ``node``'s with :func:`pod_rates` of them (computed, not
        cached: the caller keeps what it makes), in scrape order; no freshness check: the caller
        got ``node`` from :meth:`pod_blocks`."""
        entry = self._nodes.get(node)
        if entry is None:
            return []
        owner = self._pod_node
        if entry.pods is not None:
            return [
                (key, pod_rates(pairs.items(), container, pod))
                for key, pairs in entry.pods.items()
                if owner.get(key) == node
            ]
        columns, before = entry.columns, entry.before
        assert columns is not None and before is not None
        keep = lambda key: owner.get(key) == node  # noqa: E731
        got = column_pod_rates(columns, before, keep, container, pod)  # the node's rates at once
        if got is not None:
            return got
        return [(k, pod_rates(_pod_readings(entry, k), container, pod)) for k in columns.places.of if keep(k)]

    def node_names(self) -> list[str]:
        return list(self._nodes)

    def pod_keys(self) -> list[PodKey]:
        return list(self._pod_node)

    def pod_node(self, namespace: str, name: str) -> str:
        """The node whose scrape carried the pod ("" if none)."""
        return self._pod_node.get((namespace, name), "")

    def ready(self) -> bool:
        """True once a node or pod could be served, and from then on (as metrics-server's storage,
        ready once it holds a previous batch; nodes that stop answering show in /readyz's
        nodes-scraped detail instead). Every /readyz probe asks, and anyone may send one: until a
        reading has been stored with one before it this looks at nothing (it computed every pod's
        usage: 126-259 ms of event loop a probe at 150 000 pods before the second scrape), then node by
        node until one can be served."""
        if self._ready or not self._paired:
            return self._ready
        now = time.monotonic()
        for node, entry in self._nodes.items():
            if self.node_usage(node, now) is not None or any(
                self.pod_usage(ns, name, now) is not None for ns, name in _pod_keys(entry)
            ):
                self._ready = True
                break
        return self._ready

    def stats_pods(self) -> int:
        """How many pods have readings."""
        return len(self._pod_node)

    def publish_stats(self) -> None:
        """Export stats() as the kcms_store_objects gauge."""
        for kind, value in zip(("nodes", "pods", "points"), self.stats(), strict=True):
            STORED.labels(kind).set(value)

    def stats(self) -> tuple[int, int, int]:
        """(nodes, pods, stored readings) — for our own metrics."""
        # counted by store() (this ran over every reading each cycle: ~50 ms at 150 000 pods)
        return len(self._nodes), len(self._pod_node), sum(e.points for e in self._nodes.values())
