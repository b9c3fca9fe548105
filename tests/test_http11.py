"""The kubelet HTTP/1.1 client against real servers on loopback: keep-alive, chunked bodies,
servers closing idle connections, limits, malformed responses, cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl

import pytest
import trustme
from _http_helpers import raw_server, serve_app
from aiohttp import web

from kcms.collector.http11 import HTTPError, KeepAlivePool, connect_first


def chunked_handler(body: bytes, piece: int):
    """An aiohttp handler sending ``body`` chunked, ``piece`` bytes a chunk."""

    async def chunked(request):
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for i in range(0, len(body), piece):
            await resp.write(body[i : i + piece])
        await resp.write_eof()
        return resp

    return chunked


async def test_keep_alive_fixed_and_chunked_bodies(tls):
    big = b"x" * 200_000

    async def fixed(request):
        return web.Response(body=b"hello " + request.headers["X-N"].encode())

    app = web.Application()
    app.router.add_get("/fixed", fixed)
    app.router.add_get("/chunked", chunked_handler(big, 7000))
    runner, port = await serve_app(app, ssl_context=tls[0])
    pool = KeepAlivePool(tls[1], max_body_bytes=1 << 20)
    try:
        for n in range(3):
            assert await pool.get("127.0.0.1", port, "/fixed", {"X-N": str(n)}) == (
                200,
                f"hello {n}".encode(),
            )
        status, body = await pool.get("127.0.0.1", port, "/chunked", {})
        assert status == 200 and body == big
        assert pool.connects == 1  # one TLS handshake for all four requests
        small = KeepAlivePool(tls[1], max_body_bytes=100_000)
        with pytest.raises(HTTPError) as err:
            await small.get("127.0.0.1", port, "/chunked", {})
        assert err.value.reason == "too_large"
        small.close()
    finally:
        pool.close()
        await runner.cleanup()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


async def test_reused_connection_closed_by_the_server_is_retried_once(tls):
    handled = []

    async def handler(reader, writer):
        # Answers the first request of each connection, advertising keep-alive, and closes the
        # connection when the next one comes, unanswered: the client must retry it once, on a
        # new connection (a GET that got no byte of an answer).
        await read_request(reader)
        handled.append(1)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await read_request(reader)
        writer.close()

    server, port = await raw_server(handler, tls[0])
    pool = KeepAlivePool(tls[1], max_body_bytes=1000)
    try:
        assert await pool.get("127.0.0.1", port, "/", {}) == (200, b"ok")
        assert await pool.get("127.0.0.1", port, "/", {}) == (200, b"ok")
        assert pool.connects == 2 and len(handled) == 2
    finally:
        pool.close()
        server.close()


async def test_an_idle_connection_the_server_closes_is_closed_at_once(tls):
    """Kept-alive connections stay watched while idle: a server's close is seen when it happens
    (the socket is released then, not at the next cycle's request)."""

    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()

    server, port = await raw_server(handler, tls[0])
    pool = KeepAlivePool(tls[1], max_body_bytes=1000)
    try:
        assert await pool.get("127.0.0.1", port, "/", {}) == (200, b"ok")
        (idle,) = pool._idle.values()
        assert not idle.closed
        for _ in range(100):  # no request: only the loop's watch can see the close
            await asyncio.sleep(0.02)
            if idle.closed:
                break
        assert idle.closed
        assert not asyncio.get_running_loop().remove_reader(idle.fd)  # no longer watched
        assert await pool.get("127.0.0.1", port, "/", {}) == (200, b"ok")
        assert pool.connects == 2
    finally:
        pool.close()
        server.close()


@pytest.mark.parametrize("same_write", [False, True], ids=["later", "same-write"])
async def test_bytes_no_request_asked_for_close_the_connection(tls, same_write):
    """A hostile kubelet sends the head of a second response (promising a 20-byte body) before it
    is asked: 50 ms after the first response, or in the very write (one TLS record) that ends it.
    Parsed with the next request's answer, that would hand back the first 20 bytes of the genuine
    response as the body; instead the connection is closed, and the next request gets the genuine
    answer on a new connection. (Until 1 Dec the same-write case was parsed on and kept.)"""
    served = []
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n"

    async def handler(reader, writer):
        while True:
            try:
                await read_request(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            served.append(1)
            first = len(served) == 1
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + (head if first and same_write else b""))
            await writer.drain()
            if first and not same_write:
                await asyncio.sleep(0.05)
                writer.write(head)
                await writer.drain()

    server, port = await raw_server(handler, tls[0])
    pool = KeepAlivePool(tls[1], max_body_bytes=1000)
    try:
        assert await pool.get("127.0.0.1", port, "/", {}) == (200, b"ok")
        await asyncio.sleep(0.3)
        assert await pool.get("127.0.0.1", port, "/", {}) == (200, b"ok")
        assert pool.connects == 2 and len(served) == 2
    finally:
        pool.close()
        server.close()


@pytest.mark.parametrize(
    "response, reason",
    [
        (b"NOT HTTP AT ALL\r\n\r\n", "protocol"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "connection"),  # cut short
        (b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n", "too_large"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "protocol"),
    ],
)
async def test_malformed_or_truncated_responses_are_errors_with_a_reason(tls, response, reason):
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(response)
        await writer.drain()
        writer.close()

    server, port = await raw_server(handler, tls[0])
    pool = KeepAlivePool(tls[1], max_body_bytes=1000)
    try:
        with pytest.raises(HTTPError) as err:
            await pool.get("127.0.0.1", port, "/", {})
        assert err.value.reason == reason
    finally:
        pool.close()
        server.close()


async def test_body_ended_by_close_and_non_200_and_tls_and_refused(tls, ca):
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\r\nbusy")
        await writer.drain()
        writer.close()

    server, port = await raw_server(handler, tls[0])
    pool = KeepAlivePool(tls[1], max_body_bytes=1000)
    try:
        assert await pool.get("127.0.0.1", port, "/", {}) == (503, b"busy")
        untrusting = KeepAlivePool(ssl.create_default_context(), max_body_bytes=1000)
        with pytest.raises(HTTPError) as err:
            await untrusting.get("127.0.0.1", port, "/", {})
        assert err.value.reason == "tls"
    finally:
        pool.close()
        server.close()
        await server.wait_closed()
    with pytest.raises(HTTPError) as err:
        await pool.get("127.0.0.1", port, "/", {})
    assert err.value.reason == "connection"


async def test_cancelled_request_closes_its_connection(tls):
    async def handler(reader, writer):
        await read_request(reader)
        await asyncio.sleep(10)

    server, port = await raw_server(handler, tls[0])
    pool = KeepAlivePool(tls[1], max_body_bytes=1000)
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await pool.get("127.0.0.1", port, "/", {})
        assert not pool._idle  # the half-used connection was not kept
    finally:
        pool.close()
        server.close()


async def test_an_idle_connection_holds_no_body(tls):
    """After a response is returned, the kept-alive connection drops the pieces of its body, so
    idle kubelet connections cost their buffers, not the last body (~32 KiB a node)."""
    body = b"y" * 150_000
    app = web.Application()
    app.router.add_get("/", chunked_handler(body, 10_000))
    runner, port = await serve_app(app, ssl_context=tls[0])
    pool = KeepAlivePool(tls[1], max_body_bytes=1 << 20)
    try:
        assert await pool.get("127.0.0.1", port, "/", {}) == (200, body)
        (idle,) = pool._idle.values()
        assert not idle.closed and idle.size == len(body)  # the connection really read it
        assert idle.chunks == []
    finally:
        pool.close()
        await runner.cleanup()


async def test_a_hostname_is_resolved_and_checked_against_the_certificate(ca: trustme.CA):
    cert = ca.issue_cert("localhost")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)

    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
        await writer.drain()

    server = await asyncio.start_server(handler, "localhost", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    pool = KeepAlivePool(client_ctx, max_body_bytes=1000)
    try:
        assert await pool.get("localhost", port, "/", {}) == (200, b"hello")
        with pytest.raises(HTTPError) as err:  # the name asked for is what the certificate must name
            await pool.get("127.0.0.1", port, "/", {})
        assert err.value.reason == "tls"
    finally:
        pool.close()
        server.close()


async def test_each_address_of_a_name_is_tried_in_turn():
    """A name may resolve to several addresses (IPv6 and IPv4, say) of which the first refuses."""
    listener = socket.create_server(("127.0.0.1", 0))
    refused = socket.create_server(("127.0.0.1", 0))
    refused_port = refused.getsockname()[1]
    refused.close()  # nothing listens there now
    try:
        good = (socket.AF_INET, listener.getsockname())
        sock = await connect_first([(socket.AF_INET, ("127.0.0.1", refused_port)), good])
        assert sock.getpeername() == listener.getsockname()
        sock.close()
        with pytest.raises(ConnectionRefusedError):
            await connect_first([(socket.AF_INET, ("127.0.0.1", refused_port))])
    finally:
        listener.close()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_kubelet_that_never_finishes_the_handshake_costs_a_timeout_and_no_descriptor(tls):
    """A hostile node accepts TCP and then says nothing (or dribbles): the caller's deadline ends
    the attempt, and neither the socket nor a loop registration is left behind."""
    accepted: list[socket.socket] = []
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    loop = asyncio.get_running_loop()

    async def accept_and_stay_silent():
        while True:
            conn, _ = await loop.sock_accept(listener)
            accepted.append(conn)

    acceptor = asyncio.create_task(accept_and_stay_silent())
    pool = KeepAlivePool(tls[1], max_body_bytes=1000)
    try:
        await asyncio.sleep(0)
        before = _open_fds()
        for _ in range(3):
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await pool.get("127.0.0.1", port, "/", {})
        await asyncio.sleep(0.05)
        assert _open_fds() == before + len(accepted)  # only the server's ends are open
        assert len(accepted) == 3 and not pool._idle and pool.connects == 0
    finally:
        acceptor.cancel()
        for conn in accepted:
            conn.close()
        listener.close()
        pool.close()


async def test_a_body_ended_by_a_connection_cut_without_close_notify(tls):
    """No Content-Length, then the TCP connection ends without TLS's close_notify (a ragged end,
    as from a crashed server): the body is what came, and the connection is not kept."""

    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n\r\npartial body")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.transport.abort()  # no close_notify

    server, port = await raw_server(handler, tls[0])
    pool = KeepAlivePool(tls[1], max_body_bytes=1000)
    try:
        assert await pool.get("127.0.0.1", port, "/", {}) == (200, b"partial body")
        assert not pool._idle
    finally:
        pool.close()
        server.close()
