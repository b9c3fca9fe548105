"""Responses are gzip-compressed by ISA-L (the isal package) in the event loop, or, where isal is
not installed, by zlib in a worker thread: both give standard gzip that decodes to the same bytes,
for a joined body, a streamed one, and a small one. The zlib path runs in a child process where
``import isal`` fails, as on a platform without its wheels."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent(
    """
    import asyncio, gzip, sys
    if sys.argv[1] == "zlib":
        sys.modules["isal"] = None  # import isal raises ImportError
    import aiohttp
    from aiohttp import web
    from kcms.apiserver import responses

    BODY = b"".join(b'{"name":"pod-%d","cpu":"%dn"},' % (i, i * 7919 % 1000003) for i in range(60000))

    async def chunks():
        for i in range(0, len(BODY), 300_000):
            yield BODY[i : i + 300_000]

    async def handler(request):
        kind = request.path.strip("/")
        if kind == "stream":
            return await responses.stream_response(request, chunks())
        if kind == "joined":
            return await responses.bytes_response_async(request, BODY)
        return responses.bytes_response(request, BODY[:5000])

    async def main():
        app = web.Application()
        app.router.add_get("/{kind}", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        async with aiohttp.ClientSession(auto_decompress=False) as s:
            for kind, size in (("stream", len(BODY)), ("joined", len(BODY)), ("small", 5000)):
                async with s.get(f"http://127.0.0.1:{port}/{kind}", headers={"Accept-Encoding": "gzip"}) as r:
                    raw = await r.read()
                    assert r.headers["Content-Encoding"] == "gzip", kind
                    assert gzip.decompress(raw) == BODY[:size], kind
                    assert len(raw) < size / 3, kind
        await runner.cleanup()
        print(responses.GZIP_IN_LOOP, responses._deflate.__name__)

    asyncio.run(main())
    """
)


def run_child(mode: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


def test_isal_compresses_in_the_loop():
    assert run_child("isal") == "True isal.isal_zlib"


def test_without_isal_zlib_compresses_in_a_thread_to_the_same_bytes():
    assert run_child("zlib") == "False zlib"
