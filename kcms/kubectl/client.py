"""The plugin's connection to the Kubernetes API server, as kubectl makes it.

The kubeconfig is found as kubectl finds it: ``--kubeconfig``, else the files in ``KUBECONFIG``, else
``~/.kube/config``, else the in-cluster service account. It is read by KCMS's own loader
(kcms/kube/kubeconfig.py); what that loader leaves to kubernetes_asyncio (exec plugins, auth providers,
several files to merge) goes through ``KubeClient.load`` as everywhere else in KCMS.

Every failure becomes a `PluginError` whose text is one line, ready for stderr: an API `Status` as kubectl
prints it (``Error from server (Forbidden): ...``), an unreachable server, a timeout, a TLS failure, an
answer that is not JSON or over `MAX_BODY` bytes. Server-supplied text is escaped and bounded.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import orjson

from kcms.kube.kubeconfig import MAX_KUBECONFIG_BYTES, KubeConfigError, NeedsLibrary, load_kubeconfig

MAX_BODY = 256 << 20  # bytes of one answer: a 5000-node x 30-pod PodMetricsList is ~50 MiB
MESSAGE_LIMIT = 300  # characters of server-supplied text in an error line

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Gone",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class PluginError(Exception):
    """A failure to report on one stderr line (exit code 1)."""


class APIStatusError(PluginError):
    """A non-2xx answer; the text is kubectl's ``Error from server (<reason>): <message>``."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(f"Error from server ({reason}): {message}")
        self.code = code
        self.reason = reason
        self.message = message


def one_line(value: object, limit: int = MESSAGE_LIMIT) -> str:
    """``value`` as one bounded line: control characters and terminal escapes from a server are
    written escaped (\\n, \\x1b), so a hostile answer cannot forge lines or move the cursor."""
    full = value if isinstance(value, str) else str(value)
    text = full[:limit]
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text + (f"...({len(full)} chars)" if len(full) > limit else "")


def find_kubeconfig(flag: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The kubeconfig kubectl would use: the flag, KUBECONFIG's existing files (joined by os.pathsep
    when several: merged by the library), ~/.kube/config; None: the in-cluster account."""
    env = os.environ if environ is None else environ
    if flag:
        if not os.path.isfile(flag):
            raise PluginError(f"--kubeconfig {one_line(flag)}: no such file")
        return flag
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        found = [p for p in listed if os.path.isfile(p)]
        if not found:
            raise PluginError(f"KUBECONFIG={one_line(env['KUBECONFIG'])}: none of its files exists")
        return os.pathsep.join(found)
    home = os.path.join(os.path.expanduser("~"), ".kube", "config")
    if os.path.isfile(home):
        return home
    if env.get("KUBERNETES_SERVICE_HOST"):
        return None
    raise PluginError("no kubeconfig: give --kubeconfig FILE, set KUBECONFIG, or create ~/.kube/config")


class API:
    """GET requests to one API server as one identity, JSON decoded, failures as PluginError."""

    def __init__(
        self,
        host: str,
        *,
        ssl_context: ssl.SSLContext | bool,
        server_hostname: str | None,
        token: Callable[[bool], Awaitable[str | None]],
        namespace: str | None,
        timeout: float,
        source: str,
    ) -> None:
        self.host = host.rstrip("/")
        self.namespace = namespace  # the context's namespace, if it names one
        self.timeout = timeout
        self.source = source
        self._ssl = ssl_context
        self._server_hostname = server_hostname
        self._token = token
        self._session: aiohttp.ClientSession | None = None
        self._groups: dict[str, list[str]] | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> API:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._ssl, limit=16))
        return self._session

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """GET ``path`` and decode its JSON answer; PluginError (APIStatusError for a non-2xx)."""
        query = {k: v for k, v in (params or {}).items() if v}
        for attempt in (0, 1):
            token = await self._token(attempt == 1)
            headers = {"Accept": "application/json", "User-Agent": "kubectl-kcms"}
            if token:
                headers["Authorization"] = f"Bearer {token}"
            try:
                status, content_type, raw = await asyncio.wait_for(
                    self._fetch(path, query, headers), self.timeout if self.timeout > 0 else None
                )
            except TimeoutError:
                raise PluginError(
                    f"the API server at {self.host} did not answer GET {path} within {self.timeout:g}s "
                    "(--request-timeout)"
                ) from None
            except aiohttp.ClientConnectorCertificateError as e:
                raise PluginError(
                    f"cannot verify the API server at {self.host}: {one_line(e.certificate_error)}"
                ) from None
            except (aiohttp.ClientConnectorError, ConnectionError) as e:
                raise PluginError(
                    f"cannot reach the API server at {self.host}: {one_line(e.strerror or e)}"
                ) from None
            except (aiohttp.ClientError, ssl.SSLError, OSError) as e:
                raise PluginError(
                    f"GET {path} from {self.host} failed: {one_line(str(e) or type(e).__name__)}"
                ) from None
            if status == 401 and attempt == 0:
                continue  # a rotated token file or an expired exec credential: refresh once
            if status >= 300:
                raise _status_error(status, raw)
            try:
                return orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise PluginError(
                    f"the answer to GET {path} is not JSON ({one_line(content_type or 'no content type', 60)}): "
                    f"{one_line(raw[:200].decode('utf-8', 'replace'), 80)}"
                ) from None
        raise AssertionError("unreachable")

    async def _fetch(
        self, path: str, query: dict[str, str], headers: dict[str, str]
    ) -> tuple[int, str, bytes]:
        async with self._get_session().get(
            self.host + path, params=query, headers=headers, server_hostname=self._server_hostname
        ) as resp:
            chunks: list[bytes] = []
            size = 0
            async for chunk in resp.content.iter_chunked(1 << 16):
                size += len(chunk)
                if size > MAX_BODY:
                    raise PluginError(f"the answer to GET {path} is over {MAX_BODY >> 20} MiB; refused")
                chunks.append(chunk)
            return resp.status, resp.headers.get("Content-Type", ""), b"".join(chunks)

    async def get_optional(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """Like get(), but None when the server answers 404."""
        try:
            return await self.get(path, params)
        except APIStatusError as e:
            if e.code == 404:
                return None
            raise

    async def groups(self) -> dict[str, list[str]]:
        """API group name -> its versions, preferred first (GET /apis, as kubectl's discovery)."""
        if self._groups is None:
            body = await self.get("/apis")
            groups: dict[str, list[str]] = {}
            items = body.get("groups") if isinstance(body, dict) else None
            if not isinstance(items, list):
                raise PluginError("the answer to GET /apis is not an APIGroupList")
            for g in items:
                if not isinstance(g, dict) or not isinstance(g.get("name"), str):
                    continue
                versions = [
                    v["version"]
                    for v in g.get("versions") or []
                    if isinstance(v, dict) and isinstance(v.get("version"), str)
                ]
                preferred = g.get("preferredVersion")
                if isinstance(preferred, dict) and preferred.get("version") in versions:
                    versions.remove(preferred["version"])
                    versions.insert(0, preferred["version"])
                groups[g["name"]] = versions
            self._groups = groups
        return self._groups

    async def serves(self, group: str, version: str) -> bool:
        return version in (await self.groups()).get(group, [])


def _status_error(status: int, raw: bytes) -> APIStatusError:
    reason, message = _REASONS.get(status, f"HTTP {status}"), ""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict) and body.get("kind") == "Status":
        if isinstance(body.get("reason"), str) and body["reason"]:
            reason = body["reason"]
        if isinstance(body.get("message"), str):
            message = body["message"]
    elif raw:
        message = raw[:MESSAGE_LIMIT].decode("utf-8", "replace").strip()
    if not message:
        message = "the server could not find the requested resource" if status == 404 else f"HTTP {status}"
    return APIStatusError(status, one_line(reason, 60), one_line(message))


async def connect(kubeconfig: str | None, context: str | None, request_timeout: float) -> API:
    """An API for the user's kubeconfig (see find_kubeconfig) and ``context`` (default: current)."""
    path = find_kubeconfig(kubeconfig)
    where = f"kubeconfig {one_line(path)}" if path is not None else "in-cluster config"
    if path is not None:
        try:
            cfg = load_kubeconfig(path, context)
        except NeedsLibrary:
            return await _connect_library(path, context, request_timeout)
        except KubeConfigError as e:
            raise PluginError(f"{where}: {e}") from None
    else:
        from kcms.kube.kubeconfig import load_incluster

        try:
            cfg = load_incluster()
        except KubeConfigError as e:
            raise PluginError(f"{where}: {e}") from None
    try:
        ctx = _ssl_context(cfg.host, cfg.ca_file, cfg.cert_file, cfg.key_file, cfg.insecure)
    except (ssl.SSLError, OSError, ValueError) as e:
        raise PluginError(f"{where}: unusable TLS certificate or key: {one_line(e)}") from None

    async def token(force: bool) -> str | None:
        return cfg.bearer_token(force)

    return API(
        cfg.host,
        ssl_context=ctx,
        server_hostname=cfg.tls_server_name,
        token=token,
        namespace=cfg.namespace,
        timeout=request_timeout,
        source=cfg.source,
    )


async def _connect_library(path: str, context: str | None, request_timeout: float) -> API:
    """Exec plugins, auth providers, basic auth, merged files: kubernetes_asyncio's loader."""
    from kcms.kube.client import KubeClient

    try:
        kube = await KubeClient.load(path, context)
    except KubeConfigError as e:
        raise PluginError(str(e)) from None
    files = kube.client_cert_files()
    try:
        ctx = _ssl_context(kube.host, kube.ca_file(), *(files or (None, None)), kube.insecure)
    except (ssl.SSLError, OSError, ValueError) as e:
        raise PluginError(
            f"kubeconfig {one_line(path)}: unusable TLS certificate or key: {one_line(e)}"
        ) from None

    async def token(force: bool) -> str | None:
        return await kube.fresh_bearer_token()

    return API(
        kube.host,
        ssl_context=ctx,
        server_hostname=None,
        token=token,
        namespace=kube.namespace or _context_namespace(path, context),
        timeout=request_timeout,
        source=path,
    )


def _context_namespace(path: str, context: str | None) -> str | None:
    """The context's namespace in the kubeconfig file(s) the library loaded (its loader does not say):
    as kubectl merges them, the first file setting current-context and the first context of that name
    win. None when it cannot be read (the library already accepted the files, so this is rare)."""
    import yaml

    docs = []
    for name in path.split(os.pathsep):
        try:
            with open(name, "rb") as f:
                doc = yaml.safe_load(f.read(MAX_KUBECONFIG_BYTES))
        except (OSError, yaml.YAMLError, RecursionError):
            return None
        if isinstance(doc, dict):
            docs.append(doc)
    if context is None:
        context = next(
            (d["current-context"] for d in docs if isinstance(d.get("current-context"), str)), None
        )
    for doc in docs:
        for entry in doc.get("contexts") or []:
            if (
                isinstance(entry, dict)
                and entry.get("name") == context
                and isinstance(entry.get("context"), dict)
            ):
                namespace = entry["context"].get("namespace")
                return namespace if isinstance(namespace, str) and namespace else None
    return None


def _ssl_context(
    host: str, ca: str | None, cert: str | None, key: str | None, insecure: bool
) -> ssl.SSLContext | bool:
    if not host.startswith("https://"):
        return False
    ctx = ssl.create_default_context(cafile=ca)
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert and key:
        ctx.load_cert_chain(cert, key)
    return ctx
