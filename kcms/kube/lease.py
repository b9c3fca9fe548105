"""Leader election on a ``coordination.k8s.io/v1`` Lease, with the semantics of client-go's leaderelection.

A candidate takes the Lease when it does not exist (create; 409 means another candidate won), when it
already holds it, when it was released (empty ``holderIdentity``), or when the record has not changed for
``leaseDurationSeconds`` *as observed with the local monotonic clock* (the remote ``renewTime`` is never
compared with the local clock). Every write carries the resourceVersion that was read, so of two racing
candidates only one succeeds.

The leader renews every ``retry_period``; when no renewal has succeeded for ``renew_deadline`` it gives
up. :meth:`LeaderElector.is_leader` is stricter than client-go's: it is true only while the last
successful acquire/renew *started* less than ``renew_deadline`` ago. Since any other candidate waits
``lease_duration`` (> ``renew_deadline``) after it *saw* that write, a leader cut off from the API server
stops claiming leadership before anyone else can take the Lease.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import math
import random
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Gauge

from kcms.kube.client import KubeAPIError, KubeClient
from kcms.tasks import cancel_and_wait

log = logging.getLogger(__name__)

JITTER_FACTOR = 1.2  # client-go's leaderelection.JitterFactor

IS_LEADER = Gauge("kcms_leader_is_leader", "1 while this process holds the lease, else 0.", ["lease"])
TRANSITIONS = Counter(
    "kcms_leader_transitions", "Times this process started or stopped leading the lease.", ["lease"]
)


def default_identity() -> str:
    """A unique candidate identity: "<hostname>_<random uuid hex>" (as client-go's examples build it)."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex}"


def micro_time(ts: float | None = None) -> str:
    """A ``metav1.MicroTime`` string (RFC 3339, UTC, microseconds) for ``ts`` (default: now)."""
    dt = datetime.datetime.fromtimestamp(time.time() if ts is None else ts, datetime.UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """One candidate for the Lease ``namespace/name``; see the module docstring for the rules.

    ``lease_duration`` (how long others wait after the last change they saw) > ``renew_deadline`` (how long
    the leader keeps trying to renew before it gives up) > ``retry_period`` * 1.2 (the interval between
    attempts), else ValueError. The Lease records ``leaseDurationSeconds`` = ceil(lease_duration).

    Callbacks are plain functions called from the election loop; they must not block. ``on_new_leader``
    gets every new non-empty holder identity observed (ourselves included).
    """

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
        on_new_leader: Callable[[str], None] | None = None,
    ) -> None:
        if not namespace or not name:
            raise ValueError(f"leader election needs a lease namespace and name (got {namespace!r}/{name!r})")
        if not identity:
            raise ValueError("leader election needs a non-empty identity")
        if not (retry_period > 0 and renew_deadline > 0 and lease_duration > 0):
            raise ValueError(
                f"lease duration ({lease_duration}s), renew deadline ({renew_deadline}s) and retry period "
                f"({retry_period}s) must all be positive"
            )
        if not lease_duration > renew_deadline:
            raise ValueError(
                f"lease duration ({lease_duration}s) must be greater than the renew deadline ({renew_deadline}s)"
            )
        if not renew_deadline > retry_period * JITTER_FACTOR:
            raise ValueError(
                f"renew deadline ({renew_deadline}s) must be greater than retry period ({retry_period}s) "
                f"x {JITTER_FACTOR} = {retry_period * JITTER_FACTOR:g}s"
            )
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.on_new_leader = on_new_leader
        self._label = f"{namespace}/{name}"
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self._spec: dict[str, Any] | None = None  # the Lease spec last seen (or written by us)
        self._rv = ""  # its resourceVersion
        self._observed_at = 0.0  # monotonic time when _spec last changed
        self._renewed_at: float | None = None  # monotonic start of our last successful write, while held
        self._leading = False  # on_started_leading called, on_stopped_leading not yet
        self._reported = ""  # the last identity given to on_new_leader
        self._task: asyncio.Task[None] | None = None

    # ---- reading ----------------------------------------------------------------------------------
    def is_leader(self) -> bool:
        """True only while we lead and our last successful acquire/renew started < renew_deadline ago."""
        return (
            self._leading
            and self._renewed_at is not None
            and time.monotonic() - self._renewed_at < self.renew_deadline
        )

    @property
    def leader(self) -> str:
        """The holder identity last seen ("" when unknown or released)."""
        return (self._spec or {}).get("holderIdentity") or ""

    # ---- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        """Run :meth:`run` as a background task (no-op when already started)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name=f"leader election {self._label}")

    async def stop(self, release: bool = True) -> None:
        """Stop the background task; with ``release`` (default) hand the Lease over at once."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        if release:
            await self.release()

    async def release(self) -> None:
        """Graceful stop: stop the task started by :meth:`start`, and if we hold the Lease, rewrite it with
        an empty holder and ``leaseDurationSeconds`` 1 so another candidate can take it at once.

        A caller awaiting :meth:`run` itself must cancel it first. Errors are logged, not raised.
        """
        task, self._task = self._task, None
        await cancel_and_wait(task)
        self._lose("released")
        spec = self._spec
        if spec is None or spec.get("holderIdentity") != self.identity or not self._rv:
            return
        now = micro_time()
        released = {
            "holderIdentity": "",
            "leaseDurationSeconds": 1,
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": int(spec.get("leaseTransitions") or 0),
        }
        try:
            async with asyncio.timeout(self.renew_deadline):
                lease = await self.kube.put_json(f"{self._path}/{self.name}", self._lease(released, self._rv))
        except Exception as e:  # a conflict means someone else already took it: nothing to hand over
            level = logging.INFO if isinstance(e, KubeAPIError) and e.status == 409 else logging.WARNING
            log.log(level, "lease %s: not released: %s", self._label, e or type(e).__name__)
            return
        self._observe(lease)
        self._renewed_at = None
        log.info("lease %s: released by %s", self._label, self.identity)

    async def run(self) -> None:
        """Campaign forever: acquire, renew until lost, campaign again. Cancel to stop (without release)."""
        try:
            while True:
                await self._acquire_loop()
                self._start_leading()
                self._lose(await self._renew_loop())
        finally:
            self._lose("stopped")

    # ---- the loops --------------------------------------------------------------------------------
    async def _acquire_loop(self) -> None:
        while True:
            if await self._attempt(self.renew_deadline):
                return
            await asyncio.sleep(self.retry_period * (1 + random.random() * JITTER_FACTOR))

    async def _renew_loop(self) -> str:
        """Renew every retry period; return (why) once no renewal has succeeded for renew_deadline."""
        while True:
            assert self._renewed_at is not None
            deadline = self._renewed_at + self.renew_deadline
            await asyncio.sleep(max(0.0, min(self.retry_period, deadline - time.monotonic())))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return f"not renewed for {self.renew_deadline:g}s"
            if not await self._attempt(remaining) and self.leader not in (self.identity, ""):
                return f"{self.leader} holds the lease"  # no point in retrying

    async def _attempt(self, limit: float) -> bool:
        """One try-acquire-or-renew, bounded by ``limit`` seconds; False on any failure (logged)."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(limit):
                ok = await self._try_acquire_or_renew()
        except KubeAPIError as e:
            log.log(
                logging.DEBUG if e.status == 409 else logging.WARNING,
                "lease %s: %s",
                self._label,
                e,
            )
            return False
        except Exception as e:
            log.debug("lease %s: %s", self._label, e or type(e).__name__)
            return False
        if ok:
            self._renewed_at = started
        return ok

    async def _try_acquire_or_renew(self) -> bool:
        try:
            lease = await self.kube.get_json(f"{self._path}/{self.name}")
        except KubeAPIError as e:
            if e.status != 404:
                raise
            now = micro_time()
            spec = {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self._duration_seconds(),
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            }
            self._observe(await self.kube.post_json(self._path, self._lease(spec, "")))
            return True
        self._observe(lease)
        spec = self._spec or {}
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or self._duration_seconds())
        if holder and holder != self.identity and time.monotonic() < self._observed_at + duration:
            return False  # held by someone else, and it changed less than a lease duration ago
        now = micro_time()
        new = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self._duration_seconds(),
            "renewTime": now,
        }
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity and spec.get("acquireTime"):
            new["acquireTime"] = spec["acquireTime"]
            new["leaseTransitions"] = transitions
        else:
            new["acquireTime"] = now
            new["leaseTransitions"] = transitions + 1
        self._observe(await self.kube.put_json(f"{self._path}/{self.name}", self._lease(new, self._rv)))
        return True

    # ---- helpers ----------------------------------------------------------------------------------
    def _duration_seconds(self) -> int:
        return max(1, math.ceil(self.lease_duration))

    def _lease(self, spec: dict[str, Any], rv: str) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if rv:
            meta["resourceVersion"] = rv
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    def _observe(self, lease: dict[str, Any]) -> None:
        """Record a Lease read or written; restart the local expiry clock when its spec changed."""
        spec = dict(lease.get("spec") or {})
        self._rv = str((lease.get("metadata") or {}).get("resourceVersion") or "")
        if spec != self._spec:
            self._spec = spec
            self._observed_at = time.monotonic()
        holder = spec.get("holderIdentity") or ""
        if holder and holder != self._reported:
            self._reported = holder
            if holder != self.identity:
                log.info("lease %s: %s is the leader", self._label, holder)
            self._call(self.on_new_leader, holder)

    def _start_leading(self) -> None:
        if self._leading:
            return
        self._leading = True
        IS_LEADER.labels(self._label).set(1)
        TRANSITIONS.labels(self._label).inc()
        log.info("lease %s: %s started leading", self._label, self.identity)
        self._call(self.on_started_leading)

    def _lose(self, why: str) -> None:
        if not self._leading:
            return
        self._leading = False
        IS_LEADER.labels(self._label).set(0)
        TRANSITIONS.labels(self._label).inc()
        log.info("lease %s: %s stopped leading (%s)", self._label, self.identity, why)
        self._call(self.on_stopped_leading)

    def _call(self, callback: Callable[..., None] | None, *args: Any) -> None:
        if callback is None:
            return
        try:
            callback(*args)
        except Exception:
            log.exception("lease %s: leader election callback failed", self._label)
