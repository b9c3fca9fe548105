"""A real Prometheus scraping the simulated exporter (kcms/sim/prometheus.py), for the Prometheus
bridge's tests. Fixtures are declared with ``name=`` so a test module imports them:
``from _prometheus_helpers import prom_fixture  # noqa: F401`` (the fixture is then ``prom``).

``prom`` is one running Prometheus per test module (module scope: it takes seconds to start and
to scrape), already scraped the exporter (and every target up) :data:`SCRAPES` times, waited on
Prometheus's own API with a bound; ``prom.exporter`` is the :class:`SimExporter` it scrapes (its
known rates and values). Both run without an event loop of the test (the exporter in a thread of
its own), so any test loop scope can use them. The ``prometheus`` binary missing fails the test
with the install hint, never skips it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kcms.sim.prometheus import RealPrometheus, SimExporter, ThreadedExporter

SCRAPES = 5  # scrapes before a test runs: rate() over a few seconds has samples to work with
SCRAPE_INTERVAL = 1.0
WAIT_LIMIT = 90.0  # seconds for Prometheus to start and scrape SCRAPES times (not a timing check)


class PromEnv:
    """A running Prometheus and the exporter it scrapes."""

    def __init__(self, prometheus: RealPrometheus, exporter: SimExporter) -> None:
        self.prometheus = prometheus
        self.exporter = exporter
        self.url = prometheus.url

    def api(self, path: str, **params: str):
        """Prometheus's own answer (urllib, not KCMS's client): the independent read tests compare with."""
        return self.prometheus.api(path, **params)

    def wait_scrapes(self, n: int) -> None:
        self.prometheus.wait_scrapes_sync(n, WAIT_LIMIT)

    def rate_window(self, seconds: int = 4) -> str:
        """A range for ``rate()`` that Prometheus's samples fully cover (waits for enough scrapes
        first), so the rate is the exporter's known rate, not cut short by extrapolation limits."""
        self.wait_scrapes(int(seconds / SCRAPE_INTERVAL) + 3)
        return f"{seconds}s"


def start_prom_env(exporter: SimExporter, scrapes: int = SCRAPES) -> tuple[PromEnv, ThreadedExporter]:
    served = ThreadedExporter(exporter).start()
    try:
        prometheus = RealPrometheus([served.target], scrape_interval=SCRAPE_INTERVAL).start()
    except BaseException:
        served.stop()
        raise
    env = PromEnv(prometheus, exporter)
    try:
        env.wait_scrapes(scrapes)
    except BaseException:
        prometheus.stop()
        served.stop()
        raise
    return env, served


@pytest.fixture(name="prom", scope="module")
def prom_fixture() -> Iterator[PromEnv]:
    env, served = start_prom_env(SimExporter())
    try:
        yield env
    finally:
        env.prometheus.stop()
        served.stop()


@pytest.fixture(name="prom_exporter", scope="module")
def prom_exporter_fixture(prom: PromEnv) -> SimExporter:
    return prom.exporter
