"""Which Kubernetes objects a Prometheus series is about: a rule's ``resources`` block.

prometheus-adapter's ``resources`` maps series labels to group-resources two ways (its
``pkg/naming/resource_converter.go`` and ``lbl_res.go``):

- ``overrides``: ``{label: {group, resource}}`` -- that label names objects of that group-resource;
- ``template``: a Go template over ``.Group`` (dots and dashes replaced by ``_``) and ``.Resource``
  (singular), e.g. ``"<<.Resource>>"`` (label ``pod`` -> ``pods``) or ``"kube_<<.Group>>_<<.Resource>>"``
  (label ``kube_apps_deployment`` -> ``deployments.apps``). A label is read back by turning the
  template into a regular expression (``.Group`` -> ``(?P<group>.+?)``, ``.Resource`` ->
  ``(?P<resource>.+?)``, anchored), exactly as the adapter does.

The adapter then "normalizes" every group-resource with the cluster's RESTMapper: singular or plural,
with or without the group, to the served plural and group (``pod`` -> ``pods``, ``deployment`` ->
``deployments.apps``), and a label whose template reading is not a served resource is not a resource
label at all. KCMS has no RESTMapper when it loads the configuration, so :class:`ResourceMapper` uses a
``resolve`` function: by default :func:`resolve_known`, a table of the built-in Kubernetes resources
(``kcms.apis.objects.WELL_KNOWN`` plus the rest of the built-in groups) that accepts the singular, the
plural, with or without the group. An ``overrides`` entry the table does not know (a custom resource)
is still a resource -- the adapter would have refused to start if the cluster did not serve it -- with
the resource taken as written when it ends in ``s`` and otherwise pluralized by Kubernetes' rule
(``UnsafeGuessKindToResource``: ``-s`` -> ``-ses``, ``-y`` -> ``-ies``, else ``+s``). A label read
through a ``template`` must be in the table (or known to a ``resolve`` the caller passes, e.g. backed by
API discovery), so custom resources need an override.

``namespace_label`` is the label for ``namespaces`` (usually the override ``namespace: {resource:
namespace}``); ``namespaced`` is the rule's ``namespaced`` flag (external rules, default true).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kcms.apis.objects import WELL_KNOWN
from kcms.apis.prometheus.gotemplate import Template, TemplateError

__all__ = [
    "CLUSTER_SCOPED",
    "GroupResource",
    "ResourceMapper",
    "guess_plural",
    "resolve_known",
    "singular_of",
]


@dataclass(frozen=True, order=True)
class GroupResource:
    """A Kubernetes group-resource: ``str()`` is ``"pods"`` or ``"deployments.apps"`` (as kubectl writes it)."""

    group: str
    resource: str

    def __str__(self) -> str:
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @classmethod
    def parse(cls, text: str) -> GroupResource:
        """``"deployments.apps"`` -> ``GroupResource("apps", "deployments")``."""
        resource, _, group = text.partition(".")
        return cls(group, resource)


NAMESPACES = GroupResource("", "namespaces")
NODES = GroupResource("", "nodes")
PERSISTENT_VOLUMES = GroupResource("", "persistentvolumes")
# Metrics about these are listed as not namespaced (prometheus-adapter's series registry).
CLUSTER_SCOPED = frozenset({NAMESPACES, NODES, PERSISTENT_VOLUMES})

# Built-in resources beyond kcms.apis.objects.WELL_KNOWN whose singular is not plural-minus-"s".
_EXTRA = [
    ("", "events", "event"),
    ("", "limitranges", "limitrange"),
    ("", "podtemplates", "podtemplate"),
    ("", "resourcequotas", "resourcequota"),
    ("", "secrets", "secret"),
    ("", "componentstatuses", "componentstatus"),
    ("discovery.k8s.io", "endpointslices", "endpointslice"),
    ("networking.k8s.io", "networkpolicies", "networkpolicy"),
    ("networking.k8s.io", "ingressclasses", "ingressclass"),
    ("apps", "controllerrevisions", "controllerrevision"),
    ("rbac.authorization.k8s.io", "roles", "role"),
    ("rbac.authorization.k8s.io", "rolebindings", "rolebinding"),
    ("rbac.authorization.k8s.io", "clusterroles", "clusterrole"),
    ("rbac.authorization.k8s.io", "clusterrolebindings", "clusterrolebinding"),
    ("storage.k8s.io", "volumeattachments", "volumeattachment"),
    ("storage.k8s.io", "csidrivers", "csidriver"),
    ("storage.k8s.io", "csinodes", "csinode"),
    ("scheduling.k8s.io", "priorityclasses", "priorityclass"),
    ("node.k8s.io", "runtimeclasses", "runtimeclass"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "customresourcedefinition"),
    ("apiregistration.k8s.io", "apiservices", "apiservice"),
    ("certificates.k8s.io", "certificatesigningrequests", "certificatesigningrequest"),
]


def _build_known() -> tuple[dict[str, GroupResource], dict[GroupResource, str]]:
    """(singular or plural or "plural.group" or "singular.group" -> group-resource, group-resource -> singular)."""
    by_name: dict[str, GroupResource] = {}
    singular: dict[GroupResource, str] = {}
    rows = [(info.group, info.resource, info.kind.lower()) for info in WELL_KNOWN.values()] + _EXTRA
    for group, plural, single in rows:
        gr = GroupResource(group, plural)
        singular[gr] = single
        for name in (plural, single):
            by_name.setdefault(name, gr)  # the core group and the older entries win a short-name clash
            if group:
                by_name[f"{name}.{group}"] = gr
    return by_name, singular


_KNOWN, _SINGULAR = _build_known()


def guess_plural(singular: str) -> str:
    """Kubernetes' ``UnsafeGuessKindToResource`` plural of a lower-case singular."""
    if not singular:
        return singular
    if singular.endswith("s"):
        return singular + "es"
    if singular.endswith("y"):
        return singular[:-1] + "ies"
    return singular + "s"


def singular_of(gr: GroupResource) -> str:
    """The singular name of ``gr`` (what ``.Resource`` is in a label template): the table's, else the
    plural with the guessed suffix removed."""
    known = _SINGULAR.get(gr)
    if known:
        return known
    name = gr.resource
    if name.endswith("ies"):
        return name[:-3] + "y"
    if name.endswith("ses"):
        return name[:-2]
    if name.endswith("s"):
        return name[:-1]
    return name


def resolve_known(group: str, resource: str) -> GroupResource | None:
    """Normalize a group-resource the way a RESTMapper does, for the built-in resources.

    ``("", "pod")`` and ``("", "pods")`` -> ``pods``; ``("", "deployment")`` -> ``deployments.apps`` (the
    group is found from the resource, as ``kubectl get deployment`` finds it); ``("apps", "deployment")``
    -> ``deployments.apps``. Anything else is ``None``: a label read through a ``template`` is then not a
    resource label, as with the adapter when its RESTMapper does not know the name."""
    resource = resource.lower()
    if not resource:
        return None
    return _KNOWN.get(f"{resource}.{group}" if group else resource)


def _resolve_override(
    group: str, resource: str, resolve: Callable[[str, str], GroupResource | None]
) -> GroupResource:
    """An override is always a resource (the adapter refuses to start when its RESTMapper cannot find
    it; KCMS cannot ask the cluster at load time, so an unknown core-group name is kept as written,
    pluralized)."""
    found = resolve(group, resource)
    if found is not None:
        return found
    name = resource.lower()
    return GroupResource(group, name if name.endswith("s") else guess_plural(name))


def _sanitize_group(group: str) -> str:
    return group.replace(".", "_").replace("-", "_")


class ResourceMapper:
    """A rule's ``resources``: label <-> group-resource, by overrides first, then the template."""

    def __init__(
        self,
        overrides: Mapping[str, tuple[str, str]] | None = None,
        template: Template | None = None,
        *,
        namespaced: bool = True,
        resolve: Callable[[str, str], GroupResource | None] = resolve_known,
    ) -> None:
        self.namespaced = namespaced
        self._resolve = resolve
        self._template = template
        self._label_to_gr: dict[str, GroupResource] = {}
        self._gr_to_label: dict[GroupResource, str] = {}
        # the adapter builds its maps from a Go map (random order): with two labels for one group-resource
        # it is undefined which wins; here the first in the file does
        for label, (group, resource) in (overrides or {}).items():
            gr = _resolve_override(group, resource, resolve)
            self._label_to_gr[label] = gr
            self._gr_to_label.setdefault(gr, label)
        self._label_re: re.Pattern[str] | None = None
        self._group_in_template = False
        if template is not None:
            regex = template.render({"Group": "(?P<group>.+?)", "Resource": "(?P<resource>.+?)"})
            if not regex:
                raise ValueError("unable to convert label template to matcher: empty template")
            if "(?P<resource>" not in regex:
                raise ValueError("must include at least `<<.Resource>>` in the label template")
            try:
                self._label_re = re.compile("^" + regex + "$")
            except re.error as exc:
                raise ValueError(f"unable to convert label template to matcher: {exc}") from None
            self._group_in_template = "(?P<group>" in regex
        self._cache: dict[str, GroupResource | None] = {}
        self.namespace_label: str | None = self.label_for(NAMESPACES)

    @property
    def overrides(self) -> dict[str, GroupResource]:
        return dict(self._label_to_gr)

    def label_for(self, gr: GroupResource) -> str | None:
        """The series label naming objects of ``gr`` (override, else the template), or None."""
        label = self._gr_to_label.get(gr)
        if label is not None:
            return label
        if self._template is None:
            return None
        try:
            label = self._template.render({"Group": _sanitize_group(gr.group), "Resource": singular_of(gr)})
        except TemplateError:
            return None
        return label or None

    def resource_for_label(self, label: str) -> GroupResource | None:
        """The group-resource a label names, or None when it names none."""
        found = self._label_to_gr.get(label)
        if found is not None:
            return found
        if self._label_re is None or label == "__name__":
            return None
        if label in self._cache:
            return self._cache[label]
        result: GroupResource | None = None
        m = self._label_re.match(label)
        if m:
            group = m.group("group") if self._group_in_template else ""
            result = self._resolve(group, m.group("resource"))
        if len(self._cache) < 10_000:  # label names are few; the bound only guards a pathological backend
            self._cache[label] = result
        return result

    def resources_in(self, labels: Mapping[str, str] | list[str] | tuple[str, ...]) -> list[GroupResource]:
        """The group-resources a series with these labels describes, in label order, without repeats."""
        out: list[GroupResource] = []
        for label in labels:
            gr = self.resource_for_label(label)
            if gr is not None and gr not in out:
                out.append(gr)
        return out

    def metrics_in(
        self, labels: Mapping[str, str] | list[str] | tuple[str, ...]
    ) -> list[tuple[GroupResource, bool]]:
        """``(group-resource, namespaced)`` for each resource of a series, as prometheus-adapter lists them.

        The adapter's rule (``ResourcesForSeries`` + series registry): a series is namespaced when any of
        its labels (resource or not) is other than a namespace/node/persistentvolume label; a metric
        about namespaces, nodes or persistentvolumes is never namespaced."""
        names = [label for label in labels if label != "__name__"]
        resources = self.resources_in(names)
        namespaced = any(self.resource_for_label(label) not in CLUSTER_SCOPED for label in names)
        return [(gr, namespaced and gr not in CLUSTER_SCOPED) for gr in resources]
