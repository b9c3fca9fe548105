"""HTTPS serving: options, a self-signed certificate when none is given, the server ``SSLContext``
and reloading of the serving certificate when its files change on disk."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import sys
from dataclasses import dataclass

from kcms.httpguard import BODY_TIMEOUT, HEADER_TIMEOUT, IDLE_TIMEOUT
from kcms.limits import printable

from .inflight import EXECUTING, MAX_MUTATING, MAX_READONLY

log = logging.getLogger(__name__)

TLS_VERSIONS = {
    "": ssl.TLSVersion.TLSv1_2,
    "VersionTLS12": ssl.TLSVersion.TLSv1_2,
    "VersionTLS13": ssl.TLSVersion.TLSv1_3,
}


@dataclass(slots=True)
class ServingOptions:
    """Where and how to serve HTTPS (the kube ``--secure-port``/``--tls-*``/``--cert-dir`` flags)."""

    secure_port: int = 443  # 0 = an ephemeral port; see AggregatedAPIServer.port
    bind_address: str = "0.0.0.0"
    cert_dir: str = "apiserver.local.config/certificates"
    tls_cert_file: str = ""
    tls_private_key_file: str = ""
    tls_min_version: str = ""  # "", "VersionTLS12" or "VersionTLS13"
    alternate_names: tuple[str, ...] = ()
    # seconds between looks at the certificate and CA files where inotify cannot watch their
    # directories (where it can: on every change, and every minute: kcms/filewatch.py)
    reload_interval: float = 3.0
    # Connection deadlines (kcms.httpguard; kube-apiserver's values): request line and headers
    # due within request_header_timeout (--request-header-timeout), a kept-alive connection closed
    # after idle_timeout without a request, a request body due within body_timeout.
    request_header_timeout: float = HEADER_TIMEOUT
    idle_timeout: float = IDLE_TIMEOUT
    body_timeout: float = BODY_TIMEOUT
    # Overload protection (kcms.apiserver.inflight): --max-requests-inflight and
    # --max-mutating-requests-inflight, 0 = no limit; executing_requests run at once, others queue.
    max_requests_inflight: int = MAX_READONLY
    max_mutating_requests_inflight: int = MAX_MUTATING
    executing_requests: int = EXECUTING


# What makes a self-signed certificate: a child process, so that `cryptography` is never loaded
# into the serving process (see kcms/certs.py).
SELF_SIGNED_COMMAND = (sys.executable, "-m", "kcms.certs", "self-signed")
SELF_SIGNED_TIMEOUT = 120.0  # seconds; the child takes ~0.16 s here


async def generate_self_signed(cert_path: str, key_path: str, alternate_names: tuple[str, ...] = ()) -> None:
    """Write a self-signed serving certificate and its key (PEM) for localhost, 127.0.0.1 and
    ``alternate_names`` (IP addresses become IP SANs, everything else DNS SANs). Made by a child
    process (:mod:`kcms.certs`), awaited without holding the event loop (the inventory's first
    list and the scrape loop go on meanwhile); OSError when it fails."""
    child = await asyncio.create_subprocess_exec(
        *SELF_SIGNED_COMMAND, cert_path, key_path, *alternate_names,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        _, stderr = await asyncio.wait_for(child.communicate(), SELF_SIGNED_TIMEOUT)
    except TimeoutError:
        raise OSError(f"making a self-signed certificate took over {SELF_SIGNED_TIMEOUT:g} s") from None
    finally:
        if child.returncode is None:  # timed out or cancelled: no orphan
            child.kill()
            await child.wait()
    if child.returncode != 0:
        detail = stderr.decode("utf-8", "replace").strip().splitlines()
        raise OSError(
            f"making a self-signed certificate failed (exit {child.returncode}): "
            + printable(detail[-1] if detail else "no message", 300)
        )


async def resolve_cert_files(opts: ServingOptions) -> tuple[str, str]:
    """The serving cert/key paths: the given ones, or ``<cert_dir>/apiserver.{crt,key}``,
    generated (self-signed) when absent."""
    if opts.tls_cert_file and opts.tls_private_key_file:
        return opts.tls_cert_file, opts.tls_private_key_file
    if opts.tls_cert_file or opts.tls_private_key_file:
        raise ValueError("tls_cert_file and tls_private_key_file must be given together")
    cert = os.path.join(opts.cert_dir, "apiserver.crt")
    key = os.path.join(opts.cert_dir, "apiserver.key")
    if not (os.path.exists(cert) and os.path.exists(key)):  # noqa: ASYNC240 (two stats at start-up)
        log.info("generating a self-signed serving certificate in %s", opts.cert_dir)
        await generate_self_signed(cert, key, tuple(opts.alternate_names))
    return cert, key


def server_context(
    cert_file: str, key_file: str, client_ca_pems: list[bytes], min_version: str = ""
) -> ssl.SSLContext:
    """A server ``SSLContext`` that asks for (but does not require) a client certificate chaining
    to one of ``client_ca_pems``."""
    if min_version not in TLS_VERSIONS:
        raise ValueError(f"unsupported tls_min_version {min_version!r}: use VersionTLS12 or VersionTLS13")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = TLS_VERSIONS[min_version]
    ctx.load_cert_chain(cert_file, key_file)
    cadata = b"".join(p if p.endswith(b"\n") else p + b"\n" for p in client_ca_pems)
    if cadata.strip():
        ctx.load_verify_locations(cadata=cadata.decode("ascii"))
        ctx.verify_mode = ssl.CERT_OPTIONAL
        # Any certificate of a CA file is a trust anchor, an intermediate too, as in Go's
        # x509 (kube-apiserver's): OpenSSL would otherwise want the chain to reach a root.
        ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    else:
        ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])
    # No session tickets (TLS 1.2 and 1.3): a session resumed from a ticket carries the client's
    # certificate but no verified chain, and the chain is what tells which CA vouched for it
    # (kcms/apiserver/authn.py, which keeps a TLS 1.2 session id's answer for resumption by id).
    ctx.options |= ssl.OP_NO_TICKET
    ctx.num_tickets = 0
    return ctx


def _mtimes(*paths: str) -> tuple[float, ...]:
    out = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append(st.st_mtime_ns + st.st_size + st.st_ino)
        except OSError:
            out.append(-1)
    return tuple(out)


class CertReloader:
    """Owns the server's TLS configuration and rebuilds it when its sources change.

    The listening socket keeps one ``SSLContext`` (:attr:`ctx`) whose SNI callback (OpenSSL calls it for
    every ClientHello, with or without a server name) moves each new connection onto the current
    context. A rebuild — serving cert/key files changed on disk (:meth:`check`, which the API server
    calls when a :class:`kcms.filewatch.FileWatch` of their directories fires), or
    new client CAs via :meth:`set_client_cas` — makes a whole new context, so new connections see the
    new pair and trust the new CAs while established ones are untouched. A source that does not load is
    logged and the previous context kept.
    """

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        client_ca_pems: list[bytes],
        min_version: str = "",
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca_pems = list(client_ca_pems)
        self.min_version = min_version
        self.reloads = 0
        self.failures = 0
        self._seen = _mtimes(cert_file, key_file)
        self.ctx = server_context(cert_file, key_file, self.client_ca_pems, min_version)
        self.current = self.ctx
        self.ctx.sni_callback = self._select

    def _select(self, sslobj: ssl.SSLObject, server_name: str | None, ctx: ssl.SSLContext) -> None:
        current = self.current
        if current is not ctx:
            sslobj.context = current

    def _rebuild(self, client_ca_pems: list[bytes], what: str) -> bool:
        try:
            ctx = server_context(self.cert_file, self.key_file, client_ca_pems, self.min_version)
        except (OSError, ssl.SSLError, ValueError) as e:
            self.failures += 1
            log.error("%s did not load, keeping the previous TLS configuration: %s", what, e)
            return False
        self.current = ctx
        self.client_ca_pems = list(client_ca_pems)
        self.reloads += 1
        log.info("TLS configuration reloaded (%s)", what)
        return True

    def check(self) -> bool:
        """Reload now if the cert/key files changed since the last look; True when a new pair is in use.

        A failed load is retried only when the files change again (e.g. the key written after the cert).
        """
        now = _mtimes(self.cert_file, self.key_file)
        if now == self._seen:
            return False
        self._seen = now
        return self._rebuild(self.client_ca_pems, f"serving certificate {self.cert_file} / {self.key_file}")

    def set_client_cas(self, client_ca_pems: list[bytes]) -> bool:
        """Trust these client CAs for new connections; True when the configuration changed."""
        if list(client_ca_pems) == self.client_ca_pems:
            return False
        return self._rebuild(list(client_ca_pems), "client CA bundle")
