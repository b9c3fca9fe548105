"""Kubernetes-style responses: ``Status`` errors, JSON bodies, content negotiation and ``Table`` output.

Handlers either return :func:`respond` (a JSON object, possibly rendered as a ``meta.k8s.io`` ``Table``)
or raise :class:`StatusError`, which the server's middleware turns into a ``Status`` response.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from kcms.limits import printable
from kcms.statusbody import status_object
from kcms.tasks import LONG_STREAM_BYTES, STREAMS

try:
    # ISA-L's deflate: a 36 MB pod list compressed in 27-29 ms at level 1 here, zlib's level 2 took
    # 211 ms and its output was 14 % larger. At ~1 ms a MiB it runs in the event loop: handing
    # each chunk to a thread cost more than compressing it once the loop was also scraping (every
    # hand-back waits for the GIL: a 56 MB list was ~350 ms slower gzipped than not at 5000 nodes).
    from isal import isal_zlib as _deflate

    GZIP_LEVEL = 1
    GZIP_IN_LOOP = True
except ImportError:  # a platform without isal wheels: the standard library's zlib, in a thread
    import zlib as _deflate  # type: ignore[no-redef]

    GZIP_LEVEL = 2
    GZIP_IN_LOOP = False

JSON = "application/json"
GZIP_MIN_BYTES = 1024
_ACCEPTED_TYPES = "application/json"


class StatusError(Exception):
    """An error that becomes a ``v1`` ``Status`` object with ``status: Failure``."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        """The ``Status`` object as a dict."""
        return status_object(self.code, self.reason, self.message, self.details)


def _qualified(group: str, resource: str) -> str:
    return f"{resource}.{group}" if group else resource


def not_found(group: str, resource: str, name: str) -> StatusError:
    """``<resource>.<group> "<name>" not found`` (404 NotFound)."""
    return StatusError(
        404,
        "NotFound",
        f'{_qualified(group, resource)} "{name}" not found',
        {"name": name, "group": group, "kind": resource},
    )


def path_not_found() -> StatusError:
    """The 404 kube answers for a path it does not serve."""
    return StatusError(404, "NotFound", "the server could not find the requested resource", {})


def bad_request(message: str) -> StatusError:
    """400 BadRequest with the given message."""
    return StatusError(400, "BadRequest", message)


def unauthorized() -> StatusError:
    """401 Unauthorized, as kube answers a request no authenticator accepted."""
    return StatusError(401, "Unauthorized", "Unauthorized")


def forbidden(group: str, resource: str, name: str, message: str) -> StatusError:
    """403 Forbidden in kube's form: ``<resource>.<group> "<name>" is forbidden: <message>``."""
    qualified = _qualified(group, resource)
    if not qualified:
        text = f"forbidden: {message}"
    elif not name:
        text = f"{qualified} is forbidden: {message}"
    else:
        text = f'{qualified} "{name}" is forbidden: {message}'
    return StatusError(403, "Forbidden", text, {"name": name, "group": group, "kind": resource})


def method_not_allowed() -> StatusError:
    """405 MethodNotAllowed."""
    return StatusError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {}
    )


def not_acceptable() -> StatusError:
    """406 NotAcceptable, listing what the server can produce."""
    return StatusError(
        406, "NotAcceptable", f"only the following media types are accepted: {_ACCEPTED_TYPES}"
    )


def service_unavailable(message: str) -> StatusError:
    """503 ServiceUnavailable."""
    return StatusError(503, "ServiceUnavailable", message)


def internal_error(message: str) -> StatusError:
    """500 InternalError in kube's wording."""
    return StatusError(
        500,
        "InternalError",
        f"Internal error occurred: {message}",
        {"causes": [{"message": message}]},
    )


@dataclass(frozen=True, slots=True)
class TableConverter:
    """How to render objects as ``Table`` rows: column definitions and a row function."""

    columns: list[dict[str, Any]]
    row: Callable[[dict[str, Any]], list[Any]]


DEFAULT_TABLE = TableConverter(
    columns=[
        {
            "name": "Name",
            "type": "string",
            "format": "name",
            "description": "Name must be unique within a namespace.",
            "priority": 0,
        },
        {
            "name": "Created At",
            "type": "date",
            "format": "",
            "description": "CreationTimestamp is a timestamp representing the server time when this object was created.",
            "priority": 0,
        },
    ],
    row=lambda obj: [
        obj.get("metadata", {}).get("name", ""),
        obj.get("metadata", {}).get("creationTimestamp"),
    ],
)


@dataclass(frozen=True, slots=True)
class MediaRange:
    """One clause of an ``Accept`` header."""

    type: str
    subtype: str
    params: dict[str, str]
    q: float


def parse_accept(header: str) -> list[MediaRange]:
    """Parse an ``Accept`` header into media ranges, best first (by q, then specificity, then order)."""
    ranges: list[tuple[float, int, int, MediaRange]] = []
    for index, clause in enumerate(header.split(",")):
        parts = [p.strip() for p in clause.split(";")]
        if not parts[0]:
            continue
        mtype, _, subtype = parts[0].lower().partition("/")
        params: dict[str, str] = {}
        q = 1.0
        for p in parts[1:]:
            key, _, value = p.partition("=")
            key = key.strip().lower()
            value = value.strip().strip('"')
            if key == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
            elif key:
                params[key] = value
        if q <= 0:
            continue
        specificity = (mtype != "*") + (subtype not in ("*", "")) + bool(params)
        ranges.append((q, specificity, index, MediaRange(mtype, subtype or "*", params, q)))
    ranges.sort(key=lambda t: (-t[0], -t[1], t[2]))
    return [r for _, _, _, r in ranges]


@dataclass(frozen=True, slots=True)
class Rendering:
    """What :func:`negotiate` chose: plain JSON, or a ``Table`` of the given meta.k8s.io version."""

    table_version: str | None = None  # "v1" or "v1beta1" for a Table, None for the object itself


def negotiate(accept: str | None) -> Rendering:
    """Choose the output for an ``Accept`` header, or raise a 406 :class:`StatusError`.

    JSON is produced for ``application/json``, ``application/*`` and ``*/*``; a missing or empty
    header means JSON; protobuf is not produced (clients such as the HPA list ``*/*`` or JSON after it).
    ``application/json;as=Table;g=meta.k8s.io;v=v1|v1beta1`` asks for a ``Table``.
    """
    if not accept or not accept.strip():
        return Rendering()
    for mr in parse_accept(accept):
        if (mr.type, mr.subtype) not in (("application", "json"), ("application", "*"), ("*", "*")):
            continue
        as_ = mr.params.get("as")
        if as_ is None:
            if {"g", "v"} & mr.params.keys():
                continue  # a versioned request for something we do not have
            return Rendering()
        if as_ == "Table" and mr.params.get("g") == "meta.k8s.io" and mr.params.get("v") in ("v1", "v1beta1"):
            return Rendering(table_version=mr.params["v"])
    raise not_acceptable()


def to_table(
    obj: dict[str, Any], converter: TableConverter, version: str, include_object: str
) -> dict[str, Any]:
    """Render an object or a list (a dict with ``items``) as a ``meta.k8s.io/<version>`` ``Table``."""
    api_version = f"meta.k8s.io/{version}"
    is_list = isinstance(obj.get("items"), list)
    items: list[dict[str, Any]] = obj["items"] if is_list else [obj]
    rows = []
    for item in items:
        row: dict[str, Any] = {"cells": converter.row(item)}
        if include_object == "Object":
            row["object"] = item
        elif include_object != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": api_version,
                "metadata": item.get("metadata", {}),
            }
        rows.append(row)
    metadata: dict[str, Any] = {}
    if is_list:
        metadata = {k: v for k, v in obj.get("metadata", {}).items() if k in ("resourceVersion", "continue")}
    else:
        rv = obj.get("metadata", {}).get("resourceVersion")
        if rv:
            metadata["resourceVersion"] = rv
    return {
        "kind": "Table",
        "apiVersion": api_version,
        "metadata": metadata,
        "columnDefinitions": converter.columns,
        "rows": rows,
    }


def json_response(
    request: web.Request | None,
    obj: Any,
    *,
    status: int = 200,
    content_type: str = JSON,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """Serialize ``obj`` with orjson; gzip the body when the client accepts it and it is large."""
    body = orjson.dumps(obj)
    return bytes_response(request, body, status=status, content_type=content_type, headers=headers)


def _response_headers(content_type: str, headers: dict[str, str] | None) -> dict[str, str]:
    hdrs = {"Content-Type": content_type, "Cache-Control": "no-cache, private"}
    if headers:
        hdrs.update(headers)
    return hdrs


def _gzip_headers(hdrs: dict[str, str]) -> None:
    hdrs["Content-Encoding"] = "gzip"
    hdrs["Vary"] = "Accept-Encoding"


def accepts_gzip(request: web.Request) -> bool:
    return "gzip" in request.headers.get("Accept-Encoding", "").lower()


def gzip_compressor() -> Any:
    """A compressor of one gzip stream (``compress`` pieces, then ``flush``), at :data:`GZIP_LEVEL`."""
    return _deflate.compressobj(GZIP_LEVEL, _deflate.DEFLATED, 31)  # 31: gzip framing


def gzip_bytes(body: bytes) -> bytes:
    """``body`` as one gzip stream (header mtime 0)."""
    compressor = gzip_compressor()
    return compressor.compress(body) + compressor.flush()


def bytes_response(
    request: web.Request | None,
    body: bytes,
    *,
    status: int = 200,
    content_type: str = JSON,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """A response with a ready body, gzip-encoded when accepted and larger than :data:`GZIP_MIN_BYTES`."""
    hdrs = _response_headers(content_type, headers)
    if request is not None and len(body) > GZIP_MIN_BYTES and accepts_gzip(request):
        body = gzip_bytes(body)
        _gzip_headers(hdrs)
    return web.Response(body=body, status=status, headers=hdrs)


# What the JSON of metrics lists shrinks to under gzip, about (the list of 150 000 pods: 56.7 MB to
# 8.2 MB): a gzipped stream counts as long (kcms.tasks.LONG_STREAM_BYTES) after that much less.
GZIP_RATIO = 8


# Without ISA-L, bodies above this are gzip-compressed in a worker thread (zlib releases the GIL):
# a 56 MB list of 150 000 pods took 1.2 s with zlib at level 4 in the event loop (bench/list_render.py).
GZIP_OFFLOAD_BYTES = 256 * 1024


async def bytes_response_async(
    request: web.Request,
    body: bytes,
    *,
    status: int = 200,
    content_type: str = JSON,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """:func:`bytes_response`, but a body above :data:`GZIP_OFFLOAD_BYTES` that the client accepts
    gzipped is compressed in a worker thread, not in the event loop (unless ISA-L compresses it:
    :data:`GZIP_IN_LOOP`)."""
    if GZIP_IN_LOOP or len(body) <= GZIP_OFFLOAD_BYTES or not accepts_gzip(request):
        return bytes_response(request, body, status=status, content_type=content_type, headers=headers)
    hdrs = _response_headers(content_type, headers)
    body = await asyncio.get_running_loop().run_in_executor(None, gzip_bytes, body)
    _gzip_headers(hdrs)
    return web.Response(body=body, status=status, headers=hdrs)


async def stream_response(
    request: web.Request,
    chunks: AsyncIterator[bytes],
    *,
    content_type: str = JSON,
    headers: dict[str, str] | None = None,
    gzipped: bool = False,
) -> web.StreamResponse:
    """A 200 whose body is ``chunks`` sent as they come (chunked transfer encoding), for bodies too
    large to build and then write in one go: the producer runs at the pace of the socket, the loop
    is free between chunks, and no whole body is held in memory. When the client accepts gzip, each
    chunk is compressed (one gzip stream, :func:`gzip_compressor`): in the loop with ISA-L, else
    in a worker thread while the next one is produced; ``gzipped`` chunks are one gzip stream
    already, sent as they are. Returns the response already sent; ``chunks`` is closed in every case.
    """
    hdrs = _response_headers(content_type, headers)
    compressor = None
    long_after = LONG_STREAM_BYTES
    if gzipped:
        _gzip_headers(hdrs)
        long_after //= GZIP_RATIO
    elif accepts_gzip(request):
        compressor = gzip_compressor()
        _gzip_headers(hdrs)
    resp = web.StreamResponse(status=200, headers=hdrs)
    loop = asyncio.get_running_loop()
    pending: asyncio.Future[bytes] | None = None  # the previous chunk, being compressed
    produced = 0  # bytes read from ``chunks`` until the response counts as long (then -1)
    try:
        await resp.prepare(request)
        async for chunk in chunks:
            if produced >= 0:
                produced += len(chunk)
                if produced > long_after:  # from now on a scrape cycle's decodes yield more
                    STREAMS.count += 1
                    produced = -1
            if compressor is None:
                await resp.write(chunk)
                continue
            if GZIP_IN_LOOP:
                compressed = compressor.compress(chunk)
                if compressed:
                    await resp.write(compressed)
                continue
            compressed = await pending if pending is not None else b""
            pending = loop.run_in_executor(None, compressor.compress, chunk)
            if compressed:
                await resp.write(compressed)
        if compressor is not None:
            if pending is not None:
                await resp.write(await pending)
                pending = None
            await resp.write(compressor.flush())
        await resp.write_eof()
    except ConnectionError:
        pass  # the client left mid-body: nothing to answer, no traceback (aiohttp logs the access)
    except Exception:
        if not resp.prepared:
            raise  # nothing sent yet: the middleware answers with a Status
        # The status line is out, so no Status can follow: cut the connection, so the client sees
        # a truncated body rather than another response spliced into this one.
        logging.getLogger(__name__).exception("streaming %s failed", printable(request.path))
        if request.transport is not None:
            request.transport.close()
    finally:
        if produced < 0:
            STREAMS.count -= 1
        if pending is not None:
            await asyncio.wait([pending])  # never leave the compressor in use by a thread
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
    return resp


async def gzipped_body_response(
    request: web.Request, chunks: AsyncIterator[bytes], *, stream_above: int
) -> web.StreamResponse:
    """A 200 whose body is ``chunks``, one gzip stream already (``Content-Encoding: gzip``): joined
    and sent while within ``stream_above`` bytes, else streamed (:func:`stream_response`)."""
    parts, whole = await _first_chunks(chunks, stream_above)
    if whole:
        hdrs = _response_headers(JSON, None)
        _gzip_headers(hdrs)
        return web.Response(body=b"".join(parts), headers=hdrs)
    return await stream_response(request, _joined_then_rest(parts, chunks), gzipped=True)


async def _first_chunks(chunks: AsyncIterator[bytes], limit: int) -> tuple[list[bytes], bool]:
    """The chunks read until they come to more than ``limit`` bytes, and whether they are all."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        parts.append(chunk)
        size += len(chunk)
        if size > limit:
            return parts, False
    return parts, True


async def _joined_then_rest(
    parts: list[bytes], chunks: AsyncIterator[bytes], tail: bytes = b""
) -> AsyncIterator[bytes]:
    """``parts`` joined, then the rest of ``chunks``, then ``tail``; closes ``chunks`` in any case."""
    try:
        yield b"".join(parts)
        async for chunk in chunks:
            yield chunk
        if tail:
            yield tail
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]


def respond(
    request: web.Request,
    obj: dict[str, Any],
    *,
    table: TableConverter | None = None,
    status: int = 200,
) -> web.Response:
    """Answer with ``obj`` as JSON, or as a ``Table`` when the ``Accept`` header asks for one.

    ``table`` converts objects to rows; without it a default Name / Created At table is used.
    The ``includeObject`` query parameter (None, Object, Metadata; default Metadata) says what each
    row's ``object`` holds. Raises a 406 :class:`StatusError` for an ``Accept`` we cannot satisfy.
    """
    rendering = negotiate(request.headers.get("Accept"))
    if rendering.table_version is not None:
        include = request.query.get("includeObject", "Metadata") or "Metadata"
        if include not in ("None", "Object", "Metadata"):
            raise bad_request(f'includeObject: Unsupported value: "{include}"')
        obj = to_table(obj, table or DEFAULT_TABLE, rendering.table_version, include)
    return json_response(request, obj, status=status)


def status_response(request: web.Request | None, err: StatusError) -> web.Response:
    """The JSON response for a :class:`StatusError`."""
    return json_response(request, err.status(), status=err.code)


async def list_body_response(
    request: web.Request, head: bytes, items: AsyncIterator[bytes], *, stream_above: int, tail: bytes = b"]}"
) -> web.StreamResponse:
    """A JSON list made of ``head``, the comma-joined item bytes ``items`` yields in chunks, and
    ``tail``: joined and sent (:func:`bytes_response_async`) while the items stay within
    ``stream_above`` bytes, else streamed (:func:`stream_response`) from what was read so far."""
    parts, whole = await _first_chunks(items, stream_above)
    if whole:
        return await bytes_response_async(request, b"".join([head, *parts, tail]))
    return await stream_response(request, _joined_then_rest([head, *parts], items, tail))
