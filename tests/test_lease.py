"""kcms.kube.lease: leader election on a coordination.k8s.io/v1 Lease against the fake API server (HTTPS).

Timing is only asserted as lower bounds that a slow machine can only widen (a takeover never comes
before the lease expired) or as generous `eventually` deadlines.
"""

from __future__ import annotations

import asyncio
import datetime
import random
import re
import socket
import time

import pytest
from _kube_helpers import eventually
from prometheus_client import REGISTRY

from kcms.kube.client import KubeClient
from kcms.kube.lease import LeaderElector, default_identity

NS, NAME = "kcms-system", "kcms-collector"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
MICRO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
FAST = {"lease_duration": 1.5, "renew_deadline": 1.0, "retry_period": 0.2}
FAST_RECORDED = 2  # leaseDurationSeconds written for 1.5 s (rounded up to whole seconds)


@pytest.fixture
async def clients(fake_kube):
    """A factory of KubeClients (one per elector, like separate processes), all closed at the end."""
    made: list[KubeClient] = []

    async def make() -> KubeClient:
        c = await KubeClient.load(str(fake_kube.kubeconfig))
        made.append(c)
        return c

    yield make
    for c in made:
        await c.close()


class Events:
    """Records an elector's callbacks."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []

    def kwargs(self) -> dict:
        return {
            "on_started_leading": lambda: self.log.append(("started", "")),
            "on_stopped_leading": lambda: self.log.append(("stopped", "")),
            "on_new_leader": lambda who: self.log.append(("leader", who)),
        }

    def count(self, what: str) -> int:
        return sum(1 for e in self.log if e[0] == what)


async def electors(clients, n: int, name: str = NAME, **timings) -> list[LeaderElector]:
    out = []
    for i in range(n):
        out.append(LeaderElector(await clients(), NS, name, f"cand-{i}", **(timings or FAST)))
    return out


def leaders(els: list[LeaderElector]) -> list[LeaderElector]:
    return [e for e in els if e.is_leader()]


def ts(text: str) -> float:
    return datetime.datetime.fromisoformat(text).timestamp()


def check_history(writes: list[tuple], name: str = NAME, recorded: int = FAST_RECORDED) -> int:
    """What the write history proves about a lease; returns the number of takeovers without release.

    - leaseTransitions goes up by one exactly when a new non-empty holder writes, and never otherwise;
    - a holder that did not release was only replaced once its last write was at least a lease duration
      old: renewTime(new holder's first write) - renewTime(old holder's last write) >= leaseDurationSeconds.
      Each renewTime is stamped before its write is sent, and a candidate only counts a lease duration
      from when it *saw* the old write, so no two holders can both believe they lead.
    """
    ws = [w for w in writes if w[1] == name]
    assert ws, "no lease writes"
    assert [int(w[2]) for w in ws] == sorted(int(w[2]) for w in ws)
    takeovers = 0
    for prev, cur in zip(ws, ws[1:], strict=False):
        _, _, _, old_holder, old_renew, old_tr = prev
        _, _, _, holder, renew, tr = cur
        if holder == "" or holder == old_holder:
            assert tr == old_tr, (prev, cur)
            continue
        assert tr == old_tr + 1, (prev, cur)
        if old_holder:
            takeovers += 1
            assert ts(renew) - ts(old_renew) >= recorded - 0.05, (prev, cur)
    return takeovers


# ---- validation ---------------------------------------------------------------------------------
def test_validation_names_the_values():
    kube = KubeClient("https://127.0.0.1:1")
    with pytest.raises(ValueError, match=r"lease duration \(10s\).*renew deadline \(10s\)"):
        LeaderElector(kube, NS, NAME, "me", lease_duration=10, renew_deadline=10, retry_period=2)
    with pytest.raises(ValueError, match=r"renew deadline \(2.4s\).*retry period \(2s\)"):
        LeaderElector(kube, NS, NAME, "me", lease_duration=10, renew_deadline=2.4, retry_period=2)
    with pytest.raises(ValueError, match="positive"):
        LeaderElector(kube, NS, NAME, "me", lease_duration=10, renew_deadline=5, retry_period=0)
    with pytest.raises(ValueError, match="identity"):
        LeaderElector(kube, NS, NAME, "")
    with pytest.raises(ValueError, match="namespace and name"):
        LeaderElector(kube, "", NAME, "me")
    LeaderElector(kube, NS, NAME, "me", lease_duration=10, renew_deadline=2.41, retry_period=2)  # ok


def test_default_identity():
    a, b = default_identity(), default_identity()
    assert a != b
    host, _, tail = a.rpartition("_")
    assert host == socket.gethostname() and re.fullmatch(r"[0-9a-f]{32}", tail)


# ---- one elector --------------------------------------------------------------------------------
async def test_single_elector_creates_the_lease_and_releases_it(fake_kube, clients):
    ev = Events()
    el = LeaderElector(await clients(), NS, "single", "me", **ev.kwargs())
    label = {"lease": f"{NS}/single"}
    transitions = REGISTRY.get_sample_value("kcms_leader_transitions_total", label) or 0.0
    before = time.time()
    el.start()
    await eventually(el.is_leader)
    assert el.leader == "me" and ev.log == [("leader", "me"), ("started", "")]
    lease = fake_kube.get("leases", NS, "single")
    spec = lease["spec"]
    assert spec["holderIdentity"] == "me" and spec["leaseDurationSeconds"] == 15
    assert spec["leaseTransitions"] == 0
    assert MICRO.match(spec["acquireTime"]) and MICRO.match(spec["renewTime"])
    assert before - 1 <= ts(spec["acquireTime"]) <= time.time() + 1
    assert lease["metadata"]["namespace"] == NS and lease["apiVersion"] == "coordination.k8s.io/v1"
    assert [m for m, p, _ in fake_kube.requests if p == LEASES] == ["POST"]
    assert REGISTRY.get_sample_value("kcms_leader_is_leader", label) == 1.0
    assert REGISTRY.get_sample_value("kcms_leader_transitions_total", label) == transitions + 1

    await el.stop()  # graceful: release
    assert not el.is_leader() and el.leader == ""
    spec = fake_kube.get("leases", NS, "single")["spec"]
    assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1
    assert spec["leaseTransitions"] == 0
    assert ev.count("stopped") == 1 and ev.count("started") == 1
    assert REGISTRY.get_sample_value("kcms_leader_is_leader", label) == 0.0
    assert REGISTRY.get_sample_value("kcms_leader_transitions_total", label) == transitions + 2
    writes = len(fake_kube.lease_writes)
    assert fake_kube.lease_writes[-1][3] == ""
    await el.release()  # idempotent: nothing held any more
    assert ev.count("stopped") == 1 and len(fake_kube.lease_writes) == writes


async def test_renewals_keep_acquire_time_and_a_failing_callback_does_not_stop_leading(fake_kube, clients):
    def boom() -> None:
        raise RuntimeError("callback failure")

    el = LeaderElector(await clients(), NS, NAME, "me", on_started_leading=boom, **FAST)
    el.start()
    try:
        await eventually(el.is_leader)
        first = fake_kube.get("leases", NS, NAME)["spec"]
        await eventually(lambda: len(fake_kube.lease_writes) >= 4)
        spec = fake_kube.get("leases", NS, NAME)["spec"]
        assert el.is_leader() and spec["holderIdentity"] == "me"
        assert spec["acquireTime"] == first["acquireTime"] and spec["leaseTransitions"] == 0
        assert ts(spec["renewTime"]) > ts(first["renewTime"])
    finally:
        await el.stop()


# ---- several electors ---------------------------------------------------------------------------
async def test_two_electors_exactly_one_leads(fake_kube, clients):
    a, b = await electors(clients, 2)
    a.start()
    b.start()
    try:
        await eventually(lambda: len(leaders([a, b])) == 1)
        first = leaders([a, b])[0]
        await eventually(lambda: a.leader == b.leader == first.identity)
        # a few lease durations of renewals: the same single leader all along
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            assert leaders([a, b]) in ([first], []), "two leaders or a change of leader"
            await asyncio.sleep(0.02)
        assert first.is_leader()
        assert check_history(fake_kube.lease_writes) == 0
    finally:
        await a.stop()
        await b.stop()


async def test_takeover_after_a_crash_waits_for_the_lease_to_expire(fake_kube, clients):
    a, b = await electors(clients, 2)
    a.start()
    await eventually(a.is_leader)
    b.start()
    await eventually(lambda: b.leader == a.identity)
    await a.stop(release=False)  # like a crash: the Lease still names a
    crashed = time.time()
    assert fake_kube.get("leases", NS, NAME)["spec"]["holderIdentity"] == a.identity
    try:
        await eventually(b.is_leader)
        spec = fake_kube.get("leases", NS, NAME)["spec"]
        assert spec["holderIdentity"] == b.identity and spec["leaseTransitions"] == 1
        # b could only take it a full lease duration after a's last renewal
        assert ts(spec["acquireTime"]) - crashed >= FAST_RECORDED - FAST["renew_deadline"] - 0.05
        assert check_history(fake_kube.lease_writes) == 1
    finally:
        await b.stop()


async def test_graceful_release_hands_over_without_waiting_for_expiry(fake_kube, clients):
    # a 30 s lease: had a not released it, b could not lead within the 20 s `eventually` below
    timings = {"lease_duration": 30.0, "renew_deadline": 1.0, "retry_period": 0.2}
    ea, eb = Events(), Events()
    a = LeaderElector(await clients(), NS, NAME, "a", **timings, **ea.kwargs())
    b = LeaderElector(await clients(), NS, NAME, "b", **timings, **eb.kwargs())
    a.start()
    await eventually(a.is_leader)
    b.start()
    await eventually(lambda: b.leader == "a")
    await a.release()
    assert not a.is_leader() and ea.count("stopped") == 1
    try:
        await eventually(b.is_leader)
        spec = fake_kube.get("leases", NS, NAME)["spec"]
        assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
        assert spec["leaseDurationSeconds"] == 30
        assert eb.log[0] == ("leader", "a") and eb.log[-2:] == [("leader", "b"), ("started", "")]
        holders = [w[3] for w in fake_kube.lease_writes]
        assert "" in holders and holders.index("") < holders.index("b")
        check_history(fake_kube.lease_writes, recorded=30)
    finally:
        await b.stop()


async def test_a_leader_cut_off_from_the_api_stops_leading_within_the_renew_deadline(fake_kube, clients):
    ev = Events()
    a = LeaderElector(await clients(), NS, NAME, "a", **FAST, **ev.kwargs())
    a.start()
    try:
        await eventually(a.is_leader)
        await fake_kube.stop()
        await eventually(lambda: not a.is_leader(), limit=FAST["renew_deadline"] + 5)
        # is_leader() is clock-based: it turned False at the latest renew_deadline after the cut
        await eventually(lambda: ev.count("stopped") == 1, limit=5)
        assert ev.log == [("leader", "a"), ("started", ""), ("stopped", "")]
        # the server comes back: the Lease still names a, so a takes it again without a transition
        await fake_kube.start()
        await eventually(a.is_leader)
        assert ev.count("started") == 2
        assert fake_kube.get("leases", NS, NAME)["spec"]["leaseTransitions"] == 0
    finally:
        await a.stop()


async def test_is_leader_follows_the_clock_even_when_the_loop_cannot_run(fake_kube, clients):
    a = LeaderElector(await clients(), NS, NAME, "a", **FAST)
    a.start()
    try:
        await eventually(a.is_leader)
        # block the event loop past the renew deadline: no renewal can run, so whoever asks (here,
        # synchronously, before the loop gets a turn) must hear "not the leader" without any help of it
        time.sleep(FAST["renew_deadline"] + 0.1)  # noqa: ASYNC251
        assert not a.is_leader()
        await eventually(a.is_leader)  # the loop runs again and renews (the Lease still names a)
    finally:
        await a.stop()


async def test_candidates_racing_to_create_the_lease(fake_kube, clients):
    fake_kube.lease_write_delay = 0.3  # every candidate's POST is in flight before the first one lands
    els = await electors(clients, 4)
    for e in els:
        e.start()
    try:
        await eventually(lambda: len(leaders(els)) == 1)
        winner = leaders(els)[0]
        posts = [q for q in fake_kube.requests if q[0] == "POST" and q[1] == LEASES]
        assert len(posts) >= 2, "the candidates did not race"
        created = [w for w in fake_kube.lease_writes if w[5] == 0]
        assert {w[3] for w in created} == {winner.identity}  # one creation won, the others got 409
        fake_kube.lease_write_delay = 0.0
        await eventually(lambda: all(e.leader == winner.identity for e in els))
        assert leaders(els) in ([winner], [])
    finally:
        for e in els:
            await e.stop()


async def test_candidates_racing_to_take_an_expired_lease(fake_kube, clients):
    # a lease left by a crashed holder, renewed "long ago": the candidates must still wait a full
    # leaseDurationSeconds on their own clocks before they take it (the remote renewTime is not trusted)
    old = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
    stamp = old.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    fake_kube.upsert(
        {
            "kind": "Lease",
            "apiVersion": "coordination.k8s.io/v1",
            "metadata": {"name": NAME, "namespace": NS},
            "spec": {
                "holderIdentity": "ghost",
                "leaseDurationSeconds": 2,
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": 7,
            },
        }
    )
    fake_kube.lease_write_delay = 0.5  # both take-over PUTs are in flight together: one must get 409
    started = time.time()
    els = await electors(clients, 2)
    for e in els:
        e.start()
    try:
        await eventually(lambda: len(leaders(els)) == 1)
        winner = leaders(els)[0]
        spec = fake_kube.get("leases", NS, NAME)["spec"]
        assert spec["holderIdentity"] == winner.identity and spec["leaseTransitions"] == 8
        assert ts(spec["acquireTime"]) - started >= 2 - 0.05
        puts = [q for q in fake_kube.requests if q[0] == "PUT" and q[1] == f"{LEASES}/{NAME}"]
        assert len(puts) > len(fake_kube.lease_writes), "no PUT was refused"
        fake_kube.lease_write_delay = 0.0
        await asyncio.sleep(0.5)
        assert leaders(els) in ([winner], [])
    finally:
        for e in els:
            await e.stop()


async def test_history_never_has_two_leaders_at_once(fake_kube, clients):
    """Crash, release and restart candidates at random; sample is_leader() all along."""
    els = await electors(clients, 3)
    for e in els:
        e.start()
    seen_two: list[list[str]] = []
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            now = leaders(els)
            if len(now) > 1:
                seen_two.append([e.identity for e in now])
            await asyncio.sleep(0.005)

    sampler = asyncio.create_task(sample())
    rnd = random.Random(1234)
    try:
        for step in range(4):
            await eventually(lambda: len(leaders(els)) == 1)
            leader = leaders(els)[0]
            await leader.stop(release=step % 2 == 1)  # crash or graceful
            await asyncio.sleep(rnd.uniform(0.0, 0.3))
            await eventually(lambda: len(leaders(els)) == 1)  # another candidate takes over
            leader.start()  # and the old leader comes back as a candidate
        await eventually(lambda: len(leaders(els)) == 1)
    finally:
        stop.set()
        await sampler
        for e in els:
            await e.stop()
    assert not seen_two
    assert check_history(fake_kube.lease_writes) >= 2  # the takeovers after the two crashes were checked
