"""kcms.tasks.TurnBudget: kubelet bodies decoded in one turn of the event loop are bounded by time,
so what else became ready (the next chunk of a list being served, a probe) runs between them."""

from __future__ import annotations

import asyncio
import math
import time

from kcms.collector.kubelet import DECODE_TURN_SECONDS, KubeletClient, KubeletClientConfig
from kcms.tasks import TurnBudget


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
