"""Shared by the tests of kcms.kube (tests/test_kube*.py)."""

from __future__ import annotations

import asyncio


async def eventually(cond, limit: float = 20.0) -> None:
    """Wait until cond() is true (a generous deadline, not a timing assertion)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not cond():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)
