"""deploy/agent: the node agent's DaemonSet, ServiceAccount, RBAC and serving certificate, rendered with
kubectl kustomize; and the collector of deploy/ha that scrapes it: TLS on both ends by default."""

from __future__ import annotations

import argparse

import kubernetes.client
import pytest
import yaml
from _deploy_helpers import DEPLOY, allowed, expanded_args, flag, kcms_containers, only, render, secret_file

from kcms.cmd.agent import add_agent_arguments
from kcms.cmd.main import build_parser
from kcms.collector.agents import DEFAULT_AGENT_SERVER_NAME

AGENT = DEPLOY / "agent"
NS = "kube-system"


def objects() -> list[dict]:
    return render(AGENT)


def test_renders_and_validates_against_kubernetes_models() -> None:
    rendered = objects()
    assert {(o["kind"], o["metadata"]["name"]) for o in rendered} == {
        ("ServiceAccount", "kcms-agent"),
        ("ClusterRole", "kcms-agent"),
        ("ClusterRoleBinding", "kcms-agent"),
        ("ClusterRoleBinding", "kcms-agent:system:auth-delegator"),
        ("DaemonSet", "kcms-agent"),
        ("Issuer", "kcms-agent-selfsigned"),
        ("Certificate", "kcms-agent-ca"),
        ("Issuer", "kcms-agent-ca"),
        ("Certificate", "kcms-agent-tls"),
    }
    if not hasattr(kubernetes.client.V1DaemonSet, "model_validate"):
        pytest.skip("this kubernetes client's models do not validate")
    for obj in rendered:
        group, _, version = obj["apiVersion"].rpartition("/")
        if group == "cert-manager.io":  # a CRD: not in the client's models
            continue
        cls = getattr(kubernetes.client, version.capitalize() + obj["kind"])
        cls.model_validate(obj, strict=True)


def test_rbac_grants_exactly_what_the_agent_uses() -> None:
    rendered = objects()
    role = only(rendered, "ClusterRole", "kcms-agent")
    grants = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert grants == {
        ("pods", "list"),
        ("pods", "watch"),
        ("nodes/metrics", "get"),
        ("nodes/stats", "get"),
    }
    binding = only(rendered, "ClusterRoleBinding", "kcms-agent")
    assert binding["roleRef"]["name"] == "kcms-agent"
    sa = only(rendered, "ServiceAccount", "kcms-agent")
    subjects = [{"kind": "ServiceAccount", "name": "kcms-agent", "namespace": sa["metadata"]["namespace"]}]
    assert binding["subjects"] == subjects
    # Reviews of /metrics callers (TokenReview, SubjectAccessReview): the built-in auth-delegator role.
    delegator = only(rendered, "ClusterRoleBinding", "kcms-agent:system:auth-delegator")
    assert delegator["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "system:auth-delegator",
    }
    assert delegator["subjects"] == subjects


def test_daemonset_mounts_cgroups_read_only_and_runs_valid_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    ds = only(objects(), "DaemonSet", "kcms-agent")
    pod = ds["spec"]["template"]["spec"]
    assert not pod.get("hostPID")
    assert pod["serviceAccountName"] == "kcms-agent"
    assert (
        ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    )
    [container] = pod["containers"]
    assert all(m["readOnly"] is True for m in container["volumeMounts"])
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "cgroup"]
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"]["path"] == "/sys/fs/cgroup"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"

    # the container's args are accepted by `kcms agent` and agree with the mounts and ports
    assert container["args"][0] == "agent"
    monkeypatch.setenv("NODE_NAME", "node-a")
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_agent_arguments(parser)
    args = parser.parse_args(container["args"][1:])
    assert args.node_name == "node-a"
    assert args.cgroup_root == mount["mountPath"]
    port = int(args.listen.rpartition(":")[2])
    [declared] = [p for p in container["ports"] if p["containerPort"] == port]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {
            "path": "/healthz",
            "port": declared["name"],
            "scheme": "HTTPS",
        }
    # The OTLP push port is declared too, and is not the /metrics port.
    otlp_port = int(args.otlp_listen.rpartition(":")[2])
    assert otlp_port != port and otlp_port in {p["containerPort"] for p in container["ports"]}


def test_metrics_are_served_over_tls_with_the_certificate_of_the_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rendered = objects()
    ds = only(rendered, "DaemonSet", "kcms-agent")
    [container] = ds["spec"]["template"]["spec"]["containers"]
    monkeypatch.setenv("NODE_NAME", "node-a")
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_agent_arguments(parser)
    args = parser.parse_args(container["args"][1:])
    assert not args.insecure_serving
    certificate = only(rendered, "Certificate", "kcms-agent-tls")["spec"]
    assert secret_file(ds, container, args.tls_cert_file) == (certificate["secretName"], "tls.crt")
    assert secret_file(ds, container, args.tls_private_key_file) == (certificate["secretName"], "tls.key")
    # The name the collector checks by default is the certificate's; it comes from a private CA.
    assert certificate["dnsNames"] == [DEFAULT_AGENT_SERVER_NAME]
    assert "server auth" in certificate["usages"]
    issuer = only(rendered, "Issuer", certificate["issuerRef"]["name"])["spec"]
    ca = only(rendered, "Certificate", "kcms-agent-ca")["spec"]
    assert issuer == {"ca": {"secretName": ca["secretName"]}} and ca["isCA"] is True


def test_the_ha_collector_verifies_agents_and_may_read_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """deploy/overlays/multi-store's collector: the agents' CA mounted where --agent-ca-file points, the
    certificate's name checked, its ServiceAccount token sent, and RBAC lets it get nodes/metrics."""
    agent_objects = objects()
    certificate = only(agent_objects, "Certificate", "kcms-agent-tls")["spec"]
    ha = render(DEPLOY / "overlays" / "multi-store")
    collector = only(ha, "Deployment", "kcms-collector")
    [container] = kcms_containers(collector)
    argv = expanded_args(collector, container, ha)
    for key in ("POD_NAME", "POD_NAMESPACE", "KCMS_STORE_REPLICAS"):
        monkeypatch.setenv(key, "0" if key == "KCMS_STORE_REPLICAS" else NS)
    args = build_parser().parse_args(argv)
    assert args.agent_selector and not args.agent_insecure_tls and not args.agent_insecure_http
    assert args.agent_tls_server_name in certificate["dnsNames"]
    assert not args.agent_token_file  # the ServiceAccount token of the pod
    ca_file = flag(argv, "--agent-ca-file") or ""
    assert secret_file(collector, container, ca_file) == (certificate["secretName"], "ca.crt")
    account = collector["spec"]["template"]["spec"]["serviceAccountName"]
    # RBAC names a subresource as resource/subresource; the agent asks for nodes/metrics of its node.
    assert allowed(ha, (NS, account), verb="get", group="", resource="nodes/metrics", name="node-a")
    assert not allowed(ha, (NS, "default"), verb="get", group="", resource="nodes/metrics", name="node-a")


def test_not_part_of_the_base() -> None:
    for kustomization in (DEPLOY / "base").rglob("kustomization.yaml"):
        entries = yaml.safe_load(kustomization.read_text()).get("resources", [])
        for entry in entries:
            assert (kustomization.parent / entry).resolve() != AGENT.resolve(), kustomization
    assert not [o for o in render(DEPLOY / "base") if o["metadata"]["name"] == "kcms-agent"]


def test_standalone_scrape_component_points_the_base_at_the_agents(tmp_path) -> None:
    """deploy/base + deploy/agent + deploy/agent/standalone-scrape: the standalone server scrapes the
    agents' pods, verifying them with the CA of the agents' own certificate, as an account RBAC lets read
    nodes/metrics."""
    import os

    rel = os.path.relpath(DEPLOY, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {rel}/base\n  - {rel}/agent\ncomponents:\n  - {rel}/agent/standalone-scrape\n"
    )
    rendered = render(tmp_path)
    server = only(rendered, "Deployment", "kcms")
    [container] = kcms_containers(server)
    argv = expanded_args(server, container, rendered)
    args = build_parser().parse_args(argv)
    agents = only(rendered, "DaemonSet", "kcms-agent")
    labels = agents["spec"]["template"]["metadata"]["labels"]
    key, _, value = args.agent_selector.partition("=")
    assert labels.get(key) == value
    certificate = only(rendered, "Certificate", "kcms-agent-tls")["spec"]
    assert args.agent_tls_server_name in certificate["dnsNames"] and not args.agent_insecure_tls
    assert secret_file(server, container, args.agent_ca_file) == (certificate["secretName"], "ca.crt")
    account = server["spec"]["template"]["spec"]["serviceAccountName"]
    assert allowed(rendered, (NS, account), verb="get", group="", resource="nodes/metrics", name="node-a")
