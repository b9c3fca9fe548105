"""Pod and container resource usage read from the cgroup v2 files of the kubelet's pods.

Layouts found under the cgroup root (default ``/sys/fs/cgroup``), at any depth up to ``MAX_DEPTH``
below directories whose names contain ``kubepods`` (or the ``kubelet`` parent kind clusters use):

* systemd driver: ``kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid>.slice/<rt>-<id>.scope``
  (UID dashes written as underscores; Guaranteed pods sit directly in ``kubepods.slice``;
  ``<rt>`` is ``cri-containerd``, ``crio`` or ``docker``);
* cgroupfs driver: ``kubepods/<qos>/pod<uid>/<id>`` (Guaranteed: ``kubepods/pod<uid>/<id>``).

A pod's UID is resolved to its namespace and name, and a container's ID to its name, through the
pods of this node (``pods()``: the API server's pods, see :mod:`kcms.agent.pods`). Static pods are
found by their mirror pod's ``kubernetes.io/config.mirror`` annotation (their cgroup carries the
config hash). Directories of unknown pods and of unknown containers (the sandbox's pause container)
are skipped.

Series (all ``ObjectRef("pods", namespace, name)``): the pod cgroup's values have no labels (the
pod's total, cAdvisor's ``container=""``), a container's carry ``container=<name>``:

* ``cpu.stat``: ``container_cpu_usage_seconds_total``, ``container_cpu_user_seconds_total``,
  ``container_cpu_system_seconds_total``, ``container_cpu_cfs_periods_total``,
  ``container_cpu_cfs_throttled_periods_total``, ``container_cpu_cfs_throttled_seconds_total``;
* ``memory.current`` / ``memory.stat``: ``container_memory_usage_bytes``,
  ``container_memory_working_set_bytes`` (current - inactive_file, at least 0),
  ``container_memory_rss`` (anon), ``container_memory_cache`` (file);
* ``io.stat`` (summed over devices): ``container_fs_reads_bytes_total``,
  ``container_fs_writes_bytes_total``, ``container_fs_reads_total``, ``container_fs_writes_total``;
* ``{cpu,memory,io}.pressure``: ``container_pressure_<res>_<some|full>_avg10`` (percent) and
  ``container_pressure_<res>_<some|full>_seconds_total``.

A missing file is normal (a controller not enabled, a container that just exited) and skipped; a
malformed one is skipped and counted by file name (``errors``, and
``kcms_agent_cgroup_errors_total{file}``), never raised.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import Counter

from kcms.agent.buffer import Sample
from kcms.agent.pods import AgentPod
from kcms.model import Labels, ObjectRef

__all__ = ["CgroupSource", "find_pod_cgroups"]

log = logging.getLogger(__name__)

MAX_DEPTH = 5
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"

CGROUP_ERRORS = Counter("kcms_agent_cgroup_errors", "Malformed cgroup files skipped, by file name.", ["file"])

_POD_RE = re.compile(
    r"(?:^|-)pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})"
    r"(?:\.slice)?$",
    re.ASCII,
)
_CONTAINER_RE = re.compile(r"(?:(?:cri-containerd|crio|docker)-)?([0-9a-f]{64})(?:\.scope)?$", re.ASCII)

_CPU_STAT = {
    "usage_usec": ("container_cpu_usage_seconds_total", 1e-6),
    "user_usec": ("container_cpu_user_seconds_total", 1e-6),
    "system_usec": ("container_cpu_system_seconds_total", 1e-6),
    "nr_periods": ("container_cpu_cfs_periods_total", 1.0),
    "nr_throttled": ("container_cpu_cfs_throttled_periods_total", 1.0),
    "throttled_usec": ("container_cpu_cfs_throttled_seconds_total", 1e-6),
}
_IO_STAT = {
    "rbytes": "container_fs_reads_bytes_total",
    "wbytes": "container_fs_writes_bytes_total",
    "rios": "container_fs_reads_total",
    "wios": "container_fs_writes_total",
}


class _Malformed(ValueError):
    pass


def _read(path: str) -> str | None:
    """The file's text, or None if it does not exist (any more)."""
    try:
        with open(path, encoding="ascii", errors="strict") as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError, ProcessLookupError):
        return None
    except (UnicodeDecodeError, IsADirectoryError) as e:
        raise _Malformed(str(e)) from None


def _flat_keyed(text: str) -> dict[str, int]:
    """``key value`` lines (cpu.stat, memory.stat) as a dict of integers."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise _Malformed(f"expected 'key value', got {line!r}")
        try:
            out[parts[0]] = int(parts[1])
        except ValueError:
            raise _Malformed(f"not an integer in {line!r}") from None
    return out


def _io_totals(text: str) -> dict[str, int]:
    """``io.stat`` lines (``MAJ:MIN key=value ...``) summed over devices."""
    out = dict.fromkeys(_IO_STAT, 0)
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if ":" not in parts[0]:
            raise _Malformed(f"expected a device number first, got {line!r}")
        for item in parts[1:]:
            key, eq, value = item.partition("=")
            if not eq:
                raise _Malformed(f"expected key=value, got {item!r}")
            if key in out:
                try:
                    out[key] += int(value)
                except ValueError:
                    raise _Malformed(f"not an integer in {item!r}") from None
    return out


def _pressure(text: str) -> dict[str, tuple[float, int]]:
    """PSI lines (``some avg10=.. avg60=.. avg300=.. total=..``) as kind -> (avg10, total usec)."""
    out: dict[str, tuple[float, int]] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] not in ("some", "full"):
            raise _Malformed(f"expected 'some' or 'full', got {line!r}")
        fields = dict(p.partition("=")[::2] for p in parts[1:])
        try:
            avg10 = float(fields["avg10"])
            total = int(fields["total"])
        except (KeyError, ValueError):
            raise _Malformed(f"expected avg10= and total= in {line!r}") from None
        if not 0.0 <= avg10 <= 100.0:
            raise _Malformed(f"avg10 out of range in {line!r}")
        out[parts[0]] = (avg10, total)
    return out


def find_pod_cgroups(root: str) -> Iterator[tuple[str, str]]:
    """``(pod uid with dashes, directory)`` of every pod cgroup under ``root``."""

    def walk(path: str, depth: int, inside: bool) -> Iterator[tuple[str, str]]:
        try:
            entries = list(os.scandir(path))
        except OSError:
            return
        for entry in entries:
            try:
                if not entry.is_dir(follow_symlinks=False):
                    continue
            except OSError:
                continue
            m = _POD_RE.search(entry.name)
            if m is not None:
                yield m.group(1).replace("_", "-"), entry.path
            elif depth < MAX_DEPTH:
                if inside or "kubepods" in entry.name:  # below kubepods: the QoS classes
                    yield from walk(entry.path, depth + 1, True)
                elif entry.name.startswith("kubelet"):  # kind's --cgroup-root=/kubelet parent
                    yield from walk(entry.path, depth + 1, False)

    yield from walk(root, 0, False)


class CgroupSource:
    """Collects pod and container usage from cgroup v2 files (see the module docstring)."""

    def __init__(self, pods: Callable[[], Iterable[AgentPod]], root: str = "/sys/fs/cgroup") -> None:
        self.pods = pods
        self.root = root
        self.errors: dict[str, int] = {}
        self.unknown_pods = 0  # pod cgroups seen in the last collection without a known pod

    def collect(self, now: float, pods: Iterable[AgentPod] | None = None) -> list[Sample]:
        """The samples of every known pod and container cgroup, stamped ``now``.

        ``pods`` (default: ``self.pods()``) is a snapshot of this node's pods.
        """
        by_uid: dict[str, AgentPod] = {}
        for pod in self.pods() if pods is None else pods:
            by_uid[pod.uid] = pod
            mirror = pod.annotations.get(MIRROR_ANNOTATION)
            if mirror:
                by_uid.setdefault(mirror, pod)
        out: list[Sample] = []
        unknown = 0
        for uid, path in find_pod_cgroups(self.root):
            pod = by_uid.get(uid)
            if pod is None:
                unknown += 1
                continue
            obj = ObjectRef("pods", pod.namespace, pod.name)
            self._read_cgroup(path, obj, (), now, out)
            try:
                entries = list(os.scandir(path))
            except OSError:
                continue
            for entry in entries:
                m = _CONTAINER_RE.fullmatch(entry.name)
                if m is None:
                    continue
                name = pod.containers.get(m.group(1))
                if name is None:
                    continue
                self._read_cgroup(entry.path, obj, (("container", name),), now, out)
        self.unknown_pods = unknown
        return out

    async def acollect(self, now: float) -> list[Sample]:
        """:meth:`collect` with the file reads in a worker thread and ``pods()`` read on the loop
        (the pod informer belongs to the event loop's thread)."""
        snapshot = list(self.pods())
        return await asyncio.to_thread(self.collect, now, snapshot)

    def _read_cgroup(self, path: str, obj: ObjectRef, labels: Labels, now: float, out: list[Sample]) -> None:
        def emit(metric: str, value: float) -> None:
            out.append((metric, obj, labels, now, value))

        cpu = self._parse(path, "cpu.stat", _flat_keyed)
        if cpu is not None:
            for key, (metric, scale) in _CPU_STAT.items():
                if key in cpu:
                    emit(metric, cpu[key] * scale)
        current = self._parse(path, "memory.current", _single_int)
        stat = self._parse(path, "memory.stat", _flat_keyed)
        if current is not None:
            emit("container_memory_usage_bytes", float(current))
            if stat is not None and "inactive_file" in stat:
                emit("container_memory_working_set_bytes", float(max(0, current - stat["inactive_file"])))
        if stat is not None:
            if "anon" in stat:
                emit("container_memory_rss", float(stat["anon"]))
            if "file" in stat:
                emit("container_memory_cache", float(stat["file"]))
        io = self._parse(path, "io.stat", _io_totals)
        if io is not None:
            for key, metric in _IO_STAT.items():
                emit(metric, float(io[key]))
        for resource in ("cpu", "memory", "io"):
            psi = self._parse(path, f"{resource}.pressure", _pressure)
            for kind, (avg10, total) in (psi or {}).items():
                emit(f"container_pressure_{resource}_{kind}_avg10", avg10)
                emit(f"container_pressure_{resource}_{kind}_seconds_total", total * 1e-6)

    def _parse(self, path: str, name: str, parse: Callable[[str], object]):  # type: ignore[no-untyped-def]
        try:
            text = _read(os.path.join(path, name))
            return None if text is None else parse(text)
        except (_Malformed, OSError) as e:
            self.errors[name] = self.errors.get(name, 0) + 1
            CGROUP_ERRORS.labels(name).inc()
            log.debug("skipping malformed %s/%s: %s", path, name, e)
            return None


def _single_int(text: str) -> int:
    value = text.strip()
    if value == "max":
        raise _Malformed("'max' is not a usage")
    try:
        return int(value)
    except ValueError:
        raise _Malformed(f"not an integer: {value[:40]!r}") from None
