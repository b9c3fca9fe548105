"""Shared by tests/test_deploy.py and tests/test_image.py: repository paths and rendering deploy/.

Rendering uses the real ``kubectl kustomize`` (the test is skipped where kubectl is not installed);
``require_cli`` skips a test until kcms/cli.py exists.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
# Health paths the KCMS API server serves without authentication (liveness, readiness).
PROBE_PATHS = {"livenessProbe": "/livez", "readinessProbe": "/readyz"}


def kubectl() -> str:
    exe = shutil.which("kubectl") or ("/usr/bin/kubectl" if Path("/usr/bin/kubectl").exists() else None)
    if exe is None:
        pytest.skip("kubectl is not installed (needed for `kubectl kustomize`)")
    return exe


@functools.cache
def _kustomize(directory: Path) -> tuple[str, ...]:
    """Render a kustomization with the real kubectl; return the documents as JSON strings."""
    proc = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, f"kubectl kustomize {directory} failed:\n{proc.stderr}"
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d is not None]
    return tuple(json.dumps(d, sort_keys=True) for d in docs)


def render(directory: Path) -> list[dict[str, Any]]:
    """A fresh (mutable) copy of the objects `kubectl kustomize directory` produces."""
    return [json.loads(d) for d in _kustomize(directory)]


def only(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected exactly one {kind}/{name}, found {len(found)}"
    return found[0]


def require_cli() -> None:
    if not (REPO / "kcms" / "cli.py").exists():
        pytest.skip("kcms/cli.py is not written yet; this check runs once it exists")
