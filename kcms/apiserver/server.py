"""``AggregatedAPIServer``: HTTPS, authentication, authorization, discovery, OpenAPI, health and
own metrics around the routes of the installed API group versions.

Every request goes through one middleware: attributes -> max-in-flight (probes exempt) ->
authentication -> authorization -> handler, with errors turned into ``Status`` objects and the
outcome counted in Prometheus metrics. Handlers find the caller in ``request["user"]`` and the
attributes in ``request["attributes"]``. The listener is guarded by :mod:`kcms.httpguard` (header,
idle and body deadlines; protocol errors answered as ``Status``). Every request-derived string in
a log line goes through :func:`kcms.limits.printable`.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import prometheus_client
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from kcms.filewatch import FileWatch
from kcms.flags import StartupError
from kcms.httpguard import GuardedRunner, GuardOptions, accepts_encoding
from kcms.limits import printable
from kcms.model import RequestAttributes, UserInfo

from . import metrics
from .authn import ANONYMOUS, Authenticator, AuthnOptions, load_ca_certs, resolve
from .authz import Authorizer, AuthzOptions, forbidden_error
from .discovery import APIGroupVersion, Discovery, negotiate_discovery
from .health import CheckFn, Health
from .inflight import RETRY_AFTER, InflightLimiter, is_probe
from .openapi import OpenAPICache
from .responses import (
    StatusError,
    bytes_response,
    internal_error,
    json_response,
    method_not_allowed,
    path_not_found,
    status_response,
    unauthorized,
)
from .responses import bad_request as _bad_request
from .serving import CertReloader, ServingOptions, resolve_cert_files

log = logging.getLogger(__name__)

AGGREGATED_DISCOVERY_TYPE = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
VERSION_INFO = {
    "major": "0",
    "minor": "1",
    "gitVersion": "v0.1.0",
    "gitCommit": "",
    "gitTreeState": "",
    "buildDate": "",
    "goVersion": "",
    "compiler": "",
    "platform": "python",
}
_KNOWN_VERBS = frozenset(
    "get list watch create update patch delete deletecollection proxy head post put options".split()
)
# The resource label of the request metrics names only a resource the group version lists in its
# discovery (first path segment: "pods" of "pods/<metric>") or in a route's literal path, and at
# most this many distinct ones; anything else is "other" (a client may ask for any resource name,
# and an external metric's resource is its name).
MAX_RESOURCE_LABELS = 64
USER = web.RequestKey("user", UserInfo)  # typed keys; the same values are also under "user"/"attributes"
ATTRIBUTES = web.RequestKey("attributes", RequestAttributes)
_str_keys_quiet = False


def _store(request: web.Request, key: web.RequestKey[Any], name: str, value: Any) -> None:
    """Store under the typed key and under its plain name (``request["user"]``), without aiohttp's
    once-per-process warning about string keys."""
    global _str_keys_quiet
    request[key] = value
    if _str_keys_quiet:
        request[name] = value
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", web.NotAppKeyWarning)
        request[name] = value
    _str_keys_quiet = name == "user"


class AggregatedAPIServer:
    """An aggregated API server. Install group versions and checks, then ``await start()``."""

    def __init__(
        self,
        serving: ServingOptions,
        authn: AuthnOptions,
        authz: AuthzOptions,
        kube_client: Any = None,
        *,
        aggregated_discovery: bool = False,
    ) -> None:
        self.serving = serving
        self.authn_options = authn
        self.authz_options = authz
        self.kube_client = kube_client
        self.aggregated_discovery = aggregated_discovery
        self.discovery = Discovery()
        self.health = Health()
        self.authenticator: Authenticator | None = None
        self.authorizer = Authorizer(authz)
        self.reloader: CertReloader | None = None
        self.app = web.Application(middlewares=[self._middleware], client_max_size=1 << 20)
        self.limiter = InflightLimiter(
            serving.max_requests_inflight, serving.max_mutating_requests_inflight, serving.executing_requests
        )
        self._openapi = OpenAPICache()
        self._resource_labels: set[tuple[str, str]] = set()  # (group, resource) seen as labels
        self._served: dict[tuple[str, str], tuple[float, frozenset[str]]] = {}  # gv -> (when, names)
        self._generation = 0
        self._runner: web.AppRunner | None = None
        self._files: FileWatch | None = None  # the serving cert/key and CA files (start())
        self._configmap_read = 0.0  # time.monotonic() of the last read of the ConfigMap
        self._configmap: dict[str, Any] | None = None
        self.configmap_refresh_interval = 60.0  # seconds between reads of extension-apiserver-authentication
        self._port = 0
        self.serving_cert_file = ""  # the serving cert/key in use (given or generated), set by start()
        self.serving_key_file = ""
        self._add_builtin_routes()

    # ---- public API -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound TCP port (after :meth:`start`)."""
        return self._port

    def install(self, gv: APIGroupVersion) -> None:
        """Serve a group version: its routes under ``/apis/<group>/<version>`` and its discovery and
        OpenAPI documents. Must be called before :meth:`start`."""
        if self._runner is not None:
            raise RuntimeError("install() must be called before start()")
        self.discovery.add(gv)
        for method, suffix, handler in gv.routes:
            self.app.router.add_route(method, gv.prefix + suffix, handler)
        self._generation += 1

    def add_check(
        self, name: str, fn: CheckFn, *, livez: bool = True, readyz: bool = True, report: bool = False
    ) -> None:
        """Add a named health check; ``fn()`` returns ``(ok, detail)``; ``report``: the detail is shown
        in ``?verbose`` while the check passes too."""
        self.health.add(name, fn, livez=livez, readyz=readyz, report=report)

    def set_shutting_down(self) -> None:
        """Make ``/readyz`` fail from now on (graceful shutdown)."""
        self.health.shutting_down = True

    async def start(self) -> None:
        """Resolve the authentication configuration, create the TLS context and listen."""
        configmap = await self._lookup_configmap()
        resolved = resolve(self.authn_options, configmap)
        token_reviewer = self.authn_options.token_reviewer
        if token_reviewer is None and self.kube_client is not None:
            from kcms.kube.reviews import TokenReviewer

            token_reviewer = TokenReviewer(self.kube_client)
        if (
            self.authz_options.access_reviewer is None
            and self.kube_client is not None
            and not self.authz_options.allow_all
        ):
            from kcms.kube.reviews import AccessReviewer

            self.authz_options.access_reviewer = AccessReviewer(self.kube_client)
        self.authenticator = Authenticator(resolved, token_reviewer, self.authn_options.allow_anonymous)
        self._configmap = configmap
        self._configmap_read = time.monotonic()
        cert_file, key_file = await resolve_cert_files(self.serving)
        self.serving_cert_file, self.serving_key_file = cert_file, key_file
        self.reloader = CertReloader(
            cert_file,
            key_file,
            resolved.client_ca_pems + resolved.requestheader_ca_pems,
            self.serving.tls_min_version,
        )
        guard = GuardOptions(
            header_timeout=self.serving.request_header_timeout,
            idle_timeout=self.serving.idle_timeout,
            body_timeout=self.serving.body_timeout,
            listener="apiserver",
        )
        self._runner = GuardedRunner(self.app, guard, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            self.serving.bind_address,
            self.serving.secure_port,
            ssl_context=self.reloader.ctx,
            backlog=1024,
        )
        try:
            await site.start()
        except OSError as e:  # in use, or an address this host does not have: the flags' fault
            await self._runner.cleanup()
            raise StartupError(
                f"cannot listen on {self.serving.bind_address or '*'}:{self.serving.secure_port} "
                f"(--bind-address, --secure-port): {e.strerror or e}"
            ) from None
        server = site._server  # noqa: SLF001 - aiohttp exposes no public accessor for the bound socket
        sockets = getattr(server, "sockets", None) or []
        self._port = sockets[0].getsockname()[1] if sockets else self.serving.secure_port
        opts = self.authn_options
        self._files = FileWatch(
            (cert_file, key_file, opts.client_ca_file, opts.requestheader_client_ca_file),
            self._files_changed,
            interval=self.serving.reload_interval,
        )
        self._files.start()
        log.info("serving securely on %s:%d", self.serving.bind_address, self._port)

    async def stop(self) -> None:
        """Stop listening and close connections."""
        self.set_shutting_down()
        if self._files is not None:
            await self._files.stop()
            self._files = None
        if self._runner is not None:
            server = self._runner.server
            connections = list(server.connections) if server is not None else []
            transports = [c.transport for c in connections if c.transport is not None]
            await self._runner.cleanup()
            self._runner = None
            for t in transports:  # TLS close_notify may never be answered by idle pooled clients
                t.abort()

    # ---- configuration lookup ------------------------------------------------------------

    async def _lookup_configmap(self) -> dict[str, Any] | None:
        opts = self.authn_options
        if opts.skip_lookup or self.kube_client is None:
            return None
        if opts.client_ca_file and opts.requestheader_client_ca_file:
            return None
        from kcms.kube.reviews import read_extension_apiserver_authentication

        try:
            return await read_extension_apiserver_authentication(self.kube_client)
        except Exception as e:  # kube goes on without it, so do we
            log.warning(
                "unable to read kube-system/extension-apiserver-authentication, continuing without it: %s", e
            )
            return None

    async def refresh_authn(self, reread_configmap: bool = True) -> bool:
        """Re-read the CA files (and the ConfigMap when looked up); apply changes to authentication and
        to the TLS context of new connections. True when something changed; errors keep the old state."""
        if self.authenticator is None or self.reloader is None:
            return False
        if reread_configmap:
            configmap = await self._lookup_configmap()
            if configmap is not None:
                self._configmap = configmap
        try:
            resolved = resolve(self.authn_options, self._configmap)
        except (OSError, ValueError) as e:
            log.error("authentication CA files did not load, keeping the previous ones: %s", e)
            return False
        if resolved == self.authenticator.config:
            return False
        try:  # parse first: the TLS layer silently skips garbage next to a valid certificate
            for pems in (resolved.client_ca_pems, resolved.requestheader_ca_pems):
                if any(not load_ca_certs([p]) for p in pems):
                    raise ValueError("no certificate in the CA data")
        except ValueError as e:
            log.error("authentication CAs did not parse, keeping the previous ones: %s", e)
            return False
        all_cas = resolved.client_ca_pems + resolved.requestheader_ca_pems
        if not self.reloader.set_client_cas(all_cas) and self.reloader.client_ca_pems != all_cas:
            return False  # the new CAs did not load into TLS: keep everything as it was
        self.authenticator.update(resolved)
        log.info("authentication configuration reloaded")
        return True

    async def _files_changed(self) -> None:
        """The certificate or CA files may have changed (or a minute passed): look again, and
        re-read the extension-apiserver-authentication ConfigMap when it is due."""
        assert self.reloader is not None
        self.reloader.check()
        reread = time.monotonic() - self._configmap_read >= self.configmap_refresh_interval
        if reread:
            self._configmap_read = time.monotonic()
        await self.refresh_authn(reread_configmap=reread)

    # ---- the request pipeline -----------------------------------------------------------

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        start = time.perf_counter()
        attrs = _attributes(request)
        _store(request, ATTRIBUTES, "attributes", attrs)
        code = 500
        try:
            if is_probe(request.path):  # probes never queue behind list traffic
                resp = await self._serve(request, handler, attrs)
            else:
                async with self.limiter.admit(request.method):
                    resp = await self._serve(request, handler, attrs)
            code = resp.status
            return resp
        except StatusError as e:
            code = e.code
            resp = status_response(request, e)
            if code == 429:
                resp.headers["Retry-After"] = str(RETRY_AFTER)
            return resp
        except Exception as e:  # a failure outside the handler (authentication, ...)
            log.exception("request %s %s failed", printable(request.method, 16), printable(request.path))
            err = internal_error(f"{type(e).__name__}: {e}")
            return status_response(request, err)
        finally:
            labels = self._metric_labels(attrs, code)
            metrics.REQUESTS.labels(*labels).inc()
            metrics.REQUEST_DURATION.labels(*labels).observe(time.perf_counter() - start)

    def _metric_labels(self, attrs: RequestAttributes, code: int) -> tuple[str, str, str, str]:
        """Bounded label values: paths from unauthenticated or unknown requests never become labels."""
        verb = attrs.verb if attrs.verb in _KNOWN_VERBS else "other"
        group = resource = ""
        if attrs.resource_request and code not in (401, 404):
            gv = self.discovery.find(attrs.api_group, attrs.api_version)
            if gv is not None:
                group, resource = attrs.api_group, self._resource_label(gv, attrs.resource)
        return verb, group, resource, str(code)

    def _resource_label(self, gv: APIGroupVersion, resource: str) -> str:
        """``resource`` when ``gv`` lists it and the label budget allows, else ``"other"``."""
        key = (gv.group, resource)
        if key in self._resource_labels:
            return resource
        if len(self._resource_labels) >= MAX_RESOURCE_LABELS:
            return "other"
        now = time.monotonic()
        cached = self._served.get((gv.group, gv.version))
        if cached is None or now - cached[0] > 1.0:  # at most one discovery walk a second
            names = {str(r.get("name", "")).split("/", 1)[0] for r in gv.resource_list()}
            for _, path, _ in gv.routes:  # and the literal resources of its routes
                parts = path.strip("/").split("/")
                if parts[:2] == ["namespaces", "{namespace}"] and len(parts) > 2:
                    parts = parts[2:]
                if not parts[0].startswith("{"):
                    names.add(parts[0])
            cached = self._served[(gv.group, gv.version)] = (now, frozenset(names))
        if resource not in cached[1]:
            return "other"
        self._resource_labels.add(key)
        return resource

    async def _serve(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        attrs: RequestAttributes,
    ) -> web.StreamResponse:
        assert self.authenticator is not None, "server not started"
        always = self.authorizer.always_allowed_path(request.path)
        result = await self.authenticator.authenticate(request)
        metrics.AUTHENTICATIONS.labels(result.method).inc()
        user = result.user
        if user is None:
            if not always:
                raise unauthorized()
            user = ANONYMOUS
        _store(request, USER, "user", user)
        encoding = request.headers.get("Content-Encoding", "").strip().lower()
        if request.body_exists and not accepts_encoding(request.path, encoding):  # the guard refuses it first
            raise StatusError(415, "UnsupportedMediaType", "unsupported Content-Encoding")
        if always:
            metrics.AUTHORIZATIONS.labels("always-allowed-path").inc()
        elif self.authorizer.handler_authorizes(request.path):  # authenticated; the handler decides per item
            metrics.AUTHORIZATIONS.labels("by-handler").inc()
        else:
            await self._authorize(user, attrs)
        if attrs.verb == "watch" and attrs.resource_request:
            self.discovery.check_watchable(attrs)
        try:
            if is_probe(request.path):
                return await handler(request)
            async with self.limiter.seat(request.method):  # few handlers ready at once: see inflight
                return await handler(request)
        except StatusError:
            raise
        except (RequestPayloadError, ConnectionError) as e:  # the client's broken body or hang-up
            log.info(
                "request %s %s: the body could not be read: %s",
                printable(request.method, 16),
                printable(request.path),
                printable(e),
            )
            raise _bad_request("the request body could not be read") from None
        except web.HTTPNotFound as e:
            raise path_not_found() from e
        except web.HTTPMethodNotAllowed as e:
            raise method_not_allowed() from e
        except web.HTTPException as e:
            if e.status < 400:  # redirects and 304s are answers, not errors
                return web.Response(status=e.status, headers=e.headers)
            raise StatusError(e.status, e.reason.replace(" ", ""), e.text or e.reason) from e
        except Exception as e:
            log.exception("handler for %s %s failed", printable(request.method, 16), printable(request.path))
            raise internal_error(f"{type(e).__name__}: {e}") from e

    async def _authorize(self, user: UserInfo, attrs: RequestAttributes) -> None:
        try:
            allowed, reason = await self.authorizer.authorize(user, attrs)
        except StatusError:
            metrics.AUTHORIZATIONS.labels("error").inc()
            raise
        metrics.AUTHORIZATIONS.labels("allowed" if allowed else "denied").inc()
        if not allowed:
            log.info(
                "forbidden: %s %s for %s: %s",
                printable(attrs.verb, 32),
                printable(attrs.path),
                printable(user.name, 80),
                printable(reason),
            )
            raise forbidden_error(user, attrs, reason)

    # ---- built-in endpoints -------------------------------------------------------------

    def _add_builtin_routes(self) -> None:
        r = self.app.router
        r.add_get("/", self._root)
        r.add_get("/version", self._version)
        for slash in ("", "/"):  # clients ask for both /apis and /apis/
            r.add_get("/apis" + slash, self._apis)
            r.add_get("/apis/{group}" + slash, self._api_group)
            r.add_get("/apis/{group}/{version}" + slash, self._api_resources)
        r.add_get("/openapi/v2", self._openapi_v2)
        r.add_get("/openapi/v3", self._openapi_v3_index)
        r.add_get("/openapi/v3/apis/{group}/{version}", self._openapi_v3)
        r.add_get("/metrics", self._metrics)
        for endpoint in ("healthz", "livez", "readyz"):
            r.add_get(f"/{endpoint}", self._health_handler(endpoint, False))
            r.add_get(f"/{endpoint}/{{check}}", self._health_handler(endpoint, True))

    def _health_handler(
        self, endpoint: str, single: bool
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handler(request: web.Request) -> web.StreamResponse:
            return self.health.handle(endpoint, request, request.match_info["check"] if single else None)

        return handler

    async def _root(self, request: web.Request) -> web.StreamResponse:
        paths = {
            "/apis",
            "/healthz",
            "/livez",
            "/readyz",
            "/metrics",
            "/openapi/v2",
            "/openapi/v3",
            "/version",
        }
        for gv in self.discovery.all():
            paths.update({f"/apis/{gv.group}", gv.prefix})
        return json_response(request, {"paths": sorted(paths)})

    async def _version(self, request: web.Request) -> web.StreamResponse:
        return json_response(request, VERSION_INFO)

    async def _apis(self, request: web.Request) -> web.StreamResponse:
        if negotiate_discovery(request.headers.get("Accept"), self.aggregated_discovery) == "aggregated":
            return json_response(request, self.discovery.aggregated(), content_type=AGGREGATED_DISCOVERY_TYPE)
        return json_response(request, self.discovery.group_list())

    async def _api_group(self, request: web.Request) -> web.StreamResponse:
        negotiate_discovery(request.headers.get("Accept"), False)
        doc = self.discovery.group(request.match_info["group"])
        if doc is None:
            raise path_not_found()
        return json_response(request, doc)

    async def _api_resources(self, request: web.Request) -> web.StreamResponse:
        negotiate_discovery(request.headers.get("Accept"), False)
        doc = self.discovery.resource_list(request.match_info["group"], request.match_info["version"])
        if doc is None:
            raise path_not_found()
        return json_response(request, doc)

    def _refresh_openapi(self) -> None:
        self._openapi.refresh(self._generation, self.discovery.all())

    @staticmethod
    def _etagged(request: web.Request, body: bytes, etag: str, immutable: bool = False) -> web.StreamResponse:
        headers = {"ETag": etag}
        if immutable:
            headers["Cache-Control"] = "public, immutable"
        inm = request.headers.get("If-None-Match", "")
        if inm and (inm.strip() == "*" or etag in [t.strip() for t in inm.split(",")]):
            return web.Response(status=304, headers=headers)
        return bytes_response(request, body, headers=headers)

    async def _openapi_v2(self, request: web.Request) -> web.StreamResponse:
        self._refresh_openapi()
        body, etag = self._openapi.v2()
        return self._etagged(request, body, etag)

    async def _openapi_v3_index(self, request: web.Request) -> web.StreamResponse:
        self._refresh_openapi()
        return json_response(request, self._openapi.v3_index())

    async def _openapi_v3(self, request: web.Request) -> web.StreamResponse:
        self._refresh_openapi()
        key = f"apis/{request.match_info['group']}/{request.match_info['version']}"
        found = self._openapi.v3(key)
        if found is None:
            raise path_not_found()
        body, etag = found
        wanted = request.query.get("hash")
        if wanted is not None and wanted != etag.strip('"'):
            # an old hash: send the client to the current document, as kube-openapi does
            location = f"/openapi/v3/{key}?hash={etag.strip(chr(34))}"
            return web.Response(status=301, headers={"Location": location})
        return self._etagged(request, body, etag, immutable=wanted is not None)

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        body = prometheus_client.generate_latest(prometheus_client.REGISTRY)
        return bytes_response(request, body, content_type=prometheus_client.CONTENT_TYPE_LATEST)


def _attributes(request: web.Request) -> RequestAttributes:
    from .requestinfo import request_attributes

    return request_attributes(request.method, request.path, request.query)
