"""A node's last ``/metrics/resource`` body as a template: only its numbers are read again.

A kubelet writes the same lines every scrape (the same families, series, label values, comments,
in the same order); only the sample values and timestamps change, and the start times when a
container restarts. :class:`BodyTemplates` keeps, per node, what it needs of the body it last
decoded cleanly: where those tokens are among the body's tokens, a hash of all the other
(constant) tokens, and what the constant part decoded to (the three container families' label
columns, the start times, the scrape-error gauge).

A body's tokens are what ``body.replace(b"\n", b" \n").split(b" ")`` gives (in C, on the bytes as
received: no UTF-8 decode): every blank separates two tokens (two blanks: an empty token between)
and every newline starts the token after it, so the token sequence gives back the body exactly
(``b" ".join``, then each ``b" \n"`` back to ``b"\n"``) and two bodies are the same bytes exactly
when their tokens are the same. The
numbers are never first on a line, so they come as tokens of their own. The next body of the
same node must have as many tokens, the tokens at the constant positions must hash (Python's
keyed SipHash, through a tuple) to the template's, and the tokens at the variable positions are
read. A kubelet that found a second body with the same
hash (2^64 work without the process's key) could only relabel its own readings, which it can do
anyway. The tokens must then be valid numbers as
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

Where the C module is built, the check and the reading of the numbers run there instead
(kcms/sources/_bodyscan.c: the constant part taken run by run, by the lengths the template
body's runs had, and hashed with a keyed hash of its own, the numbers read as float() and the
decimal rule read them; a decode of the simulator's body 118 -> 43 us, 27 Nov; the runs instead of
a walk of every token, 910 800 -> 813 000 instructions a scrape, 1 Dec); the Python code here
stays the reader of what C leaves (a number it refuses or does not read, a template with a number
that starts a line) and of installs without a compiler. A template then keeps the runs'
lengths too: 2 bytes a number, ~0.9 kB a node of 60 containers.

Only bodies in the kubelet's layout are templated: every sample line ``name{labels} V[ T]`` with
single blanks, container families with labels exactly ``container,namespace,pod`` in one
contiguous run each, listing the same series in the same order, and a full decode with no
refusal at all, made at a node's third full decode, at most ``max_builds`` (2000) a cycle. At
most ``max_nodes`` (16384) templates, none during a cycle past that many bodies, and none at all
after a cycle that decoded more (such a cluster decodes as without them); a node not decoded for a
whole cycle is forgotten. ~8 kB a node for 60 containers (the label columns; the position tuples
are shared by nodes of the same layout), whose names the store's keys share: with templates the
decoder and the store hold less than without (42.3 against 52.1 kB a node at 1000 nodes). Keeping
the constant text itself (as pieces to join with the new numbers and compare) took 53 kB a node,
which is why templates were first kept to clusters of up to 128 nodes. At 1000 nodes a scrape's
decode and store took 356-399 us with templates against 511-612 without (``bench/scrape_cpu.py``,
three alternated runs); a build costs ~1.1-1.8 ms, about what ten scrapes save.
"""

from __future__ import annotations

from array import array
from operator import itemgetter
from sys import intern
from typing import Any

try:  # the same reading in C (kcms/sources/_bodyscan.c); without a compiler, Python does it all
    from kcms.sources._bodyscan import layout as _scan_layout
except ImportError:  # pragma: no cover - exercised by installs without a C compiler
    _scan_layout = None

_CPU = "container_cpu_usage_seconds_total"
_MEM = "container_memory_working_set_bytes"
_START = "container_start_time_seconds"
_NODE_CPU = "node_cpu_usage_seconds_total"
_NODE_MEM = "node_memory_working_set_bytes"
_ERROR_NAMES = ("resource_scrape_error", "scrape_error")
_CONTAINER_FAMILIES = (_CPU, _MEM, _START)
# each role's kind for kcms/sources/_bodyscan.c (0: a skipped family's number, checked only)
_SCAN_KINDS = {"cv": 1, "ct": 2, "mv": 3, "mt": 4, "st": 4, "nc": 5, "nct": 6, "nm": 7, "nmt": 4, "ot": 4}
_MAX_NAME_LENGTH = 253  # kcms.sources.bounds.MAX_NAME_LENGTH (a template has none longer)

# itemgetters shared by nodes of the same layout (their position tuples are ~20 kB each)
_GETTERS: dict[tuple[int, ...], Any] = {}
_MAX_GETTERS = 512
# the kinds of kcms/sources/_bodyscan.c, shared the same way
_SCAN_KINDS_SHARED: dict[bytes, bytes] = {}
# templates a KubeletClient keeps (the cluster size up to which they are used): a template holds
# less than the decoder keeps for a node without one (tracemalloc, 1000 nodes of 30 pods, the
# decoder's reuse and the store: 42.3 against 52.1 kB a node), so the bound is DecodeReuse's
DEFAULT_TEMPLATES = 16384
# templates made in one cycle at most: a build costs ~1.1-1.8 ms (a full decode and more), so a
# 5000-node cluster makes its templates over three cycles, 2-4 s of CPU in each, not 6-9 s in one
MAX_BUILDS_PER_CYCLE = 2000


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
        "const",
        "const_hash",
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
        "scan",
    )

    def __init__(self) -> None:
        self.ntok = 0  # tokens of the body (see the module docstring)
        self.get: Any = None  # the variable tokens, in text order
        self.const: Any = None  # the constant tokens
        self.const_hash = 0  # hash() of the constant tokens
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
        # (lengths of the constant runs, kinds, their hash) for kcms/sources/_bodyscan.c, or None
        self.scan: tuple[bytes, bytes, int] | None = None

    def numbers(self, body: bytes) -> tuple[bytes, ...] | None:
        """The body's variable tokens in role order if ``body`` is this template with other tokens
        in the variable places (exactly), else None. Their values are not checked here."""
        toks = body.replace(b"\n", b" \n").split(b" ")
        if len(toks) != self.ntok or hash(self.const(toks)) != self.const_hash:
            return None
        variable = self.get(toks)
        # The constant tokens are the template's (UTF-8 text); with these ASCII, so is the body.
        # (Tokens of families the decoder skips are in no role: checked here, nowhere else.)
        if not (body.isascii() or b"".join(variable).isascii()):  # the whole body: ~1 us, no join
            return None
        return self.order(variable)  # type: ignore[no-any-return]


def build(text: str) -> Template | None:
    """A template of ``text``, a body the full decoder has just decoded with no refusal, or None
    when it is not in the layout templated (see the module docstring)."""
    toks = text.replace("\n", " \n").split(" ")
    lines = text.split("\n")
    positions: list[int] = []  # token index of each variable token, text order
    read: list[str] = []  # those tokens as read line by line (to check the positions against)
    roles: dict[str, list[int]] = {k: [] for k in ("cv", "ct", "mv", "mt", "st", "nc", "nct", "nm", "nmt", "ot")}
    labels: dict[str, list[tuple[str, str, str]]] = {f: [] for f in _CONTAINER_FAMILIES}
    stamps: dict[str, set[bool]] = {f: set() for f in _CONTAINER_FAMILIES}
    runs: list[str] = []  # the family of each run of sample lines
    start: list[float] = []
    scrape_error: float | None = None
    ti = 0
    recognised = 0
    last = len(lines) - 1

    def variable(role: str | None, index: int, token: str) -> None:
        if role is not None:
            roles[role].append(len(positions))
        positions.append(index)
        read.append(token)

    for li, line in enumerate(lines):
        if not line or line[0] == "#":
            ti += len(line.split(" "))  # the first token of a line holds the newline before it
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
            if fam == _START:
                # start times are part of the template (a restart makes a new one); the float of
                # the text, as the fast path reads it
                start.append(float(parts[1]))
            else:
                variable("cv" if fam == _CPU else "mv", ti + 1, parts[1])
            if stamped:
                variable({_CPU: "ct", _MEM: "mt", _START: "st"}[fam], ti + 2, parts[2])
        elif not brace and head in (_NODE_CPU, _NODE_MEM):
            recognised += 1
            cpu = head == _NODE_CPU
            if roles["nc" if cpu else "nm"]:
                return None  # twice
            variable("nc" if cpu else "nm", ti + 1, parts[1])
            if stamped:
                variable("nct" if cpu else "nmt", ti + 2, parts[2])
        elif not brace and head in _ERROR_NAMES:
            recognised += 1
            scrape_error = float(parts[1])  # the decode had no refusal: a valid number, 0
            if scrape_error != 0:
                return None
        elif fam in _CONTAINER_FAMILIES or fam in _ERROR_NAMES or fam in (_NODE_CPU, _NODE_MEM):
            return None  # a known family in another shape: the general parser's business
        else:
            # another family (pod_*, swap, ...): the decoder skips it whatever its numbers are
            variable(None, ti + 1, parts[1])
            if stamped:
                # C checks it as a timestamp (digits), ~3x cheaper than as a float, and leaves other
                # spellings, which float() may read, to the Python reader
                variable("ot", ti + 2, parts[2])
        ti += len(parts)
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
    variable_positions = set(positions)
    t.const = _getter(tuple(i for i in range(len(toks)) if i not in variable_positions))
    # The check runs on the body's bytes (no UTF-8 decode, and bytes split in ~60 % of the time of
    # str: 55 -> 34 us for 866 tokens): blanks and newlines are single bytes that never occur
    # inside a multi-byte UTF-8 sequence, so the bytes' tokens are the text's, encoded, one for one.
    data = text.encode("utf-8")
    btoks = data.replace(b"\n", b" \n").split(b" ")
    if len(btoks) != len(toks):
        return None
    t.const_hash = hash(t.const(btoks))
    order = roles["cv"] + roles["ct"] + roles["mv"] + roles["mt"] + roles["st"]
    order += roles["nc"] + roles["nct"] + roles["nm"] + roles["nmt"]
    t.order = _getter(tuple(order))
    t.n = n
    t.stamped = bool(roles["ct"])
    t.node = bool(roles["nc"])
    t.node_stamped = bool(roles["nct"]) and bool(roles["nmt"])
    if t.node and bool(roles["nct"]) != bool(roles["nmt"]):
        return None
    # One string object per distinct name: a node's 60 series hold ~5 namespaces, 30 pods and 2
    # container names, cut from the body as 180 strings (~9 kB a node kept by the template, and by
    # the store's keys, which are these). Namespaces and container names are shared across nodes.
    pods: dict[str, str] = {}
    t.namespaces = [intern(s[1]) for s in series]
    t.pods = [pods.setdefault(s[2], s[2]) for s in series]
    t.containers = [intern(s[0]) for s in series]
    t.signature = '"'.join(x for s in series for x in s)
    t.start = start
    t.scrape_error = scrape_error
    t.recognised = recognised
    # the cut is exact: the positions hold the tokens read line by line
    if list(t.get(toks)) != read or t.numbers(data) is None:
        return None
    if _scan_layout is not None and len(toks) < 2**32:
        cpos = array("I", positions).tobytes()
        laid = _scan_layout(data, len(toks), cpos)
        if laid is not None:
            kinds = bytearray(len(positions))
            for role, indices in roles.items():
                for i in indices:
                    kinds[i] = _SCAN_KINDS[role]
            # shared by nodes of the same layout, as the itemgetters are; the runs' lengths are the
            # node's own (its pods' names): 2 bytes a variable token, ~0.9 kB a node of 60 containers
            key = bytes(kinds)
            if key not in _SCAN_KINDS_SHARED and len(_SCAN_KINDS_SHARED) >= _MAX_GETTERS:
                _SCAN_KINDS_SHARED.clear()
            t.scan = (laid[0], _SCAN_KINDS_SHARED.setdefault(key, key), laid[1])
    return t


class BodyTemplates:
    """Per-node :class:`Template` s (see the module docstring).

    Only while a cycle decodes at most ``max_nodes`` nodes (each counted once, however many times it
    is scraped: the first cycle rescrapes every node): a cycle with more disables templates
    (and frees them) until a cycle has at most ``max_nodes`` again, so a larger cluster uses no
    memory for them and decodes exactly as before. A template is made at a node's third full
    decode (not at its first two, the first cycle's pass and rescrape after start, which decide how
    soon every node is served), at most ``max_builds`` a cycle. A node whose bodies keep changing shape (a
    template dropped within a few scrapes of being made) waits longer and longer (up to 64
    scrapes) before it is templated again, so that it costs the full decode and little more;
    so does a node whose body does not fit the layout (64 scrapes).
    """

    __slots__ = ("_current", "_previous", "_wait", "_backoff", "_seen", "_decoded", "_built", "enabled",
                 "max_nodes", "max_builds", "hits", "misses")  # fmt: skip

    def __init__(self, max_nodes: int = DEFAULT_TEMPLATES, max_builds: int = MAX_BUILDS_PER_CYCLE) -> None:
        self._current: dict[str, Template] = {}
        self._previous: dict[str, Template] = {}
        self._wait: dict[str, int] = {}  # node -> scrapes before trying to template it again
        self._backoff: dict[str, int] = {}  # node -> the next wait after an early drop
        # full decodes of each node so far (up to 2): a template is made at a node's third, so the
        # first cycle of a cluster past max_nodes (before a cycle has shown its size) makes none,
        # and neither does the second (the first cycle's rescrape, after its pass), which makes
        # nodes servable
        self._seen: dict[str, int] = {}
        # nodes decoded this cycle, up to one past max_nodes (enough to know the cycle was over it)
        self._decoded: set[str] = set()
        self._built = 0  # templates made this cycle
        self.max_nodes = max(0, max_nodes)
        self.max_builds = max_builds
        self.enabled = self.max_nodes > 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._current) + sum(1 for n in self._previous if n not in self._current)

    def new_cycle(self) -> None:
        """Forget the templates of nodes not decoded since the previous call; disable (and free)
        them all after a cycle that decoded more than ``max_nodes`` nodes."""
        self.enabled = 0 < self.max_nodes and len(self._decoded) <= self.max_nodes
        self._decoded = set()
        self._built = 0
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
        self._seen.pop(node, None)

    def get(self, node: str) -> Template | None:
        """``node``'s template (None: none, or templates are disabled); counts the node as decoded
        this cycle."""
        if len(self._decoded) <= self.max_nodes:
            self._decoded.add(node)
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
        """Whether to template ``node``'s body just decoded (enabled, room left, builds left this
        cycle, the node's third full decode at least, not waiting)."""
        if not self.enabled or len(self._decoded) > self.max_nodes or len(self._current) >= self.max_nodes:
            return False
        seen = self._seen.get(node, 0)
        if seen < 2:
            self._seen[node] = seen + 1
            return False
        if self._built >= self.max_builds:
            return False
        wait = self._wait.get(node)
        if wait:
            if wait == 1:
                del self._wait[node]
            else:
                self._wait[node] = wait - 1
            return False
        self._built += 1
        return True

    def put(self, node: str, template: Template | None) -> None:
        if template is None:
            self._wait[node] = 64  # not in the templated layout: ~16 minutes at 15 s
        else:
            self._current[node] = template
