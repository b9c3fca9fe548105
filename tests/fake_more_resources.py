"""A second, small fake Kubernetes API server for the custom-metrics tests: discovery (``/api/v1``,
``/apis/<group>``, ``/apis/<group>/<version>``) and label-selected LISTs of namespaces and of
``deployments.apps`` (any resource registered with :meth:`FakeResources.add_resource`).

tests/fakeapi.py serves nodes, pods, configmaps and leases with watches; this one only answers the
plain LISTs (with ``labelSelector``) that ``kcms.apis.objects.ObjectLabels`` makes, over real HTTPS.

    async with FakeResources(ca) as fake:
        fake.add("namespaces", "", "shop", {"team": "a"})
        kube = fake.client(tmp_path)
"""

from __future__ import annotations

import ssl
from pathlib import Path

import orjson
import trustme
from aiohttp import web

from kcms.kube.client import KubeClient
from kcms.selectors import SelectorError, parse_label_selector

TOKEN = "more-resources-token"


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    body.update({"message": message, "reason": reason, "code": code})
    return web.Response(status=code, body=orjson.dumps(body), content_type="application/json")


class FakeResources:
    """Discovery and LIST of a few resources; ``requests`` records (path, query) of every request."""

    def __init__(self, ca: trustme.CA) -> None:
        self.ca = ca
        self.port = 0
        self.requests: list[tuple[str, dict[str, str]]] = []
        # (group, version, plural) -> (kind, namespaced)
        self.resources: dict[tuple[str, str, str], tuple[str, bool]] = {
            ("", "v1", "namespaces"): ("Namespace", False),
            ("", "v1", "pods"): ("Pod", True),
            ("apps", "v1", "deployments"): ("Deployment", True),
        }
        self.objects: dict[tuple[str, str], dict[tuple[str, str], dict]] = {}  # (group, plural) -> objects
        self._runner: web.AppRunner | None = None
        self._cert = ca.issue_cert("127.0.0.1")

    def add_resource(self, group: str, version: str, plural: str, kind: str, namespaced: bool) -> None:
        """Serve another resource (discovery and LIST)."""
        self.resources[(group, version, plural)] = (kind, namespaced)

    def add(self, group_resource: str, namespace: str, name: str, labels: dict[str, str]) -> None:
        """Store an object of ``group_resource`` (e.g. ``"deployments.apps"``, ``"namespaces"``)."""
        plural, _, group = group_resource.partition(".")
        meta = {"name": name, "labels": labels}
        if namespace:
            meta["namespace"] = namespace
        self.objects.setdefault((group, plural), {})[(namespace, name)] = {"metadata": meta}

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def client(self, tmp: Path) -> KubeClient:
        """A real KubeClient for this server (CA written under ``tmp``)."""
        ca_file = tmp / "more-resources-ca.pem"
        self.ca.cert_pem.write_to_path(str(ca_file))
        return KubeClient(self.url, ca_file=str(ca_file), authorization=f"Bearer {TOKEN}")

    async def __aenter__(self) -> FakeResources:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._cert.configure_cert(ctx)
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # ---- HTTP ------------------------------------------------------------------------------------
    def _resource_list(self, group: str, version: str) -> dict:
        gv = f"{group}/{version}" if group else version
        resources = [
            {"name": p, "singularName": "", "namespaced": ns, "kind": kind, "verbs": ["get", "list"]}
            for (g, v, p), (kind, ns) in self.resources.items()
            if g == group and v == version
        ]
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}

    async def _handle(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, dict(request.query)))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return _status(401, "Unauthorized", "Unauthorized")
        parts = [p for p in request.path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 2:
            group = parts[1]
            versions = sorted({v for g, v, _ in self.resources if g == group})
            if not versions:
                return _status(404, "NotFound", "the server could not find the requested resource")
            if len(parts) == 2:
                gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
                body = {
                    "kind": "APIGroup",
                    "apiVersion": "v1",
                    "name": group,
                    "versions": gvs,
                    "preferredVersion": gvs[-1],
                }
                return web.Response(body=orjson.dumps(body), content_type="application/json")
            version, rest = parts[2], parts[3:]
        else:
            return _status(404, "NotFound", "the server could not find the requested resource")
        if not rest:
            return web.Response(
                body=orjson.dumps(self._resource_list(group, version)), content_type="application/json"
            )
        namespace = ""
        if len(rest) == 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if len(rest) != 1 or (group, version, rest[0]) not in self.resources:
            return _status(404, "NotFound", "the server could not find the requested resource")
        plural = rest[0]
        kind, _ = self.resources[(group, version, plural)]
        try:
            selector = parse_label_selector(request.query.get("labelSelector", ""))
        except SelectorError as e:
            return _status(400, "BadRequest", str(e))
        items = [
            obj
            for (ns, _), obj in sorted(self.objects.get((group, plural), {}).items())
            if (not namespace or ns == namespace) and selector.matches(obj["metadata"]["labels"])
        ]
        body = {
            "kind": f"{kind}List",
            "apiVersion": f"{group}/{version}" if group else version,
            "metadata": {"resourceVersion": "1"},
            "items": items,
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")
