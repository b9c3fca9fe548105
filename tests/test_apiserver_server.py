"""The aggregated-API-server kit over real HTTPS: authentication, authorization, discovery,
negotiation, errors, health, OpenAPI, own metrics and TLS (see also test_apiserver_kube.py)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from aiohttp import web
from cryptography import x509
from multidict import CIMultiDict
from prometheus_client import REGISTRY

from kcms.apiserver import (
    AggregatedAPIServer,
    APIGroupVersion,
    AuthnOptions,
    AuthzOptions,
    ServingOptions,
    TableConverter,
    not_found,
    respond,
)
from kcms.model import RequestAttributes, UserInfo

GROUP = "toy.example.com"

# ---- helpers shared with test_apiserver_kube.py ---------------------------------------------------


def widget(name: str, size: int = 1) -> dict[str, Any]:
    return {
        "kind": "Widget",
        "apiVersion": f"{GROUP}/v1",
        "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "size": size,
    }


WIDGET_TABLE = TableConverter(
    columns=[
        {"name": "Name", "type": "string", "format": "name", "description": "name", "priority": 0},
        {"name": "Size", "type": "integer", "format": "", "description": "size", "priority": 0},
    ],
    row=lambda obj: [obj["metadata"]["name"], obj["size"]],
)


def toy_group(n_widgets: int = 3) -> APIGroupVersion:
    """A small API group: cluster-scoped widgets, a whoami endpoint and a failing endpoint."""
    widgets = {f"w{i}": widget(f"w{i}", i) for i in range(n_widgets)}

    async def list_widgets(request: web.Request) -> web.StreamResponse:
        body = {
            "kind": "WidgetList",
            "apiVersion": f"{GROUP}/v1",
            "metadata": {"resourceVersion": "7"},
            "items": list(widgets.values()),
        }
        return respond(request, body, table=WIDGET_TABLE)

    async def get_widget(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in widgets:
            raise not_found(GROUP, "widgets", name)
        return respond(request, widgets[name], table=WIDGET_TABLE)

    async def whoami(request: web.Request) -> web.StreamResponse:
        user: UserInfo = request["user"]
        attrs: RequestAttributes = request["attributes"]
        return respond(
            request,
            {
                "name": user.name,
                "uid": user.uid,
                "groups": list(user.groups),
                "extra": {k: list(v) for k, v in user.extra},
                "verb": attrs.verb,
                "resource": attrs.resource,
            },
        )

    async def boom(request: web.Request) -> web.StreamResponse:
        raise RuntimeError("kaboom")

    return APIGroupVersion(
        group=GROUP,
        version="v1",
        resources=[
            {
                "name": "widgets",
                "singularName": "widget",
                "namespaced": False,
                "kind": "Widget",
                "verbs": ["get", "list"],
            },
        ],
        routes=[
            ("GET", "/widgets", list_widgets),
            ("GET", "/widgets/{name}", get_widget),
            ("GET", "/whoami", whoami),
            ("GET", "/boom", boom),
        ],
        openapi_definitions={
            "com.example.toy.v1.Widget": {
                "type": "object",
                "properties": {"size": {"type": "integer"}},
                "x-kubernetes-group-version-kind": [{"group": GROUP, "version": "v1", "kind": "Widget"}],
            }
        },
        openapi_paths={
            "/widgets/{name}": {
                "get": {
                    "produces": ["application/json"],
                    "responses": {
                        "200": {
                            "description": "OK",
                            "schema": {"$ref": "#/definitions/com.example.toy.v1.Widget"},
                        }
                    },
                }
            }
        },
    )


@dataclass
class PKI:
    """The certificates of one test server: serving (from the session CA), front proxy, client CA."""

    server_ca: trustme.CA
    front_ca: trustme.CA
    client_ca: trustme.CA
    other_ca: trustme.CA
    dir: Path
    files: dict[str, str] = field(default_factory=dict)

    def write(self, name: str, data: bytes) -> str:
        p = self.dir / name
        p.write_bytes(data)
        return str(p)

    def client_ctx(self, cert: trustme.LeafCert | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context()
        self.server_ca.configure_trust(ctx)
        if cert is not None:
            cert.configure_cert(ctx)
        return ctx


def make_pki(ca: trustme.CA, tmp_path: Path) -> PKI:
    pki = PKI(ca, trustme.CA(), trustme.CA(), trustme.CA(), tmp_path)
    serving = ca.issue_cert("127.0.0.1", "localhost")
    pki.files["cert"] = pki.write("tls.crt", serving.cert_chain_pems[0].bytes())
    pki.files["key"] = pki.write("tls.key", serving.private_key_pem.bytes())
    pki.files["front_ca"] = pki.write("front-ca.crt", pki.front_ca.cert_pem.bytes())
    pki.files["client_ca"] = pki.write("client-ca.crt", pki.client_ca.cert_pem.bytes())
    return pki


def default_authn(pki: PKI, **kw: Any) -> AuthnOptions:
    opts = AuthnOptions(
        client_ca_file=pki.files["client_ca"],
        requestheader_client_ca_file=pki.files["front_ca"],
        requestheader_allowed_names=["front-proxy-client"],
        skip_lookup=True,
    )
    for k, v in kw.items():
        setattr(opts, k, v)
    return opts


@contextlib.asynccontextmanager
async def running(
    pki: PKI,
    authn: AuthnOptions | None = None,
    authz: AuthzOptions | None = None,
    serving: ServingOptions | None = None,
    group: APIGroupVersion | None = None,
    kube_client: Any = None,
) -> AsyncIterator[AggregatedAPIServer]:
    serving = serving or ServingOptions(
        secure_port=0,
        bind_address="127.0.0.1",
        tls_cert_file=pki.files["cert"],
        tls_private_key_file=pki.files["key"],
    )
    server = AggregatedAPIServer(serving, authn or default_authn(pki), authz or AuthzOptions(), kube_client)
    server.install(group or toy_group())
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def fetch(
    server: AggregatedAPIServer,
    ctx: ssl.SSLContext,
    path: str,
    headers: Any = None,
    method: str = "GET",
    skip: tuple[str, ...] = (),
) -> tuple[int, Any, Any]:
    """(status, headers, body: parsed JSON or text) over a fresh connection."""
    async with aiohttp.ClientSession(skip_auto_headers=skip) as s:
        async with s.request(method, f"https://127.0.0.1:{server.port}{path}", ssl=ctx, headers=headers) as r:
            if r.content_type == "application/json" or r.content_type.startswith("application/json"):
                return r.status, r.headers, await r.json(content_type=None)
            return r.status, r.headers, await r.text()


# ---- fixtures -----------------------------------------------------------------------------------


@pytest.fixture
def pki(ca: trustme.CA, tmp_path: Path) -> PKI:
    return make_pki(ca, tmp_path)


@pytest.fixture
def admin(pki: PKI) -> ssl.SSLContext:
    """A client certificate from the client CA in system:masters (always allowed)."""
    return pki.client_ctx(
        pki.client_ca.issue_cert("admin", common_name="admin", organization_name="system:masters")
    )


@pytest.fixture
def front(pki: PKI) -> ssl.SSLContext:
    """The aggregator's front-proxy client certificate."""
    return pki.client_ctx(pki.front_ca.issue_cert("front-proxy-client", common_name="front-proxy-client"))


# ---- authentication -------------------------------------------------------------------------------


async def test_client_certificate_authenticates_cn_and_organizations(pki: PKI) -> None:
    cert = pki.client_ca.issue_cert("alice", common_name="alice", organization_name="system:masters")
    async with running(pki) as server:
        status, _, body = await fetch(server, pki.client_ctx(cert), f"/apis/{GROUP}/v1/whoami")
    assert status == 200, body
    assert body["name"] == "alice"
    assert body["groups"] == ["system:masters", "system:authenticated"]
    assert (body["verb"], body["resource"]) == ("list", "whoami")


async def test_front_proxy_headers_give_user_groups_extra_uid(pki: PKI, front: ssl.SSLContext) -> None:
    headers = CIMultiDict(
        [
            ("X-Remote-User", "bob"),
            ("X-Remote-Uid", "uid-1"),
            ("X-Remote-Group", "system:masters"),
            ("X-Remote-Group", "team-a"),
            ("X-Remote-Extra-Acme.com%2Fproject", "p1"),
            ("X-Remote-Extra-Acme.com%2Fproject", "p2"),
            ("X-Remote-Extra-Scopes", "s"),
        ]
    )
    async with running(pki) as server:
        status, _, body = await fetch(server, front, f"/apis/{GROUP}/v1/whoami", headers)
    assert status == 200, body
    assert body["name"] == "bob"
    assert body["uid"] == "uid-1"
    assert body["groups"] == ["system:masters", "team-a", "system:authenticated"]
    assert body["extra"] == {"acme.com/project": ["p1", "p2"], "scopes": ["s"]}


async def test_spoofed_remote_user_without_front_proxy_cert_is_rejected(
    pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    spoof = {"X-Remote-User": "admin", "X-Remote-Group": "system:masters"}
    rejected_before = REGISTRY.get_sample_value("kcms_apiserver_requestheader_rejected_total") or 0.0
    async with running(pki) as server:
        status, _, body = await fetch(server, pki.client_ctx(), f"/apis/{GROUP}/v1/whoami", spoof)
        assert status == 401
        assert REGISTRY.get_sample_value("kcms_apiserver_requestheader_rejected_total") == rejected_before + 1
        assert body == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "Unauthorized",
            "reason": "Unauthorized",
            "code": 401,
        }
        assert any("ignoring request-header identity" in r.getMessage() for r in caplog.records)
        # a certificate from the client CA authenticates as itself, never as the spoofed header user
        carol = pki.client_ctx(
            pki.client_ca.issue_cert("carol", common_name="carol", organization_name="system:masters")
        )
        status, _, body = await fetch(server, carol, f"/apis/{GROUP}/v1/whoami", spoof)
        assert status == 200 and body["name"] == "carol"
        # a certificate from a CA the server does not trust authenticates nobody
        stranger = pki.client_ctx(
            pki.other_ca.issue_cert("front-proxy-client", common_name="front-proxy-client")
        )
        try:
            status, _, body = await fetch(server, stranger, f"/apis/{GROUP}/v1/whoami", spoof)
        except (aiohttp.ClientError, ssl.SSLError, ConnectionError):
            status = -1  # handshake refused: fine, nothing was authenticated
        assert status in (-1, 401)


async def test_front_proxy_cert_with_disallowed_cn_is_rejected(pki: PKI) -> None:
    other = pki.client_ctx(pki.front_ca.issue_cert("someone-else", common_name="someone-else"))
    async with running(pki) as server:
        status, _, _ = await fetch(
            server,
            other,
            f"/apis/{GROUP}/v1/whoami",
            {"X-Remote-User": "bob", "X-Remote-Group": "system:masters"},
        )
        assert status == 401
    # with no allowed names configured, any CN from the request-header CA is accepted
    async with running(pki, authn=default_authn(pki, requestheader_allowed_names=[])) as server:
        status, _, body = await fetch(
            server,
            other,
            f"/apis/{GROUP}/v1/whoami",
            {"X-Remote-User": "bob", "X-Remote-Group": "system:masters"},
        )
        assert status == 200 and body["name"] == "bob"


async def test_front_proxy_cert_alone_without_headers_is_not_a_user(pki: PKI, front: ssl.SSLContext) -> None:
    async with running(pki) as server:
        status, _, _ = await fetch(server, front, f"/apis/{GROUP}/v1/whoami")
    assert status == 401


async def test_anonymous_allowed_when_enabled_and_always_allow_paths(pki: PKI) -> None:
    async with running(pki) as server:
        for path in ("/healthz", "/livez", "/readyz"):
            status, _, body = await fetch(server, pki.client_ctx(), path)
            assert (status, body) == (200, "ok")
        status, _, _ = await fetch(server, pki.client_ctx(), "/apis")
        assert status == 401
    async with running(pki, authn=default_authn(pki, allow_anonymous=True)) as server:
        status, _, body = await fetch(server, pki.client_ctx(), "/apis")
        # anonymous is authenticated but not authorized (no reviewer configured)
        assert status == 403
        assert body["message"] == (
            'forbidden: User "system:anonymous" cannot get path "/apis": no authorizer configured'
        )


# ---- authorization --------------------------------------------------------------------------------


class RecordingReviewer:
    """A stand-in for the remote SubjectAccessReview endpoint (kube's side, not our code)."""

    def __init__(self, allow: bool) -> None:
        self.allow = allow
        self.seen: list[tuple[UserInfo, RequestAttributes]] = []

    async def authorize(self, user: UserInfo, attrs: RequestAttributes) -> tuple[bool, str]:
        self.seen.append((user, attrs))
        return self.allow, "" if self.allow else "no RBAC policy matched"


async def test_forbidden_status_in_kube_wording(pki: PKI) -> None:
    reviewer = RecordingReviewer(allow=False)
    dave = pki.client_ctx(pki.client_ca.issue_cert("dave", common_name="dave", organization_name="dev"))
    async with running(pki, authz=AuthzOptions(access_reviewer=reviewer)) as server:
        status, _, body = await fetch(server, dave, f"/apis/{GROUP}/v1/widgets/w1")
        assert status == 403
        assert body["reason"] == "Forbidden"
        assert body["message"] == (
            f'widgets.{GROUP} "w1" is forbidden: User "dave" cannot get resource "widgets" in API group '
            f'"{GROUP}" at the cluster scope: no RBAC policy matched'
        )
        assert body["details"] == {"name": "w1", "group": GROUP, "kind": "widgets"}
        user, attrs = reviewer.seen[-1]
        assert user.groups == ("dev", "system:authenticated")
        assert (attrs.verb, attrs.resource, attrs.name, attrs.api_version) == ("get", "widgets", "w1", "v1")
        # /metrics is a non-resource path and needs authorization too
        status, _, body = await fetch(server, dave, "/metrics")
        assert status == 403
        assert body["message"] == 'forbidden: User "dave" cannot get path "/metrics": no RBAC policy matched'
        reviewer.allow = True
        status, _, _ = await fetch(server, dave, f"/apis/{GROUP}/v1/widgets/w1")
        assert status == 200


async def test_allow_all_skips_authorization_but_not_authentication(pki: PKI) -> None:
    dave = pki.client_ctx(pki.client_ca.issue_cert("dave", common_name="dave"))
    async with running(pki, authz=AuthzOptions(allow_all=True)) as server:
        assert (await fetch(server, dave, f"/apis/{GROUP}/v1/widgets"))[0] == 200
        assert (await fetch(server, pki.client_ctx(), f"/apis/{GROUP}/v1/widgets"))[0] == 401


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


# ---- TLS ------------------------------------------------------------------------------------------


async def peer_serial(port: int, cafile: str | None = None, ca: trustme.CA | None = None) -> int:
    ctx = ssl.create_default_context(cafile=cafile)
    if ca is not None:
        ca.configure_trust(ctx)
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost")
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def test_self_signed_certificate_generated(pki: PKI, tmp_path: Path) -> None:
    cert_dir = tmp_path / "certs"
    serving = ServingOptions(
        secure_port=0,
        bind_address="127.0.0.1",
        cert_dir=str(cert_dir),
        alternate_names=("kcms.kube-system.svc", "10.0.0.1"),
    )
    async with running(pki, serving=serving) as server:
        crt = cert_dir / "apiserver.crt"
        assert crt.exists() and (cert_dir / "apiserver.key").exists()
        cert = x509.load_pem_x509_certificate(crt.read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert "kcms.kube-system.svc" in sans.get_values_for_type(x509.DNSName)
        assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "10.0.0.1"}
        assert await peer_serial(server.port, cafile=str(crt)) == cert.serial_number
    # kept across restarts
    async with running(pki, serving=serving) as server:
        assert await peer_serial(server.port, cafile=str(crt)) == cert.serial_number


async def test_serving_certificate_reload(pki: PKI, caplog: pytest.LogCaptureFixture) -> None:
    serving = ServingOptions(
        secure_port=0,
        bind_address="127.0.0.1",
        tls_cert_file=pki.files["cert"],
        tls_private_key_file=pki.files["key"],
        reload_interval=0.05,
    )
    async with running(pki, serving=serving) as server:
        first = await peer_serial(server.port, ca=pki.server_ca)
        new = pki.server_ca.issue_cert("127.0.0.1", "localhost")
        pki.write("tls.key", new.private_key_pem.bytes())
        pki.write("tls.crt", new.cert_chain_pems[0].bytes())
        want = x509.load_pem_x509_certificate(new.cert_chain_pems[0].bytes()).serial_number
        assert want != first
        for _ in range(200):  # bounded wait for the poller; no timing asserted
            if server.reloader.reloads and await peer_serial(server.port, ca=pki.server_ca) == want:
                break
            await asyncio.sleep(0.05)
        assert await peer_serial(server.port, ca=pki.server_ca) == want
        # a broken pair is refused and the working one kept
        pki.write("tls.crt", b"-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n")
        assert server.reloader.check() is False
        assert server.reloader.failures >= 1
        assert any("did not load" in r.getMessage() for r in caplog.records)
        assert await peer_serial(server.port, ca=pki.server_ca) == want


async def test_tls_min_version(pki: PKI) -> None:
    serving = ServingOptions(
        secure_port=0,
        bind_address="127.0.0.1",
        tls_cert_file=pki.files["cert"],
        tls_private_key_file=pki.files["key"],
        tls_min_version="VersionTLS13",
    )
    async with running(pki, serving=serving) as server:
        ctx = pki.client_ctx()
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises((ssl.SSLError, aiohttp.ClientError)):
            await fetch(server, ctx, "/healthz")
        assert (await fetch(server, pki.client_ctx(), "/healthz"))[0] == 200
    with pytest.raises(ValueError):
        async with running(
            pki,
            serving=ServingOptions(
                secure_port=0,
                bind_address="127.0.0.1",
                tls_cert_file=pki.files["cert"],
                tls_private_key_file=pki.files["key"],
                tls_min_version="VersionTLS10",
            ),
        ):
            pass


async def test_client_ca_rotation(pki: PKI) -> None:
    old_user = pki.client_ctx(
        pki.client_ca.issue_cert("old", common_name="old", organization_name="system:masters")
    )
    new_ca = trustme.CA()
    new_user = pki.client_ctx(new_ca.issue_cert("new", common_name="new", organization_name="system:masters"))
    async with running(pki) as server:
        assert (await fetch(server, old_user, f"/apis/{GROUP}/v1/whoami"))[2]["name"] == "old"
        assert await server.refresh_authn() is False  # nothing changed
        pki.write("client-ca.crt", new_ca.cert_pem.bytes())
        assert await server.refresh_authn() is True
        status, _, body = await fetch(server, new_user, f"/apis/{GROUP}/v1/whoami")
        assert status == 200 and body["name"] == "new"
        try:
            status = (await fetch(server, old_user, f"/apis/{GROUP}/v1/whoami"))[0]
        except (aiohttp.ClientError, ssl.SSLError, ConnectionError):
            status = -1  # the old CA is no longer trusted by the TLS layer
        assert status in (-1, 401)
        # a broken CA file keeps the working configuration
        pki.write("client-ca.crt", b"not a certificate")
        assert await server.refresh_authn() is False
        assert (await fetch(server, new_user, f"/apis/{GROUP}/v1/whoami"))[0] == 200
