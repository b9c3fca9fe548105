"""Stopping the real KCMS processes a test started."""

from __future__ import annotations

import asyncio
import signal

# A KCMS process given SIGTERM exits within seconds; this is a generous bound, not a timing check.
STOP_WAIT_SECONDS = 30.0


async def stop_process(proc: asyncio.subprocess.Process) -> int:
    """SIGTERM ``proc`` (if it still runs) and return its exit code; a process still running after
    :data:`STOP_WAIT_SECONDS` is killed and the wait's TimeoutError propagates (the test fails)."""
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return await asyncio.wait_for(proc.wait(), STOP_WAIT_SECONDS)
    finally:
        if proc.returncode is None:
            proc.kill()
