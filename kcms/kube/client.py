"""A slim Kubernetes API client: kcms.kube.kubeconfig reads the config (kubernetes_asyncio, imported only
then, for what it does not handle: exec plugins, auth providers, basic auth, proxies, merged files),
aiohttp + orjson do the requests.

We never build kubernetes_asyncio model objects: responses stay plain dicts (and are converted to the
small dataclasses of kcms.model by the callers), which keeps large inventories cheap.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import orjson

from kcms.kube.kubeconfig import (
    TOKEN_FILE_RELOAD,
    KubeConfigError,
    NeedsLibrary,
    TokenFile,
    load_incluster,
    load_kubeconfig,
)

log = logging.getLogger(__name__)

MAX_WATCH_LINE = 16 << 20  # bytes of one watch event (etcd stores objects of at most 1.5 MiB)


class KubeAPIError(Exception):
    """A non-2xx answer of the Kubernetes API server (the fields of its Status object when it sent one)."""

    def __init__(self, status: int, reason: str, message: str, body: Any = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body


def _api_error(status: int, raw: bytes) -> KubeAPIError:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = raw.decode("utf-8", "replace")[:2000]
    if isinstance(body, dict) and body.get("kind") == "Status":
        return KubeAPIError(status, body.get("reason", ""), body.get("message", ""), body)
    return KubeAPIError(status, "", str(body)[:500], body)


class KubeClient:
    """One connection pool to one Kubernetes API server, authenticated as the loaded identity.

    Create with ``await KubeClient.load(kubeconfig, context)``; close with ``await client.close()``.
    """

    def __init__(
        self,
        host: str,
        *,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        insecure: bool = False,
        authorization: str | None = None,
        tls_server_name: str | None = None,
        configuration: Any = None,
        loader: Any = None,
        token_file: TokenFile | None = None,
        namespace: str | None = None,
        request_timeout: float = 30.0,
    ) -> None:
        self.host = host.rstrip("/")
        self.insecure = insecure
        self.request_timeout = request_timeout
        self._ca_file = ca_file
        self._cert_file = cert_file
        self._key_file = key_file
        self._authorization = authorization
        self._tls_server_name = tls_server_name
        self._configuration = configuration
        self._loader = loader
        self._token_file = token_file  # kcms.kube.kubeconfig's rotating token (kubeconfig tokenFile, in-cluster)
        if token_file is not None:
            self._authorization = f"Bearer {token_file.token}"
        self.namespace = namespace  # the context's / the service account's namespace, if any
        self._token_file_read = time.monotonic()
        self._session: aiohttp.ClientSession | None = None
        self._ssl = self._make_ssl_context()

    # ---- construction -----------------------------------------------------------------------------
    @classmethod
    async def load(cls, kubeconfig: str | None, context: str | None = None) -> KubeClient:
        """Load a kubeconfig file (or, with None, the in-cluster service account) and build a client.

        kcms.kube.kubeconfig reads it; what that does not handle goes to kubernetes_asyncio (see there).
        """
        where = f"--kubeconfig {kubeconfig!r}" if kubeconfig is not None else "in-cluster config"
        try:
            if kubeconfig is not None:
                own = load_kubeconfig(kubeconfig, context)
            else:
                try:
                    own = load_incluster()
                except KubeConfigError as e:
                    raise KubeConfigError(
                        f"not running in a cluster ({e}); pass --kubeconfig PATH to reach a Kubernetes API server"
                    ) from e
        except NeedsLibrary as e:
            log.info("%s: %s, loading it with kubernetes_asyncio", where, e)
            return await cls._load_with_library(kubeconfig, context)
        except KubeConfigError as e:
            if kubeconfig is None:
                raise
            raise KubeConfigError(f"{where}: {e}") from e
        try:
            return cls(
                own.host,
                ca_file=own.ca_file,
                cert_file=own.cert_file,
                key_file=own.key_file,
                insecure=own.insecure,
                authorization=f"Bearer {own.token}" if own.token else None,
                tls_server_name=own.tls_server_name,
                token_file=own.token_file,
                namespace=own.namespace,
            )
        except (ssl.SSLError, OSError, ValueError) as e:  # a CA or key pair the TLS layer refuses
            raise KubeConfigError(f"{where}: unusable TLS certificate or key: {e}") from e

    @classmethod
    async def _load_with_library(cls, kubeconfig: str, context: str | None) -> KubeClient:
        """The kubernetes_asyncio loader (exec plugins, auth providers, basic auth, proxies, merging)."""
        from kubernetes_asyncio.client import Configuration
        from kubernetes_asyncio.config import ConfigException, load_kube_config

        cfg = Configuration()
        try:
            loader = await load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=cfg, persist_config=False
            )
        except (ConfigException, OSError, ValueError, KeyError, TypeError) as e:
            raise KubeConfigError(f"--kubeconfig {kubeconfig!r}: {e}") from e
        if getattr(cfg, "proxy", None):
            log.warning("kubeconfig proxy-url %s is ignored", cfg.proxy)
        return cls(
            cfg.host,
            ca_file=cfg.ssl_ca_cert,
            cert_file=cfg.cert_file,
            key_file=cfg.key_file,
            insecure=not cfg.verify_ssl,
            authorization=cfg.api_key.get("BearerToken"),
            tls_server_name=getattr(cfg, "tls_server_name", None),
            configuration=cfg,
            loader=loader,
        )

    def _make_ssl_context(self) -> ssl.SSLContext | bool:
        if not self.host.startswith("https://"):
            return False
        ctx = ssl.create_default_context(cafile=self._ca_file)
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self._cert_file and self._key_file:
            ctx.load_cert_chain(self._cert_file, self._key_file)
        return ctx

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl, limit=64),
                json_serialize=lambda o: orjson.dumps(o).decode(),
            )
        return self._session

    async def close(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- identity, shared with the kubelet client -------------------------------------------------
    def bearer_token(self) -> str | None:
        """The current bearer token (without the "Bearer " prefix), or None when not token-authenticated.

        Token files (in-cluster service account, kubeconfig tokenFile) are re-read when due.
        """
        self._refresh_files()
        auth = self._authorization
        if auth and auth.startswith("Bearer "):
            return auth[7:].strip()
        return None

    def client_cert_files(self) -> tuple[str, str] | None:
        """(certificate file, key file) of the client certificate, if the config uses one."""
        if self._cert_file and self._key_file:
            return self._cert_file, self._key_file
        return None

    def ca_file(self) -> str | None:
        """The CA bundle file the API server is verified with (None: system trust store)."""
        return self._ca_file

    def _refresh_files(self, force: bool = False) -> None:
        """Re-read rotating token files: the in-cluster service-account token, a kubeconfig tokenFile."""
        if self._token_file is not None:
            self._authorization = f"Bearer {self._token_file.current(force)}"
            return
        cfg, loader = self._configuration, self._loader
        if cfg is not None and cfg.refresh_api_key_hook is not None:
            cfg.refresh_api_key_hook(cfg)  # kubernetes_asyncio's in-cluster hook is synchronous
            self._authorization = cfg.api_key.get("BearerToken", self._authorization)
        user = getattr(loader, "_user", None)
        if user is not None and "tokenFile" in user and "exec" not in user:
            now = time.monotonic()
            if force or now - self._token_file_read > TOKEN_FILE_RELOAD:  # the cadence of our own loader
                self._token_file_read = now
                try:
                    if loader._load_user_token():
                        self._authorization = loader.token
                except OSError as e:
                    log.debug("cannot re-read the kubeconfig token file: %s", e)

    async def _refresh_auth(self, force: bool = False) -> None:
        """Refresh rotating credentials: token files, and exec plugins when expired (or ``force``)."""
        self._refresh_files(force)
        loader = self._loader
        user = getattr(loader, "_user", None)
        if user is not None and "exec" in user:
            if force and hasattr(loader, "exec_plugin_expiry"):
                del loader.exec_plugin_expiry
            if force or hasattr(loader, "exec_plugin_expiry"):
                await loader.load_from_exec_plugin()
                self._authorization = getattr(loader, "token", self._authorization)

    async def fresh_bearer_token(self) -> str | None:
        """Like bearer_token(), after renewing an expired exec-plugin credential."""
        await self._refresh_auth()
        return self.bearer_token()

    def _headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "kcms"}
        if self._authorization:
            headers["Authorization"] = self._authorization.strip()
        if extra:
            headers.update(extra)
        return headers

    # ---- requests ---------------------------------------------------------------------------------
    async def _request(
        self, method: str, path: str, params: Mapping[str, Any] | None, body: Any, accept: str = ""
    ) -> bytes:
        data = orjson.dumps(body) if body is not None else None
        extra = {"Content-Type": "application/json"} if data is not None else {}
        if accept:
            extra["Accept"] = accept
        for attempt in (0, 1):
            await self._refresh_auth(force=attempt == 1)
            async with self._get_session().request(
                method,
                self.host + path,
                params=_clean_params(params),
                data=data,
                headers=self._headers(extra),
                timeout=aiohttp.ClientTimeout(total=self.request_timeout),
                server_hostname=self._tls_server_name,
            ) as resp:
                raw = await resp.read()
                if resp.status == 401 and attempt == 0 and (self._loader or self._token_file) is not None:
                    continue  # credentials may have rotated: refresh once and retry
                if resp.status >= 300:
                    raise _api_error(resp.status, raw)
                return raw
        raise AssertionError("unreachable")

    async def get_json(self, path: str, params: Mapping[str, Any] | None = None) -> dict:
        """GET ``path`` (e.g. "/api/v1/nodes") and return the decoded JSON object."""
        return orjson.loads(await self._request("GET", path, params, None))

    async def get_raw(self, path: str, params: Mapping[str, Any] | None = None, *, accept: str = "") -> bytes:
        """GET ``path`` and return the body undecoded (for typed decoders that skip what they do not
        read); ``accept`` replaces the Accept header (e.g. PartialObjectMetadataList)."""
        return await self._request("GET", path, params, None, accept)

    async def post_json(self, path: str, body: Any) -> dict:
        """POST a JSON body and return the decoded answer."""
        return orjson.loads(await self._request("POST", path, None, body))

    async def put_json(self, path: str, body: Any) -> dict:
        """PUT a JSON body and return the decoded answer."""
        return orjson.loads(await self._request("PUT", path, None, body))

    async def watch_lines(self, path: str, params: Mapping[str, Any]) -> AsyncIterator[dict]:
        """Open a watch on ``path`` and yield each decoded watch event ({"type": ..., "object": ...}).

        Ends when the server closes the stream normally; raises aiohttp errors when it is cut.
        """
        async for line in self.watch_raw(path, params):
            yield orjson.loads(line)

    async def watch_raw(
        self, path: str, params: Mapping[str, Any], *, accept: str = ""
    ) -> AsyncIterator[bytes]:
        """Open a watch on ``path`` and yield each watch event line undecoded (see watch_lines)."""
        await self._refresh_auth()
        params = dict(params)
        params["watch"] = "true"
        server_timeout = float(params.get("timeoutSeconds") or 1800)
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self.request_timeout, sock_read=server_timeout + 30
        )
        async with self._get_session().get(
            self.host + path,
            params=_clean_params(params),
            headers=self._headers({"Accept": accept} if accept else None),
            timeout=timeout,
            server_hostname=self._tls_server_name,
        ) as resp:
            if resp.status >= 300:
                raise _api_error(resp.status, await resp.read())
            # Split each chunk at once (a chunk often holds many events); the unfinished tail waits
            # in ``parts``, bounded: no Kubernetes object comes near MAX_WATCH_LINE.
            # An event beyond that is dropped (to its end), not raised: a re-watch would meet it again.
            parts: list[bytes] = []
            pending = 0
            skipping = False
            async for chunk in resp.content.iter_any():
                if b"\n" not in chunk:
                    if not skipping:
                        parts.append(chunk)
                        pending += len(chunk)
                        if pending > MAX_WATCH_LINE:
                            parts, pending, skipping = [], 0, True
                    continue
                if skipping:
                    chunk = chunk[chunk.index(b"\n") + 1 :]
                    skipping = False
                    log.warning("%s: skipped a watch event over %d bytes", path, MAX_WATCH_LINE)
                elif parts:
                    parts.append(chunk)
                    chunk = b"".join(parts)
                lines = chunk.split(b"\n")
                tail = lines.pop()
                parts, pending = ([tail], len(tail)) if tail else ([], 0)
                for line in lines:
                    if len(line) > MAX_WATCH_LINE:
                        log.warning("%s: skipped a watch event over %d bytes", path, MAX_WATCH_LINE)
                    elif line and not line.isspace():
                        yield line
            tail = b"".join(parts)
            if tail.strip():
                yield tail


def _clean_params(params: Mapping[str, Any] | None) -> dict[str, str] | None:
    if not params:
        return None
    out = {}
    for k, v in params.items():
        if v is None or v == "":
            continue
        out[k] = ("true" if v else "false") if isinstance(v, bool) else str(v)
    return out
