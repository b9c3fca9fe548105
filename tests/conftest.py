"""Shared fixtures. The one fake Kubernetes API server lives in tests/fakeapi.py."""

from __future__ import annotations

import pytest
import trustme


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    """A test certificate authority; issue server and client certificates from it."""
    return trustme.CA()
