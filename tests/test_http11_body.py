"""A kubelet's 200 response with a Content-Length is decrypted straight into the bytes object the
scrape is handed (kcms/collector/_bodybuffer.c; a bytearray copied once where that is not built):
every other kind of response still goes through httptools, a connection stays usable across
both, and a hostile server's short, overlong or stalled body costs its own request only."""

from __future__ import annotations

import asyncio
import contextlib
import os

import pytest
from _http_helpers import raw_server

from kcms.collector import http11
from kcms.collector.http11 import HTTPError, KeepAlivePool


@pytest.fixture(params=["c", "python"])
def holder(request):
    """Every test twice: the body read into C's BodyBuffer (as installed) and into a bytearray
    (what an install without a C compiler has)."""
    with pytest.MonkeyPatch.context() as mp:
        if request.param == "python":
            mp.setattr(http11, "BodyBuffer", None)
        yield request.param


def test_the_c_body_buffer_is_built() -> None:
    """CI compiles kcms/collector/_bodybuffer.c: the scrapes must use it, not the copy."""
    assert http11.BodyBuffer is not None


async def next_request(reader: asyncio.StreamReader) -> str | None:
    """The target of the next request on the connection, None when the client closed it."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return head.split(b" ", 2)[1].decode()


async def write_in_pieces(writer: asyncio.StreamWriter, data: bytes, pieces: int) -> None:
    """``data`` in ``pieces`` writes 20 ms apart: the client reads it in as many turns at least."""
    step = -(-len(data) // pieces)
    for i in range(0, len(data), step):
        writer.write(data[i : i + step])
        await writer.drain()
        await asyncio.sleep(0.02)


async def get(pool: KeepAlivePool, port: int, target: str = "/") -> tuple[int, bytes]:
    """A GET that fails the test, rather than hang it, when no answer comes."""
    async with asyncio.timeout(10):
        return await pool.get("127.0.0.1", port, target, {})


def fixed(body: bytes, status: str = "200 OK") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def chunked(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


async def test_bodies_of_every_kind_on_one_connection(tls, holder) -> None:
    """Large and small fixed-length bodies, a chunked one and a 404 in turn on one kept-alive
    connection: each arrives whole and exact, as bytes; the 200s with a length went past httptools
    (nothing counted by its on_body), the others through it."""
    big = os.urandom(200_000)  # 13 TLS records at least, sent in 4 writes 20 ms apart
    answers = {
        "/big": (fixed(big), 4),
        "/small": (fixed(b"ok"), 1),
        "/chunked": (chunked(big[:50_000]), 3),
        "/missing": (fixed(b"no such path", "404 Not Found"), 1),
    }

    async def handler(reader, writer):
        while (target := await next_request(reader)) is not None:
            await write_in_pieces(writer, *answers[target])
        writer.close()

    server, port = await raw_server(handler, tls[0])
    pool = KeepAlivePool(tls[1], max_body_bytes=1 << 20)
    try:
        for target, want, past_httptools in [
            ("/big", (200, big), True),
            ("/small", (200, b"ok"), True),
            ("/chunked", (200, big[:50_000]), False),
            ("/missing", (404, b"no such path"), False),
            ("/big", (200, big), True),
        ]:
            got = await get(pool, port, target)
            assert got == want and type(got[1]) is bytes, target
            assert {bytes(bytearray(want[1])): 1}[got[1]] == 1  # hashed as the bytes it holds
            (conn,) = pool._idle.values()
            assert (conn.filled, conn.size) == ((len(want[1]), 0) if past_httptools else (0, len(want[1]))), target
            assert conn.into is None and conn.holder is None  # nothing of the body kept while idle
        assert pool.connects == 1
    finally:
        pool.close()
        server.close()


async def test_blank_lines_before_the_status_line_are_parsed_through(tls, holder) -> None:
    """CRLFs before a response's status line, which httptools skips, look like the end of a head:
    the bytes after them are still parsed (cut there, they were dropped and the scrape hung)."""
    body = os.urandom(40_000)

    async def handler(reader, writer):
        while await next_request(reader) is not None:
            await write_in_pieces(writer, b"\r\n\r\n" + fixed(body), 2)
        writer.close()

    server, port = await raw_server(handler, tls[0])
    pool = KeepAlivePool(tls[1], max_body_bytes=1 << 20)
    try:
        for _ in range(2):
            assert await get(pool, port) == (200, body)
        assert pool.connects == 1
    finally:
        pool.close()
        server.close()


async def test_a_body_cut_short_fails_that_request_only(tls, holder) -> None:
    """A kubelet promises 100 000 bytes, sends 60 000 over several reads and closes: the request
    fails as a closed connection (no partial body, no uninitialised bytes handed on), and the
    next one gets a whole body on a new connection."""
    body = os.urandom(100_000)
    count = 0

    async def handler(reader, writer):
        nonlocal count
        while await next_request(reader) is not None:
            count += 1
            if count == 1:
                await write_in_pieces(writer, fixed(body)[:60_000], 3)
                break
            await write_in_pieces(writer, fixed(body), 2)
        writer.close()

    server, port = await raw_server(handler, tls[0])
    pool = KeepAlivePool(tls[1], max_body_bytes=1 << 20)
    try:
        with pytest.raises(HTTPError) as err:
            await get(pool, port)
        assert err.value.reason == "connection"
        assert await get(pool, port) == (200, body)
        assert pool.connects == 2
    finally:
        pool.close()
        server.close()


@pytest.mark.parametrize("pieces", [1, 3], ids=["one-write", "three-writes"])
@pytest.mark.parametrize("size", [2, 70_000])
async def test_bytes_after_a_body_read_in_place_close_the_connection(tls, holder, pieces, size) -> None:
    """A hostile kubelet sends, in the same write as the end of a body (2 bytes: in the read that
    ends the headers; 70 000: read in place over several), the head of a second response no
    request asked for: the body is handed over exactly, the connection is closed rather than kept
    (its next answer would be those bytes), the next request is answered on a new connection."""
    body = os.urandom(size)
    served = 0

    async def handler(reader, writer):
        nonlocal served
        while await next_request(reader) is not None:
            served += 1
            extra = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nforge" if served == 1 else b""
            await write_in_pieces(writer, fixed(body) + extra, pieces)
        writer.close()

    server, port = await raw_server(handler, tls[0])
    pool = KeepAlivePool(tls[1], max_body_bytes=1 << 20)
    try:
        assert await get(pool, port) == (200, body)
        await asyncio.sleep(0.2)
        assert not pool._idle or next(iter(pool._idle.values())).closed
        assert await get(pool, port) == (200, body)
        assert pool.connects == 2 and served == 2
    finally:
        pool.close()
        server.close()


async def test_a_stalled_body_is_given_up_with_its_connection(tls, holder) -> None:
    """A kubelet declares 900 000 bytes (under the limit), sends 40 000 and stalls: the scrape's
    deadline cancels the request, the connection is closed and not kept, and it holds no body."""
    gate = asyncio.Event()

    async def handler(reader, writer):
        await next_request(reader)
        await write_in_pieces(writer, fixed(b"z" * 900_000)[:40_000], 2)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(gate.wait(), 5)
        writer.close()

    server, port = await raw_server(handler, tls[0])
    pool = KeepAlivePool(tls[1], max_body_bytes=1 << 20)
    opened: list[http11._Connection] = []
    connect = pool._connect

    async def watched(host: str, port: int) -> http11._Connection:
        opened.append(await connect(host, port))
        return opened[-1]

    pool._connect = watched  # to look at the connection afterwards; the exchange is real
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await pool.get("127.0.0.1", port, "/", {})
        (conn,) = opened
        assert 0 < conn.filled < 900_000  # it was reading the body in place when given up
        assert conn.closed and not pool._idle
        assert conn.into is None and conn.holder is None
    finally:
        gate.set()
        pool.close()
        server.close()


async def test_a_declared_length_over_the_limit_allocates_nothing(tls, holder) -> None:
    """Content-Length over the pool's body limit fails at the header, before any body memory is
    set aside for it."""

    async def handler(reader, writer):
        await next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n" + b"a" * 100)
        await writer.drain()
        await asyncio.sleep(0.5)
        writer.close()

    server, port = await raw_server(handler, tls[0])
    pool = KeepAlivePool(tls[1], max_body_bytes=1000)
    try:
        with pytest.raises(HTTPError) as err:
            await get(pool, port)
        assert err.value.reason == "too_large"
    finally:
        pool.close()
        server.close()


def test_body_buffer_hands_its_bytes_over_once_and_only_with_no_view_open() -> None:
    body_buffer = http11.BodyBuffer
    assert body_buffer is not None
    buf = body_buffer(5)
    assert len(buf) == 5
    view = memoryview(buf)
    view[:] = b"hello"
    with pytest.raises(BufferError):
        buf.take()  # a view is open: the bytes could still change under their holder
    view.release()
    got = buf.take()
    assert type(got) is bytes and got == b"hello" and hash(got) == hash(b"hello")
    with pytest.raises(BufferError):
        buf.take()
    with pytest.raises(BufferError):
        memoryview(buf)  # no view once taken: handed-on bytes are never written
    assert len(buf) == 0 and got == b"hello"
    for bad in (0, -1):
        with pytest.raises(ValueError):
            body_buffer(bad)
    with pytest.raises(TypeError):
        body_buffer("5")
    del buf
    assert got == b"hello"  # the taken bytes outlive their buffer
