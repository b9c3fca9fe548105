"""A real Prometheus on loopback and a simulated exporter with known values, for the Prometheus
bridge's tests, benchmark and demo.

:class:`RealPrometheus` runs the ``prometheus`` binary (Debian's 2.x package, ``/usr/bin/prometheus``)
as a subprocess with a generated configuration in a temporary folder: a free loopback port, its
own TSDB folder, a short scrape interval, ``honor_labels`` (the exporter's ``namespace``/``pod``
labels are kept as they are, as for kube-state-metrics)::

    exporter = SimExporter()                       # or SimExporter.bulk(10_000) for the benchmark
    await exporter.start()                         # aiohttp on 127.0.0.1:<port>/metrics
    async with RealPrometheus(targets=[exporter.target], scrape_interval=1.0) as prom:
        await prom.wait_scrapes(3)                 # every target scraped (and up) 3 times
        prom.url                                   # http://127.0.0.1:<port>
    await exporter.stop()

``RealPrometheus`` also works without a loop (``start()``/``stop()`` are synchronous; the async
context manager runs them in a thread): the pytest fixtures in ``tests/_prometheus_helpers.py``
keep one per test module, with the exporter in a thread of its own (:class:`ThreadedExporter`).
If the binary is missing :class:`PrometheusNotInstalled` says to run ``sh tests/system-deps.sh``
(the tests that need it fail, never skip).

The exporter (:class:`SimExporter`, its series and known values) lives in :mod:`kcms.sim.exporter`
and is re-exported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from kcms.sim.exporter import NODE_SYSTEM_CPU, NODE_SYSTEM_MEMORY, SimExporter, SimPod, ThreadedExporter

__all__ = [
    "NODE_SYSTEM_CPU",
    "NODE_SYSTEM_MEMORY",
    "PrometheusNotInstalled",
    "RealPrometheus",
    "SimExporter",
    "SimPod",
    "ThreadedExporter",
    "prometheus_binary",
]

INSTALL_HINT = "run `sh tests/system-deps.sh` (it installs Debian's prometheus package)"


class PrometheusNotInstalled(RuntimeError):
    """No ``prometheus`` binary: the message says how to install it."""


def prometheus_binary(search_path: str | None = None) -> str:
    """The path of the ``prometheus`` binary on ``search_path`` (default: ``$PATH``, then
    ``/usr/bin``), or :class:`PrometheusNotInstalled` naming the install command."""
    found = shutil.which("prometheus", path=search_path)
    if not found and search_path is None and os.access("/usr/bin/prometheus", os.X_OK):
        found = "/usr/bin/prometheus"
    if not found:
        raise PrometheusNotInstalled(f"the prometheus binary is not installed: {INSTALL_HINT}")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- Prometheus ---------------------------------------------------------------------------------


class RealPrometheus:
    """The real ``prometheus`` binary on 127.0.0.1, scraping ``targets`` (``host:port``) as job
    ``job``; ``extra_config`` (a dict) is merged into the generated configuration's top level
    (its ``scrape_configs`` are appended, its ``global`` keys merged: ``{"global":
    {"query_log_file": path}}`` logs every query with Prometheus's own timings). Stops with SIGTERM (then SIGKILL after 15 s) and
    removes its folder."""

    def __init__(
        self,
        targets: Sequence[str] = (),
        *,
        scrape_interval: float = 1.0,
        job: str = "sim",
        extra_config: dict[str, Any] | None = None,
        extra_args: Sequence[str] = (),
        start_timeout: float = 60.0,
        web_config: dict[str, Any] | None = None,
        client_ssl: ssl.SSLContext | None = None,
        route_prefix: str = "",
    ) -> None:
        self.binary = prometheus_binary()
        self.targets = list(targets)
        self.scrape_interval = scrape_interval
        self.job = job
        self.extra_config = extra_config or {}
        self.extra_args = list(extra_args)
        self.start_timeout = start_timeout
        self.web_config = web_config  # --web.config.file: tls_server_config, basic_auth_users
        self.client_ssl = client_ssl  # how its own reads (readiness, api()) verify and authenticate
        self.route_prefix = route_prefix.strip("/")  # --web.route-prefix: its API under /<prefix>/
        self.port = 0
        self.dir = ""
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The base URL (with the route prefix, if any): what ``--prometheus-url`` takes."""
        scheme = "https" if self.web_config and "tls_server_config" in self.web_config else "http"
        prefix = f"/{self.route_prefix}" if self.route_prefix else ""
        return f"{scheme}://127.0.0.1:{self.port}{prefix}"

    def config(self) -> dict[str, Any]:
        interval = f"{int(self.scrape_interval * 1000)}ms"
        cfg: dict[str, Any] = {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": interval,
            },
            "scrape_configs": [
                {"job_name": self.job, "honor_labels": True, "static_configs": [{"targets": self.targets}]}
            ]
            if self.targets
            else [],
        }
        for key, value in self.extra_config.items():
            if key == "scrape_configs":
                cfg["scrape_configs"].extend(value)
            elif key == "global":  # e.g. query_log_file: merged into the generated global section
                cfg["global"].update(value)
            else:
                cfg[key] = value
        return cfg

    def start(self) -> RealPrometheus:
        self.dir = tempfile.mkdtemp(prefix="kcms-prometheus-")
        config = os.path.join(self.dir, "prometheus.yml")
        with open(config, "w") as f:
            json.dump(self.config(), f)  # JSON is YAML
        args = list(self.extra_args)
        if self.web_config is not None:
            web = os.path.join(self.dir, "web.yml")
            with open(web, "w") as f:
                json.dump(self.web_config, f)
            args.append(f"--web.config.file={web}")
        if self.route_prefix:
            args.append(f"--web.route-prefix=/{self.route_prefix}")
        for _attempt in range(3):  # a port taken between free_port() and the bind: try another
            self.port = free_port()
            log = open(os.path.join(self.dir, "prometheus.log"), "wb")  # noqa: SIM115
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={config}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    f"--storage.tsdb.path={os.path.join(self.dir, 'data')}",
                    "--storage.tsdb.retention.time=2h",
                    "--log.level=warn",
                    *args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            log.close()
            if self._wait_ready():
                return self
            self._kill()
        tail = self.log_tail()
        self._cleanup()
        raise RuntimeError(f"prometheus did not become ready on loopback: {tail}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2, context=self.client_ssl) as r:
                    if r.status == 200:
                        return True
            time.sleep(0.1)
        return False

    def log_tail(self, size: int = 2000) -> str:
        try:
            with open(os.path.join(self.dir, "prometheus.log"), "rb") as f:
                return f.read()[-size:].decode("utf-8", "replace")
        except OSError:
            return "(no log)"

    def _kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(15)

    def _cleanup(self) -> None:
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = ""

    def stop(self) -> None:
        self._kill()
        self._cleanup()

    # its own API, read without KCMS's client (tests compare the two) ---------------------------

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>`` with ``params``; the ``data`` of a success, else RuntimeError."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(
            f"{self.url}/api/v1/{path}?{query}", timeout=30, context=self.client_ssl
        ) as r:
            doc = json.load(r)
        if doc.get("status") != "success":
            raise RuntimeError(f"prometheus: {doc}")
        return doc["data"]

    def scrapes_done(self) -> int:
        """The fewest successful scrapes of any target of the job so far (0 until all were up)."""
        counts = self.api("query", query=f'count_over_time(up{{job="{self.job}"}}[1h])')["result"]
        ups = self.api("query", query=f'up{{job="{self.job}"}}')["result"]
        if len(counts) < len(self.targets) or any(u["value"][1] != "1" for u in ups):
            return 0
        return min((int(float(c["value"][1])) for c in counts), default=0)

    def wait_scrapes_sync(self, n: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while (done := self.scrapes_done()) < n:
            if time.monotonic() > deadline or self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"prometheus scraped its targets {done} times, not {n}: {self.log_tail()}")
            time.sleep(min(0.25, self.scrape_interval / 2))

    async def wait_scrapes(self, n: int, limit: float = 60.0) -> None:
        """Wait (at most ``limit`` seconds, then RuntimeError) until every target was scraped and
        up ``n`` times."""
        await asyncio.to_thread(self.wait_scrapes_sync, n, limit)

    def __enter__(self) -> RealPrometheus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> RealPrometheus:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)
