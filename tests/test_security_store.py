"""`kcms store` under hostile or broken callers, as a real process on loopback: token files emptied or
half-written mid-rotation, wrong and malformed credentials, exports and queries naming huge lists,
gzip bombs. Every case checks the answer (code and reason), that the store stays ready, that the data
written before is intact, that its memory stays bounded, and that its log has no traceback."""

from __future__ import annotations

import asyncio
import gzip
import time
import urllib.request
import zlib

import aiohttp
import msgspec
import pytest
from _stores import TOKEN, Stores

from kcms.store import wire
from kcms.store.client import StoreError
from kcms.store.cluster import StoreCluster
from kcms.store.service import TokenFile


@pytest.fixture
def store(tmp_path):
    stores = Stores(tmp_path, 1, extra=["--max-request-bytes=1000000"])
    stores.start_all()
    yield stores
    stores.stop_all()


def base(stores: Stores) -> str:
    return f"http://127.0.0.1:{stores.ports['s0']}"


async def post(
    url: str, body: bytes, token: str | None = TOKEN, **headers: str
) -> tuple[int, dict, aiohttp.typedefs.LooseHeaders]:
    h = {"Content-Type": wire.CONTENT_TYPE, **headers}
    if token is not None:
        h["Authorization"] = "Bearer " + token
    async with aiohttp.ClientSession() as s, s.post(url, data=body, headers=h) as r:
        raw = await r.read()
        if r.headers.get("Content-Type", "").startswith("application/json"):
            return r.status, msgspec.json.decode(raw), r.headers
        return r.status, {"raw": raw}, r.headers


def write_body(name: str, value: float) -> bytes:
    return wire.encode(wire.Write(samples=[("m", "pods", "default", name, (), time.time(), value)]))


async def held(stores: Stores) -> dict[str, float]:
    """What the store serves for metric m (with the token in force)."""
    code, body, _ = await post(
        base(stores) + "/store/v1/query/series", wire.encode(wire.SeriesQuery("pods", "default", None, "m"))
    )
    assert code == 200, body
    return {r[0]: r[2] for r in wire.decode(body["raw"], list[wire.SeriesRow])}


def ready(stores: Stores) -> int:
    try:
        with urllib.request.urlopen(base(stores) + "/readyz", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def alive(stores: Stores) -> bool:
    try:
        with urllib.request.urlopen(base(stores) + "/livez", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def metric(stores: Stores, prefix: str) -> float:
    with urllib.request.urlopen(base(stores) + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def metrics_text(stores: Stores) -> str:
    with urllib.request.urlopen(base(stores) + "/metrics", timeout=5) as r:
        return r.read().decode()


def memory_kib(stores: Stores) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of the store process, KiB."""
    out = {}
    with open(f"/proc/{stores.procs['s0'].pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1])
    return out


def no_traceback(stores: Stores) -> None:
    log = (stores.tmp / "s0.log").read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]


def rewrite(path, data: bytes) -> None:
    """Rewrite the file in place (not atomically), as a careless rotation does."""
    with open(path, "wb") as f:
        f.write(data)
    # mtime alone may not change between two quick writes (coarse clocks); size and ctime do


async def raw_request(port: int, head: bytes) -> bytes:
    """One request written byte for byte (clients refuse to send some of these headers)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    await writer.drain()
    data = await reader.read(65536)
    writer.close()
    return data


async def test_token_file_emptied_or_half_written_mid_rotation(store) -> None:
    url = base(store) + "/store/v1/write"
    assert (await post(url, write_body("before", 1.0)))[0] == 200
    token_file = store.token_file

    # the file truncated (first half of a non-atomic rotation): the last good token stays in force
    rewrite(token_file, b"")
    code, body, _ = await post(url, write_body("during-empty", 2.0))
    assert code == 200, body
    for bad in (None, "", "wrong-token", TOKEN + "x"):
        code, body, _ = await post(url, write_body("refused", 9.0), token=bad)
        assert (code, body["reason"]) == (401, "Unauthorized"), (bad, code, body)

    # whitespace, garbage with control bytes, not UTF-8, a file far too large: all kept out
    for junk in (b"  \n\t\n", b"two words\n", b"tok\x00en", b"\xff\xfe\xfd", b"x" * 100_000):
        rewrite(token_file, junk)
        assert (await post(url, write_body("during-junk", 3.0)))[0] == 200
        assert (await post(url, write_body("refused", 9.0), token="junk"))[0] == 401

    # half-written: a prefix of the new token is taken as a token (it cannot be told apart) — the
    # old and the full new token get 401 until the write completes, never a 500
    new = "rotated-token-" + "n" * 40
    rewrite(token_file, new[:10].encode())
    for tok in (TOKEN, new):
        code, body, _ = await post(url, write_body("refused", 9.0), token=tok)
        assert (code, body["reason"]) == (401, "Unauthorized")
    rewrite(token_file, (new + "\n").encode())
    assert (await post(url, write_body("after", 4.0), token=new))[0] == 200
    assert (await post(url, write_body("refused", 9.0), token=TOKEN))[0] == 401

    # an Authorization header that is not UTF-8, and one of 8 KiB: refused, not a crash
    port = store.ports["s0"]
    body = write_body("refused", 9.0)
    for auth in (b"Bearer \xff\xfe" + new.encode(), b"Bearer " + b"A" * 8000):
        head = (
            b"POST /store/v1/write HTTP/1.1\r\nHost: x\r\nAuthorization: " + auth + b"\r\nContent-Type: "
            + wire.CONTENT_TYPE.encode() + b"\r\nContent-Length: " + str(len(body)).encode()
            + b"\r\nConnection: close\r\n\r\n" + body
        )  # fmt: skip
        answer = await raw_request(port, head)
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]

    # unknown paths under /store/ are refused and counted as "other", not as new label values
    for i in range(20):
        code, _, _ = await post(base(store) + f"/store/v1/hostile-{i}", b"")
        assert code in (401, 404, 405)
    text = metrics_text(store)
    assert "hostile" not in text
    assert metric(store, 'kcms_store_auth_failures_total{reason="invalid"}') >= 8
    assert metric(store, 'kcms_store_auth_failures_total{reason="missing"}') >= 1

    # the store stayed ready; everything accepted is there, nothing refused got in
    assert ready(store) == 200
    rewrite(token_file, (TOKEN + "\n").encode())
    assert await held(store) == {"before": 1.0, "during-empty": 2.0, "during-junk": 3.0, "after": 4.0}
    no_traceback(store)


async def test_store_without_a_usable_token_answers_503_until_one_arrives(tmp_path) -> None:
    stores = Stores(tmp_path, 1)
    stores.token_file.write_text("\n")  # the Secret's key is empty
    stores.start("s0")
    try:
        deadline = time.monotonic() + 30
        while not alive(stores):  # the process is up once its probes answer
            assert time.monotonic() < deadline and stores.procs["s0"].poll() is None, stores.log("s0")
            await asyncio.sleep(0.05)
        assert ready(stores) == 503  # not ready: peers and clients could not use it
        for tok in (TOKEN, None, ""):
            code, body, headers = await post(
                base(stores) + "/store/v1/write", write_body("p", 1.0), token=tok
            )
            assert (code, body["reason"]) == (503, "ServiceUnavailable"), body
            assert headers["Retry-After"] == "1"
        assert metric(stores, 'kcms_store_auth_failures_total{reason="no_token_loaded"}') == 3
        stores.token_file.write_text(TOKEN + "\n")
        stores.wait_ready("s0")
        assert (await post(base(stores) + "/store/v1/write", write_body("p", 1.0)))[0] == 200
        assert await held(stores) == {"p": 1.0}
        log = stores.log("s0")
        assert "Traceback" not in log and "it is empty; no token loaded yet" in log
    finally:
        stores.stop_all()


async def test_store_clients_never_send_a_blank_token(store, tmp_path) -> None:
    """The collector's and server's --store-token-file: an empty file fails the request cleanly before
    anything is sent; once a token was loaded, emptying the file keeps it."""
    token_path = tmp_path / "client-token"
    token_path.write_text("")
    source = TokenFile(str(token_path))
    assert source.read() == "" and source.problem == "it is empty"
    cluster = StoreCluster(_members(store), token=source.read, timeout=2.0, retries=0)
    sent_before = metric(store, 'kcms_store_requests_total{path="/store/')
    try:
        result = await cluster.write((), [("m", _pod("p"), (), time.time(), 1.0)])
        assert not result.ok and "no usable bearer token" in result.errors[0]
        with pytest.raises(Exception) as err:
            await cluster.query_series("pods", "default", None, "m")
        assert "no usable bearer token" in str(err.value)
        with pytest.raises(StoreError, match="no usable bearer token"):
            await cluster.client("s0").export(wire.ExportRequest())
        assert metric(store, 'kcms_store_requests_total{path="/store/') == sent_before  # nothing was sent
        token_path.write_text(TOKEN + "\n")
        assert (await cluster.write((), [("m", _pod("p"), (), time.time(), 1.0)])).ok
        token_path.write_text("")  # mid-rotation: the client keeps what it had
        assert (await cluster.write((), [("m", _pod("q"), (), time.time(), 2.0)])).ok
    finally:
        await cluster.close()
    assert await held(store) == {"p": 1.0, "q": 2.0}
    no_traceback(store)


def _members(stores: Stores):
    from kcms.kube.members import StaticMembers

    return StaticMembers(stores.members())


def _pod(name: str):
    from kcms.model import ObjectRef

    return ObjectRef("pods", "default", name)


async def test_exports_and_queries_naming_huge_lists_are_bounded(store) -> None:
    url = base(store)
    assert (await post(url + "/store/v1/write", write_body("kept", 7.0)))[0] == 200
    await post(url + "/store/v1/export", wire.encode(wire.ExportRequest()))  # warm up the handlers
    mem_before = memory_kib(store)

    def export(**kw) -> bytes:
        return wire.encode(wire.ExportRequest(**kw))

    too_large = [
        # a million members: 8 MB of names, refused before it is decoded
        ("/store/v1/export", export(owner="s0", members=[f"m{i}" for i in range(1_000_000)], replicas=2)),
        # the same, gzip-compressed to ~2 MB: counted after decompression
        ("/store/v1/export", export(keys=[("pods", "d", f"p{i}") for i in range(1_000_000)])),
        ("/store/v1/query/series", wire.encode(wire.SeriesQuery("pods", "d", [f"p{i}" for i in range(1_000_000)], "m"))),
        ("/store/v1/query/resource", wire.encode(wire.ResourceQuery("pods", "d", [f"p{i}" for i in range(1_000_000)]))),
    ]  # fmt: skip
    for i, (path, body) in enumerate(too_large):
        headers = {"Content-Encoding": "gzip"} if i == 1 else {}
        data = gzip.compress(body) if i == 1 else body
        code, answer, _ = await post(url + path, data, **headers)
        assert (code, answer["reason"]) == (413, "RequestEntityTooLarge"), (path, code, answer)

    bad = [
        ("/store/v1/export", export(owner="s0", members=[f"m{i}" for i in range(1000)], replicas=2), "1000 members"),
        ("/store/v1/export", export(owner="s0", members=["a", "b"], previous_members=[str(i) for i in range(300)], replicas=1), "300 previous members"),
        ("/store/v1/export", export(keys=[("pods", "d", f"p{i}") for i in range(20_000)]), "20000 keys"),
        ("/store/v1/export", export(metrics=[f"m{i}" for i in range(20_000)]), "20000 metrics"),
        ("/store/v1/export", export(owner="s0", members=["s0", "s1"], replicas=2**62), "replicas"),
        ("/store/v1/export", export(owner="s0", members=["s0", "s1"], replicas=-5), "replicas"),
        # a number that does not fit any integer type, where an integer is expected
        ("/store/v1/export", b"\x93\xa2s0", "malformed"),  # an array of three holding one item
        ("/store/v1/query/series", wire.encode(wire.SeriesQuery("pods", "d", [f"p{i}" for i in range(150_000)], "m")), "150000 objects"),
        ("/store/v1/query/series", wire.encode(wire.SeriesQuery("pods", "d", None, "m", "a in (" + "x," * 20_000 + "y)")), "selector of"),
        ("/store/v1/query/resource", wire.encode(wire.ResourceQuery("pods", "d", [f"p{i}" for i in range(150_000)])), "150000 objects"),
        ("/store/v1/query/resource", wire.encode(wire.ResourceQuery("\x1b[2Jdeployments")), "unknown kind"),
    ]  # fmt: skip
    for path, body, words in bad:
        code, answer, _ = await post(url + path, body)
        assert (code, answer["reason"]) == (400, "BadRequest"), (path, words, code, answer)
        assert words in answer["message"] or words == "malformed", (words, answer["message"])
        assert "\x1b" not in answer["message"]

    # a huge integer in msgpack (beyond 64 bits is not even encodable; the largest uint64 as replicas)
    huge = msgspec.msgpack.encode(["s0", ["s0", "s1"], 2**64 - 1])
    code, answer, _ = await post(url + "/store/v1/export", huge)
    assert (code, answer["reason"]) == (400, "BadRequest")

    # what an honest refill and a read repair ask still works
    code, answer, _ = await post(
        url + "/store/v1/export", export(owner="s0", members=["s0", "s1", "s2"], replicas=2)
    )
    assert code == 200
    keys = [("pods", "default", "kept")] + [("pods", "default", f"x{i}") for i in range(255)]
    code, answer, _ = await post(url + "/store/v1/export", export(keys=keys, resources=False))
    assert code == 200 and [s[3] for s in wire.decode(answer["raw"], wire.Write).series] == ["kept"]

    mem_after = memory_kib(store)
    grew = (mem_after["VmHWM"] - mem_before["VmHWM"]) / 1024
    print(
        f"store peak RSS {mem_before['VmHWM'] / 1024:.0f} -> {mem_after['VmHWM'] / 1024:.0f} MiB (+{grew:.1f})"
    )
    assert grew < 150, (mem_before, mem_after)  # bodies of up to 4 MiB decoded at most, never 8 MB+
    assert ready(store) == 200
    assert await held(store) == {"kept": 7.0}
    no_traceback(store)


async def test_gzip_bomb_write_is_refused_without_inflating_it(store) -> None:
    url = base(store) + "/store/v1/write"
    assert (await post(url, write_body("kept", 5.0)))[0] == 200
    # 256 MiB of one repeated sample body compresses to ~250 KB; the limit here is 1 MB decompressed
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"\x00" * (1 << 20)
    bomb = b"".join([comp.compress(chunk) for _ in range(256)] + [comp.flush()])
    assert len(bomb) < 1 << 20
    mem_before = memory_kib(store)
    for path in ("/store/v1/write", "/store/v1/export", "/store/v1/query/series"):
        code, answer, _ = await post(base(store) + path, bomb, **{"Content-Encoding": "gzip"})
        assert (code, answer["reason"]) == (413, "RequestEntityTooLarge"), (path, code, answer)
    # a body that is not gzip at all, declared as gzip
    code, answer, _ = await post(url, b"not gzip at all" * 10, **{"Content-Encoding": "gzip"})
    assert code == 400, (code, answer)
    mem_after = memory_kib(store)
    grew = (mem_after["VmHWM"] - mem_before["VmHWM"]) / 1024
    print(f"gzip bomb of {len(bomb) >> 10} KiB (256 MiB inflated): store peak RSS +{grew:.1f} MiB")
    assert grew < 64, (mem_before, mem_after)
    assert ready(store) == 200
    assert await held(store) == {"kept": 5.0}
    no_traceback(store)


async def test_a_copied_series_of_millions_of_points_is_cut_to_what_a_replica_keeps(tmp_path) -> None:
    """A peer's (or a token holder's) copy of one series with 3 million points (48 MB, under the
    default 64 MiB body bound): the newest points are merged, memory stays bounded, nothing else lost."""
    from array import array

    stores = Stores(tmp_path, 1)
    stores.start_all()
    try:
        assert (await post(base(stores) + "/store/v1/write", write_body("kept", 5.0)))[0] == 200
        n = 3_000_000
        now = time.time()
        points = array("d", [0.0]) * (2 * n)
        step = 290.0 / n
        for i in range(n):
            points[2 * i] = now - 300 + i * step
            points[2 * i + 1] = float(i)
        body = wire.encode(wire.Write(series=[("m", "pods", "default", "copied", (), points.tobytes())]))
        del points
        mem_before = memory_kib(stores)
        code, answer, _ = await post(base(stores) + "/store/v1/write", body)
        assert code == 200, answer
        mem_after = memory_kib(stores)
        grew = (mem_after["VmHWM"] - mem_before["VmHWM"]) / 1024
        print(f"a copied series of {len(body) >> 20} MiB: store peak RSS +{grew:.0f} MiB")
        assert grew < 250, (mem_before, mem_after)  # the body and a copy or two, not a 3M-entry dict
        assert await held(stores) == {"kept": 5.0, "copied": float(n - 1)}
        assert ready(stores) == 200
        no_traceback(stores)
    finally:
        stores.stop_all()


async def test_an_export_over_a_large_ring_keeps_the_store_answering(store) -> None:
    """An export for a ring of 256 members (the bound) over 5000 keys costs ~1.3 M hashes: the store
    decides it a slice at a time, so probes are answered all along; the answer is still exact."""
    from kcms.store.ring import Ring

    url = base(store)
    now = time.time()
    samples = [("m", "pods", "default", f"p{i}", (), now, float(i)) for i in range(5000)]
    code, body, _ = await post(url + "/store/v1/write", wire.encode(wire.Write(samples=samples)))
    assert code == 200 and wire.decode(body["raw"], wire.WriteAck).samples == 5000
    members = ["s0"] + [f"member-{i}" for i in range(255)]
    request = wire.encode(wire.ExportRequest(owner="s0", members=members, replicas=1, resources=False))
    export = asyncio.create_task(post(url + "/store/v1/export", request))
    answered, gaps, last = 0, [], time.monotonic()
    async with aiohttp.ClientSession() as s:
        while not export.done():
            async with s.get(url + "/livez") as r:
                assert r.status == 200
            if not export.done():
                answered += 1
                gaps.append(time.monotonic() - last)
            last = time.monotonic()
    code, body, _ = await export
    assert code == 200
    got = {row[3] for row in wire.decode(body["raw"], wire.Write).series}
    ring = Ring(members, 1)
    assert got == {f"p{i}" for i in range(5000) if ring.owns("s0", ("pods", "default", f"p{i}"))}
    print(
        f"/livez answered {answered} times during the export; longest wait {max(gaps or [0]) * 1000:.0f} ms"
    )
    assert answered >= 10  # (one answer at most, after the export, when it held the loop throughout)
    assert ready(store) == 200
    no_traceback(store)
