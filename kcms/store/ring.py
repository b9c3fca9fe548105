"""Which stores hold which keys: rendezvous (highest-random-weight) hashing.

A key is the object a series is about, ``(resource, namespace, name)``; node readings are keyed by
their node, ``("nodes", "", node)``. Each key lives on the ``replicas`` members with the highest
``hash(member, key)``; ``replicas == 0`` (or at least the number of members) puts every key on every
member, which is multi-store mode. Adding a member moves a key only when the newcomer ranks among
that key's top ``replicas`` — on average ``replicas / members`` of the keys, each losing exactly one
old owner — and removing one moves only the keys it held.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

Key = tuple[str, str, str]

_CACHE_LIMIT = 1 << 20


def node_key(node: str) -> Key:
    return ("nodes", "", node)


def _score(member: bytes, key: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(key, digest_size=8, key=member[:64]).digest(), "little")


class Ring:
    """Owners of keys among ``members`` (names), each key on ``replicas`` of them (0: all)."""

    def __init__(self, members: Iterable[str], replicas: int = 0) -> None:
        self.members: tuple[str, ...] = tuple(sorted(set(members)))
        if replicas < 0:
            raise ValueError(f"replicas must be 0 (all) or positive, not {replicas}")
        self.replicas = replicas
        self.copies = len(self.members) if replicas == 0 else min(replicas, len(self.members))
        self._encoded = [(m, m.encode()) for m in self.members]
        self._owners: dict[Key, tuple[str, ...]] = {}

    @property
    def everywhere(self) -> bool:
        """True when every member holds every key (multi-store mode)."""
        return self.copies >= len(self.members)

    def owners(self, key: Key) -> tuple[str, ...]:
        """The members holding ``key``, best first (cached: hashing costs ~1 µs a member)."""
        if self.everywhere:
            return self.members
        found = self._owners.get(key)
        if found is not None:
            return found
        raw = "\0".join(key).encode()
        ranked = sorted(self._encoded, key=lambda m: _score(m[1], raw), reverse=True)
        found = tuple(m for m, _ in ranked[: self.copies])
        if len(self._owners) >= _CACHE_LIMIT:
            self._owners.clear()
        self._owners[key] = found
        return found

    def owns(self, member: str, key: Key) -> bool:
        return member in self.owners(key)

    def with_members(self, members: Sequence[str]) -> Ring:
        return Ring(members, self.replicas)
