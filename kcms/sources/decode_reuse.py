"""Re-use of a node's unchanged ``container_start_time_seconds`` block across scrapes.

Kept apart from :mod:`kcms.sources.kubelet_decode` (which uses it and re-exports it) so each module
stays readable; see :class:`DecodeReuse` for what is kept and why it is safe.
"""

from __future__ import annotations

from array import array
from operator import itemgetter
from typing import Any

from kcms.model import PodKey, PodPlaces
from kcms.sources.bounds import MAX_NAME_LENGTH
from kcms.sources.decode_template import BodyTemplates

# the decoder's column layout: namespaces, pods, containers, values, timestamps, label signature
Columns = tuple[list[str], list[str], list[str], list[Any], Any, str]

_Entry = tuple[int, str, int, str, "array[float]", bool]


class DecodeReuse:
    """Per-node memory of the ``container_start_time_seconds`` block, to skip re-reading it unchanged.

    Start times change only when a container (re)starts, yet their block is a third of each decode.
    For every node it decoded, this keeps the block's text (without its timestamps when one timestamp
    is on all its lines) and what its fast-path parse gave (the start-time values and label
    signature): ~11 kB for 60 containers. The next body of the *same node* reuses the parse when its
    block is the same text (a kubelet: start times carry no timestamp, or their own start time), or
    the same text but for one valid timestamp common to all its lines (the simulator, exporters that
    stamp every line with the scrape time): the start-time values do not depend on timestamps, which
    are only checked. Anything else (a restart, a new pod, a hostile or malformed block) is parsed
    afresh exactly as without reuse; only the fast path's result is ever reused, so the decoded batch
    and its rejection counts are identical with or without it (a property test checks this over
    random sequences of bodies). Comparing costs ~0.3 us (same text) to ~5 us (a new timestamp), the
    parse it saves ~35 us.

    It also keeps, per node, where each pod's containers lie among the readings
    (:class:`kcms.model.PodPlaces`, :meth:`places`), so that a batch of the same series makes no
    pod dicts (~4 kB a node of 30 pods, shared with the store, which then keeps none of its own).

    Bounded: entries live in two generations; :meth:`new_cycle` (the collector calls it once a
    cycle, via ``KubeletClient.start_cycle``) drops nodes not decoded during the last whole cycle,
    and a generation that reaches ``max_nodes`` rotates by itself. Keyed by node name: one node's
    parse is never used for another node's body.
    """

    __slots__ = ("_current", "_previous", "_places", "_places_before", "max_nodes", "hits", "misses", "templates")

    def __init__(self, max_nodes: int = 16384, max_templates: int = 0) -> None:
        # node -> (timestamp length (0: the text as is), text without timestamps, lines, signature,
        # values, every name within MAX_NAME_LENGTH)
        self._current: dict[str, _Entry] = {}
        self._previous: dict[str, _Entry] = {}
        # node -> where its pods lie among its readings (pod_places), in the same two generations
        self._places: dict[str, PodPlaces] = {}
        self._places_before: dict[str, PodPlaces] = {}
        self.max_nodes = max(1, max_nodes)
        self.hits = 0
        self.misses = 0
        # whole bodies as templates (kcms/sources/decode_template.py), for up to max_templates
        # nodes (0: none; KubeletClient asks for DEFAULT_TEMPLATES); a body decoded from its
        # template counts as a reuse of its start-time entry (see touch)
        self.templates = BodyTemplates(min(max_templates, self.max_nodes))

    def __len__(self) -> int:
        """Nodes remembered (a start-time entry, or a template)."""
        nodes = self._current.keys() | self._previous.keys()
        if self.templates.enabled:
            nodes |= self.templates.nodes()
        return len(nodes)

    def new_cycle(self) -> None:
        """Forget the nodes not decoded since the previous call (nodes gone, or failing)."""
        self._previous = self._current
        self._current = {}
        self._places_before = self._places
        self._places = {}
        self.templates.new_cycle()

    def forget(self, node: str) -> None:
        self._current.pop(node, None)
        self._previous.pop(node, None)
        self._places.pop(node, None)
        self._places_before.pop(node, None)
        self.templates.forget(node)

    def lookup(self, node: str, block: str) -> tuple[Columns, bool] | None:
        """The start-time columns of ``block`` from ``node``'s last parse if it is the same block, and
        whether its names are all within MAX_NAME_LENGTH."""
        entry = self._current.get(node)
        if entry is None:
            entry = self._previous.get(node)
            if entry is None:
                self.misses += 1
                return None
        stamp, text, n, signature, values, names_ok = entry
        if stamp:
            # every line must end in " T", T one valid timestamp (digits, no leading zero, as long
            # as the cached block's, so at most 18 digits); then compare the text without them
            t = block[-stamp:]
            if block[-stamp - 1 : -stamp] == " " and t.isascii() and t.isdigit() and t[0] != "0":
                norm = block[: -stamp - 1].replace(" " + t + "\n", "\n")
                # n - 1 replacements plus the last line's: every line had it
                same = len(norm) == len(block) - n * (stamp + 1) and norm == text
            else:
                same = False
        else:
            same = block == text
        if not same:
            self.misses += 1
            return None
        self.hits += 1
        if node not in self._current:
            self._put(node, entry)
        return (None, None, None, values.tolist(), None, signature), names_ok

    def touch(self, node: str) -> None:
        """``node``'s body was decoded from its template (kcms/sources/decode_template.py), which
        holds its start-time parse too: counted as a reuse, and the node's own entry here is
        dropped (~11 kB: the template has what it has; a full decode makes it again)."""
        self.hits += 1
        if self._current:
            self._current.pop(node, None)
        if self._previous:
            self._previous.pop(node, None)

    def remember(self, node: str, block: str, cols: Columns) -> None:
        """Keep the fast-path parse ``cols`` of ``node``'s start-time ``block``."""
        n = len(cols[3])
        stamp = 0
        text = block
        # the last line's tokens after its labels: "}", V and, when the lines are stamped, T
        tokens = block[block.rfind('"') + 1 :].split()
        if len(tokens) == 3:
            t = tokens[2]
            norm = block[: -len(t) - 1].replace(" " + t + "\n", "\n")
            if len(norm) == len(block) - n * (len(t) + 1):  # one timestamp on all lines
                stamp, text = len(t), norm
        names_ok = max(map(len, cols[0]), default=0) <= MAX_NAME_LENGTH
        names_ok = names_ok and max(map(len, cols[1]), default=0) <= MAX_NAME_LENGTH
        names_ok = names_ok and max(map(len, cols[2]), default=0) <= MAX_NAME_LENGTH
        self._put(node, (stamp, text, n, cols[5], array("d", cols[3]), names_ok))

    def places(
        self, node: str, signature: str, namespaces: list[str], names: list[str], containers: list[str]
    ) -> PodPlaces | None:
        """:func:`pod_places` of these series, kept for ``node`` while they come with the same
        ``signature`` object: a template's, or a reused start-time block's (see :meth:`lookup`).
        Another object, even an equal one, makes them again from these names: a template's
        names are one object per distinct name across nodes, and its places then hold those."""
        places = self._places.get(node)
        if places is None:
            places = self._places_before.get(node)
        if places is None or places.signature is not signature:
            places = pod_places(signature, namespaces, names, containers)
            if places is None:
                return None
        if len(self._places) >= self.max_nodes and node not in self._places:
            self._places_before, self._places = self._places, {}
        self._places[node] = places
        return places

    def _put(self, node: str, entry: _Entry) -> None:
        if len(self._current) >= self.max_nodes and node not in self._current:
            self._previous, self._current = self._current, {}
        self._current[node] = entry


def pod_places(
    signature: str, namespaces: list[str], names: list[str], containers: list[str]
) -> PodPlaces | None:
    """Where each pod's containers lie when the series (one per container, in the body's order)
    are taken pod by pod, pods in their first series' order and containers in theirs, as the
    decoder's pods dict lists them; None when a container of a pod comes twice (the general path
    counts the duplicate)."""
    series: dict[PodKey, list[int]] = {}
    for i, key in enumerate(zip(namespaces, names, strict=True)):
        at = series.get(key)
        if at is None:
            series[key] = [i]
        else:
            at.append(i)
    of: dict[PodKey, tuple[int, tuple[str, ...]]] = {}
    order: list[int] = []
    for key, at in series.items():
        pod_containers = tuple(containers[i] for i in at)
        if len(set(pod_containers)) != len(at):
            return None
        of[key] = (len(order), pod_containers)
        order.extend(at)
    kept = tuple(order)
    if len(order) == 1:
        return PodPlaces(signature, of, lambda seq: (seq[0],), kept)
    return PodPlaces(signature, of, itemgetter(*order) if order else lambda seq: (), kept)
