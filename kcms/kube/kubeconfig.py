"""Kubernetes client configuration without the kubernetes_asyncio package: a kubeconfig file or the
in-cluster service account, read into a small `KubeConfig`.

Why: kubernetes_asyncio's package imports every API and model class (859 modules, ~34 MiB of RSS and
~0.2-0.5 s of CPU at each start) although KCMS only needs its config loader. This module reads the
common cases itself; `KubeClient.load` (kcms/kube/client.py) falls back to the library, imported only
then, for what is not handled here (`NeedsLibrary`).

Handled (as client-go reads them):
- one kubeconfig file (YAML or JSON, PyYAML's safe loader, the C one when available), at most
  `MAX_KUBECONFIG_BYTES`; the context given, else `current-context`;
- cluster: `server` (http:// or https://), `certificate-authority` / `-data`,
  `insecure-skip-tls-verify`, `tls-server-name`;
- user: `client-certificate` / `-data` with `client-key` / `-data`, `token`, `tokenFile` (re-read
  every `TOKEN_FILE_RELOAD` seconds, and at once after a 401, for rotation; when both `token` and
  `tokenFile` are set, `token` is used first and the file's content from its first re-read on, as
  client-go does); a context without a user is anonymous;
- `*-data` fields win over their file fields (when not empty); they are written to private (0600)
  temporary files, removed when the process that wrote them exits, because the TLS layer and the
  kubelet client take file names; relative file names are resolved against the kubeconfig's folder;
- a context's `namespace`;
- in cluster: KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT, the service account's token (re-read
  like a tokenFile: projected tokens rotate), ca.crt and namespace files.

Not handled here, left to kubernetes_asyncio exactly as before (`NeedsLibrary`): users with `exec`,
`auth-provider` or `username`/`password`, clusters with `proxy-url`, and several kubeconfig files
merged (a `--kubeconfig` value that is a list of existing files joined by os.pathsep). KCMS does not
read the KUBECONFIG variable: `--kubeconfig` names the file, and without it the in-cluster account
is used (as before). Impersonation fields (`as`, `as-groups`, ...) are ignored with a warning (the
library ignored them silently).

Every problem with a file is a `KubeConfigError` naming the file and the field, never a traceback.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import hashlib
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import yaml

from kcms.limits import printable

log = logging.getLogger(__name__)

MAX_KUBECONFIG_BYTES = 16 << 20  # far above any real kubeconfig (kubectl's with 100 clusters: < 1 MiB)
MAX_DEPTH = 64  # nesting levels of YAML collections (a kubeconfig has about 5)
MAX_TOKEN_BYTES = 1 << 20  # a service-account JWT is ~1 KiB
TOKEN_FILE_RELOAD = 60.0  # seconds between re-reads of a token file (client-go: 1 minute)

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SERVICE_TOKEN_FILENAME = SERVICE_ACCOUNT_DIR + "/token"
SERVICE_CERT_FILENAME = SERVICE_ACCOUNT_DIR + "/ca.crt"
SERVICE_NAMESPACE_FILENAME = SERVICE_ACCOUNT_DIR + "/namespace"

# Fields whose presence sends the whole file to kubernetes_asyncio (see the module docstring).
_LIBRARY_USER_FIELDS = ("exec", "auth-provider", "username", "password")
_LIBRARY_CLUSTER_FIELDS = ("proxy-url",)
_IGNORED_USER_FIELDS = ("as", "as-uid", "as-groups", "as-user-extra")

_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class KubeConfigError(Exception):
    """No usable Kubernetes client configuration."""


class NeedsLibrary(Exception):
    """The kubeconfig uses something only kubernetes_asyncio implements (the message says what)."""


class TokenFile:
    """A bearer token read from a file and re-read when due (rotation); the last good read is kept
    when a re-read fails or finds the file empty (a rotation half-written)."""

    def __init__(self, path: str, token: str | None = None, interval: float = TOKEN_FILE_RELOAD) -> None:
        self.path = path
        self.interval = interval
        self.read_at = time.monotonic()
        self.token = token if token is not None else _read_token(path)

    def current(self, force: bool = False) -> str:
        """The token, re-read first when ``interval`` has passed (or ``force``)."""
        now = time.monotonic()
        if force or now - self.read_at >= self.interval:
            self.read_at = now
            try:
                self.token = _read_token(self.path)
            except KubeConfigError as e:
                log.warning("keeping the previous bearer token: %s", e)
        return self.token


@dataclass
class KubeConfig:
    """What a KubeClient needs: where the API server is, how to verify it, who we are."""

    host: str
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    token: str | None = None  # without the "Bearer " prefix; None with token_file set
    token_file: TokenFile | None = None
    namespace: str | None = None
    source: str = ""  # the kubeconfig file, or "in-cluster"

    def bearer_token(self, force: bool = False) -> str | None:
        """The current bearer token (re-read from its file when due or ``force``), or None."""
        if self.token_file is not None:
            return self.token_file.current(force)
        return self.token


# ---- kubeconfig files -------------------------------------------------------------------------------
def load_kubeconfig(path: str, context: str | None = None, *, temp_dir: str | None = None) -> KubeConfig:
    """Read the kubeconfig file ``path`` (the ``context`` given, else its current-context).

    Raises KubeConfigError (naming the file and the problem) or NeedsLibrary.
    """
    if not os.path.isfile(path):
        parts = [p for p in path.split(os.pathsep) if p]
        if len(parts) > 1 and all(os.path.isfile(p) for p in parts):
            raise NeedsLibrary(f"{len(parts)} kubeconfig files to merge")
        raise KubeConfigError("no such file")
    doc = _parse(_read_bounded(path, MAX_KUBECONFIG_BYTES, "kubeconfig"))
    base = os.path.dirname(os.path.abspath(path))

    name = context if context is not None else doc.get("current-context")
    if name is None or name == "":
        raise KubeConfigError("no current-context (and no context was given)")
    if not isinstance(name, str):
        raise KubeConfigError(f"current-context must be a string, not {type(name).__name__}")
    ctx = _named(doc, "contexts", "context", name)
    cluster_name = _field(ctx, "cluster", str, f"context {printable(name)}")
    if cluster_name is None:
        raise KubeConfigError(f"context {printable(name)} names no cluster")
    cluster = _named(doc, "clusters", "cluster", cluster_name, f" (named by context {printable(name)})")
    user_name = _field(ctx, "user", str, f"context {printable(name)}")
    user: dict[str, Any] = {}
    if user_name:
        user = _named(doc, "users", "user", user_name, f" (named by context {printable(name)})")

    for key in _LIBRARY_USER_FIELDS:
        if key in user:
            raise NeedsLibrary(f"user {printable(user_name)} has {key}")
    for key in _LIBRARY_CLUSTER_FIELDS:
        if key in cluster:
            raise NeedsLibrary(f"cluster {printable(cluster_name)} has {key}")
    for key in _IGNORED_USER_FIELDS:
        if key in user:
            log.warning(
                "kubeconfig user %s: %s (impersonation) is not supported, ignored", printable(user_name), key
            )

    where_c, where_u = f"cluster {printable(cluster_name)}", f"user {printable(user_name)}"
    server = _field(cluster, "server", str, where_c)
    if not server:
        raise KubeConfigError(f"{where_c} has no server")
    if not server.startswith(("https://", "http://")):
        raise KubeConfigError(f"{where_c}: server {printable(server)} is not an http:// or https:// URL")
    insecure = _field(cluster, "insecure-skip-tls-verify", bool, where_c) or False
    cfg = KubeConfig(
        host=server.rstrip("/"),
        insecure=insecure,
        tls_server_name=_field(cluster, "tls-server-name", str, where_c) or None,
        namespace=_field(ctx, "namespace", str, f"context {printable(name)}") or None,
        source=path,
    )
    # Like the library, TLS files only matter (and are only checked) for an https server.
    if server.startswith("https://"):
        cfg.ca_file = _file_or_data(cluster, "certificate-authority", base, where_c, temp_dir)
        cfg.cert_file = _file_or_data(user, "client-certificate", base, where_u, temp_dir)
        cfg.key_file = _file_or_data(user, "client-key", base, where_u, temp_dir)
        if (cfg.cert_file is None) != (cfg.key_file is None):
            raise KubeConfigError(f"{where_u}: client-certificate and client-key go together")
    token = _field(user, "token", str, where_u) or None
    token_path = _field(user, "tokenFile", str, where_u) or None
    if token_path is not None:
        cfg.token_file = TokenFile(_resolve(base, token_path), token)
    else:
        cfg.token = token
    return cfg


def _read_bounded(path: str, limit: int, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise KubeConfigError(f"cannot read {what} {printable(path)}: {e.strerror or e}") from e
    if len(data) > limit:
        raise KubeConfigError(f"{what} {printable(path)} is over {limit >> 20} MiB")
    return data


def _parse(data: bytes) -> dict[str, Any]:
    try:
        # The C composer recurses once per nesting level and crashes the process (SIGSEGV) past some
        # ten thousand levels: the parser's event stream (not recursive) is checked first.
        depth = 0
        for event in yaml.parse(data, Loader=_YAML_LOADER):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise KubeConfigError(f"not a kubeconfig: nested over {MAX_DEPTH} levels deep")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        doc = yaml.load(data, Loader=_YAML_LOADER)  # noqa: S506 - a safe loader: no Python objects
    except yaml.YAMLError as e:
        raise KubeConfigError(f"not YAML: {printable(str(e), 300)}") from e
    except RecursionError as e:  # the pure-Python loader, when the C one is missing
        raise KubeConfigError("not a kubeconfig: nested too deeply") from e
    if not isinstance(doc, dict):
        raise KubeConfigError(f"not a kubeconfig: the document is a {type(doc).__name__}, not a mapping")
    return doc


def _named(doc: dict, section: str, inner: str, name: str, why: str = "") -> dict[str, Any]:
    """The ``inner`` mapping of the one entry of list ``section`` called ``name``."""
    entries = doc.get(section)
    if entries is None:
        entries = []
    if not isinstance(entries, list):
        raise KubeConfigError(f"{section} must be a list, not {type(entries).__name__}")
    found = None
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise KubeConfigError(f"every entry of {section} must be a mapping with a string name")
        if entry["name"] == name:
            if found is not None:
                raise KubeConfigError(f"two {section} are named {printable(name)}")
            found = entry
    if found is None:
        raise KubeConfigError(f"no {inner} named {printable(name)} in {section}{why}")
    body = found.get(inner)
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise KubeConfigError(f"{inner} {printable(name)}: {inner} must be a mapping")
    return body


def _field(obj: dict, key: str, typ: type, where: str) -> Any:
    value = obj.get(key)
    if value is not None and not isinstance(value, typ):
        raise KubeConfigError(f"{where}: {key} must be a {typ.__name__}, not {type(value).__name__}")
    return value


def _resolve(base: str, name: str) -> str:
    return os.path.normpath(os.path.join(base, name))  # an absolute name stays as it is


def _file_or_data(obj: dict, key: str, base: str, where: str, temp_dir: str | None) -> str | None:
    """The file holding ``key``: ``key-data`` (base64, preferred when not empty) in a private temporary
    file, else the file ``key`` names (checked to exist)."""
    data = _field(obj, key + "-data", str, where)
    if data:
        try:
            content = base64.b64decode(data)
        except (binascii.Error, ValueError) as e:
            raise KubeConfigError(f"{where}: {key}-data is not base64 ({e})") from e
        if not content:
            raise KubeConfigError(f"{where}: {key}-data is empty")
        return _temp_file(content, temp_dir)
    name = _field(obj, key, str, where)
    if not name:
        return None
    path = _resolve(base, name)
    if not os.path.isfile(path):
        raise KubeConfigError(f"{where}: {key} {printable(path)}: no such file")
    return path


_temp_files: dict[tuple[str | None, str], str] = {}  # (folder, sha256 of content) -> file name
_temp_owner = os.getpid()


def _temp_file(content: bytes, temp_dir: str | None) -> str:
    key = (temp_dir, hashlib.sha256(content).hexdigest())
    name = _temp_files.get(key)
    if name is not None and os.path.isfile(name):
        return name
    if not _temp_files:
        atexit.register(_remove_temp_files)
    fd, name = tempfile.mkstemp(prefix="kcms-kubeconfig-", suffix=".pem", dir=temp_dir)  # mode 0600
    with os.fdopen(fd, "wb") as f:
        f.write(content)
    _temp_files[key] = name
    return name


def _remove_temp_files() -> None:
    if os.getpid() != _temp_owner:  # a forked child must not remove the parent's files
        return
    for name in _temp_files.values():
        try:
            os.remove(name)
        except OSError:
            pass
    _temp_files.clear()


def _read_token(path: str) -> str:
    token = _read_bounded(path, MAX_TOKEN_BYTES, "token file").decode("utf-8", "replace").strip()
    if not token:
        raise KubeConfigError(f"token file {printable(path)} is empty")
    return token


# ---- in cluster -------------------------------------------------------------------------------------
def incluster_paths() -> tuple[str, str, str]:
    """(token, ca.crt, namespace) file names of the in-cluster service account.

    When a program imported kubernetes_asyncio's in-cluster module and set its SERVICE_TOKEN_FILENAME /
    SERVICE_CERT_FILENAME (as callers of the library did to point it elsewhere), those are honoured.
    """
    token, cert = SERVICE_TOKEN_FILENAME, SERVICE_CERT_FILENAME
    lib = sys.modules.get("kubernetes_asyncio.config.incluster_config")
    if lib is not None:
        token = getattr(lib, "SERVICE_TOKEN_FILENAME", token)
        cert = getattr(lib, "SERVICE_CERT_FILENAME", cert)
    return token, cert, SERVICE_NAMESPACE_FILENAME


def load_incluster(
    *,
    token_file: str | None = None,
    ca_file: str | None = None,
    namespace_file: str | None = None,
    environ: Any = None,
) -> KubeConfig:
    """The pod's service account: KUBERNETES_SERVICE_HOST/PORT, token (re-read when due), ca.crt,
    namespace. The file names default to the standard ones (`incluster_paths`); tests pass others."""
    env = os.environ if environ is None else environ
    default_token, default_ca, default_ns = incluster_paths()
    token_file = token_file or default_token
    ca_file = ca_file or default_ca
    namespace_file = namespace_file or default_ns
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if host is None or port is None:
        raise KubeConfigError("KUBERNETES_SERVICE_HOST/PORT are not set")
    if not host or not port:
        raise KubeConfigError("KUBERNETES_SERVICE_HOST/PORT are set but empty")
    if ":" in host or "%" in host:  # an IPv6 address (net.JoinHostPort)
        host = f"[{host}]"
    if not os.path.isfile(token_file):
        raise KubeConfigError(f"no service account token file {printable(token_file)}")
    if not os.path.isfile(ca_file):
        raise KubeConfigError(f"no service account CA file {printable(ca_file)}")
    if not _read_bounded(ca_file, MAX_KUBECONFIG_BYTES, "CA file").strip():
        raise KubeConfigError(f"service account CA file {printable(ca_file)} is empty")
    namespace = None
    if os.path.isfile(namespace_file):
        namespace = _read_bounded(namespace_file, 1024, "namespace file").decode("utf-8", "replace").strip()
    return KubeConfig(
        host=f"https://{host}:{port}",
        ca_file=ca_file,
        token_file=TokenFile(token_file),
        namespace=namespace or None,
        source="in-cluster",
    )
