"""A list+watch cache of one Kubernetes resource (a client-go style informer, without the machinery).

It lists (paged), then watches from the list's resourceVersion with bookmarks. It survives watch
streams that end (re-watch from the last resourceVersion), 410 Expired (relist), and connection errors
(exponential backoff with jitter, capped). Objects are converted on arrival; only the converted
values are kept.

Objects are converted one by one: one that cannot be converted (wrong types, missing or oversized
fields) is skipped, counted in ``kcms_kube_objects_skipped_total{resource, reason}`` and logged in one
bounded line, and the rest of the list or watch goes on; when such an object replaces a cached one,
the cached one is dropped (it no longer describes the object).

Two ways to convert: ``convert`` (a function of the decoded JSON dict) or ``wire`` (a
kcms.kube.objects.WireCodec decoding the raw bytes of LIST pages and WATCH lines into typed values,
skipping unread fields in the parser: 20-40× faster for pods). With ``nested=True`` the key must be a
(namespace, name) pair: values are stored namespace -> name -> value (no key tuple per object, and
``by_index(namespace)`` without a second index), which is what the pod cache uses.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

import aiohttp
from prometheus_client import Counter

from kcms.changelog import ChangeLog
from kcms.kube.client import KubeAPIError, KubeClient
from kcms.kube.objects import Bad, WireCodec
from kcms.limits import printable
from kcms.tasks import cancel_and_wait

log = logging.getLogger(__name__)

T = TypeVar("T")

# Changes an informer's log keeps at least (changes_since; at most twice as many): a reader
# further behind checks everything.
CHANGE_LOG = 65536

SKIPPED = Counter(
    "kcms_kube_objects_skipped_total",
    "Kubernetes objects listed or watched that were not kept (wrong types, missing or oversized "
    "fields), by resource and reason (invalid, oversized).",
    ["resource", "reason"],
)
_CONVERT_ERRORS = (ValueError, TypeError, AttributeError, KeyError)


class _Expired(Exception):
    """The watch's resourceVersion is too old: a relist is needed."""


class Informer(Generic[T]):
    """Cache of the objects at ``path`` (e.g. "/api/v1/pods"), converted with ``convert``, keyed by ``key``.

    ``index`` (optional) maps a value to a secondary index key (e.g. the namespace) for ``by_index``.
    """

    def __init__(
        self,
        client: KubeClient,
        path: str,
        convert: Callable[[dict[str, Any]], T],
        key: Callable[[T], Hashable],
        label_selector: str = "",
        field_selector: str = "",
        *,
        index: Callable[[T], Hashable] | None = None,
        wire: WireCodec[T] | None = None,
        nested: bool = False,
        page_size: int = 500,
        watch_timeout: int = 300,
        backoff_initial: float = 0.2,
        backoff_max: float = 30.0,
    ) -> None:
        self.client = client
        self.path = path
        self.convert = convert
        self.key = key
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.last_resource_version = ""
        self.relists = 0  # how many times the full list was fetched (first list included)
        self.wire = wire
        self.accept = wire.accept if wire is not None else ""  # the Accept header of LISTs
        self.resource = path.rsplit("/", 1)[-1]  # the metric's resource label: bounded by our code
        self.skipped = 0  # objects not kept since construction
        self._nested = nested
        self._count = 0  # values held when nested
        self._index_fn = None if nested else index
        # flat: key -> value; nested: namespace -> name -> value
        self._items: dict[Hashable, Any] = {}
        self._index: dict[Hashable, dict[Hashable, T]] = {}
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # The keys put or removed since the last full list (changes_since).
        self._changes: ChangeLog[Hashable] = ChangeLog(CHANGE_LOG)

    # ---- reading ----------------------------------------------------------------------------------
    def has_synced(self) -> bool:
        """True once the first full list is in."""
        return self._synced.is_set()

    def get(self, key: Hashable) -> T | None:
        """The cached value under ``key``, or None."""
        if self._nested:
            inner = self._items.get(key[0])  # type: ignore[index]
            return None if inner is None else inner.get(key[1])  # type: ignore[index]
        return self._items.get(key)

    def values(self) -> Iterable[T]:
        """A snapshot of the cached values."""
        if self._nested:
            return [v for inner in self._items.values() for v in inner.values()]
        return list(self._items.values())

    def by_index(self, value: Hashable) -> Iterable[T]:
        """A snapshot of the values whose index key is ``value`` (nested: whose namespace is)."""
        if self._nested:
            return list(self._items.get(value, {}).values())
        return list(self._index.get(value, {}).values())

    def __len__(self) -> int:
        return self._count if self._nested else len(self._items)

    @property
    def version(self) -> int:
        """Changes so far (a relist counts as one): what :meth:`changes_since` takes."""
        return self._changes.version

    def changes_since(self, version: int) -> tuple[int, list[Hashable] | None]:
        """``(version now, keys put or removed after ``version``)``; the keys are None when the log
        no longer reaches back that far (a relist, or more than :data:`CHANGE_LOG` changes since):
        then anything may have changed. A key may appear more than once."""
        return self._changes.since(version)

    # ---- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the list+watch loop and return once the first list is in (retrying while it fails)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"informer {self.path}")
        waiter = asyncio.ensure_future(self._synced.wait())
        try:
            await asyncio.wait({waiter, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if not self._synced.is_set() and self._task.done():
            self._task.result()  # re-raise what killed the loop

    async def stop(self) -> None:
        """Stop the loop; the cache keeps its last contents."""
        task, self._task = self._task, None
        await cancel_and_wait(task)

    # ---- the loop ---------------------------------------------------------------------------------
    def _params(self) -> dict[str, str]:
        return {"labelSelector": self.label_selector, "fieldSelector": self.field_selector}

    async def _run(self) -> None:
        need_list = True
        delay = self.backoff_initial
        while True:
            try:
                if need_list:
                    await self._list()
                    need_list = False
                await self._watch()
                delay = self.backoff_initial  # a watch that ran and ended normally
            except _Expired:
                log.debug("%s: resourceVersion %s expired, relisting", self.path, self.last_resource_version)
                need_list = True
            except asyncio.CancelledError:
                raise
            except Exception as e:  # keep the cache alive whatever happens; back off
                if isinstance(e, KubeAPIError) and e.status == 410:
                    need_list = True
                    continue
                quiet = isinstance(e, (aiohttp.ClientError, OSError, TimeoutError))
                level = logging.DEBUG if quiet else logging.WARNING
                log.log(level, "%s: %s; retrying in %.1fs", self.path, e or type(e).__name__, delay)
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, self.backoff_max)

    async def _list(self) -> None:
        params: dict[str, Any] = self._params()
        if self.page_size:
            params["limit"] = self.page_size
        t0 = time.monotonic()
        items: dict[Hashable, Any] = {}
        count = 0
        bad: list[Bad] = []
        while True:
            if self.wire is not None:
                page = self.wire.page(await self.client.get_raw(self.path, params, accept=self.wire.accept))
                values: Iterable[T] = page.items
                bad.extend(page.bad)
                rv, token = page.resource_version, page.continue_token
            else:
                body = await self.client.get_json(self.path, params)
                values = self._convert_all(body.get("items") or (), bad)
                meta = body.get("metadata") or {}
                rv, token = str(meta.get("resourceVersion", "")), str(meta.get("continue") or "")
            if self._nested:
                for value in values:
                    ns, name = self.key(value)  # type: ignore[misc]
                    inner = items.get(ns)
                    if inner is None:
                        inner = items[ns] = {}
                    if name not in inner:
                        count += 1
                    inner[name] = value
            else:
                for value in values:
                    items[self.key(value)] = value
            if not token:
                break
            params["continue"] = token
        self._items = items
        self._count = count
        self._rebuild_index()
        self._changes.reset()  # everything may have changed
        self.last_resource_version = rv
        self.relists += 1
        self._skipped(bad, "list")
        self._synced.set()
        # one line per (re)list: how long the start waited for this resource
        log.info(
            "%s: listed %d objects in %.1fs at resourceVersion %s",
            self.path,
            len(self),
            time.monotonic() - t0,
            printable(rv, 40),
        )

    def _convert_all(self, objects: Iterable[Any], bad: list[Bad]) -> list[T]:
        out = []
        for obj in objects:
            try:
                out.append(self.convert(obj))
            except _CONVERT_ERRORS as e:
                bad.append(Bad(getattr(e, "reason", "invalid"), str(e), None, _shown(obj)))
        return out

    def _skipped(self, bad: list[Bad], where: str) -> None:
        """Count and log (one bounded line) the objects that were not kept."""
        if not bad:
            return
        self.skipped += len(bad)
        reasons: dict[str, int] = {}
        for b in bad:
            reasons[b.reason] = reasons.get(b.reason, 0) + 1
        for reason, n in reasons.items():
            SKIPPED.labels(self.resource, reason).inc(n)
        first = bad[0]
        log.warning(
            "%s %s: skipped %d object(s) (%s), e.g. %s: %s",
            self.path,
            where,
            len(bad),
            ", ".join(f"{r}: {n}" for r, n in sorted(reasons.items())),
            printable(first.name, 120),
            printable(first.message, 200),
        )

    def _rebuild_index(self) -> None:
        self._index = {}
        if self._index_fn is not None:
            for k, v in self._items.items():
                self._index.setdefault(self._index_fn(v), {})[k] = v

    def _put(self, value: T) -> None:
        k = self.key(value)
        self._changes.add(k)
        if self._nested:
            inner = self._items.get(k[0])  # type: ignore[index]
            if inner is None:
                inner = self._items[k[0]] = {}  # type: ignore[index]
            if k[1] not in inner:  # type: ignore[index]
                self._count += 1
            inner[k[1]] = value  # type: ignore[index]
            return
        old = self._items.get(k)
        self._items[k] = value
        if self._index_fn is not None:
            if old is not None:
                self._unindex(k, old)
            self._index.setdefault(self._index_fn(value), {})[k] = value

    def _remove(self, value: T) -> None:
        self._remove_key(self.key(value))

    def _remove_key(self, k: Hashable) -> None:
        self._changes.add(k)
        if self._nested:
            inner = self._items.get(k[0])  # type: ignore[index]
            if inner is not None and inner.pop(k[1], None) is not None:  # type: ignore[index]
                self._count -= 1
                if not inner:
                    del self._items[k[0]]  # type: ignore[index]
            return
        old = self._items.pop(k, None)
        if old is not None and self._index_fn is not None:
            self._unindex(k, old)

    def _unindex(self, k: Hashable, old: T) -> None:
        assert self._index_fn is not None
        ik = self._index_fn(old)
        bucket = self._index.get(ik)
        if bucket is not None:
            bucket.pop(k, None)
            if not bucket:
                del self._index[ik]

    async def _watch(self) -> None:
        params: dict[str, Any] = self._params()
        params.update(
            resourceVersion=self.last_resource_version,
            allowWatchBookmarks="true",
            timeoutSeconds=int(self.watch_timeout * random.uniform(1.0, 2.0)),
        )
        if self.wire is not None:
            async for line in self.client.watch_raw(self.path, params, accept=self.wire.watch_accept):
                try:
                    ev = self.wire.event(line)
                except ValueError as e:
                    raise KubeAPIError(500, "BadWatchEvent", printable(str(e), 200)) from None
                if ev.type == "ERROR":
                    self._watch_error(ev.status)
                self._apply(ev.type, ev.value, ev.bad, ev.resource_version)
        else:
            async for event in self.client.watch_lines(self.path, params):
                typ = event.get("type")
                obj = event.get("object") or {}
                if not isinstance(obj, dict):
                    obj = {}
                if typ == "ERROR":
                    self._watch_error(obj)
                meta = obj.get("metadata")
                rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
                value = bad = None
                if typ in ("ADDED", "MODIFIED", "DELETED"):
                    problems: list[Bad] = []
                    converted = self._convert_all((obj,), problems)
                    value, bad = (converted[0], None) if converted else (None, problems[0])
                self._apply(str(typ), value, bad, str(rv) if rv else "")
        log.debug("%s: watch ended at resourceVersion %s", self.path, self.last_resource_version)

    @staticmethod
    def _watch_error(status: dict[str, Any]) -> None:
        code = status.get("code")
        if code == 410 or status.get("reason") in ("Expired", "Gone"):
            raise _Expired()
        try:
            code = int(code or 500)
        except (TypeError, ValueError):
            code = 500
        raise KubeAPIError(code, str(status.get("reason", "")), str(status.get("message", "")), status)

    def _apply(self, typ: str, value: T | None, bad: Bad | None, rv: str) -> None:
        """Apply one watch event to the cache."""
        if typ in ("ADDED", "MODIFIED", "DELETED"):
            if value is not None:
                if typ == "DELETED":
                    self._remove(value)
                else:
                    self._put(value)
            elif bad is not None:
                if bad.key is not None:  # what it was is no longer what it is: drop it
                    self._remove_key(bad.key)
                self._skipped([bad], f"watch {typ}")
        elif typ != "BOOKMARK":
            log.debug("%s: ignoring watch event type %s", self.path, printable(typ, 40))
            return
        if rv:
            self.last_resource_version = rv


def _shown(obj: Any) -> str:
    """namespace/name of a JSON object, as far as it can be read (for a log line)."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return "?"
    ns, name = meta.get("namespace"), meta.get("name")
    return f"{ns}/{name}" if ns else str(name)
