"""Small asyncio helpers shared by the long-running loops."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

log = logging.getLogger(__name__)


async def cancel_and_wait(task: asyncio.Task | None) -> None:
    """Cancel a background task (if any) and wait until it has finished unwinding."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def run_every(interval: float, step: Callable[[], Awaitable[object]], what: str) -> None:
    """Run ``step`` every ``interval`` seconds on a fixed grid, forever. A step that raises is
    logged and the loop goes on (the next one may well succeed); a step that overruns skips the
    ticks it missed rather than running back to back."""
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    while True:
        try:
            await step()
        except Exception:
            log.exception("%s failed", what)
        next_at += interval
        delay = next_at - loop.time()
        if delay < 0:
            next_at = loop.time()
            delay = 0
        await asyncio.sleep(delay)


class Incrementable(Protocol):
    """A counter metric (prometheus_client's ``Counter``, or one of its children)."""

    def inc(self, amount: float = 1) -> None: ...


class ActiveStreams:
    """How many long responses are being streamed right now: those past :data:`LONG_STREAM_BYTES`
    (:func:`kcms.apiserver.responses.stream_response` counts them). A :class:`TurnBudget` given
    it spends less of each turn while any is: the response's next chunk then waits behind less."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


# The process's long streamed responses (one event loop a process).
STREAMS = ActiveStreams()
# A streamed response counts once this much of it was produced: the list of every pod (57 MB at
# 150 000 pods) and the history lists do, the list of 5000 nodes (2.5 MB, ~35 ms) never does. A
# start is when clients poll the node list, while the cycles that make nodes servable run: counting
# every streamed response, 95 % of 5000 nodes were served after 32.4 and 38.4 s (two runs); counting
# these only, 27.0 and 26.4 s (the code before: 28.1, 32.0 and 30.4 s).
LONG_STREAM_BYTES = 4 << 20


class TurnBudget:
    """Bounds how long steps of one kind (kubelet bodies decoded) run in a single turn of the event
    loop. asyncio runs every callback that became ready before its next poll: with 200 scrapes in
    flight, one turn could decode 200 bodies (~140 ms) while a list being served waited for it.
    ``await budget.wait()`` before a step returns at once while this turn has spent less than
    ``seconds`` since its first such step; otherwise the step queues, and the next turns release
    the queue in order, :data:`RELEASED_A_TURN` steps each, behind what became ready meanwhile (the
    list's next chunk, a probe, another request). The connections stay in flight; only the CPU work
    is spread out. Until ``until`` (on ``clock``; set again for each cycle): past it, steps run as
    they come. While ``streams`` has a response streaming, a turn's budget is ``streaming_seconds``
    instead of ``seconds`` (at least one step still runs a turn). ``deferred`` counts the steps
    sent to a later turn, and so does ``counter`` (a metric) when given."""

    __slots__ = (
        "_ending",
        "_loop",
        "_open",
        "_queue",
        "_started",
        "clock",
        "counter",
        "deferred",
        "seconds",
        "streaming_seconds",
        "streams",
        "until",
    )

    def __init__(
        self,
        seconds: float,
        clock: Callable[[], float] = time.perf_counter,
        *,
        streams: ActiveStreams | None = None,
        streaming_seconds: float | None = None,
        counter: Incrementable | None = None,
    ) -> None:
        self.seconds = seconds
        self.clock = clock
        self.streams = streams
        self.streaming_seconds = seconds if streaming_seconds is None else streaming_seconds
        self.until = math.inf
        self._open = False  # a turn's first step was seen, and the turn has not ended yet
        self._ending = False  # _end_turn is queued
        self._started = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: collections.deque[asyncio.Future[None]] = collections.deque()
        self.deferred = 0  # steps sent to a later turn
        self.counter = counter

    def _end_turn(self) -> None:
        """Runs in the turn after one that opened: ends it, and releases queued steps for the
        next; again in every turn while steps are queued (a step released and then cancelled
        never opens a turn, so the queue cannot depend on that)."""
        self._open = False
        released, queue = 0, self._queue
        while queue and released < RELEASED_A_TURN:
            waiter = queue.popleft()
            if not waiter.done():  # not cancelled (a scrape's deadline)
                waiter.set_result(None)
                released += 1
        self._ending = bool(queue)
        if queue:
            assert self._loop is not None
            self._loop.call_soon(self._end_turn)

    async def wait(self) -> None:
        while True:
            now = self.clock()
            if now > self.until:  # past the window: no turn is opened, nothing queued to end it
                return
            if not self._open:
                self._open = True
                self._started = now
                if self._loop is None:
                    self._loop = asyncio.get_running_loop()
                if not self._ending:  # queued now, it runs in the next turn
                    self._ending = True
                    self._loop.call_soon(self._end_turn)
                return
            streams = self.streams
            budget = self.streaming_seconds if streams is not None and streams.count else self.seconds
            if now - self._started < budget:
                return
            self.deferred += 1
            if self.counter is not None:
                self.counter.inc()
            assert self._loop is not None
            waiter = self._loop.create_future()
            self._queue.append(waiter)
            await waiter


# Queued steps a turn of the loop releases: about what one turn's budget holds (a 30-pod body
# decodes and stores in ~0.6 ms here); a released step that finds the budget spent queues again.
RELEASED_A_TURN = 8


class LoopShare:
    """How much of the event loop's recent time one kind of work has held it in long stretches,
    as a level that decays with time constant ``window`` seconds (work holding a fraction f of
    the loop levels off at f * window). :meth:`allows` says whether a stretch that has run
    ``held`` seconds may go on: while the level, the stretch included, stays within ``share`` of
    the window. :meth:`add` records a stretch when it ends. ``clock`` is the clock the callers'
    ``now`` comes from; it is only read by :meth:`level`."""

    __slots__ = ("_at", "_level", "clock", "share", "window")

    def __init__(self, share: float, window: float, clock: Callable[[], float] = time.perf_counter) -> None:
        if not (0.0 <= share <= 1.0 and window > 0.0):
            raise ValueError("LoopShare: share in [0, 1] and a window above 0")
        self.share = share
        self.window = window
        self.clock = clock
        self._level = 0.0
        self._at = 0.0

    def _decayed(self, now: float) -> float:
        if self._level == 0.0:
            return 0.0
        return self._level * math.exp(-max(0.0, now - self._at) / self.window)

    def allows(self, held: float, now: float) -> bool:
        return self._decayed(now) + held <= self.share * self.window

    def add(self, held: float, now: float) -> None:
        self._level = self._decayed(now) + held
        self._at = max(self._at, now)

    def level(self) -> float:
        """Seconds held, decayed to now."""
        return self._decayed(self.clock())
