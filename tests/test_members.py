"""kcms.kube.members: static store lists and EndpointSlice membership (against the fake API server)."""

from __future__ import annotations

import pytest
from _kube_helpers import eventually
from fakeapi import make_endpointslice
from hypothesis import given
from hypothesis import strategies as st

from kcms.kube.client import KubeClient
from kcms.kube.members import (
    EndpointSliceMembers,
    Member,
    StaticMembers,
    parse_static_members,
    slice_members,
)

NS, SVC = "kcms-system", "kcms-store"


# ---- the static list ----------------------------------------------------------------------------
def test_parse_static_members_good():
    got = parse_static_members(
        " s2=https://store-2.kcms.svc:8443/ , https://10.0.0.7:8443,http://[::1]:8080/base/,"
        "s1=http://Store-1:80, https://store-3.example,"
    )
    assert got == [
        Member("10.0.0.7:8443", "https://10.0.0.7:8443"),
        Member("[::1]:8080", "http://[::1]:8080/base"),
        Member("s1", "http://store-1:80"),
        Member("s2", "https://store-2.kcms.svc:8443"),
        Member("store-3.example:443", "https://store-3.example"),
    ]
    assert parse_static_members("") == [] and parse_static_members(" , ") == []
    assert parse_static_members("a=https://x:1") < parse_static_members("b=https://x:1")  # ordered by name


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a=", "empty URL"),
        ("=https://x:1", "empty name"),
        ("store.example:8443", "http:// or https://"),
        ("ftp://x:21", "http:// or https://"),
        ("https://", "no host"),
        ("https://x:0", "port 0"),
        ("https://x:99999", "invalid URL"),
        ("https://x:http", "invalid URL"),
        ("https://user:pw@x:1", "credentials"),
        ("https://x:1/?a=b", "query or fragment"),
        ("https://x:1/#top", "query or fragment"),
        ("a b=https://x:1", "invalid name"),
        ("a=https://x:1,a=https://y:1", "duplicate name 'a'"),
        ("https://x:443,https://x", "duplicate name 'x:443'"),
        ("a=https://x:1,b=https://x:1/", "also given for 'a'"),
    ],
)
def test_parse_static_members_bad(text, message):
    with pytest.raises(ValueError, match="store endpoint") as e:
        parse_static_members(text)
    assert message in str(e.value)


_label = st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=8)
_host = st.one_of(
    st.lists(_label, min_size=1, max_size=3).map(".".join),
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(str),
)


@given(
    st.lists(
        st.tuples(st.booleans(), _host, st.integers(1, 65535), st.sampled_from(["http", "https"])),
        max_size=6,
    )
)
def test_parse_static_members_round_trip(entries):
    texts, expected, seen_names, seen_urls = [], {}, set(), set()
    for i, (named, host, port, scheme) in enumerate(entries):
        netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        url = f"{scheme}://{netloc}"
        name = f"m{i}" if named else netloc
        if name in seen_names or url in seen_urls:
            continue
        seen_names.add(name)
        seen_urls.add(url)
        texts.append(f"{name}={url}" if named else url)
        expected[name] = Member(name, url)
    assert parse_static_members(", ".join(texts)) == sorted(expected.values())


@given(st.text(max_size=40))
def test_parse_static_members_only_raises_value_error(text):
    try:
        members = parse_static_members(text)
    except ValueError as e:
        assert "store endpoint" in str(e)
    else:
        assert len({m.name for m in members}) == len(members)
        assert all(m.url.startswith(("http://", "https://")) for m in members)


async def test_static_members():
    ms = parse_static_members("b=https://b:1,a=https://a:1")
    src = StaticMembers(list(reversed(ms)))
    calls = []
    src.subscribe(calls.append)
    await src.start()
    assert src.has_synced() and src.members() == ms
    src.members().clear()  # a copy
    assert src.members() == ms
    await src.stop()
    assert calls == []
    with pytest.raises(ValueError, match="duplicate"):
        StaticMembers([Member("a", "https://a:1"), Member("a", "https://b:1")])


# ---- one EndpointSlice --------------------------------------------------------------------------
def test_slice_members_conditions_names_ports():
    sl = make_endpointslice(NS, SVC, [("pod-a", "10.0.0.1", True), ("", "10.0.0.2", None)], 8443, "api")
    sl["endpoints"].append(
        {"addresses": ["10.0.0.3"], "conditions": {"ready": False}, "targetRef": {"name": "c"}}
    )
    sl["endpoints"].append({"addresses": ["10.0.0.4"], "hostname": "store-4", "conditions": {"ready": None}})
    sl["ports"].insert(0, {"name": "metrics", "port": 9090, "protocol": "TCP"})
    assert slice_members(sl, "api") == [
        Member("pod-a", "https://10.0.0.1:8443"),
        Member("10.0.0.2", "https://10.0.0.2:8443"),
        Member("store-4", "https://10.0.0.4:8443"),
    ]
    assert slice_members(sl, "", "http")[0] == Member("pod-a", "http://10.0.0.1:9090")  # first port
    assert slice_members(sl, "nope") == []
    v6 = make_endpointslice(NS, SVC, [("pod-a", "fd00::1", True)], 8443)
    assert v6["addressType"] == "IPv6"
    assert slice_members(v6) == [Member("pod-a", "https://[fd00::1]:8443")]
    assert slice_members({"endpoints": sl["endpoints"], "ports": None}) == []  # "all ports": not usable


# ---- EndpointSliceMembers against the fake API server -------------------------------------------
@pytest.fixture
async def kube(fake_kube):
    c = await KubeClient.load(str(fake_kube.kubeconfig))
    yield c
    await c.close()


@pytest.fixture
async def watched(fake_kube, kube):
    """EndpointSliceMembers of SVC (port "api") with two slices, and the list of its callback calls."""
    fake_kube.upsert(
        make_endpointslice(
            NS, SVC, [("store-0", "10.1.0.10", True), ("store-1", "10.1.0.11", True)], 8443, "api", name="s-a"
        )
    )
    fake_kube.upsert(make_endpointslice(NS, SVC, [("store-2", "10.1.0.12", None)], 8443, "api", name="s-b"))
    # not ours: another service in the namespace, the same service name in another namespace
    fake_kube.upsert(make_endpointslice(NS, "other", [("x", "10.9.0.1", True)], 8443, "api", name="o"))
    fake_kube.upsert(make_endpointslice("elsewhere", SVC, [("y", "10.9.0.2", True)], 8443, "api", name="e"))
    src = EndpointSliceMembers(kube, NS, SVC, port_name="api")
    calls: list[list[Member]] = []
    src.subscribe(calls.append)
    assert not src.has_synced() and src.members() == []
    await src.start()
    yield src, calls
    await src.stop()


def m(i: int, port: int = 8443) -> Member:
    return Member(f"store-{i}", f"https://10.1.0.{10 + i}:{port}")


async def test_endpointslices_initial_list(fake_kube, watched):
    src, calls = watched
    assert src.has_synced()
    assert src.members() == [m(0), m(1), m(2)]
    assert calls == [[m(0), m(1), m(2)]]  # the first list counts as a change
    q = [q for q in fake_kube.requests if q[1] == f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"]
    assert q and all(r[2]["labelSelector"] == f"kubernetes.io/service-name={SVC}" for r in q)


async def test_endpointslices_changes_fire_callbacks(fake_kube, watched):
    src, calls = watched
    # an endpoint turns not ready
    fake_kube.upsert(
        make_endpointslice(
            NS,
            SVC,
            [("store-0", "10.1.0.10", True), ("store-1", "10.1.0.11", False)],
            8443,
            "api",
            name="s-a",
        )
    )
    await eventually(lambda: len(calls) == 2)
    assert calls[-1] == src.members() == [m(0), m(2)]
    # a change that leaves the set as it is (another not-ready endpoint, new labels) fires nothing...
    quiet = make_endpointslice(
        NS, SVC, [("store-2", "10.1.0.12", None), ("store-9", "10.1.0.19", False)], 8443, "api", name="s-b"
    )
    quiet["metadata"]["labels"]["extra"] = "label"
    fake_kube.upsert(quiet)
    # ...which the next real change shows: a slice added
    fake_kube.upsert(make_endpointslice(NS, SVC, [("store-3", "10.1.0.13", True)], 8443, "api", name="s-c"))
    await eventually(lambda: len(calls) == 3)
    assert calls[-1] == [m(0), m(2), m(3)]
    # a slice removed
    fake_kube.delete("endpointslices", NS, "s-a")
    await eventually(lambda: len(calls) == 4)
    assert calls[-1] == src.members() == [m(2), m(3)]
    # changes to other services are not seen at all
    fake_kube.upsert(make_endpointslice(NS, "other", [("z", "10.9.0.3", True)], 8443, "api", name="o2"))
    fake_kube.delete("endpointslices", NS, "s-c")
    await eventually(lambda: len(calls) == 5)
    assert calls[-1] == [m(2)]
    assert src.informer.relists == 1


async def test_endpointslices_survive_dropped_watches_and_410(fake_kube, watched):
    src, calls = watched
    await eventually(lambda: fake_kube.open_watches == 1)
    assert fake_kube.drop_watches() == 1
    fake_kube.delete("endpointslices", NS, "s-b")
    await eventually(lambda: src.members() == [m(0), m(1)])
    assert src.informer.relists == 1  # re-watched from the last resourceVersion
    await eventually(lambda: fake_kube.open_watches == 1)
    # the history is compacted while the watch is down: the re-watch gets 410 and relists
    fake_kube.expire_history()
    fake_kube.drop_watches()
    fake_kube.upsert(make_endpointslice(NS, SVC, [("store-4", "10.1.0.14", True)], 8443, "api", name="s-d"))
    await eventually(lambda: src.members() == [m(0), m(1), m(4)])
    assert src.informer.relists == 2
    assert calls[-2:] == [[m(0), m(1)], [m(0), m(1), m(4)]]


async def test_endpointslices_dual_stack_and_ports(fake_kube, kube):
    fake_kube.upsert(make_endpointslice(NS, SVC, [("store-0", "fd00::10", True)], 8443, "api", name="v6"))
    fake_kube.upsert(make_endpointslice(NS, SVC, [("store-0", "10.1.0.10", True)], 8443, "api", name="v4"))
    fake_kube.upsert(make_endpointslice(NS, SVC, [("store-5", "fd00::15", True)], 8443, "api", name="v6b"))
    fake_kube.upsert(make_endpointslice(NS, SVC, [("store-6", "10.1.0.16", True)], 9999, "other", name="np"))
    src = EndpointSliceMembers(kube, NS, SVC, port_name="api", scheme="http")
    await src.start()
    try:
        # one member per name: the IPv4 address of a dual-stack pod; a slice without the port adds nothing
        assert src.members() == [
            Member("store-0", "http://10.1.0.10:8443"),
            Member("store-5", "http://[fd00::15]:8443"),
        ]
        fake_kube.delete("endpointslices", NS, "v4")
        await eventually(lambda: src.members()[0] == Member("store-0", "http://[fd00::10]:8443"))
    finally:
        await src.stop()
    with pytest.raises(ValueError, match="scheme"):
        EndpointSliceMembers(kube, NS, SVC, scheme="ftp")


async def test_a_failing_callback_does_not_stop_the_others(fake_kube, kube):
    src = EndpointSliceMembers(kube, NS, SVC)

    def boom(members: list[Member]) -> None:
        raise RuntimeError("callback failure")

    calls: list[list[Member]] = []
    src.subscribe(boom)
    src.subscribe(calls.append)
    await src.start()
    try:
        assert src.has_synced() and src.members() == [] and calls == []  # an empty first list: no change
        fake_kube.upsert(make_endpointslice(NS, SVC, [("", "10.1.0.20", True)], 8443, name="s"))
        await eventually(lambda: calls == [[Member("10.1.0.20", "https://10.1.0.20:8443")]])
    finally:
        await src.stop()
