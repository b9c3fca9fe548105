"""Waiting for, and stopping, the real KCMS processes a test started."""

from __future__ import annotations

import asyncio
import signal
import ssl
import time
from collections.abc import Callable

import aiohttp

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


async def wait_readyz(
    session: aiohttp.ClientSession,
    port: int,
    proc: asyncio.subprocess.Process,
    within: float = 60.0,
    log: Callable[[], str] = lambda: "",
) -> None:
    """Poll ``https://127.0.0.1:<port>/readyz`` (certificate not checked) until it answers 200;
    fail the test if ``proc`` exits first or ``within`` seconds pass (a generous bound, not a timing
    check), with ``log()`` in the message."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    deadline = time.monotonic() + within
    while True:
        try:
            async with session.get(f"https://127.0.0.1:{port}/readyz", ssl=ctx) as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        assert proc.returncode is None, "kcms exited before it was ready: " + log()
        assert time.monotonic() < deadline, f"not ready within {within:g} s: " + log()
        await asyncio.sleep(0.2)
