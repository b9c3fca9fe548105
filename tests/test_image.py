"""The container image: Dockerfile, .dockerignore, and a real server run with the Deployment's args.

The Dockerfile and .dockerignore are checked statically (no container engine here); what the image
copies is shown to suffice to run the CLI. Then `kcms standalone` is started with the standalone
Deployment's own args against a simulated kubelet and probed over HTTPS the way the kubelet probes.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import ssl
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

from _deploy_helpers import DEPLOY, PROBE_PATHS, REPO, only, render
from _stores import free_port as _free_port

# ---------------------------------------------------------------------------------------------------
# Dockerfile and .dockerignore (checked statically: no container engine here)


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = (REPO / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            out.append((instruction.upper(), rest.strip()))
    return out


def _final_stage(instructions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    starts = [i for i, (ins, _) in enumerate(instructions) if ins == "FROM"]
    assert starts, "no FROM"
    return instructions[starts[-1] :]


def test_dockerfile_base_user_and_entrypoint() -> None:
    final = _final_stage(_dockerfile())
    assert final[0][1].split()[0] == "python:3.11-slim"
    users = [arg for ins, arg in final if ins == "USER"]
    assert users, "the image must not run as root"
    user = users[-1].split(":")[0]
    assert user.isdigit(), "USER must be numeric so that runAsNonRoot can be verified"
    assert int(user) == 1000
    entrypoint = [arg for ins, arg in final if ins == "ENTRYPOINT"]
    cmd = [arg for ins, arg in final if ins == "CMD"]
    assert json.loads(entrypoint[-1]) == ["kcms"]
    assert json.loads(cmd[-1]) == ["standalone"]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kcms"] == "kcms.cmd.main:main"


def _copied_sources() -> list[str]:
    sources = []
    for ins, arg in _dockerfile():
        if ins in ("COPY", "ADD") and "--from=" not in arg:
            words = [w for w in arg.split() if not w.startswith("--")]
            sources.extend(w.rstrip("/") for w in words[:-1])
    return sources


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore excludes path (last matching pattern wins; `!` re-includes)."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(
            fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(p, pattern.removeprefix("**/")) for p in prefixes
        ):
            ignored = not negate
    return ignored


def test_dockerignore_keeps_what_the_build_copies() -> None:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    sources = _copied_sources()
    assert set(sources) == {"pyproject.toml", "setup.py", "README.md", "kcms"}
    for source in sources:
        assert not _ignored(source, patterns), f".dockerignore excludes {source}, which the build copies"
        assert (REPO / source).exists(), f"the build copies {source}, which does not exist"
    for heavy in (
        ".git",
        "tests",
        "kcms/__pycache__",
        "kcms/store/__pycache__/x.pyc",
        "kcms/sources/_bodyscan.cpython-311-x86_64-linux-gnu.so",
        "kcms/store/_columns.cpython-311-x86_64-linux-gnu.so",
        "kcms/apis/metrics/_gzsplice.cpython-311-x86_64-linux-gnu.so",
    ):
        assert _ignored(heavy, patterns), f"{heavy} should not be sent to the build"


def test_image_contents_suffice_to_run_the_cli(tmp_path: Path) -> None:
    """Only what the Dockerfile copies, nothing else from the repo, runs `kcms standalone --help`."""
    for source in _copied_sources():
        src = REPO / source
        assert src.exists(), f"the Dockerfile copies {source}, which does not exist"
        if src.is_dir():
            shutil.copytree(src, tmp_path / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, tmp_path / source)
    code = "import runpy, sys, kcms; print(kcms.__file__, file=sys.stderr); runpy.run_module('kcms', run_name='__main__')"
    proc = subprocess.run(
        [sys.executable, "-c", code, "standalone", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[0].startswith(str(tmp_path)), "ran the repo's kcms, not the copy"
    assert "--secure-port" in proc.stdout


# ---------------------------------------------------------------------------------------------------
# the probes against a real `kcms standalone` started with the Deployment's own args


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_for(condition, what: str, procs: list[subprocess.Popen], timeout: float = 30) -> None:
    """Poll condition() until true; fail early if one of procs exits."""
    deadline = time.monotonic() + timeout
    while not condition():
        for proc in procs:
            assert proc.poll() is None, f"{proc.args[:4]} exited with {proc.returncode} before {what}"
        assert time.monotonic() < deadline, f"no {what} after {timeout}s"
        time.sleep(0.2)


def test_probes_succeed_against_a_running_server(tmp_path: Path) -> None:
    """Run the Deployment's own args against a simulated kubelet, then probe as the kubelet would.

    Only what cannot work off-cluster is swapped: the port, the cert dir, and the inventory (a file
    written by `kcms simulate` instead of the Kubernetes API). The node's kubelet listens on its own
    port, which the inventory carries in status.daemonEndpoints, so --kubelet-use-node-status-port
    and --kubelet-preferred-address-types are exercised as they are in a cluster.
    """
    container = only(render(DEPLOY / "overlays" / "standalone"), "Deployment", "kcms")
    container = container["spec"]["template"]["spec"]["containers"][0]
    inventory, kubelet_ca = tmp_path / "inventory.json", tmp_path / "kubelet-ca.pem"
    sim_args = ["simulate", "--nodes=1", "--pods-per-node=2", "--one-port-per-node"]
    sim_args += [f"--write-inventory={inventory}", f"--ca-out={kubelet_ca}"]
    port = _free_port()
    args = [a for a in container["args"] if not a.startswith(("--secure-port", "--cert-dir"))]
    args += [f"--secure-port={port}", f"--cert-dir={tmp_path}", "--bind-address=127.0.0.1"]
    args += [f"--inventory-file={inventory}", f"--kubelet-certificate-authority={kubelet_ca}"]
    procs: list[subprocess.Popen] = []
    try:
        with (tmp_path / "sim.log").open("wb") as out:
            procs.append(subprocess.Popen([sys.executable, "-m", "kcms", *sim_args], stdout=out, stderr=out))
        _wait_for(lambda: kubelet_ca.exists() and _is_json(inventory), "inventory", procs)
        with (tmp_path / "kcms.log").open("wb") as out:
            procs.append(subprocess.Popen([sys.executable, "-m", "kcms", *args], stdout=out, stderr=out))
        for probe_name in PROBE_PATHS:
            get = container[probe_name]["httpGet"]
            url = f"{get['scheme'].lower()}://127.0.0.1:{port}{get['path']}"
            _wait_for(lambda url=url: 200 <= _status(url) < 400, f"success of {url}", procs)
        # Control: the same anonymous client is refused on the API, so the probes' success means something.
        assert _status(f"https://127.0.0.1:{port}/apis/metrics.k8s.io/v1beta1/nodes") in (401, 403)
    finally:
        for proc in reversed(procs):
            _stop(proc)


def _is_json(path: Path) -> bool:
    try:
        json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return True


def _status(url: str) -> int:
    """Status of an unauthenticated GET that does not verify the certificate, as a kubelet probe does.

    0 if the server does not answer (yet).
    """
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=context, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0
