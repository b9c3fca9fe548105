"""Node-level metrics read through psutil, about ``ObjectRef("nodes", "", <node>)``.

Series (node_exporter's names where one exists):

* ``node_load1``, ``node_load5``, ``node_load15``;
* ``node_memory_total_bytes``, ``node_memory_available_bytes``, ``node_memory_used_bytes``;
* ``node_cpu_seconds_total{mode}`` (summed over CPUs; modes as psutil reports them);
* ``node_network_receive_bytes_total{interface}``, ``node_network_transmit_bytes_total{interface}``;
* ``node_disk_read_bytes_total{device}``, ``node_disk_written_bytes_total{device}``.

Inside a container, ``/proc/loadavg``, ``/proc/meminfo``, ``/proc/stat`` and ``/proc/diskstats``
already describe the whole node (they are not namespaced); ``/proc/net/dev`` describes the network
namespace, so the DaemonSet runs with ``hostNetwork: true`` to see the node's interfaces.
"""

from __future__ import annotations

import logging

import psutil

from kcms.agent.buffer import Sample
from kcms.model import ObjectRef

__all__ = ["NodeSource"]

log = logging.getLogger(__name__)


class NodeSource:
    """Collects node-level metrics of ``node`` (see the module docstring)."""

    def __init__(self, node: str) -> None:
        self.obj = ObjectRef("nodes", "", node)
        self.errors = 0

    def collect(self, now: float) -> list[Sample]:
        """One reading of every node metric, stamped ``now``; a failing group is skipped and counted."""
        obj = self.obj
        out: list[Sample] = []

        def emit(metric: str, value: float, labels: tuple[tuple[str, str], ...] = ()) -> None:
            out.append((metric, obj, labels, now, float(value)))

        for group in (self._load, self._memory, self._cpu, self._network, self._disk):
            try:
                group(emit)
            except (OSError, RuntimeError, ValueError, AttributeError) as e:
                self.errors += 1
                log.debug("node metrics: %s failed: %s", group.__name__, e)
        return out

    @staticmethod
    def _load(emit) -> None:  # type: ignore[no-untyped-def]
        load1, load5, load15 = psutil.getloadavg()
        emit("node_load1", load1)
        emit("node_load5", load5)
        emit("node_load15", load15)

    @staticmethod
    def _memory(emit) -> None:  # type: ignore[no-untyped-def]
        vm = psutil.virtual_memory()
        emit("node_memory_total_bytes", vm.total)
        emit("node_memory_available_bytes", vm.available)
        emit("node_memory_used_bytes", vm.total - vm.available)

    @staticmethod
    def _cpu(emit) -> None:  # type: ignore[no-untyped-def]
        times = psutil.cpu_times()
        for mode in times._fields:
            emit("node_cpu_seconds_total", getattr(times, mode), (("mode", mode),))

    @staticmethod
    def _network(emit) -> None:  # type: ignore[no-untyped-def]
        for nic, c in sorted(psutil.net_io_counters(pernic=True, nowrap=True).items()):
            emit("node_network_receive_bytes_total", c.bytes_recv, (("interface", nic),))
            emit("node_network_transmit_bytes_total", c.bytes_sent, (("interface", nic),))

    @staticmethod
    def _disk(emit) -> None:  # type: ignore[no-untyped-def]
        for dev, c in sorted((psutil.disk_io_counters(perdisk=True, nowrap=True) or {}).items()):
            emit("node_disk_read_bytes_total", c.read_bytes, (("device", dev),))
            emit("node_disk_written_bytes_total", c.write_bytes, (("device", dev),))
