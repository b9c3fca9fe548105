"""The real kubectl binary as a test client."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

KUBECTL = shutil.which("kubectl")


def kubectl_json(kubeconfig: str | Path, *argv: str) -> dict:
    """Run ``kubectl --kubeconfig K <argv>``; fail the test unless it succeeds; its JSON output."""
    assert KUBECTL is not None
    out = subprocess.run(
        [KUBECTL, "--kubeconfig", str(kubeconfig), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def get_raw(kubeconfig: str | Path) -> Callable[[str], dict]:
    """``kubectl get --raw PATH`` against one kubeconfig, as a one-argument function."""
    return lambda path: kubectl_json(kubeconfig, "get", "--raw", path)
