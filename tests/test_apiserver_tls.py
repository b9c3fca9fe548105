"""The aggregated-API-server kit over real HTTPS: serving certificates (self-signed, reload),
TLS minimum version and client-CA rotation."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path

import aiohttp
import pytest
import trustme
from _apiserver_helpers import (
    GROUP,
    PKI,
    fetch,
    pki_fixture,  # noqa: F401  (pytest fixture)
    running,
)
from cryptography import x509

from kcms.apiserver import ServingOptions

# ---- TLS ------------------------------------------------------------------------------------------


async def peer_serial(port: int, cafile: str | None = None, ca: trustme.CA | None = None) -> int:
    ctx = ssl.create_default_context(cafile=cafile)
    if ca is not None:
        ca.configure_trust(ctx)
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost")
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def test_self_signed_certificate_generated(pki: PKI, tmp_path: Path) -> None:
    cert_dir = tmp_path / "certs"
    serving = ServingOptions(
        secure_port=0,
        bind_address="127.0.0.1",
        cert_dir=str(cert_dir),
        alternate_names=("kcms.kube-system.svc", "10.0.0.1"),
    )
    async with running(pki, serving=serving) as server:
        crt = cert_dir / "apiserver.crt"
        assert crt.exists() and (cert_dir / "apiserver.key").exists()
        cert = x509.load_pem_x509_certificate(crt.read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert "kcms.kube-system.svc" in sans.get_values_for_type(x509.DNSName)
        assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "10.0.0.1"}
        assert await peer_serial(server.port, cafile=str(crt)) == cert.serial_number
    # kept across restarts
    async with running(pki, serving=serving) as server:
        assert await peer_serial(server.port, cafile=str(crt)) == cert.serial_number


async def test_serving_certificate_reload(pki: PKI, caplog: pytest.LogCaptureFixture) -> None:
    serving = ServingOptions(
        secure_port=0,
        bind_address="127.0.0.1",
        tls_cert_file=pki.files["cert"],
        tls_private_key_file=pki.files["key"],
        reload_interval=3600.0,  # no poll within the test: inotify (kcms/filewatch.py) must notice
    )
    async with running(pki, serving=serving) as server:
        first = await peer_serial(server.port, ca=pki.server_ca)
        new = pki.server_ca.issue_cert("127.0.0.1", "localhost")
        pki.write("tls.key", new.private_key_pem.bytes())
        pki.write("tls.crt", new.cert_chain_pems[0].bytes())
        want = x509.load_pem_x509_certificate(new.cert_chain_pems[0].bytes()).serial_number
        assert want != first
        for _ in range(200):  # bounded wait for the file watch; no timing asserted
            if server.reloader.reloads and await peer_serial(server.port, ca=pki.server_ca) == want:
                break
            await asyncio.sleep(0.05)
        assert await peer_serial(server.port, ca=pki.server_ca) == want
        # a broken pair is refused and the working one kept
        pki.write("tls.crt", b"-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n")
        assert server.reloader.check() is False
        assert server.reloader.failures >= 1
        assert any("did not load" in r.getMessage() for r in caplog.records)
        assert await peer_serial(server.port, ca=pki.server_ca) == want


async def test_tls_min_version(pki: PKI) -> None:
    serving = ServingOptions(
        secure_port=0,
        bind_address="127.0.0.1",
        tls_cert_file=pki.files["cert"],
        tls_private_key_file=pki.files["key"],
        tls_min_version="VersionTLS13",
    )
    async with running(pki, serving=serving) as server:
        ctx = pki.client_ctx()
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises((ssl.SSLError, aiohttp.ClientError)):
            await fetch(server, ctx, "/healthz")
        assert (await fetch(server, pki.client_ctx(), "/healthz"))[0] == 200
    with pytest.raises(ValueError):
        async with running(
            pki,
            serving=ServingOptions(
                secure_port=0,
                bind_address="127.0.0.1",
                tls_cert_file=pki.files["cert"],
                tls_private_key_file=pki.files["key"],
                tls_min_version="VersionTLS10",
            ),
        ):
            pass


async def test_client_ca_rotation(pki: PKI) -> None:
    old_user = pki.client_ctx(
        pki.client_ca.issue_cert("old", common_name="old", organization_name="system:masters")
    )
    new_ca = trustme.CA()
    new_user = pki.client_ctx(new_ca.issue_cert("new", common_name="new", organization_name="system:masters"))
    async with running(pki) as server:
        assert (await fetch(server, old_user, f"/apis/{GROUP}/v1/whoami"))[2]["name"] == "old"
        assert await server.refresh_authn() is False  # nothing changed
        pki.write("client-ca.crt", new_ca.cert_pem.bytes())
        assert await server.refresh_authn() is True
        status, _, body = await fetch(server, new_user, f"/apis/{GROUP}/v1/whoami")
        assert status == 200 and body["name"] == "new"
        try:
            status = (await fetch(server, old_user, f"/apis/{GROUP}/v1/whoami"))[0]
        except (aiohttp.ClientError, ssl.SSLError, ConnectionError):
            status = -1  # the old CA is no longer trusted by the TLS layer
        assert status in (-1, 401)
        # a broken CA file keeps the working configuration
        pki.write("client-ca.crt", b"not a certificate")
        assert await server.refresh_authn() is False
        assert (await fetch(server, new_user, f"/apis/{GROUP}/v1/whoami"))[0] == 200
