"""Prometheus remote write (POST /api/v1/write) against hostile and broken writers.

A real aggregated API server over TLS (tests/_remote_write_helpers.py) with delegated TokenReview and
SubjectAccessReview through the fake Kubernetes API. Every test checks that the attack is refused
with the right code and reason (answer and counter), that data written before is unchanged, that
the server stays ready, and (``clean_log``) that no traceback is logged.
"""

from __future__ import annotations

import math
import struct
import time
import tracemalloc

import cramjam
import orjson
import pytest
from _remote_write_helpers import WRITER, clean_log_fixture, counter, stack_fixture, start_stack  # noqa: F401 - fixtures

from kcms import limits
from kcms.apis.push import PushLimits
from kcms.sources import remote_write as rw

STALE_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]


def ms(delta: float = 0.0) -> int:
    return int((time.time() + delta) * 1000)


def series(metric: str, ns: str, pod: str | None, *samples: tuple[int, float], **labels: str):
    pairs = (
        [("__name__", metric), ("namespace", ns)] + ([("pod", pod)] if pod else []) + sorted(labels.items())
    )
    return (pairs, list(samples))


async def baseline(stack) -> None:
    """A series written before the attack (whose value must not change)."""
    status, _, body = await stack.post(rw.encode([series("base", "default", "web-0", (ms(-30), 42.0))]))
    assert status == 204, body


async def unaffected(stack) -> None:
    assert stack.values("base", "pods", "default", "web-0") == [((), 42.0)]
    assert await stack.ready()


def status_of(body: bytes) -> dict:
    doc = orjson.loads(body)
    assert doc["kind"] == "Status" and doc["status"] == "Failure"
    return doc


def refused(code: int, reason: str) -> float:
    return counter("kcms_remote_write_requests_total", code=str(code), reason=reason)


# ---- whole-request refusals ---------------------------------------------------------------------------


async def test_malformed_snappy_and_protobuf_are_400s(stack, clean_log) -> None:
    await baseline(stack)
    for body, reason in [
        (b"\x10not snappy at all", "malformed_snappy"),  # declares 16 bytes, holds garbage
        (b"", "malformed_snappy"),  # no length header
        (bytes(cramjam.snappy.compress_raw(b"\xff\xff\xff\xff garbage")), "malformed_protobuf"),
        (bytes(cramjam.snappy.compress_raw(b"\x0a\x05\x0a\x03ab")), "malformed_protobuf"),  # truncated
    ]:
        before = refused(400, reason)
        status, _, text = await stack.post(body)
        assert status == 400, (body, text)
        assert status_of(text)["reason"] == "BadRequest"
        assert refused(400, reason) == before + 1
    assert "remote write: refused" in clean_log.text
    await unaffected(stack)


async def test_a_snappy_bomb_is_refused_before_anything_is_allocated(stack, clean_log) -> None:
    await baseline(stack)
    # declares 4 GiB: over --remote-write-max-decompressed-bytes, refused from the header
    status, _, text = await stack.post(b"\xff\xff\xff\xff\x0f" + b"\x00" * 64)
    assert status == 413 and "declares 4294967295 bytes" in status_of(text)["message"]
    # declares 60 MiB (within the limit) in 1 KiB: snappy cannot expand that much; no 60 MiB buffer
    tracemalloc.start()
    try:
        status, _, text = await stack.post(b"\x80\x80\x80\x1e" + b"\x00" * 1024)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert status == 400 and "cannot hold" in status_of(text)["message"]
    assert peak < 8 << 20, peak
    await unaffected(stack)


async def test_oversized_requests_are_413s(ca, fake_kube, tmp_path, clean_log) -> None:
    lim = rw.WriteLimits(
        max_compressed_bytes=4096, max_decompressed_bytes=1 << 20, max_series=10, max_samples=20
    )
    stack = await start_stack(fake_kube, tmp_path, limits=lim)
    try:
        await baseline(stack)
        import random

        rnd = random.Random(1)  # values that do not compress
        big = rw.encode(
            [series("m", "default", f"web-{i}", (ms(), 1.0), v=rnd.randbytes(300).hex()) for i in range(10)]
        )
        assert len(big) > 4096
        status, _, text = await stack.post(big)
        assert status == 413 and status_of(text)["reason"] == "RequestEntityTooLarge"

        async def chunked():  # no Content-Length: counted as read
            for i in range(0, len(big), 512):
                yield big[i : i + 512]

        status, _, text = await stack.post(chunked())
        assert status == 413
        status, _, text = await stack.post(
            rw.encode([series("m", "default", None, (ms(), 1.0)) for _ in range(11)])
        )
        assert status == 413 and "11 series" in status_of(text)["message"]
        many = rw.encode(
            [series("m", "default", f"web-{i}", *((ms(-i), 1.0) for i in range(7))) for i in range(3)]
        )
        status, _, text = await stack.post(many)
        assert status == 413 and "more than 20 samples" in status_of(text)["message"]
        assert refused(413, "too_many_series") >= 1 and refused(413, "body_too_large") >= 2
        await unaffected(stack)
    finally:
        await stack.server.stop()
        await stack.kube.close()


async def test_wrong_method_content_type_and_encoding_are_refused(stack, clean_log) -> None:
    await baseline(stack)
    body = rw.encode([series("m", "default", "web-1", (ms(), 1.0))])
    status, _, _ = await stack.post(body, method="GET")
    assert status == 405
    status, _, _ = await stack.post(body, method="PUT")
    assert status == 405
    for headers in (
        {"Content-Type": "application/json"},
        {"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request"},  # remote write 2.0
        {"Content-Type": ""},
    ):
        status, _, text = await stack.post(body, headers=headers)
        assert status == 415 and "application/x-protobuf" in status_of(text)["message"], headers
    status, _, text = await stack.post(body, headers={"Content-Encoding": "identity"})
    assert status == 415 and "only snappy" in status_of(text)["message"]
    status, _, text = await stack.post(body, headers={"Content-Encoding": "zstd"})
    assert status == 415
    # remote write 1.0 with the proto parameter is fine
    status, _, _ = await stack.post(
        body, headers={"Content-Type": "application/x-protobuf;proto=prometheus.WriteRequest"}
    )
    assert status == 204
    # snappy is accepted on this path only: the push API still refuses it
    import aiohttp

    async with aiohttp.ClientSession() as s:
        hdrs = {"Authorization": "Bearer writer-token", "Content-Encoding": "snappy"}
        async with s.post(stack.url + "/push/v1/samples", data=body, headers=hdrs, ssl=stack.ctx) as r:
            assert r.status == 415
    await unaffected(stack)


async def test_no_or_unknown_credential_is_401(stack, clean_log) -> None:
    await baseline(stack)
    body = rw.encode([series("base", "default", "web-0", (ms(), 666.0))])
    for token in (None, "made-up-token"):
        status, _, text = await stack.post(body, token=token)
        assert status == 401 and status_of(text)["reason"] == "Unauthorized"
    await unaffected(stack)


# ---- per-series refusals ------------------------------------------------------------------------------


async def test_unauthorized_namespaces_are_refused_per_series_and_the_others_land(stack, clean_log) -> None:
    await baseline(stack)
    mixed = rw.encode(
        [
            series("in_flight", "default", "web-1", (ms(-1), 1.0)),
            series("in_flight", "team-a", "web-1", (ms(-1), 666.0)),  # not the writer's namespace
            series("jobs_pending", "team-a", None, (ms(-1), 666.0), queue="q"),
            series("jobs_pending", "default", None, (ms(-1), 3.0), queue="q"),
        ]
    )
    before = counter("kcms_remote_write_rejected_total", reason="forbidden")
    status, headers, _ = await stack.post(mixed)
    # 204: Prometheus drops a batch answered 4xx, the allowed half with it; the refusals are counted
    assert status == 204 and headers["X-Kcms-Rejected"] == "forbidden=2"
    assert counter("kcms_remote_write_rejected_total", reason="forbidden") == before + 2
    assert stack.values("in_flight", "pods", "default", "web-1") == [((), 1.0)]
    assert stack.values("jobs_pending", "", "default") == [((("queue", "q"),), 3.0)]
    assert stack.values("in_flight", "pods", "team-a", "web-1") == []
    assert stack.values("jobs_pending", "", "team-a") == []
    # nothing allowed at all: 403, so the sender's log shows the missing RoleBinding
    only = rw.encode([series("in_flight", "team-a", "web-2", (ms(-1), 666.0))])
    status, _, text = await stack.post(only)
    assert status == 403 and status_of(text)["reason"] == "Forbidden"
    assert "forbidden=1" in status_of(text)["message"]
    # team-a's own writer may (identity from the token, not from the series' labels)
    status, _, _ = await stack.post(only, token="other-token")
    assert status == 204 and stack.values("in_flight", "pods", "team-a", "web-2") == [((), 666.0)]
    # a writer with no grant at all
    status, _, _ = await stack.post(mixed, token="nobody-token")
    assert status == 403
    await unaffected(stack)


async def test_label_bounds_refuse_the_series_not_the_request(stack, clean_log) -> None:
    await baseline(stack)
    extra = {f"l{i}": "v" for i in range(limits.MAX_LABELS)}
    # a label that is not valid UTF-8 (labels are decoded only for a series not seen before)
    req = rw.WriteRequest()
    for value in ("\udcff", "ok"):
        ts = req.timeseries.add()
        for name, v in (("__name__", "utf"), ("namespace", "default"), ("pod", "web-1"), ("x", value)):
            raw = rw.Label(name=name, value="ok" if v == "\udcff" else v).SerializeToString()
            ts.labels.append(raw.replace(b"\x12\x02ok", b"\x12\x02\xff\xfe") if v == "\udcff" else raw)
        ts.samples.add(timestamp=ms(-1), value=5.0)
    status, headers, _ = await stack.post(bytes(cramjam.snappy.compress_raw(req.SerializeToString())))
    assert status == 204 and headers["X-Kcms-Rejected"] == "malformed_labels=1"
    assert stack.values("utf", "pods", "default", "web-1") == [((("x", "ok"),), 5.0)]
    before = {r: counter("kcms_remote_write_rejected_total", reason=r) for r in
              ("too_many_labels", "label_value_too_long", "label_name_too_long", "invalid_label_name", "metric_name_too_long")}  # fmt: skip
    body = rw.encode(
        [
            series("m", "default", "web-1", (ms(), 1.0), **extra),
            series("m", "default", "web-1", (ms(), 1.0), v="x" * (limits.MAX_LABEL_VALUE_LENGTH + 1)),
            series("m", "default", "web-1", (ms(), 1.0), **{"k" * (limits.MAX_LABEL_NAME_LENGTH + 1): "v"}),
            (
                [("__name__", "m"), ("namespace", "default"), ("bad-name", "v")],
                [(ms(), 1.0)],
            ),
            series("m" * 300, "default", "web-1", (ms(), 1.0)),
            series("good", "default", "web-1", (ms(), 7.0)),
        ]
    )
    status, headers, _ = await stack.post(body)
    assert status == 204, headers
    for reason, n in before.items():
        assert counter("kcms_remote_write_rejected_total", reason=reason) == n + 1, reason
    assert stack.values("good", "pods", "default", "web-1") == [((), 7.0)]
    assert stack.values("m", "pods", "default", "web-1") == []
    await unaffected(stack)


async def test_future_timestamps_and_non_finite_values(stack, clean_log) -> None:
    await baseline(stack)
    future = int((limits.future_limit() + 60) * 1000)
    t = ms(-3)
    before = {
        r: counter("kcms_remote_write_rejected_total", reason=r)
        for r in ("future_timestamp", "non_finite_value")
    }
    stale_before = counter("kcms_remote_write_samples_total", result="stale_marker")
    body = rw.encode(
        [
            series("v", "default", "web-1", (t, 1.0), (ms(-2), math.nan), (ms(-1), STALE_NAN)),
            series("v", "default", "web-2", (ms(-2), math.inf), (ms(-1), -math.inf)),
            series("v", "default", "web-0", (future, 9.0)),
            series("base", "default", "web-0", (future, 666.0)),  # a future point cannot overwrite
        ]
    )
    status, headers, _ = await stack.post(body)
    assert status == 204
    assert (
        counter("kcms_remote_write_rejected_total", reason="future_timestamp")
        == before["future_timestamp"] + 2
    )
    assert (
        counter("kcms_remote_write_rejected_total", reason="non_finite_value")
        == before["non_finite_value"] + 3
    )
    assert counter("kcms_remote_write_samples_total", result="stale_marker") == stale_before + 1
    assert stack.values("v", "pods", "default", "web-1") == [((), 1.0)]
    # nothing acceptable at all: a 400 naming the reasons (a 4xx: Prometheus drops it, as it should)
    status, _, text = await stack.post(rw.encode([series("v", "default", "web-1", (future, 1.0))]))
    assert status == 400 and "future_timestamp=1" in status_of(text)["message"]
    # a resend of accepted points is not an error
    status, headers, _ = await stack.post(rw.encode([series("v", "default", "web-1", (t, 1.0))]))
    assert status == 204 and headers["X-Kcms-Rejected"] == "out_of_order=1"
    await unaffected(stack)


async def test_native_histograms_are_refused_and_counted(stack, clean_log) -> None:
    await baseline(stack)
    req = rw.WriteRequest()
    ts = req.timeseries.add()
    for name, value in (("__name__", "h"), ("namespace", "default")):
        ts.labels.append(rw.Label(name=name, value=value).SerializeToString())
    ts.histograms.append(b"\x08\x01")
    before = counter("kcms_remote_write_rejected_total", reason="native_histogram")
    status, _, text = await stack.post(bytes(cramjam.snappy.compress_raw(req.SerializeToString())))
    assert status == 400 and "native_histogram=1" in status_of(text)["message"]
    assert counter("kcms_remote_write_rejected_total", reason="native_histogram") == before + 1
    await unaffected(stack)


async def test_the_push_quota_is_shared_and_known_series_keep_flowing(
    ca, fake_kube, tmp_path, clean_log
) -> None:
    stack = await start_stack(fake_kube, tmp_path, push_limits=PushLimits(max_series_per_writer=3))
    try:
        await baseline(stack)  # the writer's first series
        body = rw.encode([series("q", "default", None, (ms(-5), float(i)), queue=str(i)) for i in range(4)])
        status, headers, _ = await stack.post(body)
        assert status == 204 and headers["X-Kcms-Rejected"] == "series_limit_writer=2"
        assert stack.push.series_count(writer=WRITER) == 3
        # known series keep accepting points; another writer has its own quota
        status, headers, _ = await stack.post(rw.encode([series("base", "default", "web-0", (ms(-1), 43.0))]))
        assert status == 204 and "X-Kcms-Rejected" not in headers
        status, _, _ = await stack.post(
            rw.encode([series("q", "team-a", None, (ms(-1), 1.0), queue="z")]), token="other-token"
        )
        assert status == 204
        assert await stack.ready()
    finally:
        await stack.server.stop()
        await stack.kube.close()


async def test_api_server_down_is_a_retryable_503(stack, fake_kube, clean_log) -> None:
    await baseline(stack)  # the token and this target are cached
    await fake_kube.stop()
    try:
        body = rw.encode(
            [
                series("base", "default", "web-0", (ms(-1), 43.0)),
                series("new", "default", "web-1", (ms(-1), 1.0)),
            ]
        )
        status, headers, text = await stack.post(body)
        assert status == 503 and headers["Retry-After"] == "5"
        assert "retry later" in status_of(text)["message"]
        # the decided series landed; the undecided one is not lost: the sender retries the batch
        assert stack.values("base", "pods", "default", "web-0") == [((), 43.0)]
        assert await stack.ready()
    finally:
        await fake_kube.start()
    status, headers, _ = await stack.post(body)
    assert status == 204 and headers["X-Kcms-Rejected"] == "out_of_order=1"
    assert stack.values("new", "pods", "default", "web-1") == [((), 1.0)]


@pytest.mark.parametrize("n", [0, 1])
async def test_empty_requests_are_fine(stack, clean_log, n) -> None:
    status, _, _ = await stack.post(rw.encode([([("__name__", "m"), ("namespace", "default")], [])] * n))
    assert status == 204
