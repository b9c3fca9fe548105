"""Scraping one kubelet: address choice, TLS and credentials, bounded reads, decoding."""

from __future__ import annotations

import asyncio.sslproto
import math
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import Counter

from kcms.collector.http11 import MAX_HEADER_BYTES, MAX_HEADERS, HTTPError, KeepAlivePool
from kcms.model import DecodeError, NodeBatch, NodeInfo
from kcms.sources.decode_template import DEFAULT_TEMPLATES
from kcms.sources.kubelet_decode import DecodeReuse, decode_resource_metrics, decode_summary
from kcms.tasks import STREAMS, TurnBudget

DEFAULT_ADDRESS_TYPES = ("Hostname", "InternalDNS", "InternalIP", "ExternalDNS", "ExternalIP")
ADDRESS_TYPES = frozenset(DEFAULT_ADDRESS_TYPES)
ENDPOINTS = {"resource": "/metrics/resource", "summary": "/stats/summary"}
# CPU a turn of the event loop may spend decoding kubelet bodies (~8 bodies of 30 pods here) before
# the rest wait for a later turn (kcms.tasks.TurnBudget), for the first third of each cycle. With
# 200 scrapes in flight a turn decoded up to 200 bodies: at 5000 nodes a list of every pod served
# during a cycle took 8.0x its socket-write floor (1.9-2.3 s); with this, 3.9x (0.72-1.26 s;
# bench/resource_pipeline.py, 27 Nov; 3.7x with a first version that polled instead of queueing).
DECODE_TURN_SECONDS = 0.005
# ... and ~1 ms (one body or two) while a long response is being streamed (kcms.tasks.STREAMS: the
# list of every pod). 5000 nodes, lists of every pod during a cycle: p50 857, 737 and 840 ms (2.7x,
# 2.3x and 3.9x their floor) against 1002, 906 and 931 ms (3.6x, 4.4x, 3.4x) with 5 ms throughout,
# in runs alternated (27 Nov 13:58-15:58); cycles under two listing clients 7.8-10.4 s against 7.4-11.2.
DECODE_TURN_SECONDS_STREAMING = 0.001
DECODES_DEFERRED = Counter(
    "kcms_kubelet_decodes_deferred",
    "Times a kubelet body's decode was put off to a later turn of the event loop (a body can be "
    "put off more than once): in the first third of a cycle a turn decodes at most ~5 ms of "
    "bodies, ~1 ms while a long response streams.",
)


# asyncio gives every TLS connection a 256 KiB read buffer (SSLProtocol.max_size), allocated and
# zeroed up front. Keeping one connection alive per kubelet through asyncio's TLS transport, that
# alone was 256 MB of RSS at 1000 nodes (measured: 837 MiB -> 618). TLS records are at most
# 16 KiB, so 16 KiB reads lose nothing. Kubelet connections no longer use that transport
# (http11.py reads TLS sockets directly); the API server's and the Kubernetes client's still do.
TLS_READ_BUFFER = 16 * 1024


def limit_tls_read_buffer(size: int = TLS_READ_BUFFER) -> None:
    """Shrink asyncio's per-connection TLS read buffer for connections made from now on."""
    if asyncio.sslproto.SSLProtocol.max_size > size:
        asyncio.sslproto.SSLProtocol.max_size = size


class ScrapeError(Exception):
    """One node could not be scraped this cycle. ``reason`` is a stable metric label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(slots=True)
class KubeletClientConfig:
    """How to reach kubelets; the flags of the same names set it."""

    port: int = 10250
    use_node_status_port: bool = False
    preferred_address_types: tuple[str, ...] = DEFAULT_ADDRESS_TYPES
    insecure_tls: bool = False
    ca_file: str | None = None  # None: the system trust store
    client_cert_file: str | None = None
    client_key_file: str | None = None
    bearer_token: str | None = None  # sent when no client certificate is configured
    # Where a current token comes from (a rotated service-account token, say); asked once a cycle.
    token_source: Callable[[], str | None] | None = None
    endpoint: str = "resource"  # "resource" (/metrics/resource) or "summary" (/stats/summary)
    max_body_bytes: int = 10 * 1024 * 1024
    max_header_bytes: int = MAX_HEADER_BYTES  # status line + headers of a response (see http11)
    max_headers: int = MAX_HEADERS  # header fields of a response
    max_in_flight: int = 200  # concurrent scrapes; the rest wait their turn
    extra_ca_pem: list[str] = field(default_factory=list)


def node_address(node: NodeInfo, preferred: tuple[str, ...]) -> str | None:
    """The node's first address of the most preferred type (metrics-server's rule)."""
    for kind in preferred:
        for addr_type, address in node.addresses:
            if addr_type == kind and address:
                return address
    return None


def build_ssl_context(config: KubeletClientConfig) -> ssl.SSLContext | bool:
    if config.insecure_tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx = ssl.create_default_context(cafile=config.ca_file)
        for pem in config.extra_ca_pem:
            ctx.load_verify_locations(cadata=pem)
    if config.client_cert_file:
        ctx.load_cert_chain(config.client_cert_file, config.client_key_file or None)
    return ctx


class KubeletClient:
    """Fetches and decodes one kubelet's resource metrics over kept-alive TLS connections."""

    def __init__(self, config: KubeletClientConfig) -> None:
        limit_tls_read_buffer()
        self.config = config
        self._ssl = build_ssl_context(config)
        self._path = ENDPOINTS[config.endpoint]
        # What each node's last start-time block parsed to (bounded: nodes not scraped for a whole
        # cycle are forgotten at start_cycle); the decoded batches are the same without it.
        # And each node's whole body as a template whose numbers alone are read next time (in
        # clusters of up to DEFAULT_TEMPLATES nodes: kcms/sources/decode_template.py).
        self.decode_reuse = DecodeReuse(max_templates=DEFAULT_TEMPLATES)
        self._decode: Callable[[str, bytes], NodeBatch] | None = (
            self._decode_resource if config.endpoint == "resource" else None
        )
        self._headers = {
            "User-Agent": "kcms",
            "Accept": "text/plain" if config.endpoint == "resource" else "application/json",
        }
        if config.bearer_token and not config.client_cert_file:
            self._headers["Authorization"] = f"Bearer {config.bearer_token}"
        self._pool = KeepAlivePool(
            self._ssl,
            config.max_body_bytes,
            max_header_bytes=config.max_header_bytes,
            max_headers=config.max_headers,
        )
        self._seen: set[tuple[str, int]] = set()  # endpoints scraped since the last cycle began
        # Bodies decoded (and stored) in one turn of the event loop: at most ~DECODE_TURN_SECONDS
        # of them (DECODE_TURN_SECONDS_STREAMING while a long response streams), so that a list
        # served during a cycle is not left waiting behind up to max_in_flight decodes a turn
        # (kcms.tasks.TurnBudget).
        self.decode_turns = TurnBudget(
            DECODE_TURN_SECONDS,
            streams=STREAMS,
            streaming_seconds=DECODE_TURN_SECONDS_STREAMING,
            counter=DECODES_DEFERRED,
        )

    def _decode_resource(self, node: str, body: bytes) -> NodeBatch:
        return decode_resource_metrics(node, body, reuse=self.decode_reuse)

    def refresh_credentials(self) -> None:
        """Pick up a rotated bearer token; the collector calls this at the start of every cycle."""
        source = self.config.token_source
        if source is None or self.config.client_cert_file:
            return
        token = source()
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        else:
            self._headers.pop("Authorization", None)

    def start_cycle(self, spread_for: float = math.inf) -> None:
        """Called by the collector before each cycle: fresh credentials, and the connections of
        kubelets not scraped in the last cycle (nodes gone) closed. For the cycle's first
        ``spread_for`` seconds bodies are decoded at most DECODE_TURN_SECONDS a turn of the event
        loop (DECODE_TURN_SECONDS_STREAMING while a long response streams); after that, as they
        come (a cycle that long is behind: serving no longer slows it)."""
        self.spread_decodes(spread_for)
        self.refresh_credentials()
        self.decode_reuse.new_cycle()
        if self._seen:
            self._pool.forget(self._seen)
        self._seen = set()

    def spread_decodes(self, seconds: float) -> None:
        """Decode bodies at most DECODE_TURN_SECONDS a turn for the next ``seconds`` (as at the start
        of a cycle), e.g. for the first cycle's rescrapes, which come all at once after its pass."""
        self.decode_turns.until = self.decode_turns.clock() + seconds

    def endpoint(self, node: NodeInfo) -> tuple[str, int]:
        address = node_address(node, self.config.preferred_address_types)
        if address is None:
            raise ScrapeError(
                "no_address",
                f"node {node.name} has none of the address types "
                f"{','.join(self.config.preferred_address_types)}",
            )
        port = self.config.port
        if self.config.use_node_status_port and node.kubelet_port:
            port = node.kubelet_port
        return address, port

    def url(self, node: NodeInfo) -> str:
        address, port = self.endpoint(node)
        host = f"[{address}]" if ":" in address else address
        return f"https://{host}:{port}{self._path}"

    async def scrape(self, node: NodeInfo) -> NodeBatch:
        """One node's readings; raises ScrapeError (never anything else) when unusable."""
        host, port = self.endpoint(node)
        self._seen.add((host, port))
        try:
            status, body = await self._pool.get(host, port, self._path, self._headers)
        except HTTPError as e:
            raise ScrapeError(e.reason, f"{self.url(node)}: {e}") from None
        if status != 200:
            raise ScrapeError(f"http_{status}", f"{self.url(node)}: HTTP {status}")
        await self.decode_turns.wait()
        try:
            if self._decode is not None:
                return self._decode(node.name, body)
            return decode_summary(node.name, body, max_bytes=self.config.max_body_bytes)
        except DecodeError as e:
            raise ScrapeError(f"decode_{e.reason}", f"{self.url(node)}: {e}") from None
        except Exception as e:  # noqa: BLE001 - a decoder bug on one kubelet's body must cost that
            # node's scrape, not the cycle of every node (an exception out of here ends the loop)
            raise ScrapeError(
                "decode_internal_error", f"{self.url(node)}: the decoder failed on this body: {e.__class__.__name__}"
            ) from None

    @property
    def connects(self) -> int:
        """TLS connections opened so far (one per kubelet while connections are kept alive)."""
        return self._pool.connects

    async def close(self) -> None:
        self._pool.close()
