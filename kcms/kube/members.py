"""Who the stores are: a static list (``--store-endpoints``) or a Service's EndpointSlices.

Both sources have one interface: ``members()`` (sorted by name), ``has_synced()``, ``subscribe(callback)``
(called with the new member list whenever the set changes), ``start()`` and ``stop()``.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import urllib.parse
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from kcms.kube.client import KubeClient
from kcms.kube.informer import Informer

log = logging.getLogger(__name__)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"

_NAME = re.compile(r"^[A-Za-z0-9._:\[\]-]+$")
_DEFAULT_PORT = {"http": 80, "https": 443}
_FAMILY_ORDER = {"IPv4": 0, "IPv6": 1, "FQDN": 2}


@dataclass(frozen=True, order=True)
class Member:
    """One store replica: a stable ``name`` and the base ``url`` it serves on (no trailing slash)."""

    name: str
    url: str


MembersCallback = Callable[[list[Member]], None]


# ---- static list --------------------------------------------------------------------------------
def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _parse_url(entry: str, url: str) -> tuple[str, str]:
    """Validate a store URL; return (normalised URL, default member name host:port)."""
    if not url:
        raise ValueError(f"store endpoint {entry!r}: empty URL")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise ValueError(f"store endpoint {entry!r}: invalid URL ({e})") from None
    if parts.scheme not in _DEFAULT_PORT:
        raise ValueError(f"store endpoint {entry!r}: the URL must start with http:// or https://")
    if not parts.hostname:
        raise ValueError(f"store endpoint {entry!r}: the URL has no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"store endpoint {entry!r}: credentials in the URL are not supported")
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise ValueError(f"store endpoint {entry!r}: the URL must not have a query or fragment")
    if any(c.isspace() for c in url):
        raise ValueError(f"store endpoint {entry!r}: the URL contains whitespace")
    if port == 0:
        raise ValueError(f"store endpoint {entry!r}: port 0 is not a valid port")
    host = parts.hostname
    port = port if port is not None else _DEFAULT_PORT[parts.scheme]
    netloc = _host_port(host, port) if parts.port is not None else (f"[{host}]" if ":" in host else host)
    normalised = f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}"
    return normalised, _host_port(host, port)


def parse_static_members(text: str) -> list[Member]:
    """Parse ``--store-endpoints``: a comma-separated list of ``name=URL`` or plain ``URL`` entries.

    A plain URL's member name is its ``host:port`` (the scheme's default port when it has none).
    URLs must be http(s), with a host, without credentials, query or fragment; a trailing slash is
    dropped. Empty entries are ignored. ValueError (naming the entry) for a malformed entry, a
    duplicate name or a duplicate URL. The result is sorted by name.
    """
    members: dict[str, Member] = {}
    urls: dict[str, str] = {}
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        name, sep, url = entry.partition("=")
        named = bool(sep) and "://" not in name  # else: no "=", or the first "=" is inside a plain URL
        name, url = (name.strip(), url.strip()) if named else ("", entry)
        if named and not name:
            raise ValueError(f"store endpoint {entry!r}: empty name before '='")
        if name and not _NAME.match(name):
            raise ValueError(
                f"store endpoint {entry!r}: invalid name {name!r} (letters, digits, '.', '_', ':', '-')"
            )
        url, default_name = _parse_url(entry, url)
        name = name or default_name
        if name in members:
            raise ValueError(f"store endpoint {entry!r}: duplicate name {name!r}")
        if url in urls:
            raise ValueError(f"store endpoint {entry!r}: the URL {url} is also given for {urls[url]!r}")
        members[name] = Member(name, url)
        urls[url] = name
    return sorted(members.values())


class _Subscribers:
    def __init__(self) -> None:
        self._callbacks: list[MembersCallback] = []

    def subscribe(self, callback: MembersCallback) -> None:
        """Call ``callback(members)`` whenever the member set changes."""
        self._callbacks.append(callback)

    def _notify(self, members: list[Member]) -> None:
        for cb in list(self._callbacks):
            try:
                cb(list(members))
            except Exception:
                log.exception("store membership callback failed")


class StaticMembers(_Subscribers):
    """A fixed member list (from :func:`parse_static_members`); callbacks never fire."""

    def __init__(self, members: list[Member]) -> None:
        super().__init__()
        names = [m.name for m in members]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate member names in {names}")
        self._members = sorted(members)

    def members(self) -> list[Member]:
        """The members, sorted by name."""
        return list(self._members)

    def has_synced(self) -> bool:
        """Always True."""
        return True

    async def start(self) -> None:
        """Nothing to do."""

    async def stop(self) -> None:
        """Nothing to do."""


# ---- EndpointSlices -----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Slice:
    namespace: str
    name: str
    family: int  # _FAMILY_ORDER of the addressType
    members: tuple[Member, ...]


def slice_members(obj: dict[str, Any], port_name: str = "", scheme: str = "https") -> list[Member]:
    """The ready endpoints of one EndpointSlice as members (one per address; see EndpointSliceMembers)."""
    port = None
    for p in obj.get("ports") or ():
        if (p or {}).get("port") and (not port_name or p.get("name", "") == port_name):
            port = int(p["port"])
            break
    if port is None:
        return []
    out = []
    for ep in obj.get("endpoints") or ():
        if (ep.get("conditions") or {}).get("ready") is False:
            continue
        ref = (ep.get("targetRef") or {}).get("name") or ""
        for address in ep.get("addresses") or ():
            host = f"[{address}]" if _is_ipv6(address) else address
            out.append(Member(ref or ep.get("hostname") or address, f"{scheme}://{host}:{port}"))
    return out


def _is_ipv6(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).version == 6
    except ValueError:
        return False


class _NotifyingInformer(Informer[_Slice]):
    """An Informer that calls ``changed()`` after every change to its cache."""

    def __init__(self, *args: Any, changed: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._changed = changed

    async def _list(self) -> None:
        await super()._list()
        self._changed()

    def _put(self, value: _Slice) -> None:
        super()._put(value)
        self._changed()

    def _remove(self, value: _Slice) -> None:
        super()._remove(value)
        self._changed()


class EndpointSliceMembers(_Subscribers):
    """Members from the ``discovery.k8s.io/v1`` EndpointSlices of Service ``namespace/service``.

    Every endpoint whose ``conditions.ready`` is not false is a member, one per address: name = the
    ``targetRef`` name, else the ``hostname``, else the address; url = ``scheme://address:port`` with the
    slice's port named ``port_name`` (the first port when ""), IPv6 addresses in brackets. A slice without
    such a port contributes nothing. When one name has several addresses (dual-stack slices), the IPv4 one
    is kept (then the lowest URL), so names stay unique. Sorted by name; callbacks fire when the set changes
    (the first list included, if it is not empty).
    """

    def __init__(
        self, kube: KubeClient, namespace: str, service: str, *, port_name: str = "", scheme: str = "https"
    ) -> None:
        super().__init__()
        if scheme not in _DEFAULT_PORT:
            raise ValueError(f"scheme must be http or https, not {scheme!r}")
        if not namespace or not service:
            raise ValueError(f"a namespace and a service name are needed (got {namespace!r}/{service!r})")
        self.namespace = namespace
        self.service = service
        self.port_name = port_name
        self.scheme = scheme
        self._members: list[Member] = []
        self.informer = _NotifyingInformer(
            kube,
            f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
            self._convert,
            _slice_key,
            label_selector=f"{SERVICE_NAME_LABEL}={service}",
            changed=self._recompute,
        )

    def _convert(self, obj: dict[str, Any]) -> _Slice:
        meta = obj.get("metadata") or {}
        return _Slice(
            meta.get("namespace", ""),
            meta.get("name", ""),
            _FAMILY_ORDER.get(obj.get("addressType", ""), 3),
            tuple(slice_members(obj, self.port_name, self.scheme)),
        )

    def _recompute(self) -> None:
        best: dict[str, tuple[int, Member]] = {}
        for s in self.informer.values():
            for m in s.members:
                cur = best.get(m.name)
                if cur is None or (s.family, m.url) < (cur[0], cur[1].url):
                    best[m.name] = (s.family, m)
        members = sorted(m for _, m in best.values())
        if members != self._members:
            log.info(
                "store members of service %s/%s: %s",
                self.namespace,
                self.service,
                ", ".join(f"{m.name}={m.url}" for m in members) or "none",
            )
            self._members = members
            self._notify(members)

    def members(self) -> list[Member]:
        """The current members, sorted by name (empty before the first list)."""
        return list(self._members)

    def has_synced(self) -> bool:
        """True once the first list of EndpointSlices is in."""
        return self.informer.has_synced()

    async def start(self) -> None:
        """Start watching; return once the first list is in (retrying while the API fails)."""
        await self.informer.start()

    async def stop(self) -> None:
        """Stop watching; the last members are kept."""
        await self.informer.stop()


def _slice_key(s: _Slice) -> Hashable:
    return (s.namespace, s.name)
