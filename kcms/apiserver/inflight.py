"""Overload protection in the style of the kube-apiserver's max-in-flight filter.

Two budgets, as kube's ``--max-requests-inflight`` (read-only, default 400) and
``--max-mutating-requests-inflight`` (mutating: POST, PUT, PATCH, DELETE; default 200): a request
over its budget is answered at once with ``429 TooManyRequests`` and ``Retry-After: 1`` (as a
``Status``, ``details.retryAfterSeconds``) and counted. 0 turns a budget off.

Admitted requests then take one of :data:`EXECUTING` seats to run their handler (authentication
and authorization, which wait on the kube-apiserver's reviews, do not hold one). The event loop
is one thread:
list handlers that render thousands of objects are CPU work, and when hundreds of them are ready
at once every loop iteration runs all of them before reading a socket again, so a probe waits
seconds behind them (a kubelet's liveness probe gives up after 1 s). With a few seats, only a few
are ready at a time; the rest wait, not ready, in FIFO order, and everything else — probes first
— is read in between. A request that waits longer than :data:`QUEUE_WAIT` for a seat is answered
429 too (kube's priority-and-fairness queues time out the same way).

Probes (``/healthz``, ``/livez``, ``/readyz`` and their sub-paths) never count and never wait.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from prometheus_client import Counter, Gauge

from .responses import StatusError

MAX_READONLY = 400  # kube's --max-requests-inflight default
MAX_MUTATING = 200  # kube's --max-mutating-requests-inflight default
EXECUTING = 4  # seats: requests running at once (the others queue, FIFO)
QUEUE_WAIT = 15.0  # seconds a request may wait for a seat (kube APF: a quarter of the request timeout)
RETRY_AFTER = 1  # seconds, as kube answers
PROBE_PATHS = ("/healthz", "/livez", "/readyz")
MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

INFLIGHT = Gauge(
    "kcms_apiserver_current_inflight_requests",
    "Requests admitted and not yet answered, by kind (readOnly, mutating).",
    ["request_kind"],
)
DROPPED = Counter(
    "kcms_apiserver_dropped_requests",
    "Requests answered 429 by the max-in-flight limit, by kind (readOnly, mutating) and reason "
    "(inflight: over the budget; queue_wait: no seat in time).",
    ["request_kind", "reason"],
)


def is_probe(path: str) -> bool:
    """Whether ``path`` is a health probe (exempt from the limits)."""
    for p in PROBE_PATHS:
        if path == p or path.startswith(p + "/"):
            return True
    return False


def too_many_requests() -> StatusError:
    """The 429 kube answers an overloaded request."""
    return StatusError(
        429,
        "TooManyRequests",
        "Too many requests, please try again later.",
        {"retryAfterSeconds": RETRY_AFTER},
    )


class InflightLimiter:
    """The two budgets and the execution seats of one server."""

    def __init__(
        self,
        max_readonly: int = MAX_READONLY,
        max_mutating: int = MAX_MUTATING,
        executing: int = EXECUTING,
        queue_wait: float = QUEUE_WAIT,
    ) -> None:
        if max_readonly < 0 or max_mutating < 0 or executing < 1:
            raise ValueError("in-flight limits must be >= 0 and executing seats >= 1")
        self.limits = {"readOnly": max_readonly, "mutating": max_mutating}
        self.current = {"readOnly": 0, "mutating": 0}
        self.queue_wait = queue_wait
        self._seats = asyncio.Semaphore(executing)

    @staticmethod
    def kind(method: str) -> str:
        """``mutating`` or ``readOnly``, by HTTP method."""
        return "mutating" if method.upper() in MUTATING_METHODS else "readOnly"

    @contextlib.asynccontextmanager
    async def admit(self, method: str) -> AsyncIterator[None]:
        """Hold a place in the request's budget, or raise a 429 :class:`StatusError`."""
        kind = self.kind(method)
        limit = self.limits[kind]
        if limit and self.current[kind] >= limit:
            DROPPED.labels(kind, "inflight").inc()
            raise too_many_requests()
        self.current[kind] += 1
        INFLIGHT.labels(kind).inc()
        try:
            yield
        finally:
            self.current[kind] -= 1
            INFLIGHT.labels(kind).dec()

    @contextlib.asynccontextmanager
    async def seat(self, method: str) -> AsyncIterator[None]:
        """Hold an execution seat (FIFO), or raise a 429 after :attr:`queue_wait` seconds. A free
        seat is taken without handing the loop a turn."""
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for runs the acquire in a task of its
        # own, three turns of the event loop even for a free seat, and during a 5000-node scrape
        # cycle a turn waits behind a loop iteration of scrapes, so every request paid that wait.
        try:
            async with asyncio.timeout(self.queue_wait):
                await self._seats.acquire()
        except TimeoutError:
            DROPPED.labels(self.kind(method), "queue_wait").inc()
            raise too_many_requests() from None
        try:
            yield
        finally:
            self._seats.release()
