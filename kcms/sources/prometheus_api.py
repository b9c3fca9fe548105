"""A client for the Prometheus HTTP API (``/api/v1/series``, ``/api/v1/query``), for the Prometheus
bridge: the same two calls prometheus-adapter makes, against any Prometheus-compatible backend.

Backends:

* **Prometheus**, **Thanos Query**: the URL of the server (``http://prometheus:9090``), or of a
  route prefix (``--web.route-prefix``, ``http://host/prometheus``).
* **Mimir / Cortex**: the URL of the query path (``http://mimir/prometheus``) and the tenant in a
  header (``headers={"X-Scope-OrgID": "team-a"}``).
* **VictoriaMetrics**: single-node ``http://vm:8428`` (or ``.../prometheus``), cluster
  ``http://vmselect:8481/select/0/prometheus``.

``api/v1/...`` is appended to the URL's path, whatever prefix it has (a trailing ``/`` or none);
query parameters in the URL (some gateways want one) are kept and sent with every request.

Connection: TLS with a CA file (else the system trust store), a client certificate and key (the
key may sit in the certificate's file), or no verification at all (``insecure_skip_tls_verify``);
user:password in the URL sent as basic auth; a bearer token from a file (it wins over basic
auth), re-read when the file changes (:class:`kcms.tokenfile.TokenFile`:
a rotated projected token is picked up by the next request, a half-rotated file keeps the last
good token); extra headers; ``GET`` or ``POST`` (the parameters form-encoded in the body, as
prometheus-adapter's ``--prometheus-verb=POST``: long selectors do not hit URL length limits).
Queries are sent with ``Accept-Encoding: identity`` (small answers on the request path), series
lists with gzip (large, in the background); environment proxies (``HTTP(S)_PROXY``) are not used.
Redirects are not followed (a ``3xx`` is an error naming where it pointed): a redirect would carry
the token to wherever it points.

Every call has a timeout (``timeout`` seconds for the whole exchange) and a size cap: at most
``max_response_bytes`` of (decompressed) body is read, a larger answer is refused as ``too_large``
before it is parsed, so a huge series list costs at most that much memory. JSON is parsed with
orjson and checked for the shape the API documents.

Errors are :class:`PrometheusError` with a bounded ``reason`` (a metric label):

``unavailable``   connection refused or reset, DNS, TLS handshake, no usable token in the token file
``timeout``       no full answer within ``timeout`` (or the backend's own ``errorType: timeout``)
``http_<code>``   a non-2xx answer that is not a Prometheus error body (a proxy's 502 page, say)
``bad_response``  not JSON, wrong content type, not the documented shape
``too_large``     the body is over ``max_response_bytes``
``query_error``   Prometheus's own ``{"status":"error","errorType":..,"error":..}`` (a bad PromQL,
                  an execution error, too many samples)

Its message holds the backend's text escaped and bounded (:func:`kcms.limits.printable`), so it
can go into a log line or a ``Status`` message as it is.

Values come as Prometheus sends them, strings: ``"1.5"``, ``"NaN"``, ``"+Inf"``, ``"-Inf"`` become
the floats they name (callers decide what a NaN or infinity means for them). An instant query's
``vector`` gives one :class:`Sample` per series, a ``scalar`` one sample with no labels; a
``matrix`` (a range selector such as ``foo[5m]`` as the whole query) or ``string`` result is a
``query_error``: the bridge's queries must give one value per series. Native-histogram samples
(``"histogram"`` instead of ``"value"``) are skipped: they have no single float value.
"""

from __future__ import annotations

import asyncio
import base64
import math
import re
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from yarl import URL

from kcms.limits import printable
from kcms.tokenfile import TokenFile

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "DEFAULT_TIMEOUT",
    "REASONS",
    "PrometheusClient",
    "PrometheusError",
    "Sample",
]

DEFAULT_TIMEOUT = 10.0  # seconds, a whole exchange
DEFAULT_MAX_RESPONSE_BYTES = 64 << 20  # ~300 000 series of six labels; 10 000 are ~1.5 MB
MAX_ERROR_BODY_BYTES = 64 << 10  # read of a non-2xx body, for its message
MESSAGE_LIMIT = 300  # characters of backend text in an error message
MAX_CONNECTIONS = 32  # open connections to the backend at a time (relist + concurrent queries)

UNAVAILABLE = "unavailable"
TIMEOUT = "timeout"
BAD_RESPONSE = "bad_response"
TOO_LARGE = "too_large"
QUERY_ERROR = "query_error"
# Every fixed reason; ``http_<code>`` (100..599) comes on top.
REASONS = (UNAVAILABLE, TIMEOUT, BAD_RESPONSE, TOO_LARGE, QUERY_ERROR)

_HEADER_NAME_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_ERROR_TYPE_RE = re.compile(r"[a-z_]{1,40}", re.ASCII)  # bad_data, execution, timeout, ...
_NUMBER = (int, float)


class PrometheusError(Exception):
    """A call to the backend failed. ``reason`` is one of :data:`REASONS` or ``http_<code>``;
    ``status`` the HTTP status when there was one (else 0); ``error_type`` Prometheus's
    ``errorType`` when it sent one (``bad_data``, ``execution``, ``timeout``, ...; ``other`` for
    anything that is not 1-40 of ``[a-z_]``), else ``""``.
    ``str(error)`` is safe for a log line: backend text in it went through ``printable``."""

    def __init__(self, reason: str, message: str, *, status: int = 0, error_type: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status
        self.error_type = error_type


@dataclass(frozen=True, slots=True)
class Sample:
    """One series of an instant query's answer: its labels (``__name__`` included when the
    result kept it), its value, and the evaluation time in seconds since the epoch."""

    labels: dict[str, str]
    value: float
    timestamp: float


def api_url(base: str, endpoint: str) -> URL:
    """``endpoint`` (``"api/v1/series"``) under the path of ``base``, whatever prefix that path has
    (``http://vm:8428``, ``http://vm:8481/select/0/prometheus/``, ``http://h/prom?x=1``); the base's
    query parameters are kept. Raises ValueError for a URL that is not absolute http(s)."""
    url = URL(base)
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(
            f"the Prometheus URL must be an absolute http:// or https:// URL, not {printable(base)}"
        )
    if url.fragment:
        raise ValueError("the Prometheus URL must not hold a #fragment")
    # The raw (still percent-encoded) path and query, so a prefix is kept byte for byte.
    path = url.raw_path.rstrip("/")
    return URL.build(
        scheme=url.scheme,
        authority=url.with_user(None).raw_authority,  # the credentials go as basic auth
        path=f"{path}/{endpoint}",
        query_string=url.raw_query_string,
        encoded=True,
    )


def _ssl_context(
    ca_file: str | None, cert_file: str | None, key_file: str | None, insecure: bool
) -> ssl.SSLContext:
    try:
        ctx = ssl.create_default_context(cafile=ca_file or None)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if cert_file:
            ctx.load_cert_chain(cert_file, key_file or None)
    except (OSError, ssl.SSLError) as e:  # unreadable or mismatched files: a start-up error
        raise ValueError(f"TLS files for Prometheus: {e}") from e
    return ctx


def _checked_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in (headers or {}).items():
        if not _HEADER_NAME_RE.fullmatch(name):
            raise ValueError(f"header name {printable(name)} is not an HTTP token")
        if any(c in value for c in "\r\n\0"):
            raise ValueError(f"header {name}: the value holds a line break or NUL")
        out[name] = value
    return out


class PrometheusClient:
    """Calls one Prometheus-compatible backend (see the module docstring). Create it anywhere;
    its connection pool is made on the first call, inside the running loop. ``close()`` it.

    Raises ValueError at construction for a bad URL, method, header, timeout, size cap, or TLS
    files that cannot be loaded (callers turn that into a start-up error naming the flag)."""

    def __init__(
        self,
        url: str,
        *,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        insecure_skip_tls_verify: bool = False,
        token_file: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        method: str = "GET",
    ) -> None:
        parsed = URL(url)
        # user:password@ in the URL is sent as basic auth (Go's client, hence prometheus-adapter,
        # does the same) and kept out of ``self.url``, which is for log lines.
        self._basic = (
            "Basic "
            + base64.b64encode(f"{parsed.user or ''}:{parsed.password or ''}".encode()).decode("ascii")
            if parsed.raw_user is not None
            else None
        )
        self.url = str(parsed.with_user(None)) if parsed.is_absolute() else url
        self._series_url = api_url(url, "api/v1/series")
        self._query_url = api_url(url, "api/v1/query")
        self.method = method.upper()
        if self.method not in ("GET", "POST"):
            raise ValueError(f"the method must be GET or POST, not {printable(method)}")
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"the timeout must be a positive number of seconds, not {timeout!r}")
        if max_response_bytes < 1024:
            raise ValueError(f"max_response_bytes must be at least 1024, not {max_response_bytes!r}")
        self.timeout = float(timeout)
        self.max_response_bytes = int(max_response_bytes)
        self._headers = {"Accept": "application/json", "User-Agent": "kcms"}
        self._headers.update(_checked_headers(headers))
        # Queries (small answers, on the request path) ask for no compression: on a fast network
        # gzip costs both ends more than it saves (loopback, 100-row answer: p50 1.18 -> 1.00 ms,
        # one row: 0.41 -> 0.21 ms). Series lists (megabytes, in the background) stay gzip (aiohttp's
        # default Accept-Encoding). An Accept-Encoding in ``headers`` is used for both.
        self._plain_headers = {"Accept-Encoding": "identity", **self._headers}
        self._token = TokenFile(token_file) if token_file else None
        tls_wanted = self._series_url.scheme == "https" or ca_file or cert_file or insecure_skip_tls_verify
        self._ssl: ssl.SSLContext | None = (
            _ssl_context(ca_file, cert_file, key_file, insecure_skip_tls_verify) if tls_wanted else None
        )
        self._session: aiohttp.ClientSession | None = None

    # -- the two calls ------------------------------------------------------------------------

    async def series(
        self, matchers: Sequence[str], start: float | None = None, end: float | None = None
    ) -> list[dict[str, str]]:
        """The label sets of the series matching any of ``matchers`` (``match[]``), each a dict
        with ``__name__``. ``start``/``end`` (seconds) bound the time range; the backend's default
        otherwise (Prometheus: all it holds)."""
        if not matchers:
            raise ValueError("series() needs at least one matcher")
        params: list[tuple[str, str]] = [("match[]", m) for m in matchers]
        if start is not None:
            params.append(("start", _fmt_time(start)))
        if end is not None:
            params.append(("end", _fmt_time(end)))
        data = await self._call(self._series_url, params, compressed=True)
        if not isinstance(data, list):
            raise _bad("series: data is not a list")
        # a plain loop: ~6 ms for 10 000 series of six labels (all() over generators: ~11 ms)
        for item in data:
            if type(item) is not dict:
                raise _bad("series: an entry is not a map of strings")
            for value in item.values():
                if type(value) is not str:
                    raise _bad("series: an entry is not a map of strings")
        return data

    async def query(self, promql: str, at: float | None = None) -> list[Sample]:
        """An instant query of ``promql`` at time ``at`` (seconds; the backend's now if None)."""
        params = [("query", promql)]
        if at is not None:
            params.append(("time", _fmt_time(at)))
        data = await self._call(self._query_url, params, compressed=False)
        if not isinstance(data, dict):
            raise _bad("query: data is not an object")
        kind, result = data.get("resultType"), data.get("result")
        if kind == "vector":
            if not isinstance(result, list):
                raise _bad("query: a vector result is not a list")
            return _vector(result)
        if kind == "scalar":
            ts, value = _pair(result)
            return [Sample({}, value, ts)]
        if kind in ("matrix", "string"):
            raise PrometheusError(
                QUERY_ERROR, f"the query gave a {kind} result; an instant vector or scalar is needed"
            )
        raise _bad(f"query: unknown resultType {printable(kind, 40)}")

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def __aenter__(self) -> PrometheusClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- one exchange -------------------------------------------------------------------------

    def _request_headers(self, compressed: bool) -> dict[str, str]:
        headers = self._headers if compressed else self._plain_headers
        if self._token is None:
            return headers
        token = self._token.read()  # a stat() per call: a rotated file is seen by the next request
        if not token:
            problem = self._token.problem or "no token loaded"
            raise PrometheusError(UNAVAILABLE, f"the Prometheus token file has no usable token: {problem}")
        return {**headers, "Authorization": f"Bearer {token}"}

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, ssl=self._ssl if self._ssl else True)
            # auto_decompress stays on: the cap below counts decompressed bytes, so a gzip bomb
            # is stopped at max_response_bytes like any large body.
            # One bound per call (asyncio.timeout in _call), not aiohttp's 5-minute default on top;
            # proxies from the environment are not used (trust_env=False).
            self._session = aiohttp.ClientSession(
                connector=connector, trust_env=False, timeout=aiohttp.ClientTimeout(total=None)
            )
        return self._session

    async def _call(self, url: URL, params: list[tuple[str, str]], *, compressed: bool) -> Any:
        headers = self._request_headers(compressed)
        session = self._client()
        kwargs: dict[str, Any] = {"headers": headers, "allow_redirects": False}
        if self._basic is not None and "Authorization" not in headers:
            headers = {**headers, "Authorization": self._basic}
            kwargs["headers"] = headers
        if self.method == "POST":
            # aiohttp form-encodes a list of pairs (application/x-www-form-urlencoded)
            kwargs["data"] = params
            request_url = url
        else:
            request_url = url.extend_query(params) if params else url
        try:
            async with asyncio.timeout(self.timeout):
                async with session.request(self.method, request_url, **kwargs) as resp:
                    return await self._answer(resp)
        except PrometheusError:
            raise
        except TimeoutError as e:
            raise PrometheusError(TIMEOUT, f"no answer from Prometheus within {self.timeout:g}s") from e
        except aiohttp.ClientConnectorCertificateError as e:
            raise PrometheusError(
                UNAVAILABLE, f"TLS: {printable(str(e.certificate_error), MESSAGE_LIMIT)}"
            ) from e
        except (aiohttp.ClientError, OSError) as e:
            raise PrometheusError(
                UNAVAILABLE,
                f"cannot reach Prometheus: {printable(str(e) or type(e).__name__, MESSAGE_LIMIT)}",
            ) from e

    async def _answer(self, resp: aiohttp.ClientResponse) -> Any:
        status = resp.status
        ok = 200 <= status < 300
        limit = self.max_response_bytes if ok else MAX_ERROR_BODY_BYTES
        body, cut = await _read_capped(resp, limit)
        if ok and cut:
            raise PrometheusError(
                TOO_LARGE, f"the answer is larger than {self.max_response_bytes} bytes", status=status
            )
        doc = _json(resp, body) if not cut else None
        if isinstance(doc, dict) and doc.get("status") == "error":
            raise _prometheus_error(doc, status)
        if not ok:
            where = resp.headers.get("Location", "") if 300 <= status < 400 else ""
            if where:
                text = f"redirected to {printable(where, 200)}; give the final URL"
            else:
                text = f"(a body over {MAX_ERROR_BODY_BYTES} bytes, not read)" if cut else _snippet(body)
            reason = f"http_{status}" if 100 <= status <= 599 else BAD_RESPONSE
            raise PrometheusError(reason, f"Prometheus answered HTTP {status}: {text}", status=status)
        if doc is None:
            mime = resp.content_type
            if not _is_json_type(mime):
                raise _bad(f"the answer is {printable(mime, 60)}, not JSON: {_snippet(body)}", status)
            raise _bad(f"the answer is not valid JSON: {_snippet(body)}", status)
        if not isinstance(doc, dict) or doc.get("status") != "success" or "data" not in doc:
            raise _bad("the answer is not a Prometheus API response (no status success and data)", status)
        return doc["data"]


async def _read_capped(resp: aiohttp.ClientResponse, limit: int) -> tuple[bytes | bytearray, bool]:
    """At most ``limit`` bytes of the body and whether there was more. A declared length over the
    limit is refused before reading anything (the connection is then closed, not drained)."""
    declared = resp.content_length
    if declared is not None and declared > limit and "Content-Encoding" not in resp.headers:
        resp.close()
        return b"", True
    buf = bytearray()
    while True:
        chunk = await resp.content.readany()
        if not chunk:
            return buf, False
        if len(buf) + len(chunk) > limit:
            resp.close()  # drop the rest with the connection rather than read it
            return b"", True
        buf += chunk


def _json(resp: aiohttp.ClientResponse, body: bytes | bytearray) -> Any:
    """The body parsed, or None when it is not JSON (by content type or by content)."""
    if not _is_json_type(resp.content_type):
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _is_json_type(mime: str) -> bool:
    return mime == "application/json" or mime.endswith("+json") or mime.endswith("/json")


def _prometheus_error(doc: dict[str, Any], status: int) -> PrometheusError:
    etype = doc.get("errorType")
    etype = etype if isinstance(etype, str) and _ERROR_TYPE_RE.fullmatch(etype) else "other"
    text = doc.get("error")
    text = text if isinstance(text, str) else ""
    reason = TIMEOUT if etype == "timeout" else UNAVAILABLE if etype == "unavailable" else QUERY_ERROR
    return PrometheusError(
        reason,
        f"Prometheus error {etype}: {printable(text, MESSAGE_LIMIT)}",
        status=status,
        error_type=etype,
    )


def _snippet(body: bytes | bytearray) -> str:
    return (
        printable(bytes(body[:MESSAGE_LIMIT]).decode("utf-8", "replace"), MESSAGE_LIMIT)
        if body
        else "(empty body)"
    )


def _bad(message: str, status: int = 0) -> PrometheusError:
    return PrometheusError(BAD_RESPONSE, message, status=status)


def _str_map(d: dict[Any, Any]) -> bool:
    return all(type(v) is str for v in d.values())  # orjson keys are always str


def _pair(value: Any) -> tuple[float, float]:
    """``[timestamp, "value"]`` as floats; float() reads Prometheus's "NaN", "+Inf", "-Inf"."""
    if not isinstance(value, list) or len(value) != 2:
        raise _bad("query: a value is not a [time, value] pair")
    ts, raw = value
    if not isinstance(ts, _NUMBER) or isinstance(ts, bool):
        raise _bad("query: a sample time is not a number")
    if isinstance(raw, str):
        try:
            v = float(raw)
        except ValueError:
            raise _bad(f"query: a sample value {printable(raw, 40)} is not a number") from None
    elif isinstance(raw, _NUMBER) and not isinstance(raw, bool):
        v = float(raw)
    else:
        raise _bad("query: a sample value is not a number")
    return float(ts), v


def _vector(result: list[Any]) -> list[Sample]:
    """The samples of a vector result. The common row (``{"metric": {...}, "value": [t, "v"]}``,
    strings, a number) is checked inline, about half the time of :func:`_vector_sample`, which
    takes every other row (defaults, histograms, errors)."""
    out: list[Sample] = []
    for item in result:
        try:
            labels = item["metric"]
            ts, raw = item["value"]
        except (KeyError, TypeError, ValueError):
            labels = ts = raw = None
        if type(labels) is dict and type(raw) is str and type(ts) in _NUMBER:
            for v in labels.values():
                if type(v) is not str:
                    raise _bad("query: a vector entry's metric is not a map of strings")
            try:
                out.append(Sample(labels, float(raw), float(ts)))
                continue
            except ValueError:
                pass  # the careful path names the bad value
        sample = _vector_sample(item)
        if sample is not None:
            out.append(sample)
    return out


def _vector_sample(item: Any) -> Sample | None:
    if not isinstance(item, dict):
        raise _bad("query: a vector entry is not an object")
    labels = item.get("metric", {})
    if not isinstance(labels, dict) or not _str_map(labels):
        raise _bad("query: a vector entry's metric is not a map of strings")
    if "value" not in item:
        if "histogram" in item:
            return None  # a native histogram: no single float value (module docstring)
        raise _bad("query: a vector entry has no value")
    ts, value = _pair(item["value"])
    return Sample(labels, value, ts)


def _fmt_time(t: float) -> str:
    if not math.isfinite(t):
        raise ValueError(f"a time must be finite, not {t!r}")
    return f"{t:.3f}"
