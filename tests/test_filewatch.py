"""kcms.filewatch: certificate and CA files noticed on change through inotify, with no timer
waking the process every few seconds (issue 9's fixed costs), and polling where inotify cannot
watch. The server-level tests (this one's client CA, tests/test_apiserver_tls.py's serving
certificate) use a reload interval of an hour, so only inotify can pass them."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
import trustme
from _apiserver_helpers import (
    GROUP,
    PKI,
    fetch,
    pki_fixture,  # noqa: F401  (pytest fixture)
    running,
)

from kcms.apiserver import ServingOptions
from kcms.apiserver.serving import CertReloader
from kcms.filewatch import FileWatch, directories

HOUR = 3600.0


async def eventually(cond, limit: float = 10.0) -> bool:
    """Poll a condition nothing signals (a liveness bound, not a timing goal)."""
    deadline = time.monotonic() + limit
    while not cond() and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    return bool(cond())


class Calls:
    def __init__(self) -> None:
        self.n = 0

    async def __call__(self) -> None:
        self.n += 1


async def test_a_change_is_noticed_at_once_and_nothing_runs_while_nothing_changes(tmp_path: Path) -> None:
    f = tmp_path / "tls.crt"
    f.write_bytes(b"one")
    calls = Calls()
    watch = FileWatch([str(f)], calls, interval=HOUR, settle=0.05)
    watch.start()
    try:
        assert watch.watching
        await asyncio.sleep(0.5)
        assert calls.n == 0  # no timer: nothing runs while nothing changes
        f.write_bytes(b"two")
        assert await eventually(lambda: calls.n == 1)
        await asyncio.sleep(0.3)
        assert calls.n == 1  # one write, one look
    finally:
        await watch.stop()


async def test_a_kubernetes_secret_volume_swap_is_noticed(tmp_path: Path) -> None:
    """A Secret volume: tls.crt -> ..data/tls.crt, ..data -> ..<timestamp>; an update writes a new
    timestamped directory and renames a new ..data symlink over the old one. No file path changes."""
    ca = trustme.CA()

    def version(name: str) -> None:
        d = tmp_path / name
        d.mkdir()
        cert = ca.issue_cert("localhost")
        (d / "tls.crt").write_bytes(cert.cert_chain_pems[0].bytes())
        (d / "tls.key").write_bytes(cert.private_key_pem.bytes())
        tmp = tmp_path / "..data_tmp"
        tmp.symlink_to(name)
        os.replace(tmp, tmp_path / "..data")

    version("..2026_11_27_1")
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).symlink_to(f"..data/{name}")
    reloader = CertReloader(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"), [])
    looks: list[bool] = []

    async def look() -> None:
        looks.append(reloader.check())

    watch = FileWatch([reloader.cert_file, reloader.key_file], look, interval=HOUR, settle=0.05)
    watch.start()
    try:
        assert watch.watching
        version("..2026_11_27_2")
        assert await eventually(lambda: True in looks)
        assert reloader.reloads == 1 and reloader.failures == 0
    finally:
        await watch.stop()


async def test_a_symlink_into_another_directory_has_its_target_watched(tmp_path: Path) -> None:
    real, linked = tmp_path / "real", tmp_path / "etc"
    real.mkdir()
    linked.mkdir()
    (real / "ca.pem").write_bytes(b"one")
    (linked / "ca.pem").symlink_to(real / "ca.pem")
    assert directories([str(linked / "ca.pem")]) == [str(linked), str(real)]
    calls = Calls()
    watch = FileWatch([str(linked / "ca.pem")], calls, interval=HOUR, settle=0.05)
    watch.start()
    try:
        (real / "ca.pem").write_bytes(b"two")
        assert await eventually(lambda: calls.n >= 1)
    finally:
        await watch.stop()


async def test_a_flood_of_writes_gives_one_look_per_settling_delay(tmp_path: Path) -> None:
    """A hostile (or busy) writer of the watched file: 5000 writes (a turn of the loop every 10)
    cost at most one look per settle seconds, and the looks go on."""
    watched = tmp_path / "tls.crt"
    watched.write_bytes(b"x")
    calls = Calls()
    settle = 0.2
    watch = FileWatch([str(watched)], calls, interval=HOUR, settle=settle)
    watch.start()
    try:
        started = time.monotonic()
        for i in range(5_000):
            watched.write_bytes(b"%d" % i)
            if i % 10 == 0:
                await asyncio.sleep(0)  # let the watch read (without settling: ~250 looks)
        elapsed = time.monotonic() - started
        await eventually(lambda: calls.n >= 1)
        await asyncio.sleep(2 * settle)
        assert watch.relevant >= 5_000  # every write was seen...
        assert 1 <= calls.n <= elapsed / settle + 3  # ...and coalesced into a few looks
        n = calls.n
        watched.write_bytes(b"y")
        assert await eventually(lambda: calls.n > n)
    finally:
        await watch.stop()


async def test_other_files_in_the_directory_cause_no_look(tmp_path: Path) -> None:
    """A log file beside the certificates: were its writes looks, a look that logs a failure
    would trigger the next one, forever."""
    (tmp_path / "tls.crt").write_bytes(b"x")
    calls = Calls()
    watch = FileWatch([str(tmp_path / "tls.crt")], calls, interval=HOUR, settle=0.01)
    watch.start()
    try:
        log_file = tmp_path / "kcms.log"
        for i in range(200):
            log_file.write_bytes(b"line %d\n" % i)
            (tmp_path / f"other-{i % 3}").write_bytes(b"x")
            await asyncio.sleep(0)
        assert await eventually(lambda: watch.events >= 400)  # seen, and ignored
        await asyncio.sleep(0.2)
        assert calls.n == 0 and watch.relevant == 0
        (tmp_path / "tls.crt").write_bytes(b"y")
        assert await eventually(lambda: calls.n == 1)
    finally:
        await watch.stop()


async def test_a_removed_directory_falls_back_to_polling(tmp_path: Path) -> None:
    d = tmp_path / "certs"
    d.mkdir()
    (d / "tls.crt").write_bytes(b"x")
    calls = Calls()
    watch = FileWatch([str(d / "tls.crt")], calls, interval=0.05, resync=HOUR, settle=0.01)
    watch.start()
    try:
        assert watch.watching
        (d / "tls.crt").unlink()
        d.rmdir()
        assert await eventually(lambda: not watch.watching)
        n = calls.n
        assert await eventually(lambda: calls.n >= n + 3)  # polled every interval from then on
    finally:
        await watch.stop()


async def test_without_inotify_it_polls_and_a_failing_look_does_not_end_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    looks = 0

    async def look() -> None:
        nonlocal looks
        looks += 1
        raise RuntimeError("broken look")

    watch = FileWatch([str(tmp_path / "x")], look, interval=0.05, inotify=False)
    watch.start()
    try:
        assert not watch.watching
        assert await eventually(lambda: looks >= 3)
        assert any("file change failed" in r.getMessage() for r in caplog.records)
    finally:
        await watch.stop()


async def test_the_server_trusts_a_new_client_ca_file_with_no_poll(pki: PKI) -> None:
    new_ca = trustme.CA()
    new_user = pki.client_ctx(new_ca.issue_cert("new", common_name="new", organization_name="system:masters"))
    serving = ServingOptions(
        secure_port=0,
        bind_address="127.0.0.1",
        tls_cert_file=pki.files["cert"],
        tls_private_key_file=pki.files["key"],
        reload_interval=HOUR,
    )
    async with running(pki, serving=serving) as server:
        assert server.authenticator is not None
        before = server.authenticator.config
        pki.write("client-ca.crt", new_ca.cert_pem.bytes())
        assert await eventually(lambda: server.authenticator.config is not before)
        status, _, body = await fetch(server, new_user, f"/apis/{GROUP}/v1/whoami")
        assert status == 200 and body["name"] == "new"
