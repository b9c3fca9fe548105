"""The aggregated-API-server kit against the fake kube-apiserver (TokenReview, SubjectAccessReview,
the extension-apiserver-authentication ConfigMap) and read by real clients (kubectl, the official
``kubernetes`` Python client)."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import trustme
from multidict import CIMultiDict
from test_apiserver_server import GROUP, PKI, default_authn, fetch, make_pki, running

from kcms.apiserver import AuthnOptions
from kcms.kube.client import KubeClient


@pytest.fixture
def pki(ca: trustme.CA, tmp_path: Path) -> PKI:
    return make_pki(ca, tmp_path)


@pytest.fixture
async def kube(fake_kube: Any) -> Any:
    client = await KubeClient.load(str(fake_kube.kubeconfig))
    try:
        yield client
    finally:
        await client.close()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_bearer_tokens_via_token_review_are_cached(pki: PKI, fake_kube: Any, kube: Any) -> None:
    fake_kube.tokens["good"] = {
        "username": "erin",
        "uid": "u-9",
        "groups": ["dev"],
        "extra": {"scopes": ["a"]},
    }
    fake_kube.authorize = lambda spec: (spec["user"] == "erin", "erin only")
    authn = AuthnOptions(skip_lookup=True)
    async with running(pki, authn=authn, kube_client=kube) as server:
        ctx = pki.client_ctx()
        status, _, body = await fetch(server, ctx, f"/apis/{GROUP}/v1/whoami", bearer("good"))
        assert status == 200, body
        assert body["name"] == "erin" and body["uid"] == "u-9"
        assert body["groups"] == ["dev", "system:authenticated"]
        assert body["extra"] == {"scopes": ["a"]}
        reviews = len(fake_kube.token_reviews)
        assert reviews == 1
        assert (await fetch(server, ctx, f"/apis/{GROUP}/v1/whoami", bearer("good")))[0] == 200
        assert len(fake_kube.token_reviews) == reviews  # cached
        status, _, body = await fetch(server, ctx, f"/apis/{GROUP}/v1/whoami", bearer("bad"))
        assert status == 401 and body["reason"] == "Unauthorized"
        assert fake_kube.token_reviews[-1]["spec"]["token"] == "bad"
        # a bad token is a 401 even where anonymous requests pass (as kube does)
        assert (await fetch(server, ctx, f"/apis/{GROUP}/v1/whoami", {"Authorization": "Bearer "}))[0] == 401


async def test_subject_access_reviews_allow_deny_and_cache(pki: PKI, fake_kube: Any, kube: Any) -> None:
    def decide(spec: dict) -> tuple[bool, str]:
        ra = spec.get("resourceAttributes", {})
        return ra.get("name") == "w1", "only w1"

    fake_kube.authorize = decide
    frank = pki.client_ctx(pki.client_ca.issue_cert("frank", common_name="frank", organization_name="ops"))
    async with running(pki, kube_client=kube) as server:
        status, _, body = await fetch(server, frank, f"/apis/{GROUP}/v1/widgets/w1")
        assert status == 200, body
        assert len(fake_kube.access_reviews) == 1
        spec = fake_kube.access_reviews[0]["spec"]
        assert spec["user"] == "frank" and spec["groups"] == ["ops", "system:authenticated"]
        assert spec["resourceAttributes"] == {
            "verb": "get",
            "group": GROUP,
            "version": "v1",
            "resource": "widgets",
            "name": "w1",
        }
        assert (await fetch(server, frank, f"/apis/{GROUP}/v1/widgets/w1"))[0] == 200
        assert len(fake_kube.access_reviews) == 1  # cached
        status, _, body = await fetch(server, frank, f"/apis/{GROUP}/v1/widgets/w2")
        assert status == 403
        assert body["message"].endswith(
            'cannot get resource "widgets" in API group "toy.example.com" at the cluster scope: only w1'
        )
        assert (await fetch(server, frank, f"/apis/{GROUP}/v1/widgets/w2"))[0] == 403
        assert len(fake_kube.access_reviews) == 2  # the denial is cached too
        # non-resource paths are reviewed as such
        status, _, _ = await fetch(server, frank, "/apis")
        assert status == 403
        assert fake_kube.access_reviews[-1]["spec"]["nonResourceAttributes"] == {
            "path": "/apis",
            "verb": "get",
        }
        # always-allow paths never ask
        n = len(fake_kube.access_reviews)
        assert (await fetch(server, frank, "/healthz"))[0] == 200
        assert len(fake_kube.access_reviews) == n


async def test_authentication_config_from_configmap(pki: PKI, fake_kube: Any, kube: Any) -> None:
    fake_kube.upsert(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
            "data": {
                "client-ca-file": pki.client_ca.cert_pem.bytes().decode(),
                "requestheader-client-ca-file": pki.front_ca.cert_pem.bytes().decode(),
                "requestheader-allowed-names": '["aggregator"]',
                "requestheader-username-headers": '["X-Remote-User"]',
                "requestheader-group-headers": '["X-Remote-Group"]',
                "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
            },
        }
    )
    fake_kube.authorize = lambda spec: (spec["user"] in ("grace", "henry"), "")
    aggregator = pki.client_ctx(pki.front_ca.issue_cert("aggregator", common_name="aggregator"))
    other = pki.client_ctx(pki.front_ca.issue_cert("front-proxy-client", common_name="front-proxy-client"))
    henry = pki.client_ctx(pki.client_ca.issue_cert("henry", common_name="henry"))
    headers = CIMultiDict([("X-Remote-User", "grace"), ("X-Remote-Group", "a"), ("X-Remote-Group", "b")])
    async with running(pki, authn=AuthnOptions(), kube_client=kube) as server:
        status, _, body = await fetch(server, aggregator, f"/apis/{GROUP}/v1/whoami", headers)
        assert status == 200, body
        assert body["name"] == "grace" and body["groups"] == ["a", "b", "system:authenticated"]
        assert (await fetch(server, other, f"/apis/{GROUP}/v1/whoami", headers))[0] == 401  # CN not allowed
        status, _, body = await fetch(server, henry, f"/apis/{GROUP}/v1/whoami")
        assert status == 200 and body["name"] == "henry"


# ---- real clients ---------------------------------------------------------------------------------


def write_kubeconfig(path: Path, port: int, pki: PKI, user: dict[str, str]) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "kcms",
                "cluster": {
                    "server": f"https://127.0.0.1:{port}",
                    "certificate-authority-data": base64.b64encode(pki.server_ca.cert_pem.bytes()).decode(),
                },
            }
        ],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "kcms", "context": {"cluster": "kcms", "user": "u"}}],
        "current-context": "kcms",
    }
    path.write_text(json.dumps(doc))
    return path


async def kubectl(kubeconfig: Path, cache: Path, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        "kubectl",
        "--kubeconfig",
        str(kubeconfig),
        "--cache-dir",
        str(cache),
        "--request-timeout",
        "20s",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
async def test_kubectl_reads_the_toy_group(pki: PKI, fake_kube: Any, kube: Any, tmp_path: Path) -> None:
    fake_kube.tokens["tok"] = {"username": "ivan", "groups": ["system:masters"]}
    cert = pki.client_ca.issue_cert("admin", common_name="admin", organization_name="system:masters")
    async with running(
        pki, authn=AuthnOptions(client_ca_file=pki.files["client_ca"], skip_lookup=True), kube_client=kube
    ) as server:
        by_cert = write_kubeconfig(
            tmp_path / "kc-cert",
            server.port,
            pki,
            {
                "client-certificate-data": base64.b64encode(cert.cert_chain_pems[0].bytes()).decode(),
                "client-key-data": base64.b64encode(cert.private_key_pem.bytes()).decode(),
            },
        )
        by_token = write_kubeconfig(tmp_path / "kc-token", server.port, pki, {"token": "tok"})
        for kc in (by_cert, by_token):
            code, out, err = await kubectl(kc, tmp_path / "cache", "get", "--raw", "/apis")
            assert code == 0, err
            assert json.loads(out)["groups"][0]["name"] == GROUP
        code, out, err = await kubectl(
            by_cert, tmp_path / "cache", "get", "--raw", f"/apis/{GROUP}/v1/widgets/w2"
        )
        assert code == 0, err
        assert json.loads(out)["size"] == 2
        # discovery + Table output, as `kubectl get` does
        code, out, err = await kubectl(by_token, tmp_path / "cache2", "get", f"widgets.{GROUP}")
        assert code == 0, err
        lines = [line.split() for line in out.strip().splitlines()]
        assert lines == [["NAME", "SIZE"], ["w0", "0"], ["w1", "1"], ["w2", "2"]]
        code, out, err = await kubectl(by_token, tmp_path / "cache2", "get", f"widgets.{GROUP}", "nope")
        assert code != 0 and f'widgets.{GROUP} "nope" not found' in err
        bad = write_kubeconfig(tmp_path / "kc-bad", server.port, pki, {"token": "wrong"})
        code, out, err = await kubectl(bad, tmp_path / "cache3", "get", "--raw", "/apis")
        assert code != 0 and "Unauthorized" in err


async def test_official_kubernetes_client(pki: PKI, tmp_path: Path) -> None:
    import kubernetes

    cert = pki.client_ca.issue_cert("admin", common_name="admin", organization_name="system:masters")
    cert_file = pki.write("admin.crt", cert.cert_chain_pems[0].bytes())
    key_file = pki.write("admin.key", cert.private_key_pem.bytes())
    ca_file = pki.write("server-ca.crt", pki.server_ca.cert_pem.bytes())
    async with running(pki) as server:
        cfg = kubernetes.client.Configuration()
        cfg.host = f"https://127.0.0.1:{server.port}"
        cfg.ssl_ca_cert = ca_file
        cfg.cert_file = cert_file
        cfg.key_file = key_file

        def read() -> tuple[Any, Any, Any]:
            with kubernetes.client.ApiClient(cfg) as api:
                groups = kubernetes.client.ApisApi(api).get_api_versions()
                custom = kubernetes.client.CustomObjectsApi(api)
                items = custom.list_cluster_custom_object(GROUP, "v1", "widgets")
                try:
                    custom.get_cluster_custom_object(GROUP, "v1", "widgets", "nope")
                    missing = None
                except kubernetes.client.ApiException as e:
                    missing = e
                return groups, items, missing

        groups, items, missing = await asyncio.to_thread(read)
        assert [g.name for g in groups.groups] == [GROUP]
        assert groups.groups[0].preferred_version.group_version == f"{GROUP}/v1"
        assert [w["metadata"]["name"] for w in items["items"]] == ["w0", "w1", "w2"]
        assert missing is not None and missing.status == 404
        assert json.loads(missing.body)["reason"] == "NotFound"
        # without a client certificate the official client is refused
        cfg2 = kubernetes.client.Configuration()
        cfg2.host = cfg.host
        cfg2.ssl_ca_cert = ca_file

        def anonymous() -> int:
            with kubernetes.client.ApiClient(cfg2) as api:
                try:
                    kubernetes.client.ApisApi(api).get_api_versions()
                except kubernetes.client.ApiException as e:
                    return e.status
            return 200

        assert await asyncio.to_thread(anonymous) == 401


async def test_review_failures_when_the_kube_apiserver_is_down(pki: PKI, fake_kube: Any, kube: Any) -> None:
    fake_kube.tokens["t"] = {"username": "kim", "groups": []}
    kim = pki.client_ctx(pki.client_ca.issue_cert("kim", common_name="kim"))
    async with running(pki, authn=default_authn(pki), kube_client=kube) as server:
        await fake_kube.stop()
        # the token cannot be reviewed: unauthenticated (401), as kube answers
        status, _, body = await fetch(server, pki.client_ctx(), f"/apis/{GROUP}/v1/whoami", bearer("t"))
        assert status == 401 and body["reason"] == "Unauthorized"
        # the access cannot be reviewed: unavailable (503, kube says 500), never an allow
        status, _, body = await fetch(server, kim, f"/apis/{GROUP}/v1/widgets")
        assert status == 503 and body["reason"] == "ServiceUnavailable"
        assert "authorization check failed" in body["message"]
        # health endpoints do not depend on the kube-apiserver
        assert (await fetch(server, pki.client_ctx(), "/readyz"))[0] == 200


async def test_configmap_changes_are_picked_up(pki: PKI, fake_kube: Any, kube: Any) -> None:
    def configmap(front_ca: trustme.CA) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
            "data": {
                "requestheader-client-ca-file": front_ca.cert_pem.bytes().decode(),
                "requestheader-allowed-names": '["aggregator"]',
            },
        }

    fake_kube.upsert(configmap(pki.front_ca))
    new_front = trustme.CA()
    old_agg = pki.client_ctx(pki.front_ca.issue_cert("aggregator", common_name="aggregator"))
    new_agg = pki.client_ctx(new_front.issue_cert("aggregator", common_name="aggregator"))
    headers = {"X-Remote-User": "lee", "X-Remote-Group": "system:masters"}
    async with running(pki, authn=AuthnOptions(), kube_client=kube) as server:
        assert (await fetch(server, old_agg, f"/apis/{GROUP}/v1/whoami", headers))[0] == 200
        fake_kube.upsert(configmap(new_front))
        assert await server.refresh_authn() is True
        status, _, body = await fetch(server, new_agg, f"/apis/{GROUP}/v1/whoami", headers)
        assert status == 200 and body["name"] == "lee"
