"""What the resource store serves for a node or a container (:class:`Usage`) and for a pod
(:class:`PodUsage`); kept apart from kcms/store/resource.py so that readers of these types need
not import the store.

Both are ``msgspec`` structs with ``gc=False`` (never tracked by the cyclic collector: they hold
numbers, strings and tuples, so cannot be part of a cycle); see kcms/store/resource.py for why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import msgspec

_T = TypeVar("_T")


def _also_a_dataclass(cls: type[_T]) -> type[_T]:
    """Declare ``cls``'s fields to :mod:`dataclasses` too (``fields``, ``replace``, ``asdict`` keep
    working for callers written when these were dataclasses); msgspec keeps its own ``__init__``,
    ``__eq__`` and ``__repr__`` (same behaviour, written in C)."""
    return dataclass(init=False, repr=False, eq=False, match_args=False)(cls)


@_also_a_dataclass
class Usage(msgspec.Struct, gc=False):
    """What the API serves for one node or container."""

    timestamp: float  # time of the newer reading (kubelet clock, seconds since the epoch)
    window: float  # seconds between the two readings the rate was taken from
    cpu_nanocores: int
    memory: int  # bytes


@_also_a_dataclass
class PodUsage(msgspec.Struct, gc=False):
    """A pod's usage: its oldest container reading's timestamp and window, and every container's.
    ``containers`` is a tuple from the store (untracked by the collector), a list from replicas."""

    timestamp: float
    window: float
    containers: Sequence[tuple[str, Usage]]
