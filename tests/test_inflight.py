"""The execution seats of kcms.apiserver.inflight: a free seat costs the request no turn of the event
loop (every turn waits behind a loop iteration of scrapes during a cycle), seats go in FIFO order,
and a request that times out or is cancelled while waiting leaves every seat as it was. Turns are
counted by a ticker, not timed."""

from __future__ import annotations

import asyncio

import pytest

from kcms.apiserver.inflight import InflightLimiter
from kcms.apiserver.responses import StatusError


async def turns_taken(work) -> int:
    """How many turns of the event loop ``await work`` handed to other callbacks."""
    loop = asyncio.get_running_loop()
    count = [0]
    stop = [False]

    def tick() -> None:
        if not stop[0]:
            count[0] += 1
            loop.call_soon(tick)

    loop.call_soon(tick)
    await asyncio.sleep(0)  # the ticker is running
    before = count[0]
    await work
    taken = count[0] - before
    stop[0] = True
    return taken


async def seated(limiter: InflightLimiter, log: list[str] | None = None, name: str = "") -> None:
    async with limiter.seat("GET"):
        if log is not None:
            log.append(name)


async def test_a_free_seat_is_taken_without_a_turn_of_the_loop() -> None:
    limiter = InflightLimiter(executing=2)
    assert await turns_taken(seated(limiter)) == 0
    async with limiter.seat("GET"):  # one held, one still free
        assert await turns_taken(seated(limiter)) == 0
    # asyncio.wait_for, which this replaced, took three on Python 3.11
    assert await turns_taken(asyncio.wait_for(asyncio.sleep(0), 1)) >= 1


async def test_seats_go_in_arrival_order_and_a_newcomer_does_not_jump_the_queue() -> None:
    limiter = InflightLimiter(executing=1)
    order: list[str] = []
    gate = asyncio.Event()

    async def holder() -> None:
        async with limiter.seat("GET"):
            order.append("holder")
            await gate.wait()

    held = asyncio.create_task(holder())
    await asyncio.sleep(0)
    waiting = [asyncio.create_task(seated(limiter, order, f"w{i}")) for i in range(3)]
    await asyncio.sleep(0)
    gate.set()
    late = asyncio.create_task(seated(limiter, order, "late"))  # arrives while the others wait
    await asyncio.gather(held, *waiting, late)
    assert order == ["holder", "w0", "w1", "w2", "late"]


@pytest.mark.parametrize("how", ["timeout", "cancel"])
async def test_a_request_that_gives_up_waiting_leaves_the_seats_as_they_were(how: str) -> None:
    limiter = InflightLimiter(executing=1, queue_wait=0.05 if how == "timeout" else 60)
    gate = asyncio.Event()

    async def holder() -> None:
        async with limiter.seat("GET"):
            await gate.wait()

    held = asyncio.create_task(holder())
    await asyncio.sleep(0)
    waiter = asyncio.create_task(seated(limiter))
    if how == "timeout":
        with pytest.raises(StatusError) as refused:
            await waiter
        assert refused.value.code == 429
    else:
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
    gate.set()
    await held
    # the one seat is free again, and taken at once
    assert await turns_taken(seated(limiter)) == 0
    assert not limiter._seats.locked()
