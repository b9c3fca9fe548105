"""Kubernetes access: config loading and a slim JSON client, list+watch caches, inventories, reviews,
Lease leader election and store membership."""

from kcms.kube.client import KubeAPIError, KubeClient, KubeConfigError
from kcms.kube.informer import Informer
from kcms.kube.inventory import KubeInventory, StaticInventory
from kcms.kube.lease import LeaderElector, default_identity
from kcms.kube.members import EndpointSliceMembers, Member, StaticMembers, parse_static_members
from kcms.kube.objects import node_from_json, pod_from_json
from kcms.kube.reviews import (
    AccessReviewer,
    ReviewError,
    TokenReviewer,
    read_extension_apiserver_authentication,
)

__all__ = [
    "AccessReviewer",
    "EndpointSliceMembers",
    "LeaderElector",
    "Member",
    "StaticMembers",
    "default_identity",
    "parse_static_members",
    "Informer",
    "KubeAPIError",
    "KubeClient",
    "KubeConfigError",
    "KubeInventory",
    "ReviewError",
    "StaticInventory",
    "TokenReviewer",
    "node_from_json",
    "pod_from_json",
    "read_extension_apiserver_authentication",
]
