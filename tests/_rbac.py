"""SubjectAccessReview decisions from RBAC objects, by the rules of Kubernetes' RBAC authorizer
(pkg/registry/rbac/validation, plugin/pkg/auth/authorizer/rbac), for ``FakeKubeAPI.authorize``.

- A RoleBinding grants its role's rules in its own namespace only; a ClusterRoleBinding everywhere
  (and is the only way to grant ``nonResourceURLs``).
- Subjects: ``ServiceAccount`` (user ``system:serviceaccount:<ns>:<name>``), ``User``, ``Group``.
- A rule matches a resource request when its apiGroups hold the group (or ``*``), its resources
  hold ``<resource>/<subresource>`` (or ``<resource>`` without a subresource, ``*``, or
  ``*/<subresource>``), its verbs the verb (or ``*``), and its resourceNames are empty or hold the
  request's name (a request without a name — "all names" — only matches rules without names).
- ``nonResourceURLs`` match exactly, or as a prefix with a trailing ``*``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml


def load(path: str | Path) -> list[dict[str, Any]]:
    """The RBAC documents of a YAML file."""
    return [d for d in yaml.safe_load_all(Path(path).read_text()) if d]


def _subject_matches(subject: dict[str, Any], user: str, groups: list[str]) -> bool:
    kind = subject.get("kind")
    if kind == "ServiceAccount":
        return user == f"system:serviceaccount:{subject['namespace']}:{subject['name']}"
    if kind == "User":
        return user == subject["name"]
    if kind == "Group":
        return subject["name"] in groups
    return False


def _rule_allows(rule: dict[str, Any], spec: dict[str, Any]) -> bool:
    verbs = rule.get("verbs", [])
    if nra := spec.get("nonResourceAttributes"):
        urls = rule.get("nonResourceURLs", [])
        return (nra["verb"] in verbs or "*" in verbs) and any(
            u == nra["path"] or (u.endswith("*") and nra["path"].startswith(u[:-1])) for u in urls
        )
    ra = spec.get("resourceAttributes") or {}
    if "nonResourceURLs" in rule:
        return False
    groups, resources, names = (
        rule.get("apiGroups", []),
        rule.get("resources", []),
        rule.get("resourceNames", []),
    )
    resource, sub = ra.get("resource", ""), ra.get("subresource", "")
    combined = f"{resource}/{sub}" if sub else resource
    resource_ok = "*" in resources or combined in resources or (bool(sub) and f"*/{sub}" in resources)
    name = ra.get("name", "")
    return (
        (ra.get("verb") in verbs or "*" in verbs)
        and (ra.get("group", "") in groups or "*" in groups)
        and resource_ok
        and (not names or (bool(name) and name in names))
    )


def authorizer(docs: list[dict[str, Any]], *, privileged: Callable[[dict], bool] | None = None):
    """``spec -> (allowed, reason)`` evaluating the RBAC objects in ``docs``; ``privileged(spec)``
    (optional) allows a spec outright, e.g. for built-in roles not in ``docs``."""

    def decide(spec: dict[str, Any]) -> tuple[bool, str]:
        if privileged is not None and privileged(spec):
            return True, "built-in role"
        user, groups = spec.get("user", ""), list(spec.get("groups") or [])
        ra = spec.get("resourceAttributes")
        namespace = (ra or {}).get("namespace", "")
        for b in docs:
            if b.get("kind") not in ("RoleBinding", "ClusterRoleBinding"):
                continue
            if b["kind"] == "RoleBinding" and (ra is None or b["metadata"]["namespace"] != namespace):
                continue
            if not any(_subject_matches(s, user, groups) for s in b.get("subjects", [])):
                continue
            ref = b["roleRef"]
            for role in docs:
                if role.get("kind") != ref["kind"] or role["metadata"]["name"] != ref["name"]:
                    continue
                if role["kind"] == "Role" and role["metadata"]["namespace"] != b["metadata"]["namespace"]:
                    continue
                if any(_rule_allows(rule, spec) for rule in role.get("rules", [])):
                    return True, f"RBAC: allowed by {b['kind']} {b['metadata']['name']!r}"
        return False, ""

    return decide
