"""Shared fixtures. The one fake Kubernetes API server lives in tests/fakeapi.py."""

from __future__ import annotations

import pytest
import trustme


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    """A test certificate authority; issue server and client certificates from it."""
    return trustme.CA()


@pytest.fixture
async def fake_kube(ca: trustme.CA, tmp_path):
    """A running FakeKubeAPI (tests/fakeapi.py) with ``fake_kube.kubeconfig`` written in tmp_path."""
    from fakeapi import FakeKubeAPI

    async with FakeKubeAPI(ca) as fake:
        fake.write_kubeconfig(tmp_path / "kubeconfig")
        yield fake
