"""Reading a request body with a size limit, for every endpoint that takes pushed data."""

from __future__ import annotations

from aiohttp import web


class BodyTooLarge(Exception):
    """The body is over the limit (declared or as read)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is larger than {limit} bytes")
        self.limit = limit


async def read_body(request: web.Request, limit: int) -> bytes:
    """The body, at most ``limit`` bytes as the handler sees it (aiohttp has already undone a gzip
    Content-Encoding, so a small compressed bomb is stopped too). A declared length over the limit
    is refused before reading. Raises :class:`BodyTooLarge`; a body that cannot be read (a broken
    gzip stream, a truncated upload) raises what aiohttp raised."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding == "identity" and request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await request.content.readany()
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)
