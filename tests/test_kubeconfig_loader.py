"""kcms.kube.kubeconfig: KCMS's own kubeconfig / in-cluster loader, against real files and real TLS.

Every credential is proved by authenticating for real: token users against the fake API server
(tests/fakeapi.py), client-certificate users against a loopback HTTPS server that requires a client
certificate from the test CA. What the loader leaves to kubernetes_asyncio (exec plugins, merged
files, ...) still works through it; hostile files are refused with a KubeConfigError naming the file
and the problem.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import trustme
import yaml
from _http_helpers import serve_app
from aiohttp import web

from kcms.kube import KubeAPIError, KubeClient, KubeConfigError
from kcms.kube.kubeconfig import NeedsLibrary, TokenFile, load_incluster, load_kubeconfig

ROOT = Path(__file__).resolve().parent.parent


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _kubeconfig(path: Path, cluster: dict, user: dict | None, context_extra: dict | None = None) -> Path:
    """A real YAML kubeconfig with one context "main" (plus a decoy context that must not be used)."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "decoy", "cluster": {"server": "https://127.0.0.1:1"}},
            {"name": "main", "cluster": cluster},
        ],
        "users": [{"name": "decoy", "user": {"token": "decoy"}}],
        "contexts": [
            {"name": "decoy", "context": {"cluster": "decoy", "user": "decoy"}},
            {"name": "main", "context": {"cluster": "main", **(context_extra or {})}},
        ],
        "current-context": "main",
    }
    if user is not None:
        doc["users"].append({"name": "me", "user": user})
        doc["contexts"][1]["context"]["user"] = "me"
    path.write_text(yaml.safe_dump(doc))
    return path


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _mode(path: str) -> str:
    return oct(os.stat(path).st_mode & 0o777)


def _write_50mb(path: Path) -> None:
    """A valid kubeconfig followed by 50 MB of comments."""
    with open(path, "w") as f:
        f.write(_with() + "\n")
        line = "#" * 1023 + "\n"
        for _ in range(50 * 1024):
            f.write(line)


def _exists(path: str) -> bool:
    return os.path.exists(path)


def _native(c: KubeClient) -> bool:
    """True when the client was configured by kcms.kube.kubeconfig, not by kubernetes_asyncio."""
    return c._loader is None and c._configuration is None


@pytest.fixture
async def mtls_server(ca: trustme.CA):
    """A loopback HTTPS server that requires a client certificate of the test CA and answers a
    NodeList-shaped JSON naming the certificate's subject (proof of who authenticated)."""

    async def handle(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert")
        names = [value for kind, value in peer.get("subjectAltName", ())] if peer else []
        return web.json_response({"kind": "NodeList", "items": [], "cn": ",".join(names)})

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(ctx)
    ca.configure_trust(ctx)
    ctx.verify_mode = ssl.CERT_REQUIRED
    runner, port = await serve_app(app, ssl_context=ctx, handle_signals=False, shutdown_timeout=0.2)
    yield f"https://127.0.0.1:{port}"
    await runner.cleanup()


# ---- what the loader reads, proved by authenticating ------------------------------------------------
async def test_token_user_with_ca_data_tls_server_name_and_namespace(fake_kube, tmp_path):
    path = _kubeconfig(
        tmp_path / "config",
        {
            "server": fake_kube.url + "/",
            "certificate-authority-data": _b64(fake_kube.ca.cert_pem.bytes()),
            "tls-server-name": "localhost",
        },
        {"token": "admin-token"},
        {"namespace": "team-a"},
    )
    c = await KubeClient.load(str(path))
    try:
        assert _native(c) and c.host == fake_kube.url and c.namespace == "team-a"
        assert c.bearer_token() == "admin-token" and c.client_cert_files() is None
        assert _read(c.ca_file()) == fake_kube.ca.cert_pem.bytes()
        assert _mode(c.ca_file()) == "0o600"
        assert (await c.get_json("/api/v1/nodes"))["kind"] == "NodeList"
        fake_kube.api_tokens = {"other"}
        with pytest.raises(KubeAPIError) as e:
            await c.get_json("/api/v1/nodes")
        assert e.value.status == 401
    finally:
        await c.close()
    # tls-server-name is really what the certificate is checked against.
    doc = yaml.safe_load(path.read_text())
    doc["clusters"][1]["cluster"]["tls-server-name"] = "not-the-server.example"
    path.write_text(yaml.safe_dump(doc))
    fake_kube.api_tokens = {"admin-token"}
    c = await KubeClient.load(str(path))
    try:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await c.get_json("/api/v1/nodes")
    finally:
        await c.close()


async def test_explicit_context_is_used_over_current_context(fake_kube, tmp_path):
    path = _kubeconfig(
        tmp_path / "config",
        {"server": fake_kube.url, "certificate-authority-data": _b64(fake_kube.ca.cert_pem.bytes())},
        {"token": "admin-token"},
    )
    c = await KubeClient.load(str(path), context="decoy")
    try:
        assert c.host == "https://127.0.0.1:1" and c.bearer_token() == "decoy"
    finally:
        await c.close()
    with pytest.raises(KubeConfigError, match="no context named 'absent'"):
        await KubeClient.load(str(path), context="absent")


async def test_client_certificate_files_relative_to_the_kubeconfig(ca, mtls_server, tmp_path, monkeypatch):
    """Relative certificate-authority / client-certificate / client-key names resolve against the
    kubeconfig's folder (not the working directory); the certificate really authenticates."""
    cert = ca.issue_cert("kcms-client")
    conf_dir = tmp_path / "conf"
    (conf_dir / "pki").mkdir(parents=True)
    (conf_dir / "pki" / "ca.pem").write_bytes(ca.cert_pem.bytes())
    (conf_dir / "pki" / "client.pem").write_bytes(cert.cert_chain_pems[0].bytes())
    (conf_dir / "pki" / "client.key").write_bytes(cert.private_key_pem.bytes())
    path = _kubeconfig(
        conf_dir / "config",
        {"server": mtls_server, "certificate-authority": "pki/ca.pem"},
        {"client-certificate": "pki/client.pem", "client-key": "./pki/../pki/client.key"},
    )
    monkeypatch.chdir(tmp_path)  # the working directory is not the kubeconfig's folder
    c = await KubeClient.load("conf/config")
    try:
        assert _native(c) and c.bearer_token() is None
        assert c.ca_file() == str(conf_dir / "pki" / "ca.pem")
        assert c.client_cert_files() == (
            str(conf_dir / "pki" / "client.pem"),
            str(conf_dir / "pki" / "client.key"),
        )
        assert (await c.get_json("/api/v1/nodes"))["cn"] == "kcms-client"
    finally:
        await c.close()
    # the same server refuses a client without the certificate: the certificate is what authenticated
    path = _kubeconfig(
        conf_dir / "anon", {"server": mtls_server, "certificate-authority": "pki/ca.pem"}, None
    )
    c = await KubeClient.load(str(path))
    try:
        with pytest.raises(aiohttp.ClientError):
            await c.get_json("/api/v1/nodes")
    finally:
        await c.close()


async def test_client_certificate_data_and_insecure_skip_tls_verify(ca, mtls_server, tmp_path):
    cert = ca.issue_cert("kcms-data-client")
    path = _kubeconfig(
        tmp_path / "config",
        {"server": mtls_server, "insecure-skip-tls-verify": True},  # no CA: only insecure lets it through
        {
            "client-certificate-data": _b64(cert.cert_chain_pems[0].bytes()),
            "client-key-data": _b64(cert.private_key_pem.bytes()),
        },
    )
    c = await KubeClient.load(str(path))
    try:
        cert_file, key_file = c.client_cert_files()
        assert _read(cert_file) == cert.cert_chain_pems[0].bytes()
        assert _read(key_file) == cert.private_key_pem.bytes()
        assert _mode(key_file) == "0o600"
        assert c.insecure and (await c.get_json("/api/v1/nodes"))["cn"] == "kcms-data-client"
    finally:
        await c.close()
    doc = yaml.safe_load(path.read_text())
    doc["clusters"][1]["cluster"]["insecure-skip-tls-verify"] = False  # now the unknown CA is refused
    path.write_text(yaml.safe_dump(doc))
    c = await KubeClient.load(str(path))
    try:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await c.get_json("/api/v1/nodes")
    finally:
        await c.close()


async def test_token_file_rotation_relative_path_and_401_retry(fake_kube, tmp_path):
    (tmp_path / "secrets").mkdir()
    token_file = tmp_path / "secrets" / "token"
    token_file.write_text("token-1\n")
    fake_kube.api_tokens = {"token-1"}
    path = _kubeconfig(
        tmp_path / "config",
        {"server": fake_kube.url, "certificate-authority-data": _b64(fake_kube.ca.cert_pem.bytes())},
        {"tokenFile": "secrets/token"},
    )
    c = await KubeClient.load(str(path))
    try:
        assert _native(c) and c.bearer_token() == "token-1"
        assert (await c.get_json("/api/v1/nodes"))["kind"] == "NodeList"
        token_file.write_text("token-2")
        fake_kube.api_tokens = {"token-2"}
        # the 401 with token-1 makes the client re-read the file at once and retry
        assert (await c.get_json("/api/v1/nodes"))["kind"] == "NodeList"
        assert c.bearer_token() == "token-2"
        # a rotation caught half-written (empty file) keeps the last good token
        token_file.write_text("")
        assert (await c.get_json("/api/v1/nodes"))["kind"] == "NodeList"
        assert c.bearer_token() == "token-2"
    finally:
        await c.close()


def test_token_file_is_re_read_when_due_and_token_wins_until_then(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("from-file-1")
    tf = TokenFile(str(token_file), interval=0.0)
    assert tf.current() == "from-file-1"
    token_file.write_text("from-file-2\n")
    assert tf.current() == "from-file-2"  # due at every call with interval 0
    slow = TokenFile(str(token_file))
    token_file.write_text("from-file-3")
    assert slow.current() == "from-file-2" and slow.current(force=True) == "from-file-3"
    # token and tokenFile both set: the token first, the file's content from its first re-read (client-go)
    path = _kubeconfig(
        tmp_path / "config", {"server": "https://127.0.0.1:1"}, {"token": "inline", "tokenFile": "token"}
    )
    cfg = load_kubeconfig(str(path))
    assert cfg.bearer_token() == "inline" and cfg.bearer_token(force=True) == "from-file-3"


async def test_in_cluster_service_account_from_a_folder(fake_kube, tmp_path):
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text("sa-token-1\n")
    (sa / "ca.crt").write_bytes(fake_kube.ca.cert_pem.bytes())
    (sa / "namespace").write_text("kube-system")
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(fake_kube.port)}
    paths = {
        "token_file": str(sa / "token"),
        "ca_file": str(sa / "ca.crt"),
        "namespace_file": str(sa / "namespace"),
    }
    cfg = load_incluster(environ=env, **paths)
    assert (cfg.host, cfg.ca_file, cfg.namespace) == (fake_kube.url, str(sa / "ca.crt"), "kube-system")
    fake_kube.api_tokens = {"sa-token-1"}
    c = KubeClient(cfg.host, ca_file=cfg.ca_file, token_file=cfg.token_file, namespace=cfg.namespace)
    try:
        assert c.bearer_token() == "sa-token-1"
        assert (await c.get_json("/api/v1/nodes"))["kind"] == "NodeList"
        (sa / "token").write_text("sa-token-2")  # the kubelet rotated the projected token
        fake_kube.api_tokens = {"sa-token-2"}
        assert (await c.get_json("/api/v1/nodes"))["kind"] == "NodeList"
        assert c.bearer_token() == "sa-token-2"
    finally:
        await c.close()
    assert load_incluster(environ={**env, "KUBERNETES_SERVICE_HOST": "fd00::1"}, **paths).host == (
        f"https://[fd00::1]:{fake_kube.port}"
    )
    (sa / "namespace").unlink()
    assert load_incluster(environ=env, **paths).namespace is None
    for environ, problem in [
        ({}, "not set"),
        ({**env, "KUBERNETES_SERVICE_HOST": ""}, "empty"),
    ]:
        with pytest.raises(KubeConfigError, match=problem):
            load_incluster(environ=environ, **paths)
    with pytest.raises(KubeConfigError, match="no service account token file"):
        load_incluster(environ=env, **{**paths, "token_file": str(sa / "absent")})
    with pytest.raises(KubeConfigError, match="no service account CA file"):
        load_incluster(environ=env, **{**paths, "ca_file": str(sa / "absent")})
    (sa / "token").write_text("")
    with pytest.raises(KubeConfigError, match="is empty"):
        load_incluster(environ=env, **paths)


# ---- what goes to kubernetes_asyncio ------------------------------------------------------------------
async def test_exec_plugin_and_merged_files_go_to_the_library(fake_kube, tmp_path):
    plugin = tmp_path / "plugin.sh"
    plugin.write_text(
        "#!/bin/sh\n"
        'echo \'{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",'
        '"status":{"token":"admin-token"}}\'\n'
    )
    plugin.chmod(0o755)
    ca_data = _b64(fake_kube.ca.cert_pem.bytes())
    path = _kubeconfig(
        tmp_path / "exec",
        {"server": fake_kube.url, "certificate-authority-data": ca_data},
        {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin)}},
    )
    with pytest.raises(NeedsLibrary, match="exec"):
        load_kubeconfig(str(path))
    c = await KubeClient.load(str(path))
    try:
        assert not _native(c) and c.bearer_token() == "admin-token"
        assert (await c.get_json("/api/v1/nodes"))["kind"] == "NodeList"
    finally:
        await c.close()
    # two files joined by os.pathsep: merged by the library (the second one only adds a preference)
    extra = tmp_path / "extra"
    extra.write_text("apiVersion: v1\nkind: Config\npreferences: {}\n")
    merged = f"{fake_kube.kubeconfig}{os.pathsep}{extra}"
    with pytest.raises(NeedsLibrary, match="2 kubeconfig files"):
        load_kubeconfig(merged)
    c = await KubeClient.load(merged)
    try:
        assert not _native(c) and (await c.get_json("/api/v1/nodes"))["kind"] == "NodeList"
    finally:
        await c.close()
    for user, cluster, what in [
        ({"username": "u", "password": "p"}, {}, "username"),
        ({"auth-provider": {"name": "oidc", "config": {}}}, {}, "auth-provider"),
        ({"token": "t"}, {"proxy-url": "http://127.0.0.1:3128"}, "proxy-url"),
    ]:
        p = _kubeconfig(tmp_path / what, {"server": fake_kube.url, **cluster}, user)
        with pytest.raises(NeedsLibrary, match=what):
            load_kubeconfig(str(p))


def test_a_plain_kubeconfig_never_imports_kubernetes_asyncio(ca, tmp_path):
    """In a fresh interpreter: load token and client-certificate kubeconfigs; the library stays out."""
    cert = ca.issue_cert("kcms-client")
    server = {"server": "https://127.0.0.1:6443", "certificate-authority-data": _b64(ca.cert_pem.bytes())}
    token = _kubeconfig(tmp_path / "token", server, {"token": "admin-token"})
    certs = _kubeconfig(
        tmp_path / "certs",
        server,
        {
            "client-certificate-data": _b64(cert.cert_chain_pems[0].bytes()),
            "client-key-data": _b64(cert.private_key_pem.bytes()),
        },
    )
    code = (
        "import asyncio, sys\n"
        "from kcms.kube.client import KubeClient\n"
        "async def load(path):\n"
        "    c = await KubeClient.load(path)\n"
        "    await c.close()\n"
        "    return c.bearer_token(), c.client_cert_files() is not None\n"
        "for path in sys.argv[1:]:\n"
        "    print(asyncio.run(load(path)))\n"
        "print(sorted(m for m in sys.modules if m.startswith('kubernetes')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(token), str(certs)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["('admin-token', False)", "(None, True)", "[]"], out.stdout
    assert "Traceback" not in out.stderr


# ---- hostile and malformed files ------------------------------------------------------------------------
def _valid() -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }


def _with(**changes) -> str:
    doc = _valid()
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if value is ...:
            del node[last]
        else:
            node[last] = value
    return json.dumps(doc)


HOSTILE = {
    "not-yaml": ("clusters: [unclosed\n  - {: :", "not YAML"),
    "binary": ("\x00\x01\x02\xff garbage", "not YAML"),
    "scalar": ("just a string", "not a mapping"),
    "list": ("- a\n- b\n", "is a list, not a mapping"),
    "python-tag": ("!!python/object/apply:os.system ['touch /tmp/kcms-pwned']\n", "not YAML"),
    "deep": ("[" * 200_000, "nested over 64 levels"),
    "deep-block": ("a:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 100)), "nested over 64 levels"),
    "no-current-context": (_with(**{"current-context": ...}), "no current-context"),
    "current-context-wrong-type": (_with(**{"current-context": ["x"]}), "current-context must be a string"),
    "absent-context": (_with(**{"current-context": "nope"}), "no context named 'nope'"),
    "absent-cluster": (_with(contexts__0__context__cluster="gone"), "no cluster named 'gone' in clusters"),
    "absent-user": (_with(contexts__0__context__user="ghost"), "no user named 'ghost' in users"),
    "contexts-not-list": (_with(contexts="x"), "contexts must be a list"),
    "entry-without-name": (_with(clusters=[{"cluster": {}}]), "string name"),
    "duplicate": (_with(contexts=[_valid()["contexts"][0]] * 2), "two contexts are named 'x'"),
    "cluster-not-mapping": (_with(clusters__0__cluster="https://x"), "cluster must be a mapping"),
    "no-server": (_with(clusters__0__cluster__server=...), "has no server"),
    "server-not-url": (
        _with(clusters__0__cluster__server="127.0.0.1:6443"),
        "not an http:// or https:// URL",
    ),
    "server-number": (_with(clusters__0__cluster__server=6443), "server must be a str, not int"),
    "insecure-string": (
        _with(**{"clusters__0__cluster__insecure-skip-tls-verify": "maybe"}),
        "must be a bool",
    ),
    "token-list": (_with(users__0__user__token=["a"]), "token must be a str, not list"),
    "ca-missing-file": (
        _with(**{"clusters__0__cluster__certificate-authority": "nowhere/ca.pem"}),
        "certificate-authority .*nowhere/ca.pem.*: no such file",
    ),
    "ca-data-not-pem": (
        _with(**{"clusters__0__cluster__certificate-authority-data": _b64(b"not a certificate")}),
        "unusable TLS certificate",
    ),
    "ca-data-not-base64": (
        _with(**{"clusters__0__cluster__certificate-authority-data": "%%%"}),
        "certificate-authority-data is empty",
    ),
    "cert-without-key": (
        _with(**{"users__0__user__client-certificate-data": _b64(b"x")}),
        "client-certificate and client-key go together",
    ),
    "token-file-missing": (_with(users__0__user={"tokenFile": "no-such-token"}), "cannot read token file"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
async def test_hostile_kubeconfig_is_a_clear_error(name, tmp_path, caplog):
    text, problem = HOSTILE[name]
    path = tmp_path / f"{name}.kubeconfig"
    path.write_text(text, errors="surrogateescape")
    with pytest.raises(KubeConfigError, match=problem) as e:
        await KubeClient.load(str(path))
    assert str(path) in str(e.value) and "--kubeconfig" in str(e.value)
    assert "\n" not in str(e.value) and len(str(e.value)) < 800
    assert "Traceback" not in caplog.text
    assert not _exists("/tmp/kcms-pwned")


async def test_empty_token_file_and_oversized_kubeconfig(tmp_path):
    (tmp_path / "token").write_text("  \n")
    path = tmp_path / "empty-token"
    path.write_text(_with(users__0__user={"tokenFile": "token"}))
    with pytest.raises(KubeConfigError, match="token file .* is empty"):
        await KubeClient.load(str(path))
    big = tmp_path / "big"
    _write_50mb(big)
    with pytest.raises(KubeConfigError, match="is over 16 MiB") as e:
        await KubeClient.load(str(big))
    assert str(big) in str(e.value)


def test_standalone_with_a_malformed_kubeconfig_exits_naming_the_file(tmp_path):
    bad = tmp_path / "bad.kubeconfig"
    bad.write_text(_with(contexts__0__context__cluster="gone"))
    out = subprocess.run(
        [sys.executable, "-m", "kcms", "standalone", "--kubeconfig", str(bad), "--secure-port", "0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode != 0
    assert str(bad) in out.stderr and "no cluster named 'gone'" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
