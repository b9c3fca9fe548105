"""kcms.kube's client and reviews against the fake API server over real HTTPS.

The fake's own protocol is tested in tests/test_kube_fake.py; informers and inventories in
tests/test_kube_informer.py.
"""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
from fakeapi import make_node

from kcms.kube import (
    AccessReviewer,
    KubeAPIError,
    KubeClient,
    KubeConfigError,
    ReviewError,
    TokenReviewer,
    read_extension_apiserver_authentication,
)
from kcms.model import RequestAttributes, UserInfo


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@pytest.fixture
async def client(fake_kube):
    c = await KubeClient.load(str(fake_kube.kubeconfig))
    yield c
    await c.close()


# ---- the client ---------------------------------------------------------------------------------
async def test_client_load_errors_name_the_flag(tmp_path, monkeypatch):
    with pytest.raises(KubeConfigError, match="--kubeconfig"):
        await KubeClient.load(str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigError, match="--kubeconfig"):
        await KubeClient.load(None)
    bad = tmp_path / "bad"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    with pytest.raises(KubeConfigError, match="--kubeconfig"):
        await KubeClient.load(str(bad))


async def test_client_identity_and_errors(fake_kube, client):
    assert client.bearer_token() == "admin-token"
    assert client.client_cert_files() is None and client.insecure is False
    assert _read(client.ca_file()) == fake_kube.ca.cert_pem.bytes()
    fake_kube.upsert(make_node("n1"))
    assert (await client.get_json("/api/v1/nodes"))["items"][0]["metadata"]["name"] == "n1"
    fake_kube.api_tokens.clear()
    with pytest.raises(KubeAPIError) as e:
        await client.get_json("/api/v1/nodes")
    assert e.value.status == 401 and e.value.reason == "Unauthorized"


async def test_client_cert_kubeconfig_and_wrong_token(fake_kube, ca, tmp_path):
    cert = ca.issue_cert("kcms-client")
    doc = json.loads(fake_kube.kubeconfig.read_text())
    doc["users"][0]["user"] = {
        "client-certificate-data": base64.b64encode(cert.cert_chain_pems[0].bytes()).decode(),
        "client-key-data": base64.b64encode(cert.private_key_pem.bytes()).decode(),
        "token": "admin-token",
    }
    path = tmp_path / "certs.kubeconfig"
    path.write_text(json.dumps(doc))
    c = await KubeClient.load(str(path), context="fake")
    try:
        cert_file, key_file = c.client_cert_files()
        assert _read(cert_file) == cert.cert_chain_pems[0].bytes()
        assert (await c.get_json("/api/v1/nodes"))["kind"] == "NodeList"
    finally:
        await c.close()
    c = await KubeClient.load(str(fake_kube.write_kubeconfig(tmp_path / "wrong", token="wrong")))
    try:
        with pytest.raises(KubeAPIError) as e:
            await c.get_json("/api/v1/nodes")
        assert e.value.status == 401
    finally:
        await c.close()


async def test_rotating_credentials_token_file_and_exec_plugin(fake_kube, tmp_path):
    """A 401 makes the client re-read its tokenFile / re-run its exec plugin once and retry."""
    token_file = tmp_path / "token"
    token_file.write_text("token-1")
    plugin = tmp_path / "plugin.sh"
    plugin.write_text(
        "#!/bin/sh\n"
        'printf \'{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",'
        f'"status":{{"token":"%s"}}}}\' "$(cat {token_file})"\n'
    )
    plugin.chmod(0o755)
    doc = json.loads(fake_kube.kubeconfig.read_text())
    users = {
        "file": {"tokenFile": str(token_file)},
        "exec": {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin)}},
    }
    for kind, user in users.items():
        token_file.write_text("token-1")
        fake_kube.api_tokens = {"token-1"}
        doc["users"][0]["user"] = user
        path = tmp_path / f"{kind}.kubeconfig"
        path.write_text(json.dumps(doc))
        c = await KubeClient.load(str(path))
        try:
            assert c.bearer_token() == "token-1"
            assert (await c.get_json("/api/v1/nodes"))["kind"] == "NodeList"
            token_file.write_text("token-2")
            fake_kube.api_tokens = {"token-2"}
            assert (await c.get_json("/api/v1/nodes"))["kind"] == "NodeList", kind
            assert c.bearer_token() == "token-2"
        finally:
            await c.close()


async def test_in_cluster_service_account(fake_kube, tmp_path, monkeypatch):
    import kubernetes_asyncio.config.incluster_config as incluster

    (tmp_path / "token").write_text("admin-token\n")
    (tmp_path / "ca.crt").write_bytes(fake_kube.ca.cert_pem.bytes())
    monkeypatch.setattr(incluster, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    monkeypatch.setattr(incluster, "SERVICE_CERT_FILENAME", str(tmp_path / "ca.crt"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(fake_kube.port))
    c = await KubeClient.load(None)
    try:
        assert c.bearer_token() == "admin-token" and c.ca_file() == str(tmp_path / "ca.crt")
        assert (await c.get_json("/api/v1/nodes"))["kind"] == "NodeList"
    finally:
        await c.close()


# ---- reviews ------------------------------------------------------------------------------------
async def test_token_reviewer(fake_kube, client):
    fake_kube.tokens["good"] = {
        "username": "alice",
        "uid": "u1",
        "groups": ["devs", "system:authenticated"],
        "extra": {"scopes": ["a", "b"]},
    }
    tr = TokenReviewer(client, cache_ttl=60.0, failure_ttl=60.0)
    results = await asyncio.gather(*(tr.authenticate("good") for _ in range(5)))
    assert len(fake_kube.token_reviews) == 1  # concurrent identical look-ups share one request
    user = results[0]
    assert user == UserInfo("alice", "u1", ("devs", "system:authenticated"), (("scopes", ("a", "b")),))
    assert fake_kube.token_reviews[0]["spec"]["token"] == "good"
    assert fake_kube.token_reviews[0]["kind"] == "TokenReview"
    assert await tr.authenticate("good") == user and len(fake_kube.token_reviews) == 1  # cached
    assert await tr.authenticate("bad") is None and len(fake_kube.token_reviews) == 2
    assert await tr.authenticate("bad") is None and len(fake_kube.token_reviews) == 2  # failures cached too
    nocache = TokenReviewer(client, cache_ttl=0, failure_ttl=0)
    await nocache.authenticate("good")
    await nocache.authenticate("good")
    assert len(fake_kube.token_reviews) == 4
    bounded = TokenReviewer(client, max_entries=3)
    for i in range(10):
        await bounded.authenticate(f"t{i}")
    assert len(bounded._cache) == 3
    await fake_kube.stop()
    with pytest.raises(ReviewError):
        await TokenReviewer(client).authenticate("good")


async def test_access_reviewer(fake_kube, client):
    def decide(spec):
        ra = spec.get("resourceAttributes")
        if ra and ra.get("resource") == "pods" and spec["user"] == "alice":
            return True, "alice may see pods"
        return False, "no"

    fake_kube.authorize = decide
    ar = AccessReviewer(client, allowed_ttl=60.0, denied_ttl=60.0)
    alice = UserInfo("alice", "u1", ("devs",), (("k", ("v",)),))
    pods = RequestAttributes(
        "list",
        "/apis/metrics.k8s.io/v1beta1/namespaces/a/pods",
        True,
        "metrics.k8s.io",
        "v1beta1",
        "pods",
        "",
        "a",
    )
    nodes = RequestAttributes(
        "get", "/apis/metrics.k8s.io/v1beta1/nodes/n1", True, "metrics.k8s.io", "v1beta1", "nodes", name="n1"
    )
    health = RequestAttributes("get", "/healthz", False)
    assert await ar.authorize(alice, pods) == (True, "alice may see pods")
    spec = fake_kube.access_reviews[0]["spec"]
    assert spec["user"] == "alice" and spec["uid"] == "u1" and spec["groups"] == ["devs"]
    assert spec["extra"] == {"k": ["v"]}
    assert spec["resourceAttributes"] == {
        "namespace": "a",
        "verb": "list",
        "group": "metrics.k8s.io",
        "version": "v1beta1",
        "resource": "pods",
    }
    assert await ar.authorize(alice, nodes) == (False, "no")
    assert fake_kube.access_reviews[1]["spec"]["resourceAttributes"]["name"] == "n1"
    assert await ar.authorize(alice, health) == (False, "no")
    assert fake_kube.access_reviews[2]["spec"]["nonResourceAttributes"] == {"path": "/healthz", "verb": "get"}
    assert len(fake_kube.access_reviews) == 3
    assert await ar.authorize(alice, pods) == (True, "alice may see pods")  # cache hits
    assert await ar.authorize(alice, nodes) == (False, "no")
    assert len(fake_kube.access_reviews) == 3
    assert (await ar.authorize(UserInfo("bob"), pods))[0] is False and len(fake_kube.access_reviews) == 4
    short = AccessReviewer(client, allowed_ttl=0, denied_ttl=0)
    await short.authorize(alice, pods)
    await short.authorize(alice, pods)
    assert len(fake_kube.access_reviews) == 6


async def test_read_extension_apiserver_authentication(fake_kube, client, ca):
    pem = ca.cert_pem.bytes().decode()
    fake_kube.upsert(
        {
            "kind": "ConfigMap",
            "apiVersion": "v1",
            "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
            "data": {
                "client-ca-file": pem,
                "requestheader-client-ca-file": pem,
                "requestheader-allowed-names": '["front-proxy-client"]',
                "requestheader-username-headers": '["X-Remote-User"]',
                "requestheader-group-headers": '["X-Remote-Group"]',
                "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
            },
        }
    )
    got = await read_extension_apiserver_authentication(client)
    assert got["client-ca-file"] == pem and got["requestheader-client-ca-file"] == pem
    assert got["requestheader-allowed-names"] == ["front-proxy-client"]
    assert got["requestheader-username-headers"] == ["X-Remote-User"]
    assert got["requestheader-group-headers"] == ["X-Remote-Group"]
    assert got["requestheader-extra-headers-prefix"] == ["X-Remote-Extra-"]
    assert got["requestheader-uid-headers"] == []
