"""The deployment files: the kustomize manifests under deploy/.

Every overlay is rendered with the real ``kubectl kustomize`` (the base is also read with PyYAML and
must render unchanged), validated field by field against the official Kubernetes client's models, and
checked for consistency: APIService -> Service -> pods -> container port, RBAC subjects and role
references, probes, security context, TLS files. Container flags are checked against what
``python -m kcms <sub-command> --help`` accepts, and the Deployment's own args are run for real against
a simulated kubelet and probed over HTTPS the way the kubelet probes: that test, and the Dockerfile and
.dockerignore checks, are in tests/test_image.py.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml
from _deploy_helpers import DEPLOY, PROBE_PATHS, REPO, only, render

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


overlay_param = pytest.mark.parametrize("overlay", OVERLAYS, ids=[p.name for p in OVERLAYS])
# One process as ServiceAccount kcms with HTTPS health only: the standalone overlays. The HA overlays
# (more ServiceAccounts, the collector's plain-HTTP health port, the hostNetwork agent of push mode)
# are held to the same rules, generalised, in tests/test_deploy_ha.py.
STANDALONE = [p for p in OVERLAYS if p.name.startswith("standalone")]
standalone_param = pytest.mark.parametrize("overlay", STANDALONE, ids=[p.name for p in STANDALONE])


def test_overlays_exist() -> None:
    assert DEPLOY / "overlays" / "standalone" in OVERLAYS


# ---------------------------------------------------------------------------------------------------
# YAML and schema


def test_every_yaml_file_parses() -> None:
    files = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))
    assert len(files) >= 8
    # Prometheus rule files and promtool tests are not Kubernetes objects (tests/test_monitoring.py).
    prometheus_files = {DEPLOY / "monitoring" / "alerts.yaml", DEPLOY / "monitoring" / "alerts_test.yaml"}
    for path in files:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs, f"{path} is empty"
        if path in prometheus_files:
            continue
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


@standalone_param
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


@standalone_param
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


@standalone_param
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
            # An optional Secret may come from another kustomization (the agents' CA, deploy/agent).
            if "secret" in volume and not volume["secret"].get("optional"):
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
    missing = [f for f in METRICS_SERVER_FLAGS if f not in cli_flags("standalone")]
    assert not missing, f"`kcms standalone` lacks {missing}"


# ---------------------------------------------------------------------------------------------------
# history.kcms.io (docs/history.md)


def _history_apiservices(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [a for a in by_kind(objects, "APIService") if a["spec"]["group"] == "history.kcms.io"]


@overlay_param
def test_history_apiservice_only_where_history_is_served(overlay: Path) -> None:
    """`kcms standalone` serves history.kcms.io/v1alpha1 (--history defaults to 10m): its APIService is
    there, named for exactly the group and version the code installs; `kcms server` (HA overlays) keeps
    no history, so no APIService may announce it there (the aggregator would list a dead group)."""
    from kcms.apis.history import convert

    objects = render(overlay)
    found = _history_apiservices(objects)
    serves = any(
        c["args"][0] == "standalone" and _flag_value(c["args"], "--history") not in ("0", "0s")
        for w in workloads(objects)
        for c in containers(w)
    )
    if not serves:
        assert found == [], f"{overlay.name}: no process serves history.kcms.io"
        return
    (api,) = found
    spec = api["spec"]
    assert (spec["group"], spec["version"]) == (convert.GROUP, convert.VERSION)
    assert api["metadata"]["name"] == f"{convert.VERSION}.{convert.GROUP}"
    metrics = only(objects, "APIService", "v1beta1.metrics.k8s.io")["spec"]
    # the same backend and the same TLS arrangement as metrics.k8s.io (both components patch both)
    assert spec["service"] == metrics["service"]
    assert spec.get("insecureSkipTLSVerify") == metrics.get("insecureSkipTLSVerify")
    annotations = api["metadata"].get("annotations", {})
    metrics_annotations = only(objects, "APIService", "v1beta1.metrics.k8s.io")["metadata"].get(
        "annotations", {}
    )
    assert annotations.get("cert-manager.io/inject-ca-from") == metrics_annotations.get(
        "cert-manager.io/inject-ca-from"
    )


def test_history_apiservice_in_standalone_overlays_and_not_in_ha() -> None:
    names = {p.name: len(_history_apiservices(render(p))) for p in OVERLAYS}
    assert names["standalone"] == names["standalone-cert-manager"] == 1, names
    assert names["multi-store"] == names["sharded"] == names["push"] == 0, names


@overlay_param
def test_aggregated_reader_grants_history_reads(overlay: Path) -> None:
    """view/edit/admin (through the aggregation labels) may read history like metrics.k8s.io, read
    only: every resource the API serves, with get and list, and no write verb."""
    from kcms.apis.history.api import RESOURCES

    reader = only(render(overlay), "ClusterRole", "system:aggregated-metrics-reader")
    for resource in (r["name"] for r in RESOURCES):
        for verb in ("get", "list"):
            assert _grants(reader, "history.kcms.io", resource, verb), (resource, verb)
    for verb in ("create", "update", "patch", "delete", "deletecollection"):
        for resource in (r["name"] for r in RESOURCES):
            assert not _grants(reader, "history.kcms.io", resource, verb)
