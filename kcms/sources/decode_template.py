"""A node's last ``/metrics/resource`` body as a template: only its numbers are read again.

A kubelet writes the same lines every scrape (the same families, series, label values, comments,
in the same order); only the sample values and timestamps change, and the start times when a
container restarts. :class:`BodyTemplates` keeps, per node, the body it last decoded cleanly with
those tokens cut out: the constant text between them (``pieces``), where they are among the
body's blank-separated tokens, and what the constant part decoded to (the three container
families' label columns, the start times, the scrape-error gauge).

The next body of the same node is checked against it exactly: its tokens (one ``str.split()``,
in C) are taken at those positions, and the constant pieces joined with them must give back the
body byte for byte (``"".join``, then one comparison). The tokens must then be valid numbers as
the decoder's fast path requires them (values: ``[0-9.eE+-]`` only, ``float`` finite and >= 0;
timestamps: digits, no leading zero, at most 18). Then the body *is* the template body with other
numbers in the same places, and :func:`kcms.sources.kubelet_decode.decode_resource_metrics` builds
its batch from the template's columns and the new numbers through the same assembly and screening
as a full decode, so the result is the same (a hypothesis property test checks it on random and
mutated bodies). Anything else (a new pod, a restart, a hostile or malformed body, another order)
falls back to the full decode, which then makes a new template.

Why a hand-made path: a full decode reads every line's labels again (~150 us a body of 60
containers, ``bench/decode.py``); checking the template and converting only the numbers is ~60 %
of that (``bench/scrape_cpu.py`` figures in ``docs/performance.md``, "CPU in small clusters").

Only bodies in the kubelet's layout are templated: every sample line ``name{labels} V[ T]`` with
single blanks, container families with labels exactly ``container,namespace,pod`` in one
contiguous run each, listing the same series in the same order, and a full decode with no
refusal at all, made at a node's second full decode. For small clusters: at most ``max_nodes``
(128) templates, none during a cycle past that many bodies, and none at all after a cycle that
decoded more (a large cluster makes none, so spends no memory on them, and decodes as before); a
node not decoded for a whole cycle is forgotten. ~30 kB a node for 60 containers (the
constant text), so at most ~4 MB.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

_CPU = "container_cpu_usage_seconds_total"
_MEM = "container_memory_working_set_bytes"
_START = "container_start_time_seconds"
_NODE_CPU = "node_cpu_usage_seconds_total"
_NODE_MEM = "node_memory_working_set_bytes"
_ERROR_NAMES = ("resource_scrape_error", "scrape_error")
_CONTAINER_FAMILIES = (_CPU, _MEM, _START)
_MAX_NAME_LENGTH = 253  # kcms.sources.bounds.MAX_NAME_LENGTH (a template has none longer)

# itemgetters shared by nodes of the same layout (their position tuples are ~20 kB each)
_GETTERS: dict[tuple[int, ...], Any] = {}
_MAX_GETTERS = 512
# templates a KubeletClient keeps (the cluster size up to which they are used)
DEFAULT_TEMPLATES = 128


def _getter(positions: tuple[int, ...]) -> Any:
    g = _GETTERS.get(positions)
    if g is None:
        if len(_GETTERS) >= _MAX_GETTERS:
            _GETTERS.clear()
        g = _GETTERS[positions] = itemgetter(*positions)
    return g


class Template:
    """One node's body with its numbers cut out (see the module docstring)."""

    __slots__ = (
        "ntok",
        "get",
        "buf",
        "blank",
        "order",
        "n",
        "stamped",
        "node",
        "node_stamped",
        "namespaces",
        "pods",
        "containers",
        "signature",
        "start",
        "scrape_error",
        "recognised",
        "uses",
    )

    def __init__(self) -> None:
        self.ntok = 0  # tokens of the body (str.split())
        self.get: Any = None  # the variable tokens, in text order
        self.buf: list[str | None] = []  # constant pieces at even indexes, None where a token goes
        self.blank: tuple[None, ...] = ()
        self.order: Any = None  # variable tokens -> role order (cpu V, cpu T, mem V, mem T, start T, node)
        self.n = 0  # containers
        self.stamped = False  # container lines carry timestamps
        self.node = False  # node CPU and memory lines present
        self.node_stamped = False
        self.namespaces: list[str] = []
        self.pods: list[str] = []
        self.containers: list[str] = []
        self.signature = ""
        self.start: list[float] = []
        self.scrape_error: float | None = None
        self.recognised = 0
        self.uses = 0  # bodies decoded from it

    def numbers(self, text: str) -> tuple[str, ...] | None:
        """The body's variable tokens in role order if ``text`` is this template with other tokens
        in the variable places (exactly), else None. Their values are not checked here."""
        toks = text.split()
        if len(toks) != self.ntok:
            return None
        vt = self.get(toks)
        buf = self.buf
        buf[1::2] = vt
        same = "".join(buf) == text  # type: ignore[arg-type]
        buf[1::2] = self.blank  # hold no token of this body
        if not same:
            return None
        return self.order(vt)  # type: ignore[no-any-return]


def build(text: str) -> Template | None:
    """A template of ``text``, a body the full decoder has just decoded with no refusal, or None
    when it is not in the layout templated (see the module docstring)."""
    toks = text.split()
    lines = text.split("\n")
    buf: list[str | None] = []
    cur: list[str] = []
    positions: list[int] = []  # token index of each variable token, text order
    roles: dict[str, list[int]] = {k: [] for k in ("cv", "ct", "mv", "mt", "st", "nc", "nct", "nm", "nmt")}
    labels: dict[str, list[tuple[str, str, str]]] = {f: [] for f in _CONTAINER_FAMILIES}
    stamps: dict[str, set[bool]] = {f: set() for f in _CONTAINER_FAMILIES}
    runs: list[str] = []  # the family of each run of sample lines
    start: list[float] = []
    scrape_error: float | None = None
    ti = 0
    recognised = 0
    last = len(lines) - 1

    def variable(role: str | None, index: int) -> None:
        buf.append("".join(cur))
        buf.append(None)
        cur.clear()
        if role is not None:
            roles[role].append(len(positions))
        positions.append(index)

    for li, line in enumerate(lines):
        nl = "" if li == last else "\n"
        if not line or line[0] == "#":
            cur.append(line + nl)
            ti += len(line.split())
            if (line or li != last) and (not runs or runs[-1] != "#"):
                runs.append("#")  # a comment or blank line ends a run of samples
            continue
        parts = line.split(" ")
        if not 2 <= len(parts) <= 3 or "" in parts or len(line.split()) != len(parts):
            return None  # other blanks, or not "name value [timestamp]"
        head = parts[0]
        fam, brace, rest = head.partition("{")
        stamped = len(parts) == 3
        if not runs or runs[-1] != fam:
            runs.append(fam)
        if fam in labels and brace:
            segs = rest.split('"')
            if (
                len(segs) != 7
                or segs[0] != "container="
                or segs[2] != ",namespace="
                or segs[4] != ",pod="
                or segs[6] != "}"
                or "\\" in head
                or "" in (segs[1], segs[3], segs[5])
                or max(len(segs[1]), len(segs[3]), len(segs[5])) > _MAX_NAME_LENGTH
            ):
                return None
            labels[fam].append((segs[1], segs[3], segs[5]))
            stamps[fam].add(stamped)
            recognised += 1
            cur.append(head + " ")
            if fam == _START:
                # start times are part of the template (a restart makes a new one); the float of
                # the text, as the fast path reads it
                start.append(float(parts[1]))
                cur.append(parts[1])
            else:
                variable("cv" if fam == _CPU else "mv", ti + 1)
            if stamped:
                cur.append(" ")
                variable({_CPU: "ct", _MEM: "mt", _START: "st"}[fam], ti + 2)
        elif not brace and head in (_NODE_CPU, _NODE_MEM):
            recognised += 1
            cpu = head == _NODE_CPU
            if roles["nc" if cpu else "nm"]:
                return None  # twice
            cur.append(head + " ")
            variable("nc" if cpu else "nm", ti + 1)
            if stamped:
                cur.append(" ")
                variable("nct" if cpu else "nmt", ti + 2)
        elif not brace and head in _ERROR_NAMES:
            recognised += 1
            scrape_error = float(parts[1])  # the decode had no refusal: a valid number, 0
            if scrape_error != 0:
                return None
            cur.append(line)  # constant
        elif fam in _CONTAINER_FAMILIES or fam in _ERROR_NAMES or fam in (_NODE_CPU, _NODE_MEM):
            return None  # a known family in another shape: the general parser's business
        else:
            # another family (pod_*, swap, ...): the decoder skips it whatever its numbers are
            cur.append(head + " ")
            variable(None, ti + 1)
            if stamped:
                cur.append(" ")
                variable(None, ti + 2)
        cur.append(nl)
        ti += len(parts)
    buf.append("".join(cur))
    if ti != len(toks) or len(positions) < 2:
        return None
    samples = [r for r in runs if r != "#"]
    if len(samples) != len(set(samples)):
        return None  # a family in two runs (split by a comment, a blank line or another family)
    series = labels[_CPU]
    if not series or labels[_MEM] != series or labels[_START] != series:
        return None
    if any(len(s) != 1 for s in stamps.values()) or len({next(iter(s)) for s in stamps.values()}) != 1:
        return None
    n = len(series)
    if len(start) != n:
        return None
    if bool(roles["nc"]) != bool(roles["nm"]):
        return None
    t = Template()
    t.ntok = len(toks)
    t.get = _getter(tuple(positions))
    t.buf = buf
    t.blank = (None,) * len(positions)
    order = roles["cv"] + roles["ct"] + roles["mv"] + roles["mt"] + roles["st"]
    order += roles["nc"] + roles["nct"] + roles["nm"] + roles["nmt"]
    t.order = _getter(tuple(order))
    t.n = n
    t.stamped = bool(roles["ct"])
    t.node = bool(roles["nc"])
    t.node_stamped = bool(roles["nct"]) and bool(roles["nmt"])
    if t.node and bool(roles["nct"]) != bool(roles["nmt"]):
        return None
    t.namespaces = [s[1] for s in series]
    t.pods = [s[2] for s in series]
    t.containers = [s[0] for s in series]
    t.signature = '"'.join(x for s in series for x in s)
    t.start = start
    t.scrape_error = scrape_error
    t.recognised = recognised
    # the whole body again from the pieces and its own tokens: the cut is exact
    if t.numbers(text) is None:
        return None
    return t


class BodyTemplates:
    """Per-node :class:`Template` s, for small clusters (see the module docstring).

    Only while a cycle decodes at most ``max_nodes`` nodes: a cycle with more disables templates
    (and frees them) until a cycle has at most ``max_nodes`` again, so a large cluster uses no
    memory for them and decodes exactly as before. A node whose bodies keep changing shape (a
    template dropped within a few scrapes of being made) waits longer and longer (up to 64
    scrapes) before it is templated again, so that it costs the full decode and little more;
    so does a node whose body does not fit the layout (64 scrapes).
    """

    __slots__ = ("_current", "_previous", "_wait", "_backoff", "_seen", "_decoded", "enabled", "max_nodes",
                 "hits", "misses")  # fmt: skip

    def __init__(self, max_nodes: int = DEFAULT_TEMPLATES) -> None:
        self._current: dict[str, Template] = {}
        self._previous: dict[str, Template] = {}
        self._wait: dict[str, int] = {}  # node -> scrapes before trying to template it again
        self._backoff: dict[str, int] = {}  # node -> the next wait after an early drop
        # nodes decoded once already: a template is made at a node's second full decode, so the
        # first cycle of a large cluster (before a cycle has shown its size) makes none
        self._seen: set[str] = set()
        self._decoded = 0  # bodies decoded this cycle
        self.max_nodes = max(0, max_nodes)
        self.enabled = self.max_nodes > 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._current) + sum(1 for n in self._previous if n not in self._current)

    def new_cycle(self) -> None:
        """Forget the templates of nodes not decoded since the previous call; disable (and free)
        them all after a cycle of more than ``max_nodes`` bodies."""
        self.enabled = 0 < self.max_nodes and self._decoded <= self.max_nodes
        self._decoded = 0
        self._previous = {} if not self.enabled else self._current
        self._current = {}
        if not self.enabled or len(self._seen) > 4 * self.max_nodes:
            self._seen.clear()
        if not self.enabled or len(self._wait) > 4 * self.max_nodes:
            self._wait.clear()
        if not self.enabled or len(self._backoff) > 4 * self.max_nodes:
            self._backoff.clear()

    def nodes(self) -> set[str]:
        return self._current.keys() | self._previous.keys()

    def forget(self, node: str) -> None:
        self._current.pop(node, None)
        self._previous.pop(node, None)
        self._wait.pop(node, None)
        self._backoff.pop(node, None)
        self._seen.discard(node)

    def get(self, node: str) -> Template | None:
        """``node``'s template (None: none, or templates are disabled); counts the decode."""
        self._decoded += 1
        if not self.enabled:
            return None
        t = self._current.get(node)
        if t is None:
            t = self._previous.get(node)
            if t is not None:
                self._current[node] = t
        return t

    def drop(self, node: str, template: Template) -> None:
        """``node``'s body no longer fits ``template`` (used ``template.uses`` times)."""
        self.misses += 1
        self._current.pop(node, None)
        self._previous.pop(node, None)
        if template.uses < 4:
            wait = self._backoff.get(node, 1)
            self._wait[node] = wait
            self._backoff[node] = min(64, 2 * wait)
        else:
            self._backoff.pop(node, None)

    def want(self, node: str) -> bool:
        """Whether to template ``node``'s body just decoded (enabled, room left, the node's second
        full decode at least, not waiting)."""
        if not self.enabled or self._decoded > self.max_nodes or len(self._current) >= self.max_nodes:
            return False
        if node not in self._seen:
            self._seen.add(node)
            return False
        wait = self._wait.get(node)
        if wait:
            if wait == 1:
                del self._wait[node]
            else:
                self._wait[node] = wait - 1
            return False
        return True

    def put(self, node: str, template: Template | None) -> None:
        if template is None:
            self._wait[node] = 64  # not in the templated layout: ~16 minutes at 15 s
        else:
            self._current[node] = template
