"""kcms.tasks.TurnBudget: kubelet bodies decoded in one turn of the event loop are bounded by time,
so what else became ready (the next chunk of a list being served, a probe) runs between them."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
from _http_helpers import serve_app
from prometheus_client import CollectorRegistry, Counter

from kcms.collector.kubelet import (
    DECODE_TURN_SECONDS,
    DECODE_TURN_SECONDS_STREAMING,
    DECODES_DEFERRED,
    KubeletClient,
    KubeletClientConfig,
)
from kcms.tasks import LONG_STREAM_BYTES, STREAMS, ActiveStreams, TurnBudget


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


async def test_steps_past_the_budget_wait_for_a_later_turn_behind_other_work():
    clock = Clock()
    budget = TurnBudget(0.5, clock)  # binary fractions: exact sums
    order: list[str] = []

    async def step(name: str, cost: float) -> None:
        await budget.wait()
        order.append(name)
        clock.now += cost  # the step's work

    async def other() -> None:  # e.g. a list's next chunk, ready in the same turn
        order.append("other")

    # Five steps ready in one turn, each costing 0.25: two fit the budget, the third sees 0.5 spent.
    steps = [asyncio.ensure_future(step(f"s{i}", 0.25)) for i in range(5)]
    chunk = asyncio.ensure_future(other())
    await asyncio.gather(*steps, chunk)
    assert order[:3] == ["s0", "s1", "other"]  # the rest waited behind the other work
    assert sorted(order[3:]) == ["s2", "s3", "s4"]
    # the next turn: s2 and s3 fit, s4 waits once more
    assert budget.deferred == 3 + 1
    # the same again, counted by a metric
    registry = CollectorRegistry()
    budget = TurnBudget(0.5, clock, counter=Counter("steps_deferred", "steps deferred", registry=registry))
    order.clear()
    await asyncio.gather(*(step(f"s{i}", 0.25) for i in range(5)), other())
    assert budget.deferred == registry.get_sample_value("steps_deferred_total") == 4


async def test_a_turn_under_budget_defers_nothing():
    budget = TurnBudget(0.5, Clock())  # the clock does not move: every step is free
    done: list[int] = []

    async def step(i: int) -> None:
        await budget.wait()
        done.append(i)

    await asyncio.gather(*(step(i) for i in range(200)))
    assert done == list(range(200)) and budget.deferred == 0


async def test_past_its_window_a_budget_lets_every_step_run():
    # A cycle that has run a third of the resolution is behind: its decodes are no longer spread.
    clock = Clock()
    budget = TurnBudget(0.5, clock)
    budget.until = clock.now + 0.25
    order: list[str] = []

    async def step(name: str) -> None:
        await budget.wait()
        order.append(name)
        clock.now += 0.25

    async def other() -> None:
        order.append("other")

    await asyncio.gather(*(step(f"s{i}") for i in range(5)), other())
    assert order == ["s0", "s1", "s2", "s3", "s4", "other"] and budget.deferred == 0
    # Past the window a step opens no turn, so none has to be ended by a callback in the next.
    await budget.wait()
    assert not budget._open and not budget._ending


def test_the_kubelet_client_bounds_its_decodes_for_the_first_part_of_each_cycle():
    client = KubeletClient(KubeletClientConfig())
    assert isinstance(client.decode_turns, TurnBudget)
    assert client.decode_turns.seconds == DECODE_TURN_SECONDS <= 0.01
    before = time.perf_counter()
    client.start_cycle(spread_for=5.0)  # the collector: a third of the resolution
    assert before + 5.0 <= client.decode_turns.until <= time.perf_counter() + 5.0
    client.start_cycle()
    assert client.decode_turns.until == math.inf
    client.decode_turns.clock = clock = Clock()  # the window is on the budget's own clock
    client.start_cycle(spread_for=5.0)
    assert client.decode_turns.until == clock.now + 5.0


async def test_steps_released_and_then_cancelled_do_not_strand_the_queue():
    # A queued scrape may hit its deadline just after its turn came: it never opens a turn, so the
    # budget itself goes on releasing the rest.
    clock = Clock()
    budget = TurnBudget(0.5, clock)
    done: list[int] = []

    async def step(i: int, cost: float) -> None:
        await budget.wait()
        done.append(i)
        clock.now += cost

    first = asyncio.ensure_future(step(0, 0.5))  # spends the turn's budget
    queued = [asyncio.ensure_future(step(i, 0.0)) for i in range(1, 13)]
    await asyncio.sleep(0)  # that turn ran: step 0 done, steps 1-12 queued
    assert done == [0] and budget.deferred == 12
    released = queued[:8]  # the next turn releases eight; they are cancelled before they resume
    asyncio.get_running_loop().call_soon(lambda: [t.cancel() for t in released])
    rest = await asyncio.wait_for(asyncio.gather(*queued[8:]), timeout=5)
    assert rest == [None] * 4 and done == [0, 9, 10, 11, 12]
    assert all(t.cancelled() for t in released) and first.done()


async def test_while_a_response_streams_a_turn_runs_fewer_steps():
    # A list of every pod being streamed: each of its chunks waits behind one turn's steps, so the
    # turn holds fewer of them (but always one: the cycle still advances).
    clock, streams = Clock(), ActiveStreams()
    budget = TurnBudget(0.5, clock, streams=streams, streaming_seconds=0.25)

    async def turn_of(cost: float) -> list[str]:
        order: list[str] = []

        async def step(name: str) -> None:
            await budget.wait()
            order.append(name)
            clock.now += cost

        async def other() -> None:
            order.append("chunk")

        await asyncio.gather(*(step(f"s{i}") for i in range(4)), other())
        return order

    assert (await turn_of(0.25))[:3] == ["s0", "s1", "chunk"]  # nothing streams: 0.5 a turn
    streams.count = 1
    assert (await turn_of(0.25))[:2] == ["s0", "chunk"]  # 0.25 a turn
    assert (await turn_of(1.0))[:2] == ["s0", "chunk"]  # a step over the budget still runs
    streams.count = 0
    assert (await turn_of(0.25))[:3] == ["s0", "s1", "chunk"]


def test_the_kubelet_client_yields_more_to_streamed_responses():
    client = KubeletClient(KubeletClientConfig())
    assert client.decode_turns.streams is STREAMS
    assert client.decode_turns.counter is DECODES_DEFERRED  # kcms_kubelet_decodes_deferred_total
    assert client.decode_turns.streaming_seconds == DECODE_TURN_SECONDS_STREAMING < DECODE_TURN_SECONDS


async def test_a_long_streamed_response_counts_while_it_streams_however_it_ends():
    # A response counts once LONG_STREAM_BYTES of it were produced (the list of every pod, not
    # that of 5000 nodes), and the count a kubelet client's decodes yield to drops back when it
    # ends: whole, cut short by a client that leaves, or by a producer that fails.
    import aiohttp
    from aiohttp import web

    from kcms.apiserver import responses

    seen: list[int] = []
    gone = asyncio.Event()

    chunk = b"x" * (LONG_STREAM_BYTES // 8)

    async def chunks(fail: bool):
        for i in range(20):
            seen.append(STREAMS.count)
            if fail and i == 12:
                raise RuntimeError("producer failed")
            yield chunk
            await asyncio.sleep(0.01)

    async def handler(request: web.Request) -> web.StreamResponse:
        try:
            return await responses.stream_response(request, chunks(request.path == "/fail"))
        finally:
            gone.set()

    app = web.Application()
    app.router.add_get("/{kind}", handler)
    runner, port = await serve_app(app, access_log=None)
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{port}/whole") as r:
                assert len(await r.read()) == 20 * len(chunk)
            # counted from the ninth chunk's production on (8 chunks are exactly the threshold)
            assert seen == [0] * 9 + [1] * 11 and STREAMS.count == 0
            for kind in ("leave", "fail"):
                seen.clear()
                gone.clear()
                async with s.get(f"http://127.0.0.1:{port}/{kind}") as r:
                    if kind == "leave":
                        await r.content.readexactly(11 * len(chunk))  # then it leaves mid-body
                        r.close()
                    else:
                        with pytest.raises(aiohttp.ClientPayloadError):  # the body is cut short
                            await r.read()
                await asyncio.wait_for(gone.wait(), 10)
                assert seen[:10] == [0] * 9 + [1], kind  # it was counted before it ended
                assert STREAMS.count == 0, kind
    finally:
        await runner.cleanup()
