"""Protocol abuse against every listener: malformed request lines, unknown methods, oversized URLs
and headers, smuggling, unsupported or broken Content-Encoding — answered with the right
``Status`` (400/405/414/415/431), one bounded escaped log line and no traceback, by the API server
over TLS and by `kcms store` and `kcms agent` processes; and bad overload/timeout flags.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import ssl
from pathlib import Path
from typing import Any

import orjson
import pytest
from _abuse_helpers import (
    Gate,
    assert_clean_log,
    eventually,
    free_port,
    plain,
    raw,
    ready,
    refusals,
    status_of,
)
from _apiserver_helpers import (
    GROUP,
    PKI,
    admin_fixture,  # noqa: F401  (pytest fixture)
    fetch,
    pki_fixture,  # noqa: F401  (pytest fixture)
    running,
)

# ---- protocol errors ------------------------------------------------------------------------------


PROTOCOL_CASES = [
    ("bad request line", b"GARBAGE\r\n\r\n", 400, "BadRequest", "bad_request"),
    ("extra words", b"GET /apis HTTP/1.1 extra\r\nHost: x\r\n\r\n", 400, "BadRequest", "bad_request"),
    ("binary", b"\x00\x01\x02\x03 / HTTP/1.1\r\n\r\n", 400, "BadRequest", "bad_request"),
    (
        "unknown method",
        b"FOO /apis HTTP/1.1\r\nHost: x\r\n\r\n",
        405,
        "MethodNotAllowed",
        "method_not_allowed",
    ),
    (
        "20 KB URL",
        b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        414,
        "RequestURITooLong",
        "uri_too_long",
    ),
    (
        "20 KB header",
        b"GET /apis HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 20_000 + b"\r\n\r\n",
        431,
        "RequestHeaderFieldsTooLarge",
        "headers_too_large",
    ),
    (
        "200 headers",
        b"GET /apis HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: 1\r\n" % i for i in range(200)) + b"\r\n",
        431,
        "RequestHeaderFieldsTooLarge",
        "headers_too_large",
    ),
    (
        "brotli body",
        f"POST /apis/{GROUP}/v1/echo HTTP/1.1\r\nHost: x\r\nContent-Encoding: br\r\nContent-Length: 4\r\n\r\nabcd".encode(),
        415,
        "UnsupportedMediaType",
        "unsupported_encoding",
    ),
    (
        "unknown encoding",
        f"POST /apis/{GROUP}/v1/echo HTTP/1.1\r\nHost: x\r\nContent-Encoding: x-evil\r\nContent-Length: 4\r\n\r\nabcd".encode(),
        415,
        "UnsupportedMediaType",
        "unsupported_encoding",
    ),
    (
        "content-length and chunked",
        f"POST /apis/{GROUP}/v1/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n".encode(),
        400,
        "BadRequest",
        "bad_request",
    ),
]


@pytest.mark.parametrize(
    ("name", "request_bytes", "code", "reason", "metric"), PROTOCOL_CASES, ids=[c[0] for c in PROTOCOL_CASES]
)
async def test_protocol_errors_get_a_status_and_one_escaped_log_line(
    pki: PKI,
    admin: ssl.SSLContext,
    caplog: pytest.LogCaptureFixture,
    name: str,
    request_bytes: bytes,
    code: int,
    reason: str,
    metric: str,
) -> None:
    caplog.set_level(logging.INFO)
    gate = Gate()
    gate.open.set()
    before = refusals("apiserver", metric)
    async with running(pki, group=gate.group()) as server:
        status, headers, body = await raw(server, admin, request_bytes)
        assert status == code, (name, body)
        assert headers["content-type"].startswith("application/json")
        doc = status_of(body)
        assert (doc["code"], doc["reason"]) == (code, reason)
        assert refusals("apiserver", metric) == before + 1
        await ready(server, pki.client_ctx())
        status, _, body = await fetch(server, admin, f"/apis/{GROUP}/v1/echo", method="POST")
        assert status == 200 and body["size"] == 0
    lines = [r for r in caplog.records if r.name == "kcms.httpguard"]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert len(lines[0].getMessage()) < 400
    assert_clean_log(caplog)


async def test_a_broken_gzip_body_is_400_not_500(
    pki: PKI, admin: ssl.SSLContext, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    gate = Gate()
    async with running(pki, group=gate.group()) as server:
        good = gzip.compress(b"y" * 50)
        bad = good[:10] + b"\xff" * 20
        for body, want in ((good, 200), (bad, 400)):
            request = (
                f"POST /apis/{GROUP}/v1/echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Encoding: gzip\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode() + body
            status, _, answer = await raw(server, admin, request)
            assert status == want, answer
            if want == 400:
                assert status_of(answer)["reason"] == "BadRequest"
            else:
                assert orjson.loads(answer)["size"] == 50
        await ready(server, pki.client_ctx())
    assert_clean_log(caplog)


# ---- the other listeners: store and agent processes --------------------------------------------------


@pytest.fixture(name="component", params=["store", "agent", "collector"])
def component_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A `kcms store`, `kcms agent` or `kcms collector` (its health listener) process on loopback
    (plain HTTP): (port, a POST path, its stderr file, the process)."""
    import subprocess
    import sys

    port = free_port()
    if request.param == "store":
        (tmp_path / "token").write_text("store-token\n")
        cmd = [
            "-m",
            "kcms",
            "store",
            "--bind-address=127.0.0.1",
            f"--port={port}",
            f"--token-file={tmp_path / 'token'}",
        ]
        post = "/store/v1/write"
    elif request.param == "collector":
        (tmp_path / "token").write_text("store-token\n")
        (tmp_path / "inventory.json").write_text('{"kind": "List", "items": []}')
        cmd = [
            "-m",
            "kcms",
            "collector",
            f"--inventory-file={tmp_path / 'inventory.json'}",
            f"--store-endpoints=http://127.0.0.1:{free_port()}",
            f"--store-token-file={tmp_path / 'token'}",
            "--leader-elect=false",
            "--health-bind-address=127.0.0.1",
            f"--health-port={port}",
        ]
        post = "/status"
    else:
        cmd = [
            "-m",
            "kcms.cmd.agent",
            "--node-name=node-a",
            "--no-cgroups",
            "--no-apps",
            "--insecure-serving",
        ]
        cmd += [f"--listen=127.0.0.1:{port}"]
        post = "/v1/metrics"
    log = tmp_path / "stderr"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, *cmd], stdout=subprocess.DEVNULL, stderr=err)
    try:
        yield port, post, log, proc
    finally:
        proc.terminate()
        proc.wait(30)


async def test_store_agent_and_collector_listeners_answer_protocol_errors_with_a_status(component: Any) -> None:
    import urllib.request

    port, post, log, proc = component
    try:

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        await eventually(lambda: proc.poll() is not None or healthy(), 30)
        assert proc.poll() is None, log.read_text()
        cases = [
            (b"GARBAGE\x1b[2J\r\n\r\n", 400, "BadRequest"),
            (b"FOO / HTTP/1.1\r\nHost: x\r\n\r\n", 405, "MethodNotAllowed"),
            (b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "RequestURITooLong"),
            (
                b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 20_000 + b"\r\n\r\n",
                431,
                "RequestHeaderFieldsTooLarge",
            ),
            (
                f"POST {post} HTTP/1.1\r\nHost: x\r\nContent-Encoding: br\r\nContent-Length: 4\r\n\r\nabcd".encode(),
                415,
                "UnsupportedMediaType",
            ),
        ]
        for request, code, reason in cases:
            status, body = await plain(port, request)
            assert status == code, body
            doc = status_of(body)
            assert (doc["code"], doc["reason"]) == (code, reason)
        assert healthy()
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 30)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text
    assert "\x1b" not in text
    assert text.count("refused a request") == len(cases), text


@pytest.mark.parametrize(
    ("command", "flag", "value"),
    [
        ("server", "--max-requests-inflight", "-1"),
        ("server", "--max-mutating-requests-inflight", "-5"),
        ("standalone", "--max-requests-inflight", "many"),
        ("server", "--request-header-timeout", "0s"),
        ("standalone", "--request-header-timeout", "soon"),
        ("server", "--max-executing-requests", "0"),
    ],
)
def test_bad_overload_and_timeout_flags_stop_start_up_naming_the_flag(
    command: str, flag: str, value: str
) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "kcms", command, f"{flag}={value}"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    assert f"argument {flag}" in result.stderr
    assert "Traceback" not in result.stderr


def test_overload_flags_reach_the_servers_options() -> None:
    from kcms.cmd.main import build_parser
    from kcms.cmd.standalone import serving_options

    for command in ("standalone", "server"):
        args = build_parser().parse_args(
            [command, "--max-requests-inflight=7", "--max-mutating-requests-inflight=3", "--max-executing-requests=9"]
        )
        opts = serving_options(args)
        assert (opts.max_requests_inflight, opts.max_mutating_requests_inflight, opts.executing_requests) == (7, 3, 9)
