"""The simulated workload: nodes, pods and containers with known ("true") resource usage.

Everything is generated from a seed. Each container has a constant CPU rate (cores) and a
working set that changes a little every minute (deterministic given the time). The cumulative
CPU counter at time ``t`` is ``rate * (t - start_time)``; a restart moves ``start_time`` to the
restart moment, so the counter starts again from zero.
"""

from __future__ import annotations

import gc
import math
import random
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

NAMESPACES: tuple[tuple[str, int], ...] = (
    ("default", 4),
    ("kube-system", 2),
    ("team-a", 3),
    ("team-b", 3),
    ("monitoring", 1),
)
APPS: tuple[str, ...] = (
    "web",
    "api",
    "worker",
    "cache",
    "checkout",
    "search",
    "frontend",
    "ingest",
    "billing",
    "auth",
)
SIDECARS: tuple[str, ...] = (
    "istio-proxy",
    "log-shipper",
    "metrics-exporter",
    "config-reloader",
    "vault-agent",
)
_SAFE = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet Kubernetes uses for generated name suffixes
PAGE = 4096
MEMORY_STEP_SECONDS = 60


def go_float(f: float) -> str:
    """Format a float like Go's ``strconv.FormatFloat(f, 'g', -1, 64)`` (the Prometheus text writer)."""
    if f == 0.0:
        return "0"
    if f != f:
        return "NaN"
    if f == math.inf:
        return "+Inf"
    if f == -math.inf:
        return "-Inf"
    r = repr(f)
    sign = ""
    if r[0] == "-":
        sign = "-"
        r = r[1:]
    epos = r.find("e")
    if epos >= 0:
        digits = r[:epos].replace(".", "")
        exp = int(r[epos + 1 :])
    else:
        ip, _, fp = r.partition(".")
        if ip != "0":
            digits = ip + fp
            exp = len(ip) - 1
        else:
            s = fp.lstrip("0")
            exp = len(s) - len(fp) - 1
            digits = s
    digits = digits.rstrip("0") or "0"
    if exp < -4 or exp >= 6:
        mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mant}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if exp < 0:
        return f"{sign}0.{'0' * (-exp - 1)}{digits}"
    if len(digits) <= exp + 1:
        return sign + digits + "0" * (exp + 1 - len(digits))
    return f"{sign}{digits[: exp + 1]}.{digits[exp + 1 :]}"


def go_int(n: int) -> str:
    """Format a non-negative integer-valued float the way :func:`go_float` would, quickly."""
    s = str(n)
    if len(s) <= 6:
        return s
    d = s.rstrip("0")
    return d[0] + ("." + d[1:] if len(d) > 1 else "") + f"e+{len(s) - 1:02d}"


def go_ns(ns: int) -> str:
    """Format ``ns / 1e9`` (core-nanoseconds as core-seconds) like :func:`go_float`, from the exact integer.

    The text is the exact decimal value of ``ns`` nanoseconds (no binary rounding), so a decoder
    that converts it back to integer nanoseconds gets ``ns``.
    """
    if ns <= 0:
        return "0" if ns == 0 else "-" + go_ns(-ns)
    s = str(ns)
    exp = len(s) - 10
    if exp < -4 or exp >= 6:
        d = s.rstrip("0")
        return d[0] + ("." + d[1:] if len(d) > 1 else "") + f"e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if exp >= 0:
        frac = s[exp + 1 :].rstrip("0")
        return s[: exp + 1] + "." + frac if frac else s[: exp + 1]
    return "0." + "0" * (-exp - 1) + s.rstrip("0")


def rfc3339(t: float) -> str:
    """Seconds since the epoch as a Kubernetes ``metav1.Time`` (RFC 3339, whole seconds, UTC)."""
    return datetime.fromtimestamp(int(t), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(slots=True, eq=False)
class SimContainer:
    """One container with a constant true CPU rate and a deterministic working set."""

    name: str
    namespace: str
    pod: str
    rate: float  # cores
    start_time: float
    mem_base: int  # bytes, a multiple of PAGE
    mem_phase: int
    mem_scale: int  # pages per wobble step
    restart_every: float | None = None
    restart_rng: random.Random | None = None
    next_restart: float = math.inf
    restarts: int = 0
    # precomputed text
    labels: str = ""
    cpu_prefix: str = ""
    mem_prefix: str = ""
    start_prefix: str = ""
    start_text: str = ""
    start_rfc: str = ""
    _mem_key: int = -1
    _mem_val: int = 0
    _mem_text: str = ""

    def refresh_start(self) -> None:
        """Recompute the text forms of the start time (after a restart)."""
        self.start_text = go_float(self.start_time)
        self.start_rfc = rfc3339(self.start_time)

    def advance(self, t: float) -> None:
        """Apply every scheduled restart up to time ``t``."""
        while t >= self.next_restart:
            self.restart(self.next_restart)
            assert self.restart_rng is not None and self.restart_every
            self.next_restart = self.start_time + self.restart_rng.expovariate(1.0 / self.restart_every)

    def restart(self, at: float) -> None:
        """Restart the container at time ``at``: new start time, counter back to zero."""
        self.start_time = at
        self.restarts += 1
        self.refresh_start()

    def cpu_ns(self, t: float) -> int:
        """Cumulative CPU core-nanoseconds at time ``t``."""
        dt = t - self.start_time
        return int(self.rate * dt * 1e9) if dt > 0 else 0

    def memory(self, t: float) -> int:
        """Working set bytes at time ``t`` (changes once per MEMORY_STEP_SECONDS)."""
        key = int(t // MEMORY_STEP_SECONDS)
        if key != self._mem_key:
            k = (self.mem_phase + key) % 32
            wobble = k if k < 16 else 32 - k
            self._mem_key = key
            self._mem_val = self.mem_base + wobble * self.mem_scale * PAGE
            self._mem_text = go_int(self._mem_val)
        return self._mem_val

    def memory_text(self, t: float) -> str:
        """The working set at ``t`` formatted for the Prometheus text format."""
        self.memory(t)
        return self._mem_text


@dataclass(slots=True, eq=False)
class SimPod:
    """One running pod on a node."""

    namespace: str
    name: str
    uid: str
    app: str
    start_time: float
    containers: list[SimContainer]
    labels: str = ""  # '{namespace="..",pod=".."}'
    cpu_prefix: str = ""
    mem_prefix: str = ""
    rate: float = 0.0  # true CPU rate of the pod (sum of its containers), cores
    _mem_key: int = -1
    _mem_val: int = 0
    _mem_text: str = ""

    def __post_init__(self) -> None:
        self.cpu_prefix = f"pod_cpu_usage_seconds_total{self.labels} "
        self.mem_prefix = f"pod_memory_working_set_bytes{self.labels} "
        self.rate = sum(c.rate for c in self.containers)

    def cpu_ns(self, t: float) -> int:
        """Cumulative pod CPU: the pod cgroup keeps counting across container restarts."""
        dt = t - self.start_time
        return int(self.rate * dt * 1e9) if dt > 0 else 0

    def memory(self, t: float) -> int:
        """Pod working set: the sum of its containers."""
        key = int(t // MEMORY_STEP_SECONDS)
        if key != self._mem_key:
            self._mem_val = sum(c.memory(t) for c in self.containers)
            self._mem_text = go_int(self._mem_val)
            self._mem_key = key
        return self._mem_val

    def memory_text(self, t: float) -> str:
        """The working set at ``t`` formatted for the Prometheus text format."""
        self.memory(t)
        return self._mem_text


@dataclass(slots=True, eq=False)
class SimNode:
    """One node: its kubelet address, its pods, and its own overhead."""

    index: int
    name: str
    address: str
    port: int
    start_time: float
    overhead_rate: float
    overhead_memory: int
    pods: list[SimPod]
    created: float
    uid: str
    mode: str = "ok"
    containers_sorted: list[SimContainer] = field(default_factory=list)
    pods_sorted: list[SimPod] = field(default_factory=list)
    rate: float = 0.0
    requests: int = 0
    _mem_key: int = -1
    _mem_val: int = 0
    _mem_text: str = ""

    def finish(self) -> None:
        """Precompute sort orders (the Prometheus registry sorts samples by label values) and sums."""
        self.containers_sorted = sorted(
            (c for p in self.pods for c in p.containers), key=lambda c: (c.name, c.namespace, c.pod)
        )
        self.pods_sorted = sorted(self.pods, key=lambda p: (p.namespace, p.name))
        self.rate = self.overhead_rate + sum(p.rate for p in self.pods)

    def advance(self, t: float) -> None:
        """Apply scheduled restarts of every container up to ``t``."""
        for c in self.containers_sorted:
            if t >= c.next_restart:
                c.advance(t)

    def cpu_ns(self, t: float) -> int:
        """Cumulative node CPU core-nanoseconds at ``t``."""
        dt = t - self.start_time
        return int(self.rate * dt * 1e9) if dt > 0 else 0

    def memory(self, t: float) -> int:
        """Node working set: its containers plus the node overhead."""
        key = int(t // MEMORY_STEP_SECONDS)
        if key != self._mem_key:
            self._mem_val = self.overhead_memory + sum(p.memory(t) for p in self.pods)
            self._mem_text = go_int(self._mem_val)
            self._mem_key = key
        return self._mem_val

    def memory_text(self, t: float) -> str:
        """The working set at ``t`` formatted for the Prometheus text format."""
        self.memory(t)
        return self._mem_text


def _suffix(rng: random.Random, n: int) -> str:
    return "".join(rng.choices(_SAFE, k=n))


def node_addresses(base: str, count: int) -> list[str]:
    """``count`` IPv4 addresses from ``base`` upwards, skipping those ending in .0 or .255."""
    parts = [int(x) for x in base.split(".")]
    if len(parts) != 4 or not all(0 <= x <= 255 for x in parts):
        raise ValueError(f"not an IPv4 address: {base!r}")
    n = (parts[0] << 24) | (parts[1] << 16) | (parts[2] << 8) | parts[3]
    out: list[str] = []
    while len(out) < count:
        if (n & 0xFF) not in (0, 255):
            if n >> 24 != parts[0]:
                raise ValueError(f"{count} addresses from {base} leave the {parts[0]}.0.0.0/8 range")
            out.append(f"{n >> 24}.{(n >> 16) & 0xFF}.{(n >> 8) & 0xFF}.{n & 0xFF}")
        n += 1
    return out


def generate_nodes(**kwargs: Any) -> list[SimNode]:
    """Build the whole simulated workload (see :func:`_generate`); the cyclic GC is paused meanwhile,
    since hundreds of thousands of new objects would otherwise trigger many full collections.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _generate(**kwargs)
    finally:
        if was_enabled:
            gc.enable()


def _generate(
    *,
    nodes: int,
    pods_per_node: int,
    containers_per_pod: tuple[int, int],
    seed: int,
    now: float,
    addresses: list[str],
    ports: list[int],
    restart_every: float | None,
) -> list[SimNode]:
    """Build the whole simulated workload, deterministically from ``seed`` (times relative to ``now``)."""
    rng = random.Random(seed)
    ns_names = [n for n, _ in NAMESPACES]
    ns_weights = [w for _, w in NAMESPACES]
    used: set[tuple[str, str]] = set()
    width = max(4, len(str(nodes - 1)))
    out: list[SimNode] = []
    lo, hi = containers_per_pod
    for i in range(nodes):
        created = now - rng.uniform(10 * 86400, 60 * 86400)
        node_start = created + rng.uniform(0, 86400)
        pods: list[SimPod] = []
        for _ in range(pods_per_node):
            ns = rng.choices(ns_names, ns_weights)[0]
            app = rng.choice(APPS)
            while True:
                name = f"{app}-{_suffix(rng, 10)}-{_suffix(rng, 5)}"
                if (ns, name) not in used:
                    used.add((ns, name))
                    break
            pod_start = node_start + rng.uniform(60, max(120.0, now - node_start - 3600))
            count = rng.randint(lo, hi)
            cnames = [app] + rng.sample(SIDECARS, min(count - 1, len(SIDECARS)))
            cnames += [f"extra-{k}" for k in range(count - len(cnames))]
            containers = []
            for cname in cnames:
                c = SimContainer(
                    name=cname,
                    namespace=ns,
                    pod=name,
                    rate=10 ** rng.uniform(-3, math.log10(0.5)),
                    start_time=pod_start + rng.uniform(0.5, 5.0),
                    mem_base=rng.randrange(2048, 131072) * PAGE,
                    mem_phase=rng.randrange(32),
                    mem_scale=rng.randrange(1, 64),
                )
                c.labels = f'{{container="{cname}",namespace="{ns}",pod="{name}"}}'
                c.cpu_prefix = f"container_cpu_usage_seconds_total{c.labels} "
                c.mem_prefix = f"container_memory_working_set_bytes{c.labels} "
                c.start_prefix = f"container_start_time_seconds{c.labels} "
                c.refresh_start()
                if restart_every:
                    c.restart_every = restart_every
                    c.restart_rng = random.Random(f"{seed}/{ns}/{name}/{cname}")
                    c.next_restart = now + c.restart_rng.expovariate(1.0 / restart_every)
                containers.append(c)
            pod = SimPod(
                namespace=ns,
                name=name,
                uid=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                app=app,
                start_time=pod_start,
                containers=containers,
                labels=f'{{namespace="{ns}",pod="{name}"}}',
            )
            pods.append(pod)
        node = SimNode(
            index=i,
            name=f"sim-node-{i:0{width}d}",
            address=addresses[i],
            port=ports[i],
            start_time=node_start,
            overhead_rate=rng.uniform(0.02, 0.2),
            overhead_memory=rng.randrange(65536, 262144) * PAGE,
            pods=pods,
            created=created,
            uid=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        )
        node.finish()
        out.append(node)
    return out
