"""Which CA vouched for a client certificate, read from the chain OpenSSL verified (no
``cryptography`` in the serving process): certificates issued through intermediates the client
sends, a client-CA certificate that poses as the front proxy, TLS sessions (a resumed one has no
verified chain: none in TLS 1.3, a TLS 1.2 one keeps its full handshake's identity until the CAs
change), CA bundles parsed by OpenSSL, and the self-signed certificate made by a child process."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from pathlib import Path

import aiohttp
import pytest
from _apiserver_helpers import (
    GROUP,
    PKI,
    fetch,
    pki_fixture,  # noqa: F401  (pytest fixture)
    running,
)

from kcms.apiserver import generate_self_signed
from kcms.apiserver.authn import load_ca_certs

WHOAMI = f"/apis/{GROUP}/v1/whoami"
MASTERS = {"X-Remote-User": "alice", "X-Remote-Group": "system:masters"}


async def test_certificates_through_intermediates_are_matched_to_their_root(pki: PKI) -> None:
    client_sub = pki.client_ca.create_child_ca()
    front_sub = pki.front_ca.create_child_ca()
    dave = pki.client_ctx(
        client_sub.issue_cert("dave", common_name="dave", organization_name="system:masters")
    )
    proxy = pki.client_ctx(front_sub.issue_cert("front-proxy-client", common_name="front-proxy-client"))
    # the client CA's intermediate issues a certificate named like the front proxy
    poser = pki.client_ctx(
        client_sub.issue_cert(
            "front-proxy-client", common_name="front-proxy-client", organization_name="system:masters"
        )
    )
    async with running(pki) as server:
        status, _, body = await fetch(server, dave, WHOAMI)
        assert status == 200 and body["name"] == "dave"
        assert body["groups"] == ["system:masters", "system:authenticated"]
        # the front proxy's certificate through its CA's intermediate: the headers name the user
        status, _, body = await fetch(server, proxy, WHOAMI, MASTERS)
        assert status == 200 and body["name"] == "alice"
        # the same certificate without headers is nobody (the front-proxy CA is not a client CA)
        assert (await fetch(server, proxy, WHOAMI))[0] == 401
        # a client-CA certificate with the front proxy's name is itself, never the header's user
        status, _, body = await fetch(server, poser, WHOAMI, MASTERS)
        assert status == 200 and body["name"] == "front-proxy-client"


async def test_an_intermediate_in_the_ca_file_is_an_anchor_of_its_own(pki: PKI) -> None:
    """A CA file holding only an intermediate (as Go's x509 pools allow): its leaves authenticate,
    its root's other leaves do not."""
    sub = pki.client_ca.create_child_ca()
    pki.write("client-ca.crt", sub.cert_pem.bytes())
    frank = pki.client_ctx(sub.issue_cert("frank", common_name="frank", organization_name="system:masters"))
    grace = pki.client_ctx(
        pki.client_ca.issue_cert("grace", common_name="grace", organization_name="system:masters")
    )
    async with running(pki) as server:
        status, _, body = await fetch(server, frank, WHOAMI)
        assert status == 200 and body["name"] == "frank"
        try:
            status = (await fetch(server, grace, WHOAMI))[0]
        except (aiohttp.ClientError, ssl.SSLError, ConnectionError):
            status = -1  # refused at the handshake: nobody either
        assert status in (-1, 401)


def _get_over(
    port: int, ctx: ssl.SSLContext, session: ssl.SSLSession | None, headers: dict[str, str] | None = None
) -> tuple[bool, bytes, ssl.SSLSession]:
    """One GET of whoami on a new TLS connection offering ``session``: (resumed, response, session)."""
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost", session=session) as tls:
            request = f"GET {WHOAMI} HTTP/1.1\r\nHost: localhost\r\n{extra}Connection: close\r\n\r\n"
            tls.sendall(request.encode())
            chunks = []
            while chunk := tls.recv(65536):
                chunks.append(chunk)
            return tls.session_reused, b"".join(chunks), tls.session


def _name(response: bytes) -> str | None:
    """The user whoami names in a raw HTTP response; None for anything but 200."""
    head, _, body = response.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        return None
    return json.loads(body)["name"]


async def test_tls_1_3_sessions_are_not_resumed(pki: PKI) -> None:
    """No tickets: a client offering its last session gets a full handshake, and so a verified
    chain, each time (a session resumed from a ticket has the certificate but not the chain)."""
    ctx = pki.client_ctx(
        pki.client_ca.issue_cert("erin", common_name="erin", organization_name="system:masters")
    )
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    async with running(pki) as server:
        session = None
        for _ in range(3):
            resumed, response, session = await asyncio.to_thread(_get_over, server.port, ctx, session)
            assert not resumed
            assert _name(response) == "erin"


async def test_a_resumed_tls_1_2_session_is_who_its_full_handshake_was(pki: PKI) -> None:
    """TLS 1.2 resumes by session id (OpenSSL's server cache): the session keeps the identity its
    full handshake's chain gave, for the client CA and the front proxy alike, and none once the
    CAs have changed."""
    erin = pki.client_ctx(
        pki.client_ca.issue_cert("erin", common_name="erin", organization_name="system:masters")
    )
    proxy = pki.client_ctx(pki.front_ca.issue_cert("front-proxy-client", common_name="front-proxy-client"))
    for ctx in (erin, proxy):
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    async with running(pki) as server:
        resumed, response, session = await asyncio.to_thread(_get_over, server.port, erin, None)
        assert not resumed and _name(response) == "erin"
        resumed, response, session = await asyncio.to_thread(_get_over, server.port, erin, session)
        assert resumed and _name(response) == "erin"
        resumed, response, proxy_session = await asyncio.to_thread(
            _get_over, server.port, proxy, None, MASTERS
        )
        assert not resumed and _name(response) == "alice"
        resumed, response, _ = await asyncio.to_thread(_get_over, server.port, proxy, proxy_session, MASTERS)
        assert resumed and _name(response) == "alice"
        # the session is still in OpenSSL's cache, but the CAs changed: nobody, until a full handshake
        pki.write("client-ca.crt", pki.client_ca.cert_pem.bytes() + pki.other_ca.cert_pem.bytes())
        assert await server.refresh_authn() is True
        resumed, response, _ = await asyncio.to_thread(_get_over, server.port, erin, session)
        assert resumed and _name(response) is None and response.startswith(b"HTTP/1.1 401")
        resumed, response, _ = await asyncio.to_thread(_get_over, server.port, erin, None)
        assert not resumed and _name(response) == "erin"


def test_ca_bundles_are_read_by_openssl(pki: PKI) -> None:
    good = pki.client_ca.cert_pem.bytes()
    other = pki.other_ca.cert_pem.bytes()
    assert load_ca_certs([good]) == [ssl.PEM_cert_to_DER_cert(good.decode())]
    assert load_ca_certs([b"# comments\n" + good + b"\n" + other]) == [
        ssl.PEM_cert_to_DER_cert(good.decode()),
        ssl.PEM_cert_to_DER_cert(other.decode()),
    ]
    assert load_ca_certs([b"not a certificate", b""]) == []
    broken = b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"
    for bad in (broken, good + broken, b"-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----\n"):
        with pytest.raises(ValueError, match="does not parse"):
            load_ca_certs([bad])


async def test_self_signed_certificate_is_made_by_a_child_process(tmp_path: Path) -> None:
    cert, key = tmp_path / "a" / "apiserver.crt", tmp_path / "a" / "apiserver.key"
    await generate_self_signed(str(cert), str(key), ("kcms.example", "10.1.2.3"))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)  # a pair that belongs together
    assert (key.stat().st_mode & 0o777) == 0o600
    # a child that fails: its last line, bounded and escaped, in an OSError
    with pytest.raises(OSError, match="making a self-signed certificate failed .*IsADirectoryError"):
        await generate_self_signed(str(tmp_path), str(tmp_path / "k"))
