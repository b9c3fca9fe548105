"""A lean HTTP/1.1 GET client for kubelets: one kept-alive TLS connection per kubelet.

Why not aiohttp here: every kubelet is asked the same GET every cycle, and aiohttp's request
machinery (request/response objects, stream readers, connector bookkeeping) cost ~180 µs a
request at 1000 nodes, against ~110 µs for an asyncio protocol feeding httptools (the C llhttp
parser, which also handles chunked bodies) — measured on this machine with 32 KiB bodies over TLS.
At 5000 nodes that is ~0.35 s of CPU per cycle. Everything else (the API server, the Kubernetes
client, agents) stays on aiohttp.

Why not asyncio's TLS transport either: it decrypts through two memory BIOs and a Python-level
read loop, and every connection keeps its read buffer (16 KiB here, see
:func:`kcms.collector.kubelet.limit_tls_read_buffer`) and BIO capacity while idle. Kept alive to
every kubelet, that was 80 kB of RSS a connection. Here each connection is a non-blocking
:class:`ssl.SSLSocket` that OpenSSL reads straight from the socket (its buffers are released
between records, ``SSL_MODE_RELEASE_BUFFERS``), watched with the loop's ``add_reader`` from
connect to close, and decrypted into one buffer shared by the pool's connections (the loop runs one
callback at a time): 33 kB a connection, and 190–205 instead of 231–233 µs of CPU a 32 kB
response (measured on this machine, 50 connections).

A 200 response with a Content-Length (every kubelet answer) is decrypted straight into the bytes
object the scrape is handed, once its headers are parsed (kcms/collector/_bodybuffer.c; where that
is not built, into a bytearray copied once at the end); httptools parses the head and whatever of
the body came with it, and anything else (chunked, no length, another status) as before. The
declared length is set aside when the headers end: at most ``max_body_bytes``, as a body sent in
full could take.

Scope: GET only, no redirects, no proxies, identity encoding; one request at a time per
connection. A request cancelled mid-way (its deadline passed) closes its connection, since the
connection's state is then unknown. Bytes after a whole response (the head of a second one, in the
same read or later) close the connection once the response is handed over: nothing was asked for,
and kept they would be read as the start of the next answer.

Response limits (a kubelet is a node, and a node may be compromised): the status line and headers
together at most ``max_header_bytes`` (default :data:`MAX_HEADER_BYTES`, 1 MiB) and at most
``max_headers`` header fields (default :data:`MAX_HEADERS`, 100), the body at most
``max_body_bytes``. Go's HTTP client, which metrics-server uses, bounds a response's status line and
headers at 10 MiB (``Transport.MaxResponseHeaderBytes``' default; its http2 limit is the same) and
bounds the number of fields only through those bytes. We keep every kubelet connection alive and
scrape up to ``--max-in-flight`` of them at once, and httptools gathers a long header value by
concatenation (quadratic in its length), so the byte bound is Go's server-side default (1 MiB,
``DefaultMaxHeaderBytes``) and the count an explicit 100: a kubelet sends about six. Beyond either,
the exchange fails with reason ``headers_too_large`` or ``too_many_headers`` as soon as the bound is
crossed (bytes are counted as they arrive, so a never-ending header costs at most the bound plus
one TLS record), and the connection is closed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from typing import Any

import httptools

try:  # kcms/collector/_bodybuffer.c: a body decrypted straight into the bytes object handed on
    from kcms.collector._bodybuffer import BodyBuffer
except ImportError:  # not compiled: a bytearray, copied into bytes once whole
    BodyBuffer = None

MAX_HEADER_BYTES = 1 << 20  # status line and headers of one response
MAX_HEADERS = 100  # header fields of one response
READ_SIZE = 64 * 1024  # plaintext read at most per recv (OpenSSL returns one TLS record, <= 16 KiB)


class HTTPError(Exception):
    """The exchange failed: connection, TLS, protocol or size. ``reason`` is a metric label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, write: bool) -> None:
    """Until ``fd`` is readable (or writable)."""
    waiter = loop.create_future()
    done = lambda: waiter.done() or waiter.set_result(None)  # noqa: E731
    (loop.add_writer if write else loop.add_reader)(fd, done)
    try:
        await waiter
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)


class _Connection:
    """One kept-alive TLS connection; feeds the bytes of each response to httptools and completes
    the waiting request."""

    def __init__(
        self,
        sock: ssl.SSLSocket,
        buffer: bytearray,
        limit: int,
        max_header_bytes: int = MAX_HEADER_BYTES,
        max_headers: int = MAX_HEADERS,
    ) -> None:
        self.sock = sock
        self.buffer = buffer  # the pool's: shared by its connections, which one loop runs in turn
        self.view = memoryview(buffer)
        self.fd = sock.fileno()
        self.loop = asyncio.get_running_loop()
        self.limit = limit
        self.max_header_bytes = max_header_bytes
        self.max_headers = max_headers
        self.header_bytes = 0  # bytes received for the current response before its headers ended
        self.header_count = 0
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.chunks: list[bytes] = []
        self.size = 0
        self.got_bytes = False  # any response bytes for the current request
        self.complete = False  # the current request's response has been parsed whole
        self.headers_done = False
        self.delimited = False  # Content-Length or Transfer-Encoding seen
        self.length = -1  # the current response's Content-Length (-1: none, or not digits)
        self.chunked = False  # Transfer-Encoding seen
        # A 200 response with a Content-Length is read into its body's own memory once its headers
        # are done (``into``, a writable view of ``holder``), past httptools, which stays mid-body
        # and is replaced for the next request (~0.3 us). Before, every piece went through
        # httptools' on_body (a bytes object each) and the pieces were joined: two more copies of
        # ~32 kB a scrape. 50 nodes, 2 Dec: bench/scrape_instructions.py 663 000-693 000 -> 622 700-
        # 634 500 instructions a scrape (five and three runs); bench/fixed_costs.py --per-scrape,
        # alternated, 173 / 149 / 161 -> 164 / 142 / 152 us of CPU a scrape.
        self.holder: Any = None
        self.into: memoryview | None = None
        self.filled = 0
        self.closed = False
        self.keep_alive = True
        # The loop watches the socket from now to close(): registering it per request and removing
        # it after cost two epoll_ctl calls and the selector's bookkeeping a scrape (with the
        # history in rows, HTTP/TLS/asyncio went 206 / 219 / 190 -> 175 / 172 / 165 us of a scrape,
        # bench/fixed_costs.py --per-scrape, alternated). An idle connection the server closes is
        # then closed at once; bytes no request asked for close it too.
        self.loop.add_reader(self.fd, self._readable)

    # -- reading ------------------------------------------------------------------------------

    def _readable(self) -> None:
        """The loop's reader callback: decrypt and parse until OpenSSL has nothing more."""
        sock, buffer = self.sock, self.buffer
        try:
            while not self.closed:
                into = self.into
                if into is not None:  # the body's bytes, decrypted where they are handed on from
                    n = sock.recv_into(into[self.filled :], self.length - self.filled)
                else:
                    n = sock.recv_into(buffer, READ_SIZE)
                if not n:  # close_notify, or the TCP connection ended (ragged EOFs are EOFs)
                    self._lost(None)
                    return
                waiter = self.waiter
                if waiter is None or waiter.done():
                    self.close()  # bytes while no response is awaited: the exchange is out of step
                    return
                if into is None:
                    self._received(n)
                else:
                    self.filled += n
                    if self.filled == self.length:
                        self._body_done()
                if self.complete and not sock.pending():
                    # The response is whole: no read just to learn that nothing follows (an
                    # SSLWantReadError a scrape). Bytes that do follow wake this again, and no
                    # response is awaited then: the connection is closed.
                    return
        except ssl.SSLWantReadError:
            return  # all read: wait for the next bytes
        except ssl.SSLWantWriteError:  # a renegotiation (TLS 1.2); kubelets never ask for one
            self._fail(HTTPError("tls", "the server asked for a TLS renegotiation"))
        except OSError as e:  # ssl.SSLError included: a broken record is a broken connection
            self._lost(e)

    def _received(self, n: int) -> None:
        """The read's ``n`` bytes, in the pool's buffer, to httptools (or, past the headers of a
        body read in place, to that body)."""
        self.got_bytes = True
        view = self.view
        if self.headers_done:
            self._feed(view[:n])
            return
        # Up to the headers' end alone, when it is in this read: the rest of a body read in place
        # is then copied once, from here, not made a bytes object by httptools and copied again.
        # (A head split across reads goes whole; its body bytes then come through on_body.)
        end = self.buffer.find(b"\r\n\r\n", 0, n) + 4
        if end < 4:
            end = n
        if not self._feed(view[:end]):
            return
        if end < n and not self.headers_done and not self.closed:
            # A blank line that did not end the headers (httptools skips CRLFs before the status
            # line): the rest of the read goes to httptools as well.
            if not self._feed(view[end:n]):
                return
            end = n
        if not self.headers_done:
            # Counted after feeding: a read that also ends the headers (and carries body bytes)
            # must not count against the header bound; one that does not end them does.
            self.header_bytes += n
            if self.header_bytes > self.max_header_bytes:
                self._fail(
                    HTTPError(
                        "headers_too_large",
                        f"response status line and headers over {self.max_header_bytes} bytes",
                    )
                )
            return
        if end == n or self.closed:
            return
        if self.into is None:
            self._feed(view[end:n])
            return
        take = self._fill(view[end:n])
        if self.filled == self.length:
            self._body_done()
            if n - end > take:
                self.close()  # bytes after the whole response, unasked for: out of step

    def _fill(self, data: Any) -> int:
        """``data`` copied into the body read in place, up to its length: how many bytes it took."""
        assert self.into is not None
        take = min(len(data), self.length - self.filled)
        self.into[self.filled : self.filled + take] = data[:take]
        self.filled += take
        return take

    def _feed(self, data: memoryview) -> bool:
        """``data`` to httptools; False when it refused them (the request has failed)."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(HTTPError("protocol", f"malformed HTTP response: {e}"))
            return False
        return True

    def _lost(self, exc: Exception | None) -> None:
        """The connection ended (``exc`` None: cleanly, by the server)."""
        self.close()
        if self.waiter is None or self.waiter.done():
            return
        if self.headers_done and not self.delimited and exc is None:
            # No Content-Length and not chunked: the body ends with the connection (RFC 9112 6.3).
            self.keep_alive = False
            self.waiter.set_result((self.parser.get_status_code(), b"".join(self.chunks)))
        else:
            self._fail(HTTPError("connection", f"connection closed: {exc or 'by the server'}"))

    # -- httptools callbacks --------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_count += 1
        if self.header_count > self.max_headers:
            if not self.closed:
                self._fail(
                    HTTPError("too_many_headers", f"response with over {self.max_headers} header fields")
                )
            return
        name = name.lower()
        if name == b"content-length":
            self.delimited = True
            value = value.strip()
            if value.isdigit():
                self.length = int(value)
                if self.length > self.limit:
                    self._fail(HTTPError("too_large", f"body of {self.length} bytes over {self.limit}"))
        elif name == b"transfer-encoding":
            self.delimited = self.chunked = True

    def on_message_begin(self) -> None:
        if self.complete:
            # A second response to one request, in the same read as the first: out of step.
            # Kept, the next request would be answered with its bytes.
            self.close()

    def on_headers_complete(self) -> None:
        self.headers_done = True
        if self.length > 0 and not self.chunked and not self.closed and self.parser.get_status_code() == 200:
            self.holder = BodyBuffer(self.length) if BodyBuffer is not None else bytearray(self.length)
            self.into = memoryview(self.holder)

    def on_body(self, body: bytes) -> None:
        if self.into is not None:  # the body's first bytes, in the read that ended the headers
            self._fill(body)  # httptools hands over at most Content-Length bytes: it takes them all
            return
        self.size += len(body)
        if self.size > self.limit:
            self._fail(HTTPError("too_large", f"body over {self.limit} bytes"))
            return
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        if self.into is not None:  # the whole body came with the read that ended the headers
            self._body_done()
            return
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((self.parser.get_status_code(), b"".join(self.chunks)))

    def _body_done(self) -> None:
        """The body read into ``holder`` is whole: hand it over."""
        assert self.into is not None
        self.into.release()  # no view stays open: the bytes object is never written again
        self.into = None
        holder, self.holder = self.holder, None
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()
        if self.waiter is not None and not self.waiter.done():
            body = holder.take() if BodyBuffer is not None else bytes(holder)
            self.waiter.set_result((200, body))

    # -- use --------------------------------------------------------------------------------------

    def _fail(self, error: HTTPError) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(error)
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.loop.remove_reader(self.fd)  # watched from __init__ until now
            self.sock.close()

    async def _send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[self.sock.send(view) :]
            except ssl.SSLWantWriteError:
                await _ready(self.loop, self.fd, write=True)
            except ssl.SSLWantReadError:  # a renegotiation (TLS 1.2); kubelets never ask for one
                raise HTTPError("tls", "the server asked for a TLS renegotiation") from None

    async def get(self, request: bytes) -> tuple[int, bytes]:
        if self.headers_done:  # a response came before: httptools may have been left mid-body
            self.parser = httptools.HttpResponseParser(self)
        self.chunks, self.size, self.got_bytes, self.complete = [], 0, False, False
        self.headers_done = self.delimited = self.chunked = False
        self.length, self.filled = -1, 0
        self.header_bytes = self.header_count = 0
        self.waiter = self.loop.create_future()
        try:
            try:
                await self._send(request)
            except OSError as e:  # the server closed or reset the idle connection, say
                raise HTTPError("connection", f"{e.__class__.__name__}: {e}") from None
            return await self.waiter
        except BaseException:
            self.close()  # cancelled or failed mid-exchange: the connection's state is unknown
            raise
        finally:
            # The joined body has been handed over; the pieces it was joined from would otherwise
            # stay referenced by this idle connection until the next cycle (~32 KiB a kubelet:
            # 31 MiB at 1000 nodes).
            self.waiter, self.chunks = None, []
            if self.into is not None:  # an unfinished body: its bytes object is never handed on
                self.into.release()
            self.into = self.holder = None


async def _addresses(host: str, port: int) -> list[tuple[Any, ...]]:
    """(family, address) to try, in order; an IP literal without asking the resolver."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        return [(family, address) for family, _, _, _, address in infos]
    return [(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, (host, port))]


async def connect_first(addresses: list[tuple[Any, ...]]) -> socket.socket:
    """A non-blocking TCP socket connected to the first of ``addresses`` ((family, address)
    pairs) that accepts; the last error when none does."""
    loop = asyncio.get_running_loop()
    error: OSError | None = None
    for family, address in addresses:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, address)
            return sock
        except OSError as e:
            sock.close()
            error = e
        except BaseException:
            sock.close()
            raise
    raise error or OSError("no address to connect to")


async def _open(host: str, port: int, context: ssl.SSLContext) -> ssl.SSLSocket:
    """A connected non-blocking TLS socket, handshake done; OSError (ssl.SSLError) otherwise."""
    loop = asyncio.get_running_loop()
    sock = await connect_first(await _addresses(host, port))
    tls = context.wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False)
    try:
        while True:
            try:
                tls.do_handshake()
                return tls
            except ssl.SSLWantReadError:
                await _ready(loop, tls.fileno(), write=False)
            except ssl.SSLWantWriteError:
                await _ready(loop, tls.fileno(), write=True)
    except BaseException:
        tls.close()
        raise


class KeepAlivePool:
    """At most one idle connection per (host, port); GETs answered as (status, body)."""

    def __init__(
        self,
        ssl_context: ssl.SSLContext,
        max_body_bytes: int,
        *,
        max_header_bytes: int = MAX_HEADER_BYTES,
        max_headers: int = MAX_HEADERS,
    ) -> None:
        self.ssl_context = ssl_context
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes
        self.max_headers = max_headers
        self._idle: dict[tuple[str, int], _Connection] = {}
        self.connects = 0  # new connections made (TLS handshakes), for tests and metrics
        # Decrypted bytes land here, are fed to httptools (which copies what it keeps: body
        # pieces) and are overwritten by the next read: one buffer for all of the pool's connections.
        self._buffer = bytearray(READ_SIZE)

    async def _connect(self, host: str, port: int) -> _Connection:
        try:
            sock = await _open(host, port, self.ssl_context)
        except ssl.SSLError as e:
            raise HTTPError("tls", f"{e.__class__.__name__}: {e}") from None
        except OSError as e:
            raise HTTPError("connection", f"{e.__class__.__name__}: {e}") from None
        self.connects += 1
        return _Connection(sock, self._buffer, self.max_body_bytes, self.max_header_bytes, self.max_headers)

    async def get(self, host: str, port: int, target: str, headers: dict[str, str]) -> tuple[int, bytes]:
        """GET ``target`` from host:port over TLS; raise HTTPError for anything but a response."""
        host_header = f"[{host}]" if ":" in host else host
        lines = [f"GET {target} HTTP/1.1", f"Host: {host_header}:{port}"]
        lines.extend(f"{k}: {v}" for k, v in headers.items())
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        key = (host, port)
        conn = self._idle.pop(key, None)
        if conn is not None and not conn.closed:
            try:
                return self._done(key, conn, await conn.get(request))
            except HTTPError as e:
                # The server may close an idle connection just as we reuse it: retry once on a
                # new connection, but only when it answered nothing (GET is idempotent).
                if e.reason != "connection" or conn.got_bytes:
                    raise
        conn = await self._connect(host, port)
        return self._done(key, conn, await conn.get(request))

    def _done(self, key: tuple[str, int], conn: _Connection, result: tuple[int, bytes]) -> tuple[int, bytes]:
        if conn.keep_alive and not conn.closed:
            old = self._idle.pop(key, None)
            if old is not None:
                old.close()
            self._idle[key] = conn
        else:
            conn.close()
        return result

    def forget(self, keep: set[tuple[str, int]]) -> None:
        """Close idle connections to endpoints not in ``keep`` (nodes that left)."""
        for key in [k for k in self._idle if k not in keep]:
            self._idle.pop(key).close()

    def close(self) -> None:
        for conn in self._idle.values():
            conn.close()
        self._idle.clear()
