"""Request attributes (kube RequestInfoFactory rules), Accept negotiation, Table rendering and
forbidden wording of the aggregated-API-server kit, without a network."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kcms.apiserver.authz import forbidden_error, path_always_allowed
from kcms.apiserver.discovery import APIGroupVersion
from kcms.apiserver.openapi import v2_document, v3_document
from kcms.apiserver.requestinfo import request_attributes
from kcms.apiserver.responses import StatusError, negotiate, parse_accept, to_table
from kcms.model import RequestAttributes, UserInfo


def attrs(path: str, method: str = "GET", **query: str) -> RequestAttributes:
    return request_attributes(method, path, query)


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/apis",
        "/apis/",
        "/apis/metrics.k8s.io",
        "/apis/metrics.k8s.io/v1beta1",
        "/api",
        "/api/v1",
        "/openapi/v2",
        "/openapi/v3/apis/metrics.k8s.io/v1beta1",
        "/metrics",
        "/healthz",
        "/readyz/ping",
        "/version",
    ],
)
def test_non_resource_paths(path: str) -> None:
    a = attrs(path)
    assert a == RequestAttributes(verb="get", path=path, resource_request=False)
    assert attrs(path, "HEAD").verb == "head"


def test_resource_paths() -> None:
    a = attrs("/apis/metrics.k8s.io/v1beta1/nodes")
    assert (a.verb, a.api_group, a.api_version, a.resource, a.name, a.namespace) == (
        "list",
        "metrics.k8s.io",
        "v1beta1",
        "nodes",
        "",
        "",
    )
    assert a.resource_request
    a = attrs("/apis/metrics.k8s.io/v1beta1/nodes/n1")
    assert (a.verb, a.resource, a.name) == ("get", "nodes", "n1")
    a = attrs("/apis/metrics.k8s.io/v1beta1/namespaces/kube-system/pods")
    assert (a.verb, a.namespace, a.resource, a.name) == ("list", "kube-system", "pods", "")
    a = attrs("/apis/metrics.k8s.io/v1beta1/namespaces/kube-system/pods/p1")
    assert (a.verb, a.namespace, a.resource, a.name) == ("get", "kube-system", "pods", "p1")
    a = attrs("/apis/metrics.k8s.io/v1beta1/pods", watch="true")
    assert a.verb == "watch"
    assert attrs("/apis/metrics.k8s.io/v1beta1/pods", watch="false").verb == "list"
    assert attrs("/apis/metrics.k8s.io/v1beta1/pods", watch="0").verb == "list"
    a = attrs("/apis/metrics.k8s.io/v1beta1/nodes", fieldSelector="metadata.name=n7")
    assert (a.verb, a.name) == ("list", "n7")
    assert attrs("/apis/metrics.k8s.io/v1beta1/nodes", fieldSelector="metadata.name!=n7").name == ""
    a = attrs("/api/v1/namespaces/default/pods/p/log")
    assert (a.api_group, a.api_version, a.resource, a.name, a.subresource, a.namespace) == (
        "",
        "v1",
        "pods",
        "p",
        "log",
        "default",
    )
    a = attrs("/apis/apps/v1/watch/namespaces/ns/deployments")
    assert (a.verb, a.namespace, a.resource) == ("watch", "ns", "deployments")


def test_custom_and_external_metrics_paths() -> None:
    a = attrs("/apis/custom.metrics.k8s.io/v1beta2/namespaces/ns/pods/*/requests")
    assert (a.verb, a.namespace, a.resource, a.name, a.subresource) == ("get", "ns", "pods", "*", "requests")
    a = attrs("/apis/custom.metrics.k8s.io/v1beta2/nodes/n1/load")
    assert (a.verb, a.namespace, a.resource, a.name, a.subresource) == ("get", "", "nodes", "n1", "load")
    a = attrs("/apis/custom.metrics.k8s.io/v1beta2/namespaces/ns/metrics/queue_len")
    assert (a.namespace, a.resource, a.name, a.subresource) == ("ns", "metrics", "queue_len", "")
    a = attrs("/apis/external.metrics.k8s.io/v1beta1/namespaces/ns/queue_messages")
    assert (a.verb, a.namespace, a.resource, a.name) == ("list", "ns", "queue_messages", "")
    # a bare namespaces/<ns> is the namespace object itself
    a = attrs("/api/v1/namespaces/ns")
    assert (a.verb, a.namespace, a.resource, a.name) == ("get", "ns", "namespaces", "ns")
    a = attrs("/api/v1/namespaces/ns/status", "PUT")
    assert (a.verb, a.resource, a.name, a.subresource) == ("update", "namespaces", "ns", "status")


def test_method_verbs() -> None:
    p = "/apis/g.example.com/v1/things"
    assert attrs(p, "POST").verb == "create"
    assert attrs(p + "/a", "PUT").verb == "update"
    assert attrs(p + "/a", "PATCH").verb == "patch"
    assert attrs(p + "/a", "DELETE").verb == "delete"
    assert attrs(p, "DELETE").verb == "deletecollection"


@given(
    st.lists(st.text(alphabet="abc*-._", min_size=1, max_size=5), max_size=6),
    st.sampled_from(["GET", "POST", "PUT"]),
)
def test_request_attributes_never_fail(segments: list[str], method: str) -> None:
    path = "/apis/" + "/".join(segments)
    a = request_attributes(method, path, {})
    assert a.path == path
    if a.resource_request:
        assert a.resource and a.api_version


def test_accept_parsing_and_negotiation() -> None:
    ranges = parse_accept("text/html;q=0.5, application/json;as=Table;v=v1;g=meta.k8s.io, */*;q=0.1")
    assert [(r.type, r.subtype) for r in ranges] == [("application", "json"), ("text", "html"), ("*", "*")]
    assert negotiate(None).table_version is None
    assert negotiate("").table_version is None
    assert negotiate("application/vnd.kubernetes.protobuf, */*").table_version is None
    assert negotiate("application/json;as=Table;v=v1beta1;g=meta.k8s.io").table_version == "v1beta1"
    assert (
        negotiate(
            "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io, application/json"
        ).table_version
        is None
    )
    for bad in (
        "application/yaml",
        "application/vnd.kubernetes.protobuf",
        "application/json;as=Table;v=v2;g=meta.k8s.io",
    ):
        with pytest.raises(StatusError) as e:
            negotiate(bad)
        assert e.value.code == 406


def test_forbidden_wording() -> None:
    u = UserInfo("jo")
    e = forbidden_error(u, attrs("/apis/metrics.k8s.io/v1beta1/namespaces/ns/pods"), "")
    assert e.message == (
        'pods.metrics.k8s.io is forbidden: User "jo" cannot list resource "pods" in API group '
        '"metrics.k8s.io" in the namespace "ns"'
    )
    e = forbidden_error(u, attrs("/apis/custom.metrics.k8s.io/v1beta2/namespaces/ns/pods/*/requests"), "why")
    assert e.message == (
        'pods.custom.metrics.k8s.io "*" is forbidden: User "jo" cannot get resource "pods/requests" in API '
        'group "custom.metrics.k8s.io" in the namespace "ns": why'
    )
    assert e.status()["details"] == {"name": "*", "group": "custom.metrics.k8s.io", "kind": "pods"}
    assert path_always_allowed("/healthz", ["/healthz"])
    assert not path_always_allowed("/healthz/ping", ["/healthz"])
    assert path_always_allowed("/healthz/ping", ["/healthz/*"])


def test_table_of_single_object_and_list() -> None:
    from kcms.apiserver.responses import DEFAULT_TABLE

    obj = {"kind": "X", "metadata": {"name": "a", "creationTimestamp": "t", "resourceVersion": "5"}}
    t = to_table(obj, DEFAULT_TABLE, "v1", "Metadata")
    assert t["metadata"] == {"resourceVersion": "5"}
    assert t["rows"][0]["cells"] == ["a", "t"]
    t = to_table(
        {"metadata": {"resourceVersion": "9", "selfLink": "x"}, "items": [obj, obj]},
        DEFAULT_TABLE,
        "v1",
        "None",
    )
    assert t["metadata"] == {"resourceVersion": "9"} and len(t["rows"]) == 2


def test_openapi_documents_shapes() -> None:
    async def h(request):  # pragma: no cover - never called
        raise AssertionError

    gv = APIGroupVersion(
        "metrics.k8s.io",
        "v1beta1",
        [],
        routes=[
            ("GET", "/nodes", h),
            ("GET", "/nodes/{name}", h),
            ("GET", "/namespaces/{namespace}/pods/{name}", h),
        ],
        openapi_definitions={
            "io.k8s.metrics.pkg.apis.metrics.v1beta1.NodeMetrics": {
                "type": "object",
                "properties": {
                    "metadata": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
                },
                "x-kubernetes-group-version-kind": [
                    {"group": "metrics.k8s.io", "kind": "NodeMetrics", "version": "v1beta1"}
                ],
            }
        },
    )
    v2 = v2_document([gv])
    item = v2["paths"]["/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods/{name}"]
    assert [p["name"] for p in item["parameters"]] == ["namespace", "name"]
    assert item["get"]["operationId"]
    assert item["get"]["x-kubernetes-action"] == "get"
    assert v2["paths"]["/apis/metrics.k8s.io/v1beta1/nodes"]["get"]["x-kubernetes-action"] == "list"
    v3 = v3_document(gv)
    schema = v3["components"]["schemas"]["io.k8s.metrics.pkg.apis.metrics.v1beta1.NodeMetrics"]
    assert (
        schema["properties"]["metadata"]["$ref"]
        == "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    )
    p = v3["paths"]["/apis/metrics.k8s.io/v1beta1/nodes/{name}"]["parameters"][0]
    assert p == {
        "name": "name",
        "in": "path",
        "description": "name of the object",
        "required": True,
        "schema": {"type": "string"},
    }
