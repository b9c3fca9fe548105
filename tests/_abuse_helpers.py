"""Helpers shared by the abuse tests of the API server and the other listeners
(test_security_apiserver.py, test_apiserver_protocol.py): raw TLS/plain requests, Status checks,
a gated toy API group, the guard's refusal counters and the clean-log check."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from _apiserver_helpers import GROUP, PKI, fetch
from _stores import free_port as free_port  # re-exported: the tests import it from here
from aiohttp import web
from prometheus_client import REGISTRY

from kcms.apiserver import AggregatedAPIServer, APIGroupVersion, ServingOptions, respond


def serving(pki: PKI, **kw: Any) -> ServingOptions:
    return ServingOptions(
        secure_port=0,
        bind_address="127.0.0.1",
        tls_cert_file=pki.files["cert"],
        tls_private_key_file=pki.files["key"],
        **kw,
    )


class Gate:
    """Handlers that wait until the test opens the gate, and one that reads its body."""

    def __init__(self) -> None:
        self.open = asyncio.Event()

    def group(self) -> APIGroupVersion:
        async def slow(request: web.Request) -> web.StreamResponse:
            await self.open.wait()
            return respond(request, {"kind": "SlowList", "items": []})

        async def echo(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            return respond(request, {"kind": "Echo", "size": len(body)})

        return APIGroupVersion(
            group=GROUP,
            version="v1",
            resources=[
                {"name": "slow", "singularName": "", "namespaced": False, "kind": "Slow", "verbs": ["list"]},
                {
                    "name": "echo",
                    "singularName": "",
                    "namespaced": False,
                    "kind": "Echo",
                    "verbs": ["create"],
                },
                {
                    "name": "watched",
                    "singularName": "",
                    "namespaced": False,
                    "kind": "Watched",
                    "verbs": ["list", "watch"],
                },
            ],
            routes=[
                ("GET", "/slow", slow),
                ("POST", "/slow", slow),
                ("POST", "/echo", echo),
                ("GET", "/watched", slow),
            ],
        )


async def raw(
    server: AggregatedAPIServer, ctx: ssl.SSLContext, data: bytes
) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes over TLS; (status, lower-cased headers, body) of the answer (read to EOF)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=ctx)
    try:
        writer.write(data)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 30)  # a hang guard, not a timing assertion
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def status_of(body: bytes) -> dict[str, Any]:
    doc = orjson.loads(body)
    assert doc["kind"] == "Status" and doc["apiVersion"] == "v1" and doc["status"] == "Failure", doc
    return doc


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Read until the server closes the connection (EOF or reset); returns what it sent."""
    got = b""
    while True:
        try:
            chunk = await asyncio.wait_for(reader.read(65536), 60)  # hang guard only
        except (ConnectionError, ssl.SSLError):
            return got
        if not chunk:
            return got
        got += chunk


def refusals(listener: str, reason: str) -> float:
    return (
        REGISTRY.get_sample_value("kcms_http_refusals_total", {"listener": listener, "reason": reason}) or 0.0
    )


def assert_clean_log(caplog: pytest.LogCaptureFixture) -> None:
    """No traceback, and nothing a client sent reaches the log raw (newlines, terminal escapes)."""
    for r in caplog.records:
        msg = r.getMessage()
        assert r.exc_info is None and not r.exc_text, f"traceback logged: {msg}"
        assert "Traceback" not in msg, msg
        if r.name.startswith(("kcms", "aiohttp")):
            assert "\n" not in msg and "\x1b" not in msg and "\r" not in msg, repr(msg)


async def eventually(cond: Callable[[], bool], limit: float = 20.0) -> None:
    end = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < end, "condition not met"
        await asyncio.sleep(0.02)


async def ready(server: AggregatedAPIServer, ctx: ssl.SSLContext) -> None:
    for path in ("/readyz", "/livez", "/healthz"):
        status, _, text = await fetch(server, ctx, path)
        assert status == 200 and text == "ok", (path, status, text)


async def plain(port: int, data: bytes) -> tuple[int, bytes]:
    """Send raw bytes over plain HTTP; (status, body) of the answer (read to EOF)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 30)  # hang guard only
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body
