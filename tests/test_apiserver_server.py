"""The aggregated-API-server kit over real HTTPS: authentication and authorization (see also
test_apiserver_discovery.py, test_apiserver_tls.py and test_apiserver_kube.py)."""

from __future__ import annotations

import ssl

import aiohttp
import pytest
from _apiserver_helpers import (
    GROUP,
    PKI,
    WIDGET_TABLE,  # noqa: F401  (re-exported: other test modules import it from here)
    admin_fixture,  # noqa: F401  (pytest fixture)
    default_authn,
    fetch,
    front_fixture,  # noqa: F401  (pytest fixture)
    make_pki,  # noqa: F401  (re-exported: other test modules import it from here)
    pki_fixture,  # noqa: F401  (pytest fixture)
    running,
    toy_group,  # noqa: F401  (re-exported: other test modules import it from here)
    widget,  # noqa: F401  (re-exported: other test modules import it from here)
)
from multidict import CIMultiDict
from prometheus_client import REGISTRY

from kcms.apiserver import AuthzOptions
from kcms.model import RequestAttributes, UserInfo

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
