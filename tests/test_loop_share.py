"""kcms.tasks.LoopShare: the list of every pod may hold the event loop past its usual slice only
while such stretches have taken less than a share of the last window, so one list during a scrape
cycle runs through while clients listing in a loop are held to the share."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kcms.apis.metrics import blocks, render
from kcms.model import NodeBatch, ResourcePoint
from kcms.store.resource import ResourceStore
from kcms.tasks import LoopShare

START = 1.7e9


def test_a_fresh_share_allows_a_stretch_up_to_its_share_of_the_window():
    share = LoopShare(0.25, 1.0)
    assert share.allows(0.25, 100.0)
    assert not share.allows(0.2501, 100.0)
    share.add(0.2, 100.0)
    assert share.allows(0.05, 100.0) and not share.allows(0.06, 100.0)


def test_held_time_decays_with_the_window():
    share = LoopShare(0.25, 2.0)
    share.add(0.25, 10.0)
    assert math.isclose(share._decayed(10.0), 0.25)
    assert math.isclose(share._decayed(12.0), 0.25 * math.exp(-1.0))
    assert share.allows(0.5 - 0.25 * math.exp(-1.0) - 1e-9, 12.0)
    assert not share.allows(0.5 - 0.25 * math.exp(-1.0) + 1e-6, 12.0)
    share.add(0.1, 9.0)  # a clock read before the last: nothing decays backwards, or grows
    assert math.isclose(share._decayed(10.0), 0.35)


def test_a_share_of_zero_allows_no_stretch_at_all():
    share = LoopShare(0.0, 1.0)
    assert share.allows(0.0, 1.0)
    assert not share.allows(1e-9, 1.0)


@pytest.mark.parametrize(("share", "window"), [(-0.1, 1.0), (1.5, 1.0), (0.5, 0.0), (0.5, -1.0), (math.nan, 1.0)])
def test_a_share_or_window_out_of_range_is_refused(share, window):
    with pytest.raises(ValueError):
        LoopShare(share, window)


@given(
    fraction=st.floats(0.01, 0.9),
    period=st.floats(0.01, 0.5),
    share=st.floats(0.05, 0.5),
)
def test_work_that_holds_the_loop_steadily_is_held_to_the_share(fraction, period, share):
    """Stretches of ``fraction * period`` every ``period`` seconds (window 1 s), each going on only
    while allowed, else cut to what is allowed: never more than the share of a minute (plus the
    first window's allowance); and none is cut while the level's peak in steady state,
    stretch / (1 - e^-period), stays within the share."""
    loop_share = LoopShare(share, 1.0)
    now = held_total = 0.0
    want = fraction * period
    cut = 0
    while now < 60.0:
        held = 0.0  # a stretch checks every millisecond of work whether it may go on, as a list does
        while held < want:
            step = min(0.001, want - held)
            if not loop_share.allows(held + step, now + held + step):
                cut += 1
                break
            held += step
        loop_share.add(held, now + held)
        held_total += held
        now += period
    assert held_total <= share * 60.0 + share + 1e-9
    if want / (1 - math.exp(-period)) <= share * 0.999:
        assert cut == 0


def test_lists_are_held_to_a_quarter_of_the_loop():
    """The figures lists use: a quarter of the last ~second, 50 ms at most in one stretch; the list
    of every pod and the others (by namespace or selector, nodes) draw on the one share."""
    assert render.LIST_HOLDS.share == render.LIST_SHARE == 0.25
    assert render.LIST_HOLDS.window == render.LIST_SHARE_WINDOW == 1.0
    assert render.YIELD_AFTER < render.HOLD_MAX <= render.LIST_SHARE * render.LIST_SHARE_WINDOW
    assert blocks.ListTurn is render.ListTurn  # the list of every pod keeps its turns as the others do


async def turns_during_a_list(pods: int = 400) -> tuple[int, bytes]:
    """Turns of the event loop that ran while a list of every pod (``pods`` pods on 4 nodes, each
    rendered by the list: ~``pods`` units of its work) was made, and the list."""
    from test_metrics_list_render import MutableInventory, pod_info

    inv = MutableInventory()
    store = ResourceStore(15.0, max_age=3600.0)
    for n in range(4):
        for i in range(n, pods, 4):
            inv.put_pod(pod_info("default", f"p{i}", {"app": "web"}, node=f"n{n}"))
    for t in (START, START + 15):  # two scrapes: a rate
        for n in range(4):
            batch = NodeBatch(f"n{n}", ResourcePoint(START - 3600, t, int(1e9 * (t - START + 3600)), 2**30))
            for i in range(n, pods, 4):
                batch.pods["default", f"p{i}"] = {"c": ResourcePoint(START - 3600, t, int(1e7 * i * (t - START + 1)), 4096)}
            store.store(batch)
    renderer = blocks.NodeBlocks(render.ListRenderer(inv), prerender_within=0)
    return await turns_while_collecting(renderer.items(store, time.monotonic(), "2026-05-01T10:00:00Z"))


async def turns_while_collecting(chunks) -> tuple[int, bytes]:
    """Turns of the event loop that ran while a list's ``chunks`` were collected, and the list."""
    from test_metrics_list_render import POD_HEAD, collect

    loop = asyncio.get_running_loop()
    turns, listing = [0], [True]

    def tick() -> None:
        if listing[0]:
            turns[0] += 1
            loop.call_soon(tick)

    loop.call_soon(tick)
    body = await collect(POD_HEAD, chunks)
    listing[0] = False
    await asyncio.sleep(0)
    return turns[0], body


async def turns_during_a_selective_list(pods: int = 3000) -> tuple[int, bytes]:
    """Turns of the event loop that ran while a list of the pods labelled app=web among ``pods``
    (one in ten) was rendered by ListRenderer (the HPA's query: six slices looked at), and the list."""
    from test_metrics_list_render import MutableInventory, pod_info

    from kcms.selectors import parse_label_selector
    from kcms.store.usage import PodUsage, Usage

    inv = MutableInventory()
    for i in range(pods):
        inv.put_pod(pod_info("default", f"p{i}", {"app": "web" if i % 10 == 0 else "db"}))
    usage = PodUsage(START, 15.0, (("c", Usage(START, 15.0, 1000, 4096)),))
    selector = parse_label_selector("app=web")
    chunks = render.ListRenderer(inv).pods(inv.pods("default"), lambda ns, name, now: usage, 0.0,
                                           lambda pod: selector.matches(pod.labels), "2026-05-01T10:00:00Z")  # fmt: skip
    return await turns_while_collecting(chunks)


@pytest.mark.parametrize(
    ("listing", "items", "checks"),
    [("turns_during_a_list", 400, 3), ("turns_during_a_selective_list", 300, 5)],
    ids=["every-pod", "by-selector"],
)
async def test_a_list_runs_through_while_lists_are_within_their_share_and_hands_turns_back_past_it(
    monkeypatch, listing, items, checks
):
    """Every check of the list's loop finds its slice spent (YIELD_AFTER 0): it goes on only while
    its share allows, and never past HOLD_MAX; the bytes are the same either way. The list of
    every pod checks every 100 pods rendered; a list by selector every 500 pods looked at (the
    HPA's query yielded at each before: 68 times a query at 5000 nodes, each turn slow to come back
    during a scrape cycle), and not at all while its stretch is short."""
    run = globals()[listing]
    module = render  # ListTurn reads the policy from render, for every kind of list
    monkeypatch.setattr(module, "YIELD_AFTER", 0.0)
    monkeypatch.setattr(module, "HOLD_MAX", math.inf)
    monkeypatch.setattr(module, "LIST_HOLDS", LoopShare(1.0, 1e6))
    through, body = await run()
    assert through == 0 and body.count(b'"name":"p') == items
    assert module.LIST_HOLDS.level() > 0  # the list's stretch was recorded
    monkeypatch.setattr(module, "LIST_HOLDS", LoopShare(0.0, 1.0))
    sliced, same = await run()
    assert sliced >= checks and same == body
    monkeypatch.setattr(module, "LIST_HOLDS", LoopShare(1.0, 1e6))
    monkeypatch.setattr(module, "HOLD_MAX", 0.0)
    capped, same = await run()
    assert capped >= checks and same == body
    monkeypatch.setattr(module, "YIELD_AFTER", math.inf)  # a stretch never long enough to hand back
    monkeypatch.setattr(module, "LIST_HOLDS", LoopShare(0.0, 1.0))
    short, same = await run()
    assert short == 0 and same == body
