"""The deployment files: kustomize manifests under deploy/, the Dockerfile and .dockerignore.

Every overlay is rendered with the real ``kubectl kustomize`` (the base is also read with PyYAML and
must render unchanged), validated field by field against the official Kubernetes client's models, and
checked for consistency: APIService -> Service -> pods -> container port, RBAC subjects and role
references, probes, security context, TLS files. Container flags are checked against what
``python -m kcms <sub-command> --help`` accepts, and the Deployment's own args are run for real against
a simulated kubelet and probed over HTTPS the way the kubelet probes. The Dockerfile and .dockerignore
are checked statically (no container engine here).
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
BASE = DEPLOY / "base"
OVERLAYS = sorted(p.parent for p in (DEPLOY / "overlays").glob("*/kustomization.yaml"))
NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "kcms"

# Roles that every conformant cluster defines; bindings may refer to them without defining them.
BUILTIN_ROLES = {
    ("ClusterRole", "system:auth-delegator"),
    ("Role", "extension-apiserver-authentication-reader"),
}
# API groups of custom resources we ship objects for (not in the Kubernetes client's models).
CRD_GROUPS = {"cert-manager.io"}
# Health paths the KCMS API server serves without authentication (liveness, readiness).
PROBE_PATHS = {"livenessProbe": "/livez", "readinessProbe": "/readyz"}
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet"}

# Flags a metrics-server user may already pass; `kcms standalone` must accept all of them.
METRICS_SERVER_FLAGS = """
    --kubeconfig --metric-resolution --kubelet-port --kubelet-use-node-status-port
    --kubelet-preferred-address-types --kubelet-insecure-tls --kubelet-certificate-authority
    --kubelet-client-certificate --kubelet-client-key --kubelet-request-timeout --node-selector
    --secure-port --bind-address --cert-dir --tls-cert-file --tls-private-key-file --tls-min-version
    --authentication-kubeconfig --authorization-kubeconfig --authentication-skip-lookup --client-ca-file
    --requestheader-client-ca-file --requestheader-allowed-names --requestheader-username-headers
    --requestheader-group-headers --requestheader-extra-headers-prefix --authorization-always-allow-paths
    -v --kubelet-endpoint
""".split()


# ---------------------------------------------------------------------------------------------------
# rendering


def _kubectl() -> str:
    exe = shutil.which("kubectl") or ("/usr/bin/kubectl" if Path("/usr/bin/kubectl").exists() else None)
    if exe is None:
        pytest.skip("kubectl is not installed (needed for `kubectl kustomize`)")
    return exe


@functools.cache
def _kustomize(directory: Path) -> tuple[str, ...]:
    """Render a kustomization with the real kubectl; return the documents as JSON strings."""
    proc = subprocess.run(
        [_kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, f"kubectl kustomize {directory} failed:\n{proc.stderr}"
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d is not None]
    return tuple(json.dumps(d, sort_keys=True) for d in docs)


def render(directory: Path) -> list[dict[str, Any]]:
    """A fresh (mutable) copy of the objects `kubectl kustomize directory` produces."""
    return [json.loads(d) for d in _kustomize(directory)]


def load_plain(directory: Path) -> list[dict[str, Any]]:
    """Read a kustomization's resources with PyYAML only (no patches, no components, no transformers)."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    assert not set(kustomization) & {"patches", "components", "images", "namespace", "labels"}, (
        "load_plain only understands plain resource lists"
    )
    objects: list[dict[str, Any]] = []
    for entry in kustomization["resources"]:
        path = (directory / entry).resolve()
        if path.is_dir():
            objects.extend(load_plain(path))
        else:
            objects.extend(d for d in yaml.safe_load_all(path.read_text()) if d is not None)
    return objects


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def workloads(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in WORKLOAD_KINDS]


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def only(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected exactly one {kind}/{name}, found {len(found)}"
    return found[0]


overlay_param = pytest.mark.parametrize("overlay", OVERLAYS, ids=[p.name for p in OVERLAYS])


def test_overlays_exist() -> None:
    assert DEPLOY / "overlays" / "standalone" in OVERLAYS


# ---------------------------------------------------------------------------------------------------
# YAML and schema


def test_every_yaml_file_parses() -> None:
    files = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))
    assert len(files) >= 8
    for path in files:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs, f"{path} is empty"
        for doc in docs:
            assert isinstance(doc, dict), f"{path}: a document is not a mapping"
            assert doc.get("apiVersion") and doc.get("kind"), f"{path}: document without apiVersion/kind"


def test_kustomize_base_equals_plain_yaml() -> None:
    """kustomize adds nothing to the base: what kubectl renders is exactly what the files say."""
    rendered = {key(o): o for o in render(BASE)}
    plain = {key(o): o for o in load_plain(BASE)}
    assert rendered == plain


@overlay_param
def test_objects_have_identity_and_are_unique(overlay: Path) -> None:
    objects = render(overlay)
    assert objects
    for obj in objects:
        assert obj.get("apiVersion") and obj.get("kind") and obj.get("metadata", {}).get("name"), obj
    keys = [key(o) for o in objects]
    assert len(keys) == len(set(keys)), "duplicate objects"


def _model_for(obj: dict[str, Any]) -> type | None:
    group, _, version = obj["apiVersion"].rpartition("/")
    if group in CRD_GROUPS:
        return None
    cls = getattr(kubernetes.client, version.capitalize() + obj["kind"], None)
    assert cls is not None, f"no Kubernetes client model for {obj['apiVersion']} {obj['kind']}"
    return cls


@overlay_param
def test_objects_validate_against_kubernetes_models(overlay: Path) -> None:
    """Every field name, type and required field, checked by the official client's (strict) models."""
    if not hasattr(kubernetes.client.V1Deployment, "model_validate"):
        pytest.skip("this kubernetes client's models do not validate (needs the pydantic-based client)")
    for obj in render(overlay):
        cls = _model_for(obj)
        if cls is not None:
            cls.model_validate(obj, strict=True)


def test_model_validation_rejects_a_misspelt_field() -> None:
    """Control for the test above: a typo in a probe's field name is caught."""
    if not hasattr(kubernetes.client.V1Deployment, "model_validate"):
        pytest.skip("this kubernetes client's models do not validate")
    deployment = only(render(BASE), "Deployment", "kcms")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {"periodSeconds": 5}
    with pytest.raises(ValueError):
        kubernetes.client.V1Deployment.model_validate(deployment, strict=True)


# ---------------------------------------------------------------------------------------------------
# consistency: APIService -> Service -> pods -> port


@overlay_param
def test_apiservice_points_at_service(overlay: Path) -> None:
    objects = render(overlay)
    apiservices = by_kind(objects, "APIService")
    assert apiservices
    for api in apiservices:
        spec = api["spec"]
        assert api["metadata"]["name"] == f"{spec['version']}.{spec['group']}"
        ref = spec["service"]
        service = only(objects, "Service", ref["name"])
        assert service["metadata"]["namespace"] == ref["namespace"]
        assert ref.get("port", 443) in [p["port"] for p in service["spec"]["ports"]]


@overlay_param
def test_apiservice_tls_verification_is_configured_once(overlay: Path) -> None:
    """Either insecureSkipTLSVerify, or a CA bundle (given, or injected by cert-manager) - never both."""
    for api in by_kind(render(overlay), "APIService"):
        skip = api["spec"].get("insecureSkipTLSVerify", False)
        injected = "cert-manager.io/inject-ca-from" in api["metadata"].get("annotations", {})
        has_ca = bool(api["spec"].get("caBundle")) or injected
        assert skip != has_ca, api["spec"]
        if injected:
            namespace, _, name = api["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].partition(
                "/"
            )
            certificate = only(render(overlay), "Certificate", name)
            assert certificate["metadata"]["namespace"] == namespace
            service = api["spec"]["service"]
            assert f"{service['name']}.{service['namespace']}.svc" in certificate["spec"]["dnsNames"]


def _selected_pods(service: dict[str, Any], objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    selector = service["spec"]["selector"]
    return [
        w
        for w in workloads(objects)
        if w["metadata"].get("namespace") == service["metadata"]["namespace"]
        and selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
    ]


@overlay_param
def test_service_selects_pods_and_target_port_is_a_container_port(overlay: Path) -> None:
    objects = render(overlay)
    for service in by_kind(objects, "Service"):
        assert service["spec"].get("selector"), "a Service without selector selects nothing"
        selected = _selected_pods(service, objects)
        assert selected, f"Service {service['metadata']['name']} selects no pods"
        for workload in selected:
            ports = [p for c in containers(workload) for p in c.get("ports", [])]
            for port in service["spec"]["ports"]:
                target = port.get("targetPort", port["port"])
                field = "name" if isinstance(target, str) else "containerPort"
                assert any(p.get(field) == target for p in ports), f"targetPort {target!r} not in {ports}"


@overlay_param
def test_workload_selector_matches_its_pod_labels(overlay: Path) -> None:
    for workload in workloads(render(overlay)):
        match = workload["spec"]["selector"]["matchLabels"]
        assert match and match.items() <= workload["spec"]["template"]["metadata"]["labels"].items()


# ---------------------------------------------------------------------------------------------------
# RBAC


@overlay_param
def test_service_account_exists(overlay: Path) -> None:
    objects = render(overlay)
    accounts = {
        (o["metadata"]["namespace"], o["metadata"]["name"]) for o in by_kind(objects, "ServiceAccount")
    }
    for workload in workloads(objects):
        name = workload["spec"]["template"]["spec"].get("serviceAccountName")
        assert name, "pods must not run as the namespace's default ServiceAccount"
        assert (workload["metadata"]["namespace"], name) in accounts


@overlay_param
def test_bindings_bind_our_account_to_known_roles(overlay: Path) -> None:
    objects = render(overlay)
    bindings = by_kind(objects, "ClusterRoleBinding") + by_kind(objects, "RoleBinding")
    assert len(bindings) >= 3
    defined = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objects}
    for binding in bindings:
        assert binding["subjects"], binding["metadata"]["name"]
        for subject in binding["subjects"]:
            assert subject == {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}
        ref = binding["roleRef"]
        assert ref["apiGroup"] == "rbac.authorization.k8s.io"
        if binding["kind"] == "ClusterRoleBinding":
            assert ref["kind"] == "ClusterRole", "a ClusterRoleBinding can only refer to a ClusterRole"
        # A Role referred to by a RoleBinding must live in the binding's namespace.
        namespace = binding["metadata"]["namespace"] if ref["kind"] == "Role" else ""
        builtin = (ref["kind"], ref["name"]) in BUILTIN_ROLES
        known = builtin or (ref["kind"], namespace, ref["name"]) in defined
        assert known, f"{binding['metadata']['name']} refers to unknown {ref['kind']} {ref['name']}"


def _grants(role: dict[str, Any], group: str, resource: str, verb: str) -> bool:
    return any(
        group in rule.get("apiGroups", [])
        and resource in rule.get("resources", [])
        and (verb in rule.get("verbs", []) or "*" in rule.get("verbs", []))
        for rule in role["rules"]
    )


def test_rbac_grants_what_kcms_needs_and_no_more() -> None:
    objects = render(DEPLOY / "overlays" / "standalone")
    role = only(objects, "ClusterRole", "system:kcms")
    for resource in ("nodes/metrics", "nodes/stats"):
        assert _grants(role, "", resource, "get")
    for resource in ("nodes", "pods", "namespaces"):
        for verb in ("get", "list", "watch"):
            assert _grants(role, "", resource, verb)
    for resource in ("configmaps", "secrets", "nodes/proxy"):
        assert not _grants(role, "", resource, "get"), f"system:kcms must not read {resource}"
    assert all("*" not in r.get("verbs", []) + r.get("resources", []) for r in role["rules"])

    binding = only(objects, "RoleBinding", "kcms-auth-reader")
    assert binding["metadata"]["namespace"] == "kube-system"
    assert binding["roleRef"]["name"] == "extension-apiserver-authentication-reader"
    delegator = only(objects, "ClusterRoleBinding", "kcms:system:auth-delegator")
    assert delegator["roleRef"]["name"] == "system:auth-delegator"
    assert only(objects, "ClusterRoleBinding", "system:kcms")["roleRef"]["name"] == "system:kcms"

    reader = only(objects, "ClusterRole", "system:aggregated-metrics-reader")
    for level in ("view", "edit", "admin"):
        assert reader["metadata"]["labels"][f"rbac.authorization.k8s.io/aggregate-to-{level}"] == "true"
    for resource in ("pods", "nodes"):
        for verb in ("get", "list", "watch"):
            assert _grants(reader, "metrics.k8s.io", resource, verb)


# ---------------------------------------------------------------------------------------------------
# pods: probes, security, the standalone specifics


def _flag_value(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag and i + 1 < len(args) and not args[i + 1].startswith("-"):
            return args[i + 1]
    return None


@overlay_param
def test_probes_hit_health_endpoints_over_https(overlay: Path) -> None:
    for workload in workloads(render(overlay)):
        for container in workload["spec"]["template"]["spec"]["containers"]:
            ports = container.get("ports", [])
            secure_port = _flag_value(container.get("args", []), "--secure-port")
            for probe_name, path in PROBE_PATHS.items():
                probe = container.get(probe_name)
                assert probe, f"{container['name']} has no {probe_name}"
                get = probe["httpGet"]
                assert get["path"] == path
                assert get["scheme"] == "HTTPS"
                field = "name" if isinstance(get["port"], str) else "containerPort"
                matching = [p for p in ports if p.get(field) == get["port"]]
                assert matching, f"{probe_name} port {get['port']!r} is not a container port"
                if secure_port is not None:
                    assert matching[0]["containerPort"] == int(secure_port), "probe misses --secure-port"


@overlay_param
def test_security_context(overlay: Path) -> None:
    for workload in workloads(render(overlay)):
        pod = workload["spec"]["template"]["spec"]
        pod_ctx = pod.get("securityContext", {})
        assert not pod.get("hostNetwork") and not pod.get("hostPID")
        for container in containers(workload):
            ctx = container.get("securityContext", {})
            effective = {**pod_ctx, **ctx}  # container settings override the pod's
            assert effective.get("runAsNonRoot") is True
            assert effective.get("runAsUser") == 1000
            assert effective.get("seccompProfile") == {"type": "RuntimeDefault"}
            assert ctx.get("readOnlyRootFilesystem") is True
            assert ctx.get("allowPrivilegeEscalation") is False
            assert ctx.get("privileged", False) is False
            assert ctx.get("capabilities", {}).get("drop") == ["ALL"]
            assert not ctx.get("capabilities", {}).get("add")
            # A read-only root needs a writable /tmp for --cert-dir.
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            tmp = [m for m in container.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
            assert tmp and "emptyDir" in volumes[tmp[0]["name"]]


def test_standalone_deployment_specifics() -> None:
    objects = render(DEPLOY / "overlays" / "standalone")
    deployment = only(objects, "Deployment", "kcms")
    assert deployment["metadata"]["namespace"] == NAMESPACE
    pod = deployment["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    (container,) = pod["containers"]
    assert container["image"] == "kcms:0.1.0"
    assert container["args"] == [
        "standalone",
        "--cert-dir=/tmp",
        "--secure-port=10250",
        "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
        "--kubelet-use-node-status-port",
        "--metric-resolution=15s",
    ]
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "200Mi"}
    assert container["ports"] == [{"name": "https", "containerPort": 10250, "protocol": "TCP"}]

    service = only(objects, "Service", "kcms")
    assert service["spec"]["ports"][0]["port"] == 443 and service["spec"]["ports"][0]["targetPort"] == "https"
    api = only(objects, "APIService", "v1beta1.metrics.k8s.io")["spec"]
    assert (api["group"], api["version"]) == ("metrics.k8s.io", "v1beta1")
    assert (api["groupPriorityMinimum"], api["versionPriority"]) == (100, 100)
    assert api["insecureSkipTLSVerify"] is True and "caBundle" not in api
    assert api["service"] == {"name": "kcms", "namespace": NAMESPACE, "port": 443}


@overlay_param
def test_tls_files_come_from_mounted_volumes(overlay: Path) -> None:
    """--tls-cert-file / --tls-private-key-file point into a mount; a mounted Secret is one we create."""
    objects = render(overlay)
    secrets = {o["metadata"]["name"] for o in by_kind(objects, "Secret")}
    secrets |= {c["spec"]["secretName"] for c in by_kind(objects, "Certificate")}
    for workload in workloads(objects):
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"].get("volumes", [])}
        for volume in volumes.values():
            if "secret" in volume:
                assert volume["secret"]["secretName"] in secrets, volume
        for container in containers(workload):
            mounts = [m["mountPath"].rstrip("/") + "/" for m in container.get("volumeMounts", [])]
            for flag in ("--tls-cert-file", "--tls-private-key-file", "--client-ca-file"):
                value = _flag_value(container.get("args", []), flag)
                if value is not None:
                    assert any(value.startswith(m) for m in mounts), f"{flag}={value} is not under a mount"


# ---------------------------------------------------------------------------------------------------
# container flags against the real CLI

_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z0-9][\w-]*)")


def _require_cli() -> None:
    if not (REPO / "kcms" / "cli.py").exists():
        pytest.skip("kcms/cli.py is not written yet; this check runs once it exists")


@functools.cache
def cli_flags(subcommand: str) -> frozenset[str]:
    """The flag names `python -m kcms <subcommand> --help` lists."""
    proc = subprocess.run(
        [sys.executable, "-m", "kcms", subcommand, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
        env={**os.environ, "COLUMNS": "1000"},  # no flag names broken across lines
    )
    assert proc.returncode == 0, f"`python -m kcms {subcommand} --help` failed:\n{proc.stdout}\n{proc.stderr}"
    flags = frozenset(_FLAG.findall(proc.stdout))
    assert "--help" in flags, f"no flags found in the help text:\n{proc.stdout}"
    return flags


def _split_args(args: list[str]) -> tuple[str, list[str]]:
    """(sub-command, flag names) of a container's args; values given as separate words are skipped."""
    assert args and not args[0].startswith("-"), f"args must start with a sub-command: {args}"
    names = []
    for i, arg in enumerate(args[1:], start=1):
        if arg.startswith("-"):
            names.append(arg.split("=", 1)[0])
        else:
            assert args[i - 1].startswith("-") and "=" not in args[i - 1], f"stray argument {arg!r}"
    return args[0], names


def test_split_args() -> None:
    assert _split_args(["standalone", "--a=1", "-v", "2", "--b"]) == ("standalone", ["--a", "-v", "--b"])
    with pytest.raises(AssertionError):
        _split_args(["--secure-port=1"])


@overlay_param
def test_container_flags_are_accepted_by_the_cli(overlay: Path) -> None:
    _require_cli()
    checked = 0
    for workload in workloads(render(overlay)):
        for container in containers(workload):
            subcommand, names = _split_args(container["args"])
            accepted = cli_flags(subcommand)
            assert "--no-such-flag-anywhere" not in accepted
            unknown = [n for n in names if n not in accepted]
            assert not unknown, f"`kcms {subcommand}` does not accept {unknown}"
            checked += len(names)
    assert checked > 0


def test_standalone_accepts_metrics_server_flags() -> None:
    """Drop-in: every metrics-server flag we promise is a flag of `kcms standalone`."""
    _require_cli()
    missing = [f for f in METRICS_SERVER_FLAGS if f not in cli_flags("standalone")]
    assert not missing, f"`kcms standalone` lacks {missing}"


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
    assert scripts["kcms"] == "kcms.cli:main"


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
    assert set(sources) == {"pyproject.toml", "README.md", "kcms"}
    for source in sources:
        assert not _ignored(source, patterns), f".dockerignore excludes {source}, which the build copies"
        assert (REPO / source).exists(), f"the build copies {source}, which does not exist"
    for heavy in (".git", "tests", "kcms/__pycache__", "kcms/store/__pycache__/x.pyc"):
        assert _ignored(heavy, patterns), f"{heavy} should not be sent to the build"


def test_image_contents_suffice_to_run_the_cli(tmp_path: Path) -> None:
    """Only what the Dockerfile copies, nothing else from the repo, runs `kcms standalone --help`."""
    _require_cli()
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    _require_cli()
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
