"""A list+watch cache of one Kubernetes resource (a client-go style informer, without the machinery).

It lists (paged), then watches from the list's resourceVersion with bookmarks. It survives watch
streams that end (re-watch from the last resourceVersion), 410 Expired (relist), and connection errors
(exponential backoff with jitter, capped). Objects are converted on arrival; only the converted
values are kept.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

import aiohttp

from kcms.kube.client import KubeAPIError, KubeClient
from kcms.tasks import cancel_and_wait

log = logging.getLogger(__name__)

T = TypeVar("T")


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
        self._index_fn = index
        self._items: dict[Hashable, T] = {}
        self._index: dict[Hashable, dict[Hashable, T]] = {}
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # ---- reading ----------------------------------------------------------------------------------
    def has_synced(self) -> bool:
        """True once the first full list is in."""
        return self._synced.is_set()

    def get(self, key: Hashable) -> T | None:
        """The cached value under ``key``, or None."""
        return self._items.get(key)

    def values(self) -> Iterable[T]:
        """A snapshot of the cached values."""
        return list(self._items.values())

    def by_index(self, value: Hashable) -> Iterable[T]:
        """A snapshot of the values whose index key is ``value``."""
        return list(self._index.get(value, {}).values())

    def __len__(self) -> int:
        return len(self._items)

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
        items: dict[Hashable, T] = {}
        while True:
            body = await self.client.get_json(self.path, params)
            for obj in body.get("items") or ():
                value = self.convert(obj)
                items[self.key(value)] = value
            meta = body.get("metadata") or {}
            if not meta.get("continue"):
                break
            params["continue"] = meta["continue"]
        self._items = items
        self._rebuild_index()
        self.last_resource_version = str(meta.get("resourceVersion", ""))
        self.relists += 1
        self._synced.set()
        log.debug(
            "%s: listed %d objects at resourceVersion %s", self.path, len(items), self.last_resource_version
        )

    def _rebuild_index(self) -> None:
        self._index = {}
        if self._index_fn is not None:
            for k, v in self._items.items():
                self._index.setdefault(self._index_fn(v), {})[k] = v

    def _put(self, value: T) -> None:
        k = self.key(value)
        old = self._items.get(k)
        self._items[k] = value
        if self._index_fn is not None:
            if old is not None:
                self._unindex(k, old)
            self._index.setdefault(self._index_fn(value), {})[k] = value

    def _remove(self, value: T) -> None:
        k = self.key(value)
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
        async for event in self.client.watch_lines(self.path, params):
            typ = event.get("type")
            obj = event.get("object") or {}
            if typ == "ERROR":
                code = obj.get("code")
                if code == 410 or obj.get("reason") in ("Expired", "Gone"):
                    raise _Expired()
                raise KubeAPIError(int(code or 500), obj.get("reason", ""), obj.get("message", ""), obj)
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if typ in ("ADDED", "MODIFIED"):
                self._put(self.convert(obj))
            elif typ == "DELETED":
                self._remove(self.convert(obj))
            elif typ != "BOOKMARK":
                log.debug("%s: ignoring watch event type %r", self.path, typ)
                continue
            if rv:
                self.last_resource_version = str(rv)
        log.debug("%s: watch ended at resourceVersion %s", self.path, self.last_resource_version)
