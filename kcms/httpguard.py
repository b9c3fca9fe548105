"""Connection guards for every HTTP listener (API server, store service, agent): the limits Go's
``net/http`` server gives the kube-apiserver, which aiohttp lacks or answers badly.

Use :class:`GuardedRunner` instead of ``web.AppRunner``; sites are created as usual::

    runner = GuardedRunner(app, GuardOptions(listener="store"), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=ctx).start()

What a guarded connection gets (defaults are the kube-apiserver's):

* **header deadline** (``header_timeout``, 32 s, kube's ``ReadHeaderTimeout``): a new connection,
  and a kept-alive one from the first byte of its next request, must deliver the whole request
  line and headers in time, or it is closed (a slowloris holding sockets open). aiohttp has no
  such timer: its keep-alive timer only runs between requests.
* **idle timeout** (``idle_timeout``, 90 s, kube's ``IdleTimeout``): aiohttp's keep-alive timeout.
* **body deadline** (``body_timeout``, 60 s, kube's default ``--request-timeout``): a body must
  have arrived completely within this time after its headers, or the connection is closed.
* **sizes**: request line (URL) at most ``max_line_size`` bytes (else ``414``), one header line at
  most ``max_field_size`` bytes and at most ``max_headers`` headers (else ``431``).
* **protocol errors** answered as a Kubernetes ``Status`` in JSON with the right code instead of
  aiohttp's ``text/plain`` 400 and logged as one bounded, escaped line instead of a traceback:
  malformed request line ``400``, an unknown but well-formed method ``405``, URL too long ``414``,
  headers too large ``431``, a request body in a ``Content-Encoding`` other than identity, gzip or
  deflate ``415``, a body that cannot be read (broken gzip, cut short) ``400``.

Every refusal and every connection closed by a deadline is counted in
``kcms_http_refusals_total{listener, reason}`` (bounded reasons: :data:`REASONS`).

The TLS handshake itself is bounded by asyncio's ``ssl_handshake_timeout`` (60 s).
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from aiohttp.http import RawRequestMessage
from aiohttp.http_exceptions import (
    BadHttpMethod,
    ContentEncodingError,
    HttpProcessingError,
    LineTooLong,
)
from aiohttp.web_protocol import RequestHandler, RequestPayloadError
from prometheus_client import Counter

from kcms.limits import printable
from kcms.statusbody import status_object

__all__ = [
    "ACCEPTED_ENCODINGS",
    "HANDLER_ENCODINGS",
    "GuardOptions",
    "GuardedRunner",
    "REASONS",
    "REFUSALS",
    "accepts_encoding",
    "status_body",
]

log = logging.getLogger(__name__)

# Request Content-Encodings aiohttp decodes itself (brotli and zstd only with optional libraries,
# which would make what the server accepts depend on what happens to be installed).
ACCEPTED_ENCODINGS = frozenset({"", "identity", "gzip", "x-gzip", "deflate"})
# Exact paths whose handler decodes the body itself in these encodings (aiohttp passes them through
# undecoded): Prometheus remote write's snappy block (kcms/apis/remote_write.py, which bounds it).
HANDLER_ENCODINGS: dict[str, frozenset[str]] = {"/api/v1/write": frozenset({"snappy"})}


def accepts_encoding(path: str, encoding: str) -> bool:
    """Whether a request body in ``encoding`` (lower case) may reach the handler of ``path``."""
    return encoding in ACCEPTED_ENCODINGS or encoding in HANDLER_ENCODINGS.get(path, ())


REASONS = (
    "bad_request",
    "method_not_allowed",
    "uri_too_long",
    "headers_too_large",
    "unsupported_encoding",
    "body_unreadable",
    "header_timeout",
    "body_timeout",
)
REFUSALS = Counter(
    "kcms_http_refusals",
    "Requests refused and connections closed by the HTTP guard, by listener and reason "
    "(bad_request, method_not_allowed, uri_too_long, headers_too_large, unsupported_encoding, "
    "body_unreadable, header_timeout, body_timeout).",
    ["listener", "reason"],
)

# An HTTP method is a token (RFC 9110 5.6.2); a request line starting with one and a space is a
# well-formed request for a method aiohttp's parser does not know: 405, as Go would route it.
_METHOD_LINE = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,32} [^ \r\n]")
_HEAD_BYTES = 64


HEADER_TIMEOUT = 32.0  # seconds; kube-apiserver's ReadHeaderTimeout
IDLE_TIMEOUT = 90.0  # kube-apiserver's IdleTimeout
BODY_TIMEOUT = 60.0  # kube's default --request-timeout


@dataclass(frozen=True, slots=True)
class GuardOptions:
    """Deadlines and size limits of one listener; see the module docstring."""

    header_timeout: float = HEADER_TIMEOUT
    idle_timeout: float = IDLE_TIMEOUT
    body_timeout: float = BODY_TIMEOUT
    max_line_size: int = 8190
    max_field_size: int = 8190
    max_headers: int = 128
    listener: str = "http"  # the metric label: which listener refused

    def __post_init__(self) -> None:
        for name in ("header_timeout", "idle_timeout", "body_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")

    def handler_args(self) -> dict[str, Any]:
        """The aiohttp request-handler arguments these options set."""
        return {
            "keepalive_timeout": self.idle_timeout,
            "max_line_size": self.max_line_size,
            "max_field_size": self.max_field_size,
            "max_headers": self.max_headers,
        }


def status_body(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> bytes:
    """A failure ``v1`` ``Status`` as JSON (the API server kit's shape; this module sits below it)."""
    return orjson.dumps(status_object(code, reason, message, details))


def _status_response(code: int, reason: str, message: str) -> web.Response:
    return web.Response(
        status=code,
        body=status_body(code, reason, message),
        content_type="application/json",
        headers={"Cache-Control": "no-cache, private"},
    )


def _unsupported_encoding(encoding: str) -> tuple[int, str, str, str]:
    return (
        415,
        "UnsupportedMediaType",
        f"unsupported Content-Encoding {printable(encoding, 40)}: only identity, gzip and deflate are accepted",
        "unsupported_encoding",
    )


def _peer(peername: Any) -> str:
    if isinstance(peername, tuple) and len(peername) >= 2:
        return f"{peername[0]}:{peername[1]}"
    return printable(peername, 60)


class _GuardedHandler(RequestHandler):
    """aiohttp's protocol with the header/body deadlines and Status answers to protocol errors."""

    def __init__(self, manager: web.Server, *, guard: GuardOptions, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._g = guard
        self._g_timer: asyncio.TimerHandle | None = None
        self._g_payload: Any = None  # the body stream of the latest parsed request
        self._g_head = b""  # the first bytes of the request being read (to classify a bad line)
        self._g_seen = 0  # bytes of the request's head seen so far
        self._g_line_end: int | None = None  # where its request line ends (LineTooLong: URL or header)

    # ---- deadlines ----------------------------------------------------------------------------

    def _g_arm(self, seconds: float, what: str) -> None:
        if self._g_timer is not None:
            self._g_timer.cancel()
        self._g_timer = self._loop.call_later(seconds, self._g_expire, what)

    def _g_disarm(self) -> None:
        if self._g_timer is not None:
            self._g_timer.cancel()
            self._g_timer = None

    def _g_expire(self, what: str) -> None:
        self._g_timer = None
        if what == "body_timeout" and (self._g_payload is None or self._g_payload.is_eof()):
            return  # the body arrived: the handler's own time is not this guard's business
        REFUSALS.labels(self._g.listener, what).inc()
        log.info(
            "%s: closing the connection from %s: %s (%.0f s)",
            self._g.listener,
            _peer(self.peername),
            "request headers not received in time"
            if what == "header_timeout"
            else "request body not received in time",
            self._g.header_timeout if what == "header_timeout" else self._g.body_timeout,
        )
        transport = self.transport
        if transport is not None:
            transport.abort()  # a hostile peer may never read a TLS close_notify
        self.force_close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # Go starts ReadHeaderTimeout at accept: the first request's headers are due from now on.
        self._g_arm(self._g.header_timeout, "header_timeout")

    def connection_lost(self, exc: BaseException | None) -> None:
        self._g_disarm()
        self._g_payload = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._force_close or self._close or self._upgraded:
            super().data_received(data)
            return
        payload = self._g_payload
        if data and (payload is None or payload.is_eof()):
            # bytes of a request's head: its deadline starts with its first byte
            if self._g_timer is None:
                self._g_arm(self._g.header_timeout, "header_timeout")
                # the keep-alive timer must not cut the head short of its own deadline
                self._next_keepalive_close_time = max(
                    self._next_keepalive_close_time, self._loop.time() + self._g.header_timeout
                )
            if len(self._g_head) < _HEAD_BYTES:
                self._g_head += data[: _HEAD_BYTES - len(self._g_head)]
            if self._g_line_end is None:
                newline = data.find(b"\n")
                if newline >= 0:
                    self._g_line_end = self._g_seen + newline
            self._g_seen += len(data)
        before = self._request_count
        super().data_received(data)
        if self._request_count != before and self._messages:
            if not isinstance(self._messages[-1][0], RawRequestMessage):
                return  # a protocol error: keep the head for handle_error; the connection closes
            # a request's head is complete: now its body (if any) is due
            self._g_payload = self._messages[-1][1]
            self._g_head = b""
            self._g_seen = 0
            self._g_line_end = None
            if self._g_payload.is_eof():
                self._g_disarm()
            else:
                self._g_arm(self._g.body_timeout, "body_timeout")

    # ---- protocol errors ----------------------------------------------------------------------

    def _g_classify(self, exc: BaseException) -> tuple[int, str, str, str]:
        """(code, Status reason, message, metric reason) for a client's protocol error."""
        if isinstance(exc, LineTooLong):
            if self._g_line_end is None or self._g_line_end > self._g.max_line_size:
                return (
                    414,
                    "RequestURITooLong",
                    f"the request line is longer than {self._g.max_line_size} bytes",
                    "uri_too_long",
                )
            return (
                431,
                "RequestHeaderFieldsTooLarge",
                f"a request header line is longer than {self._g.max_field_size} bytes",
                "headers_too_large",
            )
        if isinstance(exc, HttpProcessingError) and exc.message == "Too many headers received":
            return (
                431,
                "RequestHeaderFieldsTooLarge",
                f"more than {self._g.max_headers} request headers",
                "headers_too_large",
            )
        if isinstance(exc, BadHttpMethod) and _METHOD_LINE.match(self._g_head):
            method = self._g_head.split(b" ", 1)[0].decode("ascii", "replace")
            return (
                405,
                "MethodNotAllowed",
                f"the server does not allow the method {printable(method, 32)}",
                "method_not_allowed",
            )
        if isinstance(exc, ContentEncodingError) and (self._g_payload is None or self._g_payload.is_eof()):
            # raised while parsing the headers: an encoding aiohttp cannot decode (br, zstd)
            encoding = "br" if "(br)" in exc.message else "zstd" if "(zstd)" in exc.message else "?"
            return _unsupported_encoding(encoding)
        if isinstance(exc, RequestPayloadError) or isinstance(exc.__cause__, HttpProcessingError):
            return 400, "BadRequest", "the request body could not be read", "body_unreadable"
        return 400, "BadRequest", "malformed HTTP request", "bad_request"

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError | RequestPayloadError):
            return super().handle_error(request, status, exc, message)  # a server bug: keep the traceback
        code, reason, text, metric = self._g_classify(exc)
        REFUSALS.labels(self._g.listener, metric).inc()
        detail = exc.message if isinstance(exc, HttpProcessingError) else str(exc)
        log.info(
            "%s: refused a request from %s: %d %s: %s",
            self._g.listener,
            _peer(self.peername),
            code,
            reason,
            printable(detail, 160),
        )
        if request.writer.output_size > 0:  # aiohttp's rule: nothing more can be sent
            raise ConnectionError("response already started")
        resp = _status_response(code, reason, text)
        resp.force_close()
        return resp

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """aiohttp logs a client's broken body or early disconnect with a traceback: one line here."""
        exc = kw.get("exc_info")
        if isinstance(exc, HttpProcessingError | RequestPayloadError | ConnectionError):
            log.info(
                "%s: connection from %s ended: %s",
                self._g.listener,
                _peer(self.peername),
                printable(f"{type(exc).__name__}: {exc}", 160),
            )
            return
        super().log_exception(*args, **kw)


class _GuardedServer(web.Server):
    """aiohttp's low-level server making :class:`_GuardedHandler` protocols, with the request
    handler refusing bodies in encodings the server does not accept before the application runs."""

    def __init__(self, guard: GuardOptions, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = guard
        app_handler = self.request_handler

        async def encoding_check(request: web.BaseRequest) -> web.StreamResponse:
            encoding = request.headers.get("Content-Encoding", "").strip().lower()
            if request.body_exists and not accepts_encoding(request.path, encoding):
                code, reason, text, metric = _unsupported_encoding(encoding)
                REFUSALS.labels(guard.listener, metric).inc()
                log.info(
                    "%s: refused a request from %s: %d %s: %s",
                    guard.listener,
                    printable(request.remote or "", 60),
                    code,
                    reason,
                    printable(encoding, 40),
                )
                resp = _status_response(code, reason, text)
                resp.force_close()  # the body is not read: do not parse it as the next request
                return resp
            return await app_handler(request)

        self.request_handler = encoding_check

    def __call__(self) -> RequestHandler:
        return _GuardedHandler(self, guard=self.guard, loop=self._loop, **self._kwargs)


class GuardedRunner(web.AppRunner):
    """A ``web.AppRunner`` whose connections are guarded (see the module docstring). Handler
    arguments given here (``keepalive_timeout``, ``max_line_size``, ...) override the guard's."""

    def __init__(self, app: web.Application, guard: GuardOptions | None = None, **kwargs: Any) -> None:
        self.guard = guard or GuardOptions()
        for key, value in self.guard.handler_args().items():
            kwargs.setdefault(key, value)
        super().__init__(app, **kwargs)

    async def _make_server(self) -> web.Server:
        base = await super()._make_server()
        return _GuardedServer(
            self.guard,
            base.request_handler,
            request_factory=base.request_factory,
            handler_cancellation=base.handler_cancellation,
            loop=asyncio.get_running_loop(),
            **base._kwargs,  # noqa: SLF001 - the handler arguments aiohttp collected (debug, access log, ...)
        )
