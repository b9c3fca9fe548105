"""Small asyncio helpers shared by the long-running loops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

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
