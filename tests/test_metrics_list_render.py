"""metrics.k8s.io lists made of cached byte pieces (kcms.apis.metrics.render) give exactly the JSON
the dict path (kcms.apis.metrics.convert + orjson) gives, over real HTTPS: selectors and phase still
apply, changed pods are re-rendered, deleted pods' pieces are dropped, large lists are streamed
(gzipped or not) and decode to the same document, hostile label text is escaped, and a client that
leaves in the middle of a streamed list costs nothing but its own response."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import logging
import ssl
import time
from pathlib import Path

import aiohttp
import orjson
import pytest
from _abuse_helpers import assert_clean_log
from _http_helpers import serve_app
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kcms.apis.metrics import blocks, convert, render
from kcms.apis.metrics.api import MetricsAPI
from kcms.apiserver import AggregatedAPIServer, AuthnOptions, AuthzOptions, ServingOptions
from kcms.model import NodeBatch, NodeInfo, PodInfo, ResourcePoint
from kcms.quantity import format_bytes, format_cpu_nanocores
from kcms.selectors import parse_label_selector
from kcms.store.resource import PodUsage, ResourceStore, Usage

BASE = "/apis/metrics.k8s.io/v1beta1"
POD_HEAD = b'{"kind":"PodMetricsList","apiVersion":"metrics.k8s.io/v1beta1","metadata":{},"items":['
NODE_HEAD = b'{"kind":"NodeMetricsList","apiVersion":"metrics.k8s.io/v1beta1","metadata":{},"items":['
HOSTILE = 'a"b\\c\n\r\t\x00\x01\x1f\x7f é ✓ 🚀 \u2028\u2029 </script> ${x} %s'


class MutableInventory:
    """An Inventory (kcms.model) as the informers keep one: a changed object is a new object."""

    def __init__(self) -> None:
        self.node_map: dict[str, NodeInfo] = {}
        self.pod_map: dict[tuple[str, str], PodInfo] = {}

    def has_synced(self) -> bool:
        return True

    def nodes(self):
        return self.node_map.values()

    def node(self, name: str):
        return self.node_map.get(name)

    def pods(self, namespace: str | None = None):
        return [p for p in self.pod_map.values() if namespace is None or p.namespace == namespace]

    def pod(self, namespace: str, name: str):
        return self.pod_map.get((namespace, name))

    def put_pod(self, pod: PodInfo) -> None:
        self.pod_map[(pod.namespace, pod.name)] = pod


def pod_info(ns: str, name: str, labels: dict[str, str], node: str = "n0", phase: str = "Running") -> PodInfo:
    return PodInfo(ns, name, labels, node, phase, "2026-01-01T00:00:00Z")


# ---- the reference: what the dict path serves ---------------------------------------------------


def reference_pods(pods, usages, created: str, keep=None) -> bytes:
    fmt = convert.TimeFormatter()
    items = []
    for p in pods:
        if p.phase != "Running" or (keep is not None and not keep(p)):
            continue
        u = usages.get((p.namespace, p.name))
        if u is not None:
            items.append(convert.pod_metrics(p, convert.pod_usage_body(u, fmt), created))
    return orjson.dumps(convert.object_list("PodMetricsList", items))


def reference_nodes(nodes, usages, created: str) -> bytes:
    fmt = convert.TimeFormatter()
    items = [convert.node_metrics(n, usages[n.name], created, fmt) for n in nodes if n.name in usages]
    return orjson.dumps(convert.object_list("NodeMetricsList", items))


async def collect(head: bytes, chunks) -> bytes:
    return head + b"".join([c async for c in chunks]) + b"]}"


def rendered_pods(renderer, pods, usages, created, keep=None, by_value=False) -> bytes:
    def usage_of(ns, name, now):
        return usages.get((ns, name))

    return asyncio.run(
        collect(POD_HEAD, renderer.pods(pods, usage_of, 0.0, keep, created, by_value=by_value))
    )


def copied(usages: dict, bump: int = 0) -> dict:
    """New PodUsage objects with the same values (as a replica snapshot gives), or cpu + ``bump``."""
    return {
        k: PodUsage(
            u.timestamp,
            u.window,
            [(c, dataclasses.replace(x, cpu_nanocores=x.cpu_nanocores + bump)) for c, x in u.containers],
        )  # fmt: skip
        for k, u in usages.items()
    }


# ---- property: byte for byte the dict path -------------------------------------------------------

texts = st.text(max_size=12)
floats = st.floats(allow_nan=True, allow_infinity=True) | st.floats(-1e6, 1e6) | st.floats(1e9, 2e9)
cpus = st.integers(0, 10**15) | st.integers(0, 10**6).map(lambda n: n * 10**6) | st.just(0)
memories = (
    st.integers(0, 2**50)
    | st.integers(0, 2**20).map(lambda n: n * 1024)
    | st.integers(0, 2**12).map(lambda n: n * 1024**2)
    | st.integers(0, 3).map(lambda n: n * 1024**6)
)
usage_values = st.builds(Usage, floats, floats, cpus, memories)
pod_usages = st.builds(
    PodUsage, floats, floats, st.lists(st.tuples(texts, usage_values), min_size=0, max_size=3)
)
pods_and_usages = st.lists(
    st.tuples(
        st.sampled_from(["", "default", 'te"am\\a', "ns-é"]),
        st.text(min_size=1, max_size=12),
        st.dictionaries(texts, texts, max_size=3),
        st.sampled_from(["Running", "Running", "Pending", "Succeeded", ""]),
        st.none() | pod_usages,
    ),
    max_size=12,
    unique_by=lambda t: (t[0], t[1]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pods_and_usages, st.sampled_from(["", "app=web", "app!=web", "tier in (a,b)", "!app"]), st.integers(0, 3)
)
def test_pod_fragments_are_the_dict_path_bytes(rows, selector, reruns):
    pods = [pod_info(ns, name, labels, phase=phase) for ns, name, labels, phase, _ in rows]
    usages = {(ns, name): u for ns, name, _, _, u in rows if u is not None}
    labels = parse_label_selector(selector)
    keep = None if labels.empty else (lambda p: labels.matches(p.labels))
    renderer = render.ListRenderer(MutableInventory())
    created = "2026-05-01T10:00:00Z"
    expected = reference_pods(pods, usages, created, keep)
    for _ in range(reruns + 1):  # from the cache too
        got = rendered_pods(renderer, pods, usages, created, keep)
        assert got == expected
        orjson.loads(got)
    # replica snapshots: new objects every request, reused when equal, rendered again when not
    assert rendered_pods(renderer, pods, copied(usages), created, keep, by_value=True) == expected
    bumped = copied(usages, bump=1)
    assert rendered_pods(renderer, pods, bumped, created, keep, by_value=True) == reference_pods(
        pods, bumped, created, keep
    )


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=12), st.dictionaries(texts, texts, max_size=3),
                          usage_values), max_size=8, unique_by=lambda t: t[0]))  # fmt: skip
def test_node_fragments_are_the_dict_path_bytes(rows):
    nodes = [NodeInfo(name, labels, [], 0, "") for name, labels, _ in rows]
    usages = {name: u for name, _, u in rows}
    renderer = render.ListRenderer(MutableInventory())
    created = "2026-05-01T10:00:00Z"

    async def run():
        out = []
        for _ in range(2):
            chunks = renderer.nodes(nodes, lambda name, now: usages.get(name), 0.0, None, created)
            out.append(await collect(NODE_HEAD, chunks))
        return out

    for got in asyncio.run(run()):
        assert got == reference_nodes(nodes, usages, created)


@given(cpus | st.integers(-(10**12), 10**12), memories | st.integers(-(2**40), 2**40))
def test_quantity_shortcuts_are_the_formatters(cpu, memory):
    assert render.cpu_text(cpu) == format_cpu_nanocores(cpu)
    assert render.memory_text(memory) == format_bytes(memory)


def test_hostile_label_values_and_names_are_escaped():
    labels = {HOSTILE: HOSTILE, "app": "web"}
    pods = [pod_info("ns", 'pod"\\\n\x00✓', labels), pod_info(HOSTILE, HOSTILE, {})]
    usage = PodUsage(1.7e9, 15.0, [(HOSTILE, Usage(1.7e9, 15.0, 5, 7))])
    usages = {(p.namespace, p.name): usage for p in pods}
    got = rendered_pods(render.ListRenderer(MutableInventory()), pods, usages, "2026-05-01T10:00:00Z")
    assert got == reference_pods(pods, usages, "2026-05-01T10:00:00Z")
    doc = orjson.loads(got)
    assert doc["items"][0]["metadata"]["labels"] == labels
    assert doc["items"][0]["metadata"]["name"] == 'pod"\\\n\x00✓'
    assert doc["items"][1]["metadata"]["namespace"] == HOSTILE
    assert doc["items"][1]["containers"][0]["name"] == HOSTILE
    assert "labels" not in doc["items"][1]["metadata"]


def test_a_changed_pod_is_rendered_again_and_deleted_pods_leave_the_cache():
    inv = MutableInventory()
    usage = PodUsage(1.7e9, 15.0, [("c", Usage(1.7e9, 15.0, 1234567, 4096))])
    for i in range(1500):
        inv.put_pod(pod_info("ns", f"p{i}", {"app": "web"}))
    renderer = render.ListRenderer(inv)

    def usage_of(ns, name):
        return usage if inv.pod(ns, name) is not None else None

    def listed() -> dict:
        return orjson.loads(
            rendered_pods(
                renderer, list(inv.pods()), {k: usage_of(*k) for k in inv.pod_map}, "2026-05-01T10:00:00Z"
            )
        )

    assert len(listed()["items"]) == 1500
    # labels changed: the inventory holds a new PodInfo for the pod
    inv.put_pod(dataclasses.replace(inv.pod("ns", "p7"), labels={"app": "api", "new": 'x"y'}))
    items = {i["metadata"]["name"]: i for i in listed()["items"]}
    assert items["p7"]["metadata"]["labels"] == {"app": "api", "new": 'x"y'}
    assert items["p8"]["metadata"]["labels"] == {"app": "web"}
    # a new reading: the usage part is rendered again
    usage = PodUsage(1.7e9 + 15, 15.0, [("c", Usage(1.7e9 + 15, 15.0, 7654321, 8192))])
    assert listed()["items"][0]["containers"][0]["usage"] == {"cpu": "7654321n", "memory": "8Ki"}

    # churn: every pod deleted and replaced by another, three times over; the cache stays bounded
    # and, once swept, holds only pods the inventory has
    peak = 0
    for generation in range(3):
        inv.pod_map.clear()
        for i in range(1500):
            inv.put_pod(pod_info("ns", f"g{generation}-{i}", {"app": "web"}))
        assert len(listed()["items"]) == 1500
        peak = max(peak, renderer.cached()[0])
        assert renderer.cached()[0] <= 2 * 1500 + render.SWEEP_SLACK + 1500
    assert peak < 4 * 1500 + render.SWEEP_SLACK
    inv.pod_map.clear()
    for i in range(3000):  # enough new pods to pass the bound and sweep
        inv.put_pod(pod_info("ns", f"last-{i}", {}))
    listed()
    live = {id(p) for p in inv.pod_map.values()}
    assert renderer.cached()[0] == 3000
    assert all(k in live for k in renderer._pods)  # noqa: SLF001 - what is cached is what exists


# ---- over HTTPS ----------------------------------------------------------------------------------


class Served:
    def __init__(
        self, server: AggregatedAPIServer, api: MetricsAPI, inv: MutableInventory, store: ResourceStore
    ):
        self.server, self.api, self.inv, self.store = server, api, inv, store
        self.url = f"https://127.0.0.1:{server.port}"
        self.ssl = ssl.create_default_context(cafile=server.serving_cert_file)
        self.ssl.check_hostname = False

    async def get(self, path: str, *, accept: str = "application/json", gzip_ok: bool = False):
        headers = {"Accept": accept, "Accept-Encoding": "gzip" if gzip_ok else "identity"}
        async with aiohttp.ClientSession(auto_decompress=False) as s:
            async with s.get(self.url + path, headers=headers, ssl=self.ssl) as r:
                return r.status, r.headers.copy(), await r.read()


START = time.time() - 3600  # the containers' (and nodes') start time


def batches(node: str, pods: list[tuple[str, str]], t: float, scale: int) -> NodeBatch:
    """One scrape of ``node`` at ``t``: counters grow with ``t`` at a rate set by ``scale``."""
    batch = NodeBatch(node, ResourcePoint(START, t, int(scale * 10**9 * (t - START)), 2**30 + scale))
    for i, key in enumerate(pods):
        batch.pods[key] = {
            "app": ResourcePoint(START, t, int((i + 1) * scale * 1_234_567 * (t - START)), 4096 * (i + 1)),
            "side": ResourcePoint(START, t, int(7_000_003 * (t - START)), 1000 + i),
        }
    return batch


@pytest.fixture
async def served(tmp_path: Path):
    inv = MutableInventory()
    store = ResourceStore(15.0, max_age=3600.0)
    now = time.time()
    for n in range(4):
        node = f"node-{n}"
        inv.node_map[node] = NodeInfo(node, {"kubernetes.io/hostname": node, "zone": HOSTILE}, [], 0, "")
        keys = []
        for i in range(1100):  # 4400 pods: over a MiB, so the list is streamed
            ns = ("default", "team-a", HOSTILE)[i % 3]
            labels = {"app": ("web", "api")[i % 2], "weird": HOSTILE} if i % 5 else {}
            inv.put_pod(pod_info(ns, f"pod-{n}-{i}", labels, node))
            keys.append((ns, f"pod-{n}-{i}"))
        inv.put_pod(pod_info("default", f"pending-{n}", {"app": "web"}, node, phase="Pending"))
        keys.append(("default", f"pending-{n}"))
        for t in (now - 15, now):
            store.store(batches(node, keys, t, n + 1))
    server = AggregatedAPIServer(
        ServingOptions(secure_port=0, bind_address="127.0.0.1", cert_dir=str(tmp_path / "certs")),
        AuthnOptions(skip_lookup=True, allow_anonymous=True),
        AuthzOptions(always_allow_paths=["/healthz", "/readyz", "/livez", f"{BASE}/*"]),
    )
    api = MetricsAPI(inv, store)
    server.install(api.group_version())
    await server.start()
    try:
        yield Served(server, api, inv, store)
    finally:
        await server.stop()


def created_of(body: bytes) -> str:
    items = orjson.loads(body)["items"]
    return items[0]["metadata"]["creationTimestamp"] if items else ""


def expected_pods(s: Served, body: bytes, namespace: str | None = None, keep=None) -> bytes:
    usages = {(p.namespace, p.name): s.store.pod_usage(p.namespace, p.name) for p in s.inv.pods()}
    return reference_pods(s.inv.pods(namespace), usages, created_of(body), keep)


async def test_lists_over_https_are_the_dict_path_bytes_streamed_or_not(served: Served, caplog):
    caplog.set_level(logging.INFO)
    s = served
    status, headers, body = await s.get(f"{BASE}/pods")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert body == expected_pods(s, body)
    doc = orjson.loads(body)
    assert len(doc["items"]) == 4400  # the Pending pods have readings but are not served
    assert not any(i["metadata"]["name"].startswith("pending") for i in doc["items"])
    assert len(body) > render.STREAM_BYTES and headers.get("Transfer-Encoding") == "chunked"

    status, headers, zipped = await s.get(f"{BASE}/pods", gzip_ok=True)
    assert status == 200 and headers["Content-Encoding"] == "gzip" and headers["Vary"] == "Accept-Encoding"
    plain = gzip.decompress(zipped)
    assert plain == expected_pods(s, plain) and len(zipped) < len(plain) / 3

    status, headers, body = await s.get(f"{BASE}/nodes")
    assert status == 200 and "Content-Length" in headers  # small: joined and sent in one piece
    usages = {n: s.store.node_usage(n) for n in s.inv.node_map}
    assert body == reference_nodes(s.inv.nodes(), usages, created_of(body))
    assert orjson.loads(body)["items"][0]["metadata"]["labels"]["zone"] == HOSTILE
    status, headers, zipped = await s.get(f"{BASE}/nodes?labelSelector=zone%21%3Dx", gzip_ok=True)
    assert gzip.decompress(zipped) == reference_nodes(
        s.inv.nodes(), usages, created_of(gzip.decompress(zipped))
    )
    assert_clean_log(caplog)


async def test_selectors_and_namespaces_apply_on_the_fragment_path(served: Served):
    s = served
    status, _, body = await s.get(f"{BASE}/namespaces/team-a/pods?labelSelector=app%3Dweb")
    assert status == 200
    web = parse_label_selector("app=web")
    assert body == expected_pods(s, body, "team-a", lambda p: web.matches(p.labels))
    names = [i["metadata"]["name"] for i in orjson.loads(body)["items"]]
    assert names and all(s.inv.pod("team-a", n).labels.get("app") == "web" for n in names)

    status, _, body = await s.get(
        f"{BASE}/pods?fieldSelector=metadata.name%3Dpod-2-7,metadata.namespace%3Dteam-a"
    )
    assert [i["metadata"]["name"] for i in orjson.loads(body)["items"]] == ["pod-2-7"]
    status, _, body = await s.get(
        f"{BASE}/pods?fieldSelector=metadata.name%3Dpending-1,metadata.namespace%3Ddefault"
    )
    assert status == 200 and orjson.loads(body)["items"] == []
    status, _, body = await s.get(f"{BASE}/nodes?fieldSelector=metadata.name%3Dnode-3")
    assert [i["metadata"]["name"] for i in orjson.loads(body)["items"]] == ["node-3"]
    status, _, body = await s.get(f"{BASE}/pods?labelSelector=app%3D%3D%3D")
    assert status == 400 and orjson.loads(body)["reason"] == "BadRequest"

    # Table output keeps the dict path and the same objects
    table = "application/json;as=Table;g=meta.k8s.io;v=v1"
    status, _, body = await s.get(f"{BASE}/namespaces/team-a/pods?labelSelector=app%3Dweb&includeObject=Object",
                                  accept=table)  # fmt: skip
    rows = orjson.loads(body)["rows"]
    assert [r["object"]["metadata"]["name"] for r in rows] == names
    status, _, body = await s.get(f"{BASE}/pods", accept="application/yaml")
    assert status == 406


async def test_label_change_and_new_readings_over_https(served: Served):
    s = served
    status, _, body = await s.get(f"{BASE}/namespaces/default/pods")  # rendered and cached
    assert body == expected_pods(s, body, "default")
    old = s.inv.pod("default", "pod-0-3")
    s.inv.put_pod(dataclasses.replace(old, labels={"app": "changed", "q": '"\\'}))
    status, _, body = await s.get(f"{BASE}/namespaces/default/pods?labelSelector=app%3Dchanged")
    items = orjson.loads(body)["items"]
    assert [i["metadata"]["name"] for i in items] == ["pod-0-3"]
    assert items[0]["metadata"]["labels"] == {"app": "changed", "q": '"\\'}
    before = items[0]["containers"]

    keys = [(p.namespace, p.name) for p in s.inv.pods() if p.node_name == "node-0"]
    s.store.store(batches("node-0", keys, time.time() + 1, 9))  # a new scrape of node-0
    status, _, body = await s.get(f"{BASE}/namespaces/default/pods?labelSelector=app%3Dchanged")
    assert body == expected_pods(s, body, "default", lambda p: p.labels.get("app") == "changed")
    assert orjson.loads(body)["items"][0]["containers"] != before


async def test_gzipped_lists_of_every_pod_are_spliced_from_compressed_blocks_over_https(
    served: Served, caplog, monkeypatch
):
    """Lists a second apart start rendering ahead; from then on blocks are compressed once and
    spliced with each list's timestamp. Every list inflates (CRC-32 checked) to the dict path's
    bytes, with a new scrape of a node and a relabelled pod between lists; joined (92 kB) or, with
    a lower bound, streamed."""
    caplog.set_level(logging.INFO)
    s = served
    keys = [(p.namespace, p.name) for p in s.inv.pods() if p.node_name == "node-1"]
    for i in range(4):
        if i == 2:
            monkeypatch.setattr(render, "STREAM_BYTES", 64 * 1024)
        status, headers, zipped = await s.get(f"{BASE}/pods", gzip_ok=True)
        assert status == 200 and headers["Content-Encoding"] == "gzip"
        assert (headers.get("Transfer-Encoding") == "chunked") == (i >= 2)
        plain = gzip.decompress(zipped)
        assert plain == expected_pods(s, plain), i
        assert len(orjson.loads(plain)["items"]) == 4400
        if i == 1:
            s.store.store(batches("node-1", keys, time.time() + 1, 7))
            old = s.inv.pod("team-a", "pod-2-1")
            s.inv.put_pod(dataclasses.replace(old, labels={"app": HOSTILE + "\x16\x13"}))
        await asyncio.sleep(0.2)  # rendering ahead renders (and compresses) node-1 again
    spliced = [b for b in s.api.pod_blocks._blocks.values() if b.gz not in (None, blocks.NO_SPLICE)]  # noqa: SLF001
    assert len(spliced) >= 3  # the list before the last was spliced, not compressed whole
    status, _, plain = await s.get(f"{BASE}/pods")  # and identity lists are as before
    assert plain == expected_pods(s, plain)
    assert_clean_log(caplog)


async def test_the_gzipped_list_right_after_a_cold_one_is_spliced(served: Served, caplog):
    """A gzipped list that renders nodes' pods compresses them for splicing as it goes (all but
    the first item's node, sent without its comma), so the next list, a moment later and before
    rendering ahead has begun, splices every one of them and compresses none whole."""
    caplog.set_level(logging.INFO)
    s = served
    node_blocks = s.api.pod_blocks
    status, _, zipped = await s.get(f"{BASE}/pods", gzip_ok=True)
    plain = gzip.decompress(zipped)
    assert status == 200 and plain == expected_pods(s, plain)
    assert node_blocks._prerender_handle is None  # noqa: SLF001 - one list: no rendering ahead yet
    held = list(node_blocks._blocks.values())  # noqa: SLF001
    compressed = [b for b in held if b.gz not in (None, blocks.NO_SPLICE)]
    assert len(held) == 4 and len(compressed) == 3
    made = {id(b.gz) for b in compressed}
    status, _, zipped = await s.get(f"{BASE}/pods", gzip_ok=True)
    plain = gzip.decompress(zipped)
    assert status == 200 and plain == expected_pods(s, plain)
    assert {id(b.gz) for b in node_blocks._blocks.values()} >= made  # noqa: SLF001 - reused
    assert_clean_log(caplog)


async def test_a_node_that_cannot_be_spliced_goes_between_spliced_ones_in_order(served: Served, caplog):
    """A node whose block cannot be spliced (a pod with 34 000 bytes of labels puts two timestamps
    further apart than deflate reaches) is compressed by each gzipped list, between the runs of
    spliced blocks before and after it: the list inflates, CRC-32 checked, to the dict path's bytes."""
    caplog.set_level(logging.INFO)
    s = served
    old = s.inv.pod("default", "pod-2-3")
    s.inv.put_pod(dataclasses.replace(old, labels={"big": "x" * 34_000}))
    node_blocks = s.api.pod_blocks
    for _ in range(3):
        status, _, zipped = await s.get(f"{BASE}/pods", gzip_ok=True)
        plain = gzip.decompress(zipped)
        assert status == 200 and plain == expected_pods(s, plain)
    held = node_blocks._blocks  # noqa: SLF001
    assert held["node-2"].gz is blocks.NO_SPLICE  # sent as text, after node-1's spliced block
    assert all(held[n].gz not in (None, blocks.NO_SPLICE) for n in ("node-1", "node-3"))
    assert_clean_log(caplog)


async def test_client_leaving_mid_stream_costs_only_its_response(served: Served, caplog):
    caplog.set_level(logging.INFO)
    s = served
    for _ in range(3):  # read the first bytes of a streamed list, then drop the connection
        reader, writer = await asyncio.open_connection("127.0.0.1", s.server.port, ssl=s.ssl)
        writer.write(f"GET {BASE}/pods HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n".encode())
        await writer.drain()
        assert (await reader.readexactly(12)).startswith(b"HTTP/1.1 200")
        writer.transport.abort()
    status, _, _ = await s.get("/readyz")
    assert status == 200
    status, _, body = await s.get(f"{BASE}/pods")
    assert status == 200 and body == expected_pods(s, body)
    assert_clean_log(caplog)


def test_window_beyond_go_duration_saturates_instead_of_failing_the_list():
    # A window past int64 nanoseconds raised OverflowError (a 500 for the whole list); Go's
    # time.Sub saturates, and so does the text here.
    assert convert.go_duration(1.8e302) == "2562047h47m16.854775807s"
    assert convert.go_duration(-1e300) == "-2562047h47m16.854775808s"
    usage = PodUsage(1.7e9, 1.8e302, [("c", Usage(1.7e9, 1.8e302, 1, 1))])
    pods = [pod_info("ns", "p", {})]
    got = rendered_pods(render.ListRenderer(MutableInventory()), pods, {("ns", "p"): usage}, "x")
    assert orjson.loads(got)["items"][0]["window"] == "2562047h47m16.854775807s"


def test_bench_list_render_runs_and_checks_its_item_counts():
    """bench/list_render.py still runs (a tiny cluster; its figures are its own, nothing timed)."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, str(repo / "bench" / "list_render.py"), "--nodes", "3", "--repeat", "1"],
        capture_output=True, text=True, timeout=300, cwd=repo, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {
        ln[:26].strip(): ln[26:].split()
        for ln in out.stdout.splitlines()
        if ln[:4] in ("pods", "node", "hpa:")
    }
    assert set(rows) == {
        "pods", "pods gzip", "pods after a scrape", "pods gzip after a scrape", "nodes", "nodes gzip",
        "hpa: team-a app=web",
    }  # fmt: skip
    assert int(rows["pods"][0]) == 90 and int(rows["nodes"][0]) == 3  # every item served
    assert all(float(r[5]) > 0 for r in rows.values())  # the floor was measured


async def test_a_failure_mid_stream_cuts_the_connection_instead_of_splicing_a_status(ca, caplog):
    """stream_response: once the status line is out, a producer failure truncates the body (the
    client sees an error, never a second response inside the first) and the server keeps serving."""
    from aiohttp import web

    from kcms.apiserver.responses import stream_response

    async def failing():
        yield b'{"items":['
        yield b"1," * 300_000
        raise RuntimeError("producer broke")

    async def fine():
        yield b'{"items":['
        yield b"1," * 300_000
        yield b"1]}"

    async def handler(request: web.Request) -> web.StreamResponse:
        return await stream_response(request, failing() if request.path == "/bad" else fine())

    app = web.Application()
    app.router.add_get("/bad", handler)
    app.router.add_get("/good", handler)
    cert = ca.issue_cert("127.0.0.1")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    runner, port = await serve_app(app, ssl_context=server_ctx, access_log=None)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    caplog.set_level(logging.INFO)
    try:
        async with aiohttp.ClientSession() as s:
            for gz in (False, True):
                headers = {"Accept-Encoding": "gzip" if gz else "identity"}
                with pytest.raises(aiohttp.ClientPayloadError):
                    async with s.get(f"https://127.0.0.1:{port}/bad", ssl=client_ctx, headers=headers) as r:
                        assert r.status == 200
                        await r.read()
                async with s.get(f"https://127.0.0.1:{port}/good", ssl=client_ctx, headers=headers) as r:
                    assert orjson.loads(await r.read()) == {"items": [1] * 300_001}
                    assert r.headers.get("Content-Encoding", "") == ("gzip" if gz else "")
    finally:
        await runner.cleanup()
    failures = [r for r in caplog.records if r.name == "kcms.apiserver.responses"]
    assert len(failures) == 2 and all(r.getMessage() == "streaming '/bad' failed" for r in failures)
