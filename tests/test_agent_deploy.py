"""deploy/agent: the node agent's DaemonSet, ServiceAccount and RBAC, rendered with kubectl kustomize."""

from __future__ import annotations

import argparse

import kubernetes.client
import pytest
import yaml
from _deploy_helpers import DEPLOY, only, render

from kcms.agent.cli import add_agent_arguments

AGENT = DEPLOY / "agent"


def objects() -> list[dict]:
    return render(AGENT)


def test_renders_and_validates_against_kubernetes_models() -> None:
    rendered = objects()
    assert {(o["kind"], o["metadata"]["name"]) for o in rendered} == {
        ("ServiceAccount", "kcms-agent"),
        ("ClusterRole", "kcms-agent"),
        ("ClusterRoleBinding", "kcms-agent"),
        ("DaemonSet", "kcms-agent"),
    }
    if not hasattr(kubernetes.client.V1DaemonSet, "model_validate"):
        pytest.skip("this kubernetes client's models do not validate")
    for obj in rendered:
        group, _, version = obj["apiVersion"].rpartition("/")
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
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "kcms-agent", "namespace": sa["metadata"]["namespace"]}
    ]


def test_daemonset_mounts_cgroups_read_only_and_runs_valid_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    ds = only(objects(), "DaemonSet", "kcms-agent")
    pod = ds["spec"]["template"]["spec"]
    assert not pod.get("hostPID")
    assert pod["serviceAccountName"] == "kcms-agent"
    assert (
        ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    )
    [container] = pod["containers"]
    [mount] = container["volumeMounts"]
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"]["path"] == "/sys/fs/cgroup" and mount["readOnly"] is True
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
    [declared] = container["ports"]
    assert declared["containerPort"] == port
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": declared["name"]}


def test_not_part_of_the_base() -> None:
    for kustomization in (DEPLOY / "base").rglob("kustomization.yaml"):
        entries = yaml.safe_load(kustomization.read_text()).get("resources", [])
        for entry in entries:
            assert (kustomization.parent / entry).resolve() != AGENT.resolve(), kustomization
    assert not [o for o in render(DEPLOY / "base") if o["metadata"]["name"] == "kcms-agent"]
