"""The HA deployment modes: deploy/overlays/multi-store, sharded and push (built from deploy/ha).

Each overlay is rendered with the real ``kubectl kustomize`` and validated against the official
Kubernetes client's models; then the objects are checked against each other the way the cluster would
use them: every ``kcms`` container's args, with ``$(VAR)`` expanded from the container's env as the
kubelet expands them, are parsed by the real ``kcms`` parser; probes hit ports the container exposes
and the right scheme; PodDisruptionBudgets, anti-affinity and spread constraints select their own
workload's pods; the APIService's Service selects the ``kcms server`` pods only; the ServiceAccounts'
bindings are evaluated like RBAC evaluates them; secrets and certificates mounted where the flags
point; the store copy count (``--replicas``) is the same in every component. The multi-store
overlay's processes run for real from their own args in tests/test_deploy_ha_run.py.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from _deploy_helpers import (
    DEPLOY,
    allowed,
    by_kind,
    expanded_args,
    flag,
    generated,
    kcms_containers,
    mount_source,
    only,
    pod_labels,
    pod_spec,
    render,
    resolved_env,
    secret_file,
    selected_workloads,
    selects,
    workloads,
)

from kcms.agent.push import NODES_PATH
from kcms.apis.nodepush import NODES_PATH as SERVED_PATH
from kcms.cmd.main import build_parser

NS = "kube-system"
MULTI, SHARDED, PUSH = (DEPLOY / "overlays" / n for n in ("multi-store", "sharded", "push"))
STORE_OVERLAYS = [MULTI, SHARDED]
HA_OVERLAYS = [MULTI, SHARDED, PUSH]
CRD_GROUPS = {"cert-manager.io"}
BUILTIN_ROLES = {
    ("ClusterRole", "system:auth-delegator"),
    ("Role", "extension-apiserver-authentication-reader"),
}
# Deployment/StatefulSet replicas, and the store copy count (--replicas) every component must agree on.
EXPECTED = {
    "multi-store": {"stores": 3, "servers": 2, "collectors": 2, "copies": "0"},
    "sharded": {"stores": 4, "servers": 2, "collectors": 2, "copies": "2"},
}

ha_param = pytest.mark.parametrize("overlay", HA_OVERLAYS, ids=[p.name for p in HA_OVERLAYS])
store_param = pytest.mark.parametrize("overlay", STORE_OVERLAYS, ids=[p.name for p in STORE_OVERLAYS])


# ---------------------------------------------------------------------------------------------------
# helpers: objects, selectors, env expansion, RBAC


def role_of(workload: dict[str, Any]) -> str:
    """The sub-command the workload's (single) kcms container runs."""
    [container] = kcms_containers(workload)
    return container["args"][0]


def test_selects() -> None:
    labels = {"a": "1", "b": "2"}
    assert selects({"matchLabels": {"a": "1"}}, labels)
    assert not selects({"matchLabels": {"a": "2"}}, labels)
    assert not selects({"matchLabels": {"a": "1", "c": "3"}}, labels)
    assert selects({"matchExpressions": [{"key": "b", "operator": "In", "values": ["2", "3"]}]}, labels)
    assert not selects({"matchExpressions": [{"key": "c", "operator": "Exists"}]}, labels)
    assert not selects({}, labels)


def parse(workload: dict[str, Any], container: dict[str, Any], objects: list[dict[str, Any]], monkeypatch):
    """Parse the container's expanded args with the real `kcms` parser, under the container's env."""
    for key, value in resolved_env(workload, container, objects).items():
        monkeypatch.setenv(key, value)
    return build_parser().parse_args(expanded_args(workload, container, objects))


def can(objects: list[dict[str, Any]], account: str, verb: str, resource: str, **kw: str) -> bool:
    group, _, resource = resource.rpartition(".") if "." in resource else ("", "", resource)
    return allowed(objects, (NS, account), verb=verb, group=group, resource=resource, **kw)


# ---------------------------------------------------------------------------------------------------
# objects and schema


@ha_param
def test_renders_unique_objects_valid_for_the_kubernetes_models(overlay: Path) -> None:
    objects = render(overlay)
    keys = [(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys)), "duplicate objects"
    if not hasattr(kubernetes.client.V1Deployment, "model_validate"):
        pytest.skip("this kubernetes client's models do not validate (needs the pydantic-based client)")
    for obj in objects:
        group, _, version = obj["apiVersion"].rpartition("/")
        if group in CRD_GROUPS:
            continue
        model = getattr(kubernetes.client, version.capitalize() + obj["kind"])
        model.model_validate(obj, strict=True)


@store_param
def test_store_modes_have_stores_collectors_and_servers(overlay: Path) -> None:
    objects = render(overlay)
    want = EXPECTED[overlay.name]
    store = only(objects, "StatefulSet", "kcms-store")
    server = only(objects, "Deployment", "kcms")
    collector = only(objects, "Deployment", "kcms-collector")
    assert (store["spec"]["replicas"], server["spec"]["replicas"], collector["spec"]["replicas"]) == (
        want["stores"],
        want["servers"],
        want["collectors"],
    )
    assert [role_of(w) for w in (store, server, collector)] == ["store", "server", "collector"]
    assert sorted(role_of(w) for w in workloads(objects)) == ["collector", "server", "store"]

    headless = only(objects, "Service", "kcms-store")["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is False
    assert store["spec"]["serviceName"] == "kcms-store"
    assert selected_workloads({"matchLabels": headless["selector"]}, objects, NS) == [
        "StatefulSet/kcms-store"
    ]
    assert store["spec"]["podManagementPolicy"] == "Parallel"

    budgets = {p["metadata"]["name"]: p["spec"] for p in by_kind(objects, "PodDisruptionBudget")}
    assert budgets["kcms-store"]["maxUnavailable"] == 1 and "minAvailable" not in budgets["kcms-store"]
    assert budgets["kcms-collector"]["minAvailable"] == 1
    assert budgets["kcms"]["minAvailable"] == 1


def test_push_mode_has_active_standby_servers_and_pushing_agents() -> None:
    objects = render(PUSH)
    server = only(objects, "Deployment", "kcms")
    assert server["spec"]["replicas"] == 2
    assert sorted(role_of(w) for w in workloads(objects)) == ["agent", "server"]
    # A standby is never ready: a rolling update would wait for it forever.
    assert server["spec"]["strategy"] == {"type": "Recreate"}
    [container] = kcms_containers(server)
    args = expanded_args(server, container, objects)
    assert "--active-standby" in args and flag(args, "--node-stale-after") == "1m"
    assert flag(args, "--leader-elect-resource-namespace") == NS
    assert not [a for a in args if a.startswith("--store-")], "push mode reads no stores"
    probe = container["readinessProbe"]
    assert probe["httpGet"]["path"] == "/readyz" and probe["periodSeconds"] <= 5
    # With only the active server ready, any budget over the servers would block draining its node.
    for budget in by_kind(objects, "PodDisruptionBudget"):
        assert not selects(budget["spec"]["selector"], pod_labels(server)), budget["metadata"]["name"]
    assert not by_kind(objects, "StatefulSet") and not [
        o for o in objects if "collector" in o["metadata"]["name"]
    ]


# ---------------------------------------------------------------------------------------------------
# args: the real parser, env expansion, the same copy count everywhere


@ha_param
def test_var_references_resolve_to_the_containers_env(overlay: Path) -> None:
    objects = render(overlay)
    expanded = 0
    for workload in workloads(objects):
        for container in kcms_containers(workload):
            args = expanded_args(workload, container, objects)
            assert not [a for a in args if "$(" in a]
            expanded += sum(a != b for a, b in zip(args, container["args"], strict=True))
    assert expanded >= (1 if overlay == PUSH else 8)


def test_var_expansion_control() -> None:
    """Control: a reference to a variable the container does not define is caught."""
    objects = render(MULTI)
    store = only(objects, "StatefulSet", "kcms-store")
    [container] = kcms_containers(store)
    assert flag(expanded_args(store, container, objects), "--store-name") == "kcms-store-0"
    container["args"].append("--store-endpoints=$(STORE_ENDPOINTS)")
    with pytest.raises(AssertionError, match="STORE_ENDPOINTS"):
        expanded_args(store, container, objects)


@ha_param
def test_every_kcms_container_parses_with_the_real_cli(
    overlay: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = render(overlay)
    parsed = 0
    for workload in workloads(objects):
        for container in kcms_containers(workload):
            args = parse(workload, container, objects, monkeypatch)
            assert args.command == container["args"][0]
            parsed += 1
    assert parsed == (2 if overlay == PUSH else 3)


@store_param
def test_store_flags_agree_with_the_service_the_secrets_and_each_other(
    overlay: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = render(overlay)
    copies = EXPECTED[overlay.name]["copies"]
    service = only(objects, "Service", "kcms-store")
    [service_port] = service["spec"]["ports"]
    token = generated(objects, "Secret", "kcms-store-token")
    assert set(token["data"]) == {"token"}
    certificate = only(objects, "Certificate", "kcms-store-tls")

    store = only(objects, "StatefulSet", "kcms-store")
    [container] = kcms_containers(store)
    args = parse(store, container, objects, monkeypatch)
    assert args.store_service == f"{NS}/kcms-store" and args.store_port_name == service_port["name"]
    assert args.store_name == "kcms-store-0" and str(args.replicas) == copies
    [port] = [p for p in container["ports"] if p["name"] == service_port["targetPort"]]
    assert port["containerPort"] == args.port == service_port["port"]
    assert secret_file(store, container, args.token_file) == (token["metadata"]["name"], "token")
    for path, key in ((args.tls_cert_file, "tls.crt"), (args.tls_private_key_file, "tls.key")):
        assert secret_file(store, container, path) == (certificate["spec"]["secretName"], key)
    assert secret_file(store, container, args.store_ca_file) == (certificate["spec"]["secretName"], "ca.crt")

    for name in ("kcms", "kcms-collector"):
        client = only(objects, "Deployment", name)
        [container] = kcms_containers(client)
        args = parse(client, container, objects, monkeypatch)
        assert args.store_service == f"{NS}/kcms-store" and args.store_port_name == service_port["name"]
        assert str(args.replicas) == copies, f"{name}: --replicas differs from the stores'"
        assert args.write_quorum == 0 and args.read_quorum == 0, "quorums are left at their defaults"
        assert secret_file(client, container, args.store_token_file) == (token["metadata"]["name"], "token")
        assert secret_file(client, container, args.store_ca_file) == (
            certificate["spec"]["secretName"],
            "ca.crt",
        )
        # Only the CA of the stores' Secret is mounted, never their private key.
        volume, _ = mount_source(client, container, args.store_ca_file)
        assert [i["key"] for i in volume["secret"]["items"]] == ["ca.crt"]


@store_param
def test_copy_count_is_one_value_for_every_component(overlay: Path) -> None:
    """Without the CLI: the raw --replicas of stores, collector and server resolve to the same value,
    and no quorum is set (the defaults R + W > copies hold by construction)."""
    objects = render(overlay)
    values = {}
    for workload in workloads(objects):
        [container] = kcms_containers(workload)
        args = expanded_args(workload, container, objects)
        values[workload["metadata"]["name"]] = flag(args, "--replicas")
        assert flag(args, "--write-quorum") is None and flag(args, "--read-quorum") is None
    assert values == dict.fromkeys(("kcms", "kcms-collector", "kcms-store"), EXPECTED[overlay.name]["copies"])
    stores = only(objects, "StatefulSet", "kcms-store")["spec"]["replicas"]
    assert int(EXPECTED[overlay.name]["copies"]) < stores


@store_param
def test_store_certificate_names_the_stores(overlay: Path) -> None:
    """Store URLs come from EndpointSlices (pod IPs), so clients can only check a DNS name of the
    headless Service: the per-pod names <pod>.kcms-store.<ns>.svc or the Service's own."""
    objects = render(overlay)
    certificate = only(objects, "Certificate", "kcms-store-tls")["spec"]
    assert {f"*.kcms-store.{NS}.svc", f"kcms-store.{NS}.svc"} <= set(certificate["dnsNames"])
    issuer = only(objects, "Issuer", certificate["issuerRef"]["name"])
    ca = only(objects, "Certificate", issuer["spec"]["ca"]["secretName"])
    assert ca["spec"]["isCA"] is True and ca["spec"]["secretName"] == issuer["spec"]["ca"]["secretName"]


def test_agents_push_to_the_api_service_and_verify_its_certificate(monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render(PUSH)
    agent = only(objects, "DaemonSet", "kcms-agent")
    [container] = kcms_containers(agent)
    args = expanded_args(agent, container, objects)
    url = urllib.parse.urlsplit(flag(args, "--push") or "")
    ref = only(objects, "APIService", "v1beta1.metrics.k8s.io")["spec"]["service"]
    assert (url.scheme, url.hostname, url.port) == (
        "https",
        f"{ref['name']}.{ref['namespace']}.svc",
        ref["port"],
    )
    certificate = only(objects, "Certificate", "kcms-serving-cert")["spec"]
    assert url.hostname in certificate["dnsNames"]
    ca_file = flag(args, "--push-ca-file") or ""
    assert secret_file(agent, container, ca_file) == (certificate["secretName"], "ca.crt")
    volume, _ = mount_source(agent, container, ca_file)
    assert [i["key"] for i in volume["secret"]["items"]] == ["ca.crt"]
    parsed = parse(agent, container, objects, monkeypatch)
    assert "https://kcms.kube-system.svc:443" in (
        parsed.push if isinstance(parsed.push, list | tuple) else [parsed.push]
    )


# ---------------------------------------------------------------------------------------------------
# probes, selectors, scheduling


# sub-command -> (the port its health endpoints are on, from the parsed args; liveness and readiness paths)
HEALTH = {
    "store": (lambda a: a.port, "/livez", "/readyz"),
    "server": (lambda a: a.secure_port, "/livez", "/readyz"),
    "collector": (lambda a: a.health_port, "/healthz", "/readyz"),
    "agent": (lambda a: int(a.listen.rpartition(":")[2]), "/healthz", "/healthz"),
}


@ha_param
def test_probes_hit_the_port_and_scheme_the_component_serves(
    overlay: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = render(overlay)
    for workload in workloads(objects):
        for container in kcms_containers(workload):
            args = parse(workload, container, objects, monkeypatch)
            port_of, *paths = HEALTH[args.command]
            https = args.command == "server" or bool(getattr(args, "tls_cert_file", ""))
            for probe_name, path in zip(("livenessProbe", "readinessProbe"), paths, strict=True):
                get, what = container[probe_name]["httpGet"], f"{workload['metadata']['name']} {probe_name}"
                assert get["path"] == path and get.get("scheme", "HTTP") == ("HTTPS" if https else "HTTP"), (
                    what
                )
                field = "name" if isinstance(get["port"], str) else "containerPort"
                [declared] = [p for p in container["ports"] if p.get(field) == get["port"]]
                assert declared["containerPort"] == port_of(args), f"{what} misses the served port"


@ha_param
def test_budgets_select_exactly_their_workload(overlay: Path) -> None:
    objects = render(overlay)
    for budget in by_kind(objects, "PodDisruptionBudget"):
        name = budget["metadata"]["name"]
        chosen = selected_workloads(budget["spec"]["selector"], objects, budget["metadata"]["namespace"])
        kind = "StatefulSet" if name == "kcms-store" else "Deployment"
        assert chosen == [f"{kind}/{name}"], f"PodDisruptionBudget {name} selects {chosen}"


@ha_param
def test_anti_affinity_and_spread_select_the_workloads_own_pods(overlay: Path) -> None:
    objects = render(overlay)
    checked = 0
    for workload in workloads(objects):
        if workload["kind"] == "DaemonSet":
            continue  # one per node by construction
        own = f"{workload['kind']}/{workload['metadata']['name']}"
        affinity = pod_spec(workload)["affinity"]["podAntiAffinity"]
        required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution", [])
        preferred = [
            t["podAffinityTerm"] for t in affinity.get("preferredDuringSchedulingIgnoredDuringExecution", [])
        ]
        spread = pod_spec(workload)["topologySpreadConstraints"]
        for term in required + preferred + spread:
            namespace = workload["metadata"]["namespace"]
            assert selected_workloads(term["labelSelector"], objects, namespace) == [own], term
            checked += 1
        hostname = [t for t in required + preferred if t["topologyKey"] == "kubernetes.io/hostname"]
        if role_of(workload) == "store":  # two copies on one node would fail together: required
            assert hostname and hostname[0] in required
        else:
            assert hostname and hostname[0] in preferred and not required
        assert [c["topologyKey"] for c in spread] == ["topology.kubernetes.io/zone"]
    assert checked >= (2 if overlay == PUSH else 6)


@ha_param
def test_api_service_reaches_only_the_server_pods(overlay: Path) -> None:
    objects = render(overlay)
    for api in by_kind(objects, "APIService"):
        ref = api["spec"]["service"]
        service = only(objects, "Service", ref["name"])
        assert service["metadata"]["namespace"] == ref["namespace"]
        chosen = selected_workloads({"matchLabels": service["spec"]["selector"]}, objects, ref["namespace"])
        assert chosen == ["Deployment/kcms"], chosen
        [container] = kcms_containers(only(objects, "Deployment", "kcms"))
        assert container["args"][0] == "server"
        [port] = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]]
        assert port["targetPort"] in [p["name"] for p in container["ports"]]


# ---------------------------------------------------------------------------------------------------
# RBAC and security


@ha_param
def test_accounts_and_bindings_refer_to_what_exists(overlay: Path) -> None:
    objects = render(overlay)
    accounts = {o["metadata"]["name"] for o in by_kind(objects, "ServiceAccount")}
    for workload in workloads(objects):
        assert pod_spec(workload)["serviceAccountName"] in accounts
    defined = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objects}
    for binding in by_kind(objects, "ClusterRoleBinding") + by_kind(objects, "RoleBinding"):
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount" and subject["namespace"] == NS
            assert subject["name"] in accounts, (
                f"{binding['metadata']['name']} binds unknown {subject['name']}"
            )
        ref = binding["roleRef"]
        namespace = binding["metadata"]["namespace"] if ref["kind"] == "Role" else ""
        assert (ref["kind"], ref["name"]) in BUILTIN_ROLES or (ref["kind"], namespace, ref["name"]) in defined


@store_param
def test_rbac_of_the_store_modes(overlay: Path) -> None:
    objects = render(overlay)
    accounts = {w["metadata"]["name"]: pod_spec(w)["serviceAccountName"] for w in workloads(objects)}
    collector, store, server = accounts["kcms-collector"], accounts["kcms-store"], accounts["kcms"]
    assert len({collector, store, server}) == 3, "each component runs as its own ServiceAccount"
    lease = {"namespace": NS, "name": "kcms-collector"}
    for verb in ("create", "get", "update"):
        assert can(objects, collector, verb, "coordination.k8s.io.leases", **lease)
    assert not can(objects, collector, "update", "coordination.k8s.io.leases", namespace=NS, name="other")
    assert not can(
        objects, collector, "get", "coordination.k8s.io.leases", namespace="default", name="kcms-collector"
    )
    for resource in ("nodes/metrics", "nodes/stats"):
        assert can(objects, collector, "get", resource)
    for account in (collector, server):
        for resource in ("nodes", "pods"):
            for verb in ("get", "list", "watch"):
                assert can(objects, account, verb, resource)
    for account in (collector, store, server):
        for verb in ("list", "watch"):
            assert can(objects, account, verb, "discovery.k8s.io.endpointslices", namespace=NS)
        assert not can(objects, account, "list", "discovery.k8s.io.endpointslices", namespace="default")
        assert not can(objects, account, "get", "secrets", namespace=NS)
    # least privilege: the server and the stores never talk to kubelets; the stores read nothing else
    for account in (server, store):
        assert not can(objects, account, "get", "nodes/metrics") and not can(
            objects, account, "get", "nodes/stats"
        )
    assert not can(objects, store, "list", "pods") and not can(
        objects, store, "create", "coordination.k8s.io.leases", namespace=NS
    )
    # delegated authentication and authorization of the server (built-in roles, bound in the base)
    delegated = {
        (b["kind"], b["roleRef"]["name"])
        for b in by_kind(objects, "ClusterRoleBinding") + by_kind(objects, "RoleBinding")
        if {"kind": "ServiceAccount", "name": server, "namespace": NS} in b["subjects"]
    }
    assert {
        ("ClusterRoleBinding", "system:auth-delegator"),
        ("RoleBinding", "extension-apiserver-authentication-reader"),
    } <= delegated


def test_rbac_of_push_mode() -> None:
    objects = render(PUSH)
    assert NODES_PATH == SERVED_PATH
    server = pod_spec(only(objects, "Deployment", "kcms"))["serviceAccountName"]
    agent = pod_spec(only(objects, "DaemonSet", "kcms-agent"))["serviceAccountName"]
    for verb in ("create", "get", "update"):
        assert can(objects, server, verb, "coordination.k8s.io.leases", namespace=NS, name="kcms-server")
    assert not can(
        objects, server, "update", "coordination.k8s.io.leases", namespace=NS, name="kcms-collector"
    )
    assert not can(objects, server, "get", "nodes/stats"), "in push mode nobody scrapes kubelets centrally"
    # POST /push/v1/nodes is a non-resource request with the verb "post" (kcms/apis/nodepush.py), the one
    # path `kcms agent --push` uses (kcms/agent/push.py); nothing else is granted.
    assert allowed(objects, (NS, agent), verb="post", path=NODES_PATH)
    assert not allowed(objects, (NS, agent), verb="get", path=NODES_PATH)
    assert not allowed(objects, (NS, agent), verb="post", path="/push/v1/samples")
    assert not allowed(objects, (NS, agent), verb="get", path="/push/v1/status")
    assert not allowed(objects, (NS, server), verb="post", path=NODES_PATH)


@ha_param
def test_security_context(overlay: Path) -> None:
    for workload in workloads(render(overlay)):
        pod = pod_spec(workload)
        pod_ctx = pod.get("securityContext", {})
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in pod["containers"]:
            ctx = container.get("securityContext", {})
            effective = {**pod_ctx, **ctx}
            assert effective.get("runAsNonRoot") is True and effective.get("runAsUser") == 1000
            assert effective.get("seccompProfile") == {"type": "RuntimeDefault"}
            assert ctx.get("readOnlyRootFilesystem") is True and ctx.get("allowPrivilegeEscalation") is False
            assert ctx.get("capabilities", {}).get("drop") == ["ALL"] and not ctx["capabilities"].get("add")
            assert ctx.get("privileged", False) is False
            if workload["kind"] == "DaemonSet":
                continue  # the node agent of deploy/agent: hostNetwork by design, checked in test_agent_deploy
            assert not pod.get("hostNetwork") and not pod.get("hostPID")
            tmp = [m for m in container.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
            assert tmp and "emptyDir" in volumes[tmp[0]["name"]]


def test_the_committed_store_token_is_the_documented_placeholder() -> None:
    """The token in the repository is a placeholder the overlay's comment tells users to replace."""
    token = (MULTI / "store-token").read_text()
    assert "REPLACE-ME" in token
    assert (
        "openssl rand -hex 32 > deploy/overlays/multi-store/store-token"
        in (MULTI / "kustomization.yaml").read_text()
    )
