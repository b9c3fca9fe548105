"""Shared fixtures. The one fake Kubernetes API server lives in tests/fakeapi.py."""

from __future__ import annotations

import ssl

import pytest
import trustme


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    """A test certificate authority; issue server and client certificates from it."""
    return trustme.CA()


@pytest.fixture
def tls(ca: trustme.CA) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) TLS contexts: a 127.0.0.1 certificate of ``ca``, and a client trusting it."""
    cert = ca.issue_cert("127.0.0.1")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return server, client


@pytest.fixture
async def fake_kube(ca: trustme.CA, tmp_path):
    """A running FakeKubeAPI (tests/fakeapi.py) with ``fake_kube.kubeconfig`` written in tmp_path."""
    from fakeapi import FakeKubeAPI

    async with FakeKubeAPI(ca) as fake:
        fake.write_kubeconfig(tmp_path / "kubeconfig")
        yield fake
