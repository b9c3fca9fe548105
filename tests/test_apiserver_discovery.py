"""The aggregated-API-server kit over real HTTPS: discovery, content negotiation, tables, gzip,
errors, own metrics, health and OpenAPI."""

from __future__ import annotations

import ssl

import pytest
from _apiserver_helpers import (
    GROUP,
    PKI,
    admin_fixture,  # noqa: F401  (pytest fixture)
    default_authn,
    fetch,
    pki_fixture,  # noqa: F401  (pytest fixture)
    running,
    toy_group,
    widget,
)

from kcms.apiserver import AggregatedAPIServer, AuthzOptions, ServingOptions

# ---- discovery, negotiation, errors ---------------------------------------------------------------


async def test_discovery_documents(pki: PKI, admin: ssl.SSLContext) -> None:
    v2 = toy_group()
    v2.version = "v2"
    v2.preferred = True
    async with running(pki) as server:
        status, _, groups = await fetch(server, admin, "/apis")
        assert status == 200
        assert groups == {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": GROUP,
                    "versions": [{"groupVersion": f"{GROUP}/v1", "version": "v1"}],
                    "preferredVersion": {"groupVersion": f"{GROUP}/v1", "version": "v1"},
                }
            ],
        }
        _, _, group = await fetch(server, admin, f"/apis/{GROUP}")
        assert group["kind"] == "APIGroup" and group["name"] == GROUP
        _, _, rl = await fetch(server, admin, f"/apis/{GROUP}/v1")
        assert rl["kind"] == "APIResourceList" and rl["groupVersion"] == f"{GROUP}/v1"
        assert rl["resources"][0]["name"] == "widgets"
        for path in ("/apis/nope.example.com", "/apis/nope.example.com/v1", f"/apis/{GROUP}/v9", "/api"):
            status, _, body = await fetch(server, admin, path)
            assert status == 404 and body["reason"] == "NotFound", path
    server = AggregatedAPIServer(
        ServingOptions(
            secure_port=0,
            bind_address="127.0.0.1",
            tls_cert_file=pki.files["cert"],
            tls_private_key_file=pki.files["key"],
        ),
        default_authn(pki),
        AuthzOptions(),
    )
    server.install(toy_group())
    server.install(v2)
    await server.start()
    try:
        _, _, group = await fetch(server, admin, f"/apis/{GROUP}")
        assert group["preferredVersion"]["version"] == "v2"
        assert [v["version"] for v in group["versions"]] == ["v2", "v1"]
    finally:
        await server.stop()


async def test_callable_resources_are_evaluated_per_request(pki: PKI, admin: ssl.SSLContext) -> None:
    names = ["a"]
    gv = toy_group()
    gv.resources = lambda: [
        {"name": n, "singularName": "", "namespaced": True, "kind": "MetricValueList", "verbs": ["get"]}
        for n in names
    ]
    async with running(pki, group=gv) as server:
        assert [r["name"] for r in (await fetch(server, admin, f"/apis/{GROUP}/v1"))[2]["resources"]] == ["a"]
        names.append("pods/requests")
        assert [r["name"] for r in (await fetch(server, admin, f"/apis/{GROUP}/v1"))[2]["resources"]] == [
            "a",
            "pods/requests",
        ]


TABLE_ACCEPT = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"


async def test_table_output(pki: PKI, admin: ssl.SSLContext) -> None:
    async with running(pki) as server:
        status, headers, table = await fetch(
            server, admin, f"/apis/{GROUP}/v1/widgets", {"Accept": TABLE_ACCEPT}
        )
        assert status == 200 and headers["Content-Type"] == "application/json"
        assert table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
        assert table["metadata"] == {"resourceVersion": "7"}
        assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Size"]
        assert [r["cells"] for r in table["rows"]] == [["w0", 0], ["w1", 1], ["w2", 2]]
        assert table["rows"][0]["object"] == {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"name": "w0", "creationTimestamp": "2026-01-01T00:00:00Z"},
        }
        _, _, table = await fetch(
            server, admin, f"/apis/{GROUP}/v1/widgets/w2?includeObject=Object", {"Accept": TABLE_ACCEPT}
        )
        assert table["rows"] == [{"cells": ["w2", 2], "object": widget("w2", 2)}]
        _, _, table = await fetch(
            server, admin, f"/apis/{GROUP}/v1/widgets?includeObject=None", {"Accept": TABLE_ACCEPT}
        )
        assert all("object" not in r for r in table["rows"])
        _, _, table = await fetch(
            server,
            admin,
            f"/apis/{GROUP}/v1/widgets",
            {"Accept": "application/json;as=Table;v=v1beta1;g=meta.k8s.io"},
        )
        assert table["apiVersion"] == "meta.k8s.io/v1beta1"
        assert table["rows"][0]["object"]["apiVersion"] == "meta.k8s.io/v1beta1"
        status, _, body = await fetch(
            server, admin, f"/apis/{GROUP}/v1/widgets?includeObject=Bogus", {"Accept": TABLE_ACCEPT}
        )
        assert status == 400 and body["reason"] == "BadRequest"


async def test_content_negotiation(pki: PKI, admin: ssl.SSLContext) -> None:
    path = f"/apis/{GROUP}/v1/widgets/w1"
    async with running(pki) as server:
        for accept in (
            "application/vnd.kubernetes.protobuf, */*",
            "application/json",
            "application/*",
            "*/*",
        ):
            status, headers, body = await fetch(server, admin, path, {"Accept": accept})
            assert status == 200 and headers["Content-Type"] == "application/json", accept
            assert body == widget("w1", 1)
        status, headers, body = await fetch(server, admin, path, skip=("Accept",))
        assert status == 200 and body == widget("w1", 1)
        for accept in (
            "application/yaml",
            "application/vnd.kubernetes.protobuf",
            "text/html",
            "application/json;q=0",
        ):
            status, _, body = await fetch(server, admin, path, {"Accept": accept})
            assert status == 406 and body["reason"] == "NotAcceptable", accept
        # discovery documents negotiate too
        status, _, _ = await fetch(server, admin, "/apis", {"Accept": "application/yaml"})
        assert status == 406
        status, _, body = await fetch(
            server,
            admin,
            "/apis",
            {
                "Accept": "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
            },
        )
        assert status == 200 and body["kind"] == "APIGroupList"

    # the aggregated discovery form, when enabled, answers what newer aggregators ask for
    server = AggregatedAPIServer(
        ServingOptions(
            secure_port=0,
            bind_address="127.0.0.1",
            tls_cert_file=pki.files["cert"],
            tls_private_key_file=pki.files["key"],
        ),
        default_authn(pki),
        AuthzOptions(),
        aggregated_discovery=True,
    )
    server.install(toy_group())
    await server.start()
    try:
        accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
        status, headers, body = await fetch(server, admin, "/apis", {"Accept": accept})
        assert status == 200
        assert (
            headers["Content-Type"] == "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
        )
        assert body["kind"] == "APIGroupDiscoveryList" and body["apiVersion"] == "apidiscovery.k8s.io/v2"
        version = body["items"][0]["versions"][0]
        assert body["items"][0]["metadata"]["name"] == GROUP and version["version"] == "v1"
        assert version["resources"][0] == {
            "resource": "widgets",
            "responseKind": {"group": "", "version": "", "kind": "Widget"},
            "scope": "Cluster",
            "singularResource": "widget",
            "verbs": ["get", "list"],
        }
        assert (await fetch(server, admin, "/apis", {"Accept": "application/json"}))[2][
            "kind"
        ] == "APIGroupList"
    finally:
        await server.stop()


async def test_gzip_for_large_bodies_only(pki: PKI, admin: ssl.SSLContext) -> None:
    async with running(pki, group=toy_group(n_widgets=50)) as server:
        status, headers, body = await fetch(
            server, admin, f"/apis/{GROUP}/v1/widgets", {"Accept-Encoding": "gzip"}
        )
        assert status == 200 and headers.get("Content-Encoding") == "gzip"
        assert len(body["items"]) == 50
        status, headers, body = await fetch(
            server, admin, f"/apis/{GROUP}/v1/widgets", {"Accept-Encoding": "identity"}
        )
        assert "Content-Encoding" not in headers and len(body["items"]) == 50
        status, headers, body = await fetch(
            server, admin, f"/apis/{GROUP}/v1/widgets/w1", {"Accept-Encoding": "gzip"}
        )
        assert "Content-Encoding" not in headers and body["size"] == 1


async def test_error_statuses(pki: PKI, admin: ssl.SSLContext, caplog: pytest.LogCaptureFixture) -> None:
    async with running(pki) as server:
        status, _, body = await fetch(server, admin, "/no/such/path")
        assert status == 404
        assert body["message"] == "the server could not find the requested resource" and body["code"] == 404
        status, _, body = await fetch(server, admin, f"/apis/{GROUP}/v1/widgets/nope")
        assert status == 404 and body["message"] == f'widgets.{GROUP} "nope" not found'
        assert body["details"] == {"name": "nope", "group": GROUP, "kind": "widgets"}
        status, _, body = await fetch(server, admin, f"/apis/{GROUP}/v1/widgets", method="POST")
        assert status == 405 and body["reason"] == "MethodNotAllowed"
        status, _, body = await fetch(server, admin, f"/apis/{GROUP}/v1/boom")
        assert status == 500 and body["reason"] == "InternalError"
        assert "kaboom" in body["message"]
        assert any(r.exc_info and "kaboom" in str(r.exc_info[1]) for r in caplog.records)
        # own metrics counted those requests
        status, headers, text = await fetch(server, admin, "/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain")
        assert (
            f'kcms_apiserver_requests_total{{code="500",group="{GROUP}",resource="boom",verb="list"}}' in text
        )
        assert "kcms_apiserver_request_duration_seconds_bucket" in text
        assert 'kcms_apiserver_authentication_attempts_total{method="x509"}' in text
        # unknown paths do not become label values
        assert "/no/such/path" not in text and 'resource="nope"' not in text
        await fetch(server, admin, f"/apis/{GROUP}/v1/random-{id(server)}")
        assert f"random-{id(server)}" not in (await fetch(server, admin, "/metrics"))[2]


# ---- health ---------------------------------------------------------------------------------------


async def test_health_checks(pki: PKI, admin: ssl.SSLContext) -> None:
    state = {"db": True}
    anon = pki.client_ctx()
    async with running(pki) as server:
        server.add_check("db", lambda: (state["db"], "db unreachable"), livez=False, readyz=True)
        assert (await fetch(server, anon, "/readyz"))[:3:2] == (200, "ok")
        status, _, text = await fetch(server, anon, "/readyz?verbose")
        assert status == 200 and "[+]ping ok" in text and "[+]db ok" in text
        state["db"] = False
        status, _, text = await fetch(server, anon, "/readyz")
        assert status == 500 and "[-]db failed: db unreachable" in text and "readyz check failed" in text
        assert (await fetch(server, anon, "/livez"))[0] == 200
        # single checks are not in the default always-allow paths (as in kube)
        assert (await fetch(server, anon, "/readyz/db"))[0] == 401
        assert (await fetch(server, admin, "/readyz/db"))[0] == 500
        assert (await fetch(server, admin, "/readyz/ping"))[0] == 200
        assert (await fetch(server, admin, "/readyz/nope"))[0] == 404
        status, _, text = await fetch(server, anon, "/readyz?exclude=db")
        assert status == 200
        state["db"] = True
        server.set_shutting_down()
        status, _, text = await fetch(server, anon, "/readyz")
        assert status == 500 and "[-]shutdown failed" in text
        assert (await fetch(server, anon, "/livez"))[0] == 200


# ---- OpenAPI --------------------------------------------------------------------------------------


async def test_openapi_v2_etag_and_v3(pki: PKI, admin: ssl.SSLContext) -> None:
    async with running(pki) as server:
        status, headers, doc = await fetch(server, admin, "/openapi/v2")
        assert status == 200 and doc["swagger"] == "2.0"
        assert "com.example.toy.v1.Widget" in doc["definitions"]
        assert f"/apis/{GROUP}/v1/widgets/{{name}}" in doc["paths"]
        assert doc["paths"][f"/apis/{GROUP}/v1/widgets"]["get"]["responses"]["200"]
        etag = headers["ETag"]
        status, headers, _ = await fetch(server, admin, "/openapi/v2", {"If-None-Match": etag})
        assert status == 304 and headers["ETag"] == etag
        status, _, _ = await fetch(server, admin, "/openapi/v2", {"If-None-Match": '"other"'})
        assert status == 200
        status, _, index = await fetch(server, admin, "/openapi/v3")
        url = index["paths"][f"apis/{GROUP}/v1"]["serverRelativeURL"]
        assert url.startswith(f"/openapi/v3/apis/{GROUP}/v1?hash=")
        status, headers, v3 = await fetch(server, admin, url)
        assert status == 200 and v3["openapi"] == "3.0.0"
        op = v3["paths"][f"/apis/{GROUP}/v1/widgets/{{name}}"]["get"]
        assert op["responses"]["200"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/com.example.toy.v1.Widget"
        }
        assert "com.example.toy.v1.Widget" in v3["components"]["schemas"]
        assert (await fetch(server, admin, url, {"If-None-Match": headers["ETag"]}))[0] == 304
        assert (await fetch(server, admin, f"/openapi/v3/apis/{GROUP}/v9"))[0] == 404
