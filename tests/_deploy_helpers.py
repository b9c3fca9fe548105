"""Shared by tests/test_deploy.py and tests/test_image.py: repository paths and rendering deploy/.

Rendering uses the real ``kubectl kustomize`` (the test is skipped where kubectl is not installed).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import shutil
import subprocess
import sys
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


# ---------------------------------------------------------------------------------------------------
# Reading rendered objects the way the cluster uses them (added for tests/test_deploy_ha.py):
# label selectors, $(VAR) expansion in args, mounted files, RBAC evaluation.

WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet"}


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def workloads(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in WORKLOAD_KINDS]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector (matchLabels and matchExpressions) against a label set."""
    if not selector.get("matchLabels") and not selector.get("matchExpressions"):
        return False  # an empty selector in a PDB/affinity term: here always a mistake
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def selected_workloads(selector: dict[str, Any], objects: list[dict[str, Any]], namespace: str) -> list[str]:
    return sorted(
        f"{w['kind']}/{w['metadata']['name']}"
        for w in workloads(objects)
        if w["metadata"]["namespace"] == namespace and selects(selector, pod_labels(w))
    )


_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def resolved_env(workload: dict[str, Any], container: dict[str, Any], objects: list[dict[str, Any]]) -> dict:
    """The values the kubelet would give the container's env: downward API fields of a made-up pod of
    this workload (node node-a, host IP 10.0.0.1), ConfigMap keys from the rendered ConfigMaps."""
    name = workload["metadata"]["name"]
    fields = {
        "metadata.name": f"{name}-0" if workload["kind"] == "StatefulSet" else f"{name}-5d4f8b7c9-x2x7q",
        "metadata.namespace": workload["metadata"]["namespace"],
        "spec.nodeName": "node-a",
        "status.hostIP": "10.0.0.1",
    }
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), var["value"])
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            env[var["name"]] = fields[source["fieldRef"]["fieldPath"]]
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            config = only(objects, "ConfigMap", ref["name"])
            assert config["metadata"]["namespace"] == workload["metadata"]["namespace"]
            env[var["name"]] = config["data"][ref["key"]]
        else:
            raise AssertionError(f"{var['name']}: env source {sorted(source)} not understood by this test")
    return env


def expanded_args(workload: dict[str, Any], container: dict[str, Any], objects: list[dict[str, Any]]) -> list:
    """The container's args as the kubelet passes them: every $(VAR) must be a variable of the env."""
    env = resolved_env(workload, container, objects)
    args = []
    for arg in container["args"]:
        missing = [v for v in _VAR.findall(arg) if v not in env]
        assert not missing, f"{container['name']}: {arg!r} refers to {missing}, not in the container's env"
        args.append(_VAR.sub(lambda m: env[m.group(1)], arg))
    return args


def flag(args: list[str], name: str) -> str | None:
    """The value of --name=value in args (the manifests always use the = form)."""
    values = [a.split("=", 1)[1] for a in args if a.startswith(name + "=")]
    assert len(values) <= 1, f"{name} given {len(values)} times"
    return values[0] if values else None


def mount_source(workload: dict[str, Any], container: dict[str, Any], path: str) -> tuple[dict, str]:
    """(volume, path inside it) of the file `path` in the container; fails if no mount holds it."""
    mounts = [
        m for m in container.get("volumeMounts", []) if path.startswith(m["mountPath"].rstrip("/") + "/")
    ]
    assert mounts, f"{container['name']}: {path} is not under any volume mount"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    volume = next(v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"])
    return volume, path[len(mount["mountPath"].rstrip("/")) + 1 :]


def secret_file(workload: dict[str, Any], container: dict[str, Any], path: str) -> tuple[str, str]:
    """(Secret name, key) a mounted file comes from."""
    volume, inner = mount_source(workload, container, path)
    assert "secret" in volume, f"{path} is not from a Secret: {volume}"
    items = volume["secret"].get("items")
    if items:
        keys = [i["key"] for i in items if i["path"] == inner]
        assert keys, f"{path}: no item of {volume['name']} projects to {inner}"
        return volume["secret"]["secretName"], keys[0]
    return volume["secret"]["secretName"], inner


def _rule_matches(rule: dict[str, Any], request: dict[str, str]) -> bool:
    if request["verb"] not in rule["verbs"] and "*" not in rule["verbs"]:
        return False
    if "path" in request:
        urls = rule.get("nonResourceURLs", [])
        return any(
            u == request["path"] or (u.endswith("*") and request["path"].startswith(u[:-1])) for u in urls
        )
    if "nonResourceURLs" in rule:
        return False
    groups, resources = rule.get("apiGroups", []), rule.get("resources", [])
    names = rule.get("resourceNames", [])
    return (
        (request["group"] in groups or "*" in groups)
        and (request["resource"] in resources or "*" in resources)
        and (not names or request.get("name", "") in names)
    )


def allowed(objects: list[dict[str, Any]], account: tuple[str, str], **request: str) -> bool:
    """Whether ServiceAccount ``account`` = (namespace, name) may make the request, by the rendered RBAC
    objects. ``request``: verb and either path (non-resource) or group, resource, namespace ("" for
    cluster scope), name. RBAC's rules: RoleBindings grant within their namespace, resourceNames never
    match a create, nonResourceURLs only through ClusterRoleBindings, a trailing * is a prefix match.
    Roles not among the objects (built-in ones) grant nothing here."""
    subject = {"kind": "ServiceAccount", "namespace": account[0], "name": account[1]}
    for binding in by_kind(objects, "ClusterRoleBinding") + by_kind(objects, "RoleBinding"):
        if subject not in binding["subjects"]:
            continue
        namespaced = binding["kind"] == "RoleBinding"
        if namespaced and ("path" in request or request.get("namespace") != binding["metadata"]["namespace"]):
            continue
        ref = binding["roleRef"]
        roles = [
            o
            for o in by_kind(objects, ref["kind"])
            if o["metadata"]["name"] == ref["name"]
            and (
                ref["kind"] == "ClusterRole" or o["metadata"]["namespace"] == binding["metadata"]["namespace"]
            )
        ]
        for role in roles:
            if any(_rule_matches(rule, request) for rule in role.get("rules", [])):
                return True
    return False


def kcms_containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers running the kcms image (any registry, any tag)."""
    return [
        c for c in pod_spec(workload)["containers"] if c["image"].rsplit("/", 1)[-1].split(":")[0] == "kcms"
    ]


def generated(objects: list[dict[str, Any]], kind: str, prefix: str) -> dict[str, Any]:
    """A ConfigMap/Secret made by a kustomize generator: name + "-" + a 10-character hash."""
    found = [
        o for o in by_kind(objects, kind) if re.fullmatch(rf"{prefix}-[a-z0-9]{{10}}", o["metadata"]["name"])
    ]
    assert len(found) == 1, f"expected one generated {kind} {prefix}-<hash>, found {len(found)}"
    return found[0]


def local_files(tmp: Path, workload: dict, container: dict, secrets: dict[str, dict[str, bytes]]) -> dict:
    """Materialise the container's volume mounts under tmp; return {mountPath: local directory}."""
    volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
    local = {}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        directory = tmp / workload["metadata"]["name"] / mount["name"]
        directory.mkdir(parents=True, exist_ok=True)
        if "secret" in volume:
            name = volume["secret"]["secretName"]
            if name not in secrets and volume["secret"].get("optional"):
                local[mount["mountPath"]] = str(directory)  # the kubelet mounts it empty
                continue
            data = secrets[name]
            items = volume["secret"].get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                (directory / item["path"]).write_bytes(data[item["key"]])
        local[mount["mountPath"]] = str(directory)
    return local


async def start_kcms(
    log: Path,
    workload: dict[str, Any],
    objects: list[dict[str, Any]],
    *,
    env: dict[str, str],
    mounts: dict[str, str],
    replace: dict[str, object],
    extra: list[str],
) -> asyncio.subprocess.Process:
    """Start `python -m kcms` with the args of the workload's kcms container, $(VAR)s expanded, files
    under a mountPath moved to its local directory (``mounts``, from :func:`local_files`), the flags in
    ``replace`` given new values and ``extra`` appended; the process's output goes to ``log``."""
    [container] = kcms_containers(workload)
    args = []
    for arg in expanded_args(workload, container, objects):
        key, _, value = arg.partition("=")
        if key in replace:
            arg = f"{key}={replace[key]}"
        else:
            for mount_path, directory in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
                prefix = mount_path.rstrip("/") + "/"
                if value.startswith(prefix):
                    arg = f"{key}={directory}/{value[len(prefix) :]}"
                    break
        args.append(arg)
    with log.open("wb") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kcms", *args, *extra, stdin=asyncio.subprocess.DEVNULL, stdout=out,
            stderr=out, env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
