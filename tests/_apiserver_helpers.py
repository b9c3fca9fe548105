"""Helpers and fixtures shared by the aggregated-API-server tests (test_apiserver_*.py): a toy API
group, a per-test PKI, a running server and a one-shot HTTPS fetch. Fixtures are declared with
``name=`` so that test modules can import them without shadowing warnings."""

from __future__ import annotations

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


@pytest.fixture(name="pki")
def pki_fixture(ca: trustme.CA, tmp_path: Path) -> PKI:
    return make_pki(ca, tmp_path)


@pytest.fixture(name="admin")
def admin_fixture(pki: PKI) -> ssl.SSLContext:
    """A client certificate from the client CA in system:masters (always allowed)."""
    return pki.client_ctx(
        pki.client_ca.issue_cert("admin", common_name="admin", organization_name="system:masters")
    )


@pytest.fixture(name="front")
def front_fixture(pki: PKI) -> ssl.SSLContext:
    """The aggregator's front-proxy client certificate."""
    return pki.client_ctx(pki.front_ca.issue_cert("front-proxy-client", common_name="front-proxy-client"))
