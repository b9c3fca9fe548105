"""Delegated authentication, in the order of the kube generic apiserver:

1. request-header (front proxy): only for a TLS peer whose client certificate was issued by the
   request-header CA (and whose CN is allowed); user, groups, extra and uid from the headers;
2. client certificate issued by the client CA: user = CN, groups = O;
3. ``Authorization: Bearer <token>`` checked by a token reviewer (TokenReview, cached there).

The server's ``SSLContext`` trusts both CAs, so after the handshake the chain OpenSSL verified is
read here and its trust anchor (its last certificate, one of the configured CA certificates) is
compared, byte for byte, with each CA bundle's certificates to know which CA vouched for it: the
client may send intermediates, as with kube. The answer is cached per TLS connection, and per
TLS 1.2 session id: a resumed session has no verified chain, so it keeps its full handshake's
answer, until the CAs change (TLS 1.3 tickets are not issued: kcms/apiserver/serving.py). A
connection with no verified chain otherwise has no certificate identity. Python 3.13 reads
that chain with ``SSLObject.get_verified_chain()``; 3.11 and 3.12 have the same method, unexported,
on the object under it. This module does not load the ``cryptography`` package (see
kcms/certs.py for what that saves).
"""

from __future__ import annotations

import _ssl
import base64
import binascii
import logging
import re
import ssl
import time
import urllib.parse
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from kcms.limits import printable
from kcms.model import UserInfo

from .metrics import SPOOFED_HEADERS

log = logging.getLogger(__name__)

ANONYMOUS = UserInfo(name="system:anonymous", groups=("system:unauthenticated",))
AUTHENTICATED_GROUP = "system:authenticated"
# Sessions whose full handshake's answer is kept for TLS 1.2 resumption: OpenSSL's own server
# session cache holds at most as many (SSL_SESSION_CACHE_MAX_SIZE_DEFAULT).
MAX_SESSIONS = 20480


class TokenAuthenticator(Protocol):
    """Anything that turns a bearer token into a user (e.g. ``kcms.kube.reviews.TokenReviewer``)."""

    async def authenticate(self, token: str) -> UserInfo | None: ...


@dataclass(slots=True)
class AuthnOptions:
    """Authentication settings (the kube ``--client-ca-file``/``--requestheader-*`` flags).

    Empty CA files are looked up (unless ``skip_lookup``) in the
    ``kube-system/extension-apiserver-authentication`` ConfigMap.
    """

    client_ca_file: str = ""
    requestheader_client_ca_file: str = ""
    requestheader_allowed_names: list[str] = field(default_factory=list)
    requestheader_username_headers: list[str] = field(default_factory=lambda: ["X-Remote-User"])
    requestheader_group_headers: list[str] = field(default_factory=lambda: ["X-Remote-Group"])
    requestheader_extra_headers_prefix: list[str] = field(default_factory=lambda: ["X-Remote-Extra-"])
    requestheader_uid_headers: list[str] = field(default_factory=lambda: ["X-Remote-Uid"])
    skip_lookup: bool = False
    token_reviewer: TokenAuthenticator | None = None
    allow_anonymous: bool = False


@dataclass(slots=True)
class ResolvedAuthn:
    """Authentication settings with CA material in memory (files read, ConfigMap merged)."""

    client_ca_pems: list[bytes]
    requestheader_ca_pems: list[bytes]
    allowed_names: list[str]
    username_headers: list[str]
    group_headers: list[str]
    extra_prefixes: list[str]
    uid_headers: list[str]


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    return [str(v) for v in value]


def resolve(opts: AuthnOptions, configmap: dict[str, Any] | None = None) -> ResolvedAuthn:
    """Read the CA files; fill what is unset from the extension-apiserver-authentication data
    (``configmap``, keys as in the ConfigMap, lists already decoded), like kube's delegating
    authentication: the request-header settings come from the ConfigMap when no request-header
    CA file was given."""
    cm = configmap or {}
    client = [_read(opts.client_ca_file)] if opts.client_ca_file else []
    if not client and cm.get("client-ca-file"):
        client = [str(cm["client-ca-file"]).encode()]
    if opts.requestheader_client_ca_file:
        return ResolvedAuthn(
            client_ca_pems=client,
            requestheader_ca_pems=[_read(opts.requestheader_client_ca_file)],
            allowed_names=list(opts.requestheader_allowed_names),
            username_headers=list(opts.requestheader_username_headers),
            group_headers=list(opts.requestheader_group_headers),
            extra_prefixes=list(opts.requestheader_extra_headers_prefix),
            uid_headers=list(opts.requestheader_uid_headers),
        )
    rh = [str(cm["requestheader-client-ca-file"]).encode()] if cm.get("requestheader-client-ca-file") else []
    return ResolvedAuthn(
        client_ca_pems=client,
        requestheader_ca_pems=rh,
        allowed_names=_as_list(cm.get("requestheader-allowed-names")) if rh else [],
        username_headers=_as_list(cm.get("requestheader-username-headers"))
        or list(opts.requestheader_username_headers),
        group_headers=_as_list(cm.get("requestheader-group-headers"))
        or list(opts.requestheader_group_headers),
        extra_prefixes=_as_list(cm.get("requestheader-extra-headers-prefix"))
        or list(opts.requestheader_extra_headers_prefix),
        uid_headers=_as_list(cm.get("requestheader-uid-headers")) or list(opts.requestheader_uid_headers),
    )


_PEM_CERTIFICATE = re.compile(rb"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", re.S)


def load_ca_certs(pems: Iterable[bytes]) -> list[bytes]:
    """Every certificate of the PEM bundles, DER-encoded; ValueError for a certificate block that
    is not one (OpenSSL's own reading, the one the TLS layer trusts them by)."""
    out: list[bytes] = []
    reader = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # only to have OpenSSL read each block
    for pem in pems:
        for block in _PEM_CERTIFICATE.finditer(pem):
            try:
                der = base64.b64decode(b"".join(block.group(1).split()), validate=True)
                reader.load_verify_locations(cadata=der)
            except (binascii.Error, ssl.SSLError) as e:
                raise ValueError(f"a CA certificate does not parse: {printable(e, 200)}") from None
            out.append(der)
    return out


def verified_chain(ssl_object: Any) -> list[bytes]:
    """The certificates (DER) of the chain OpenSSL verified for the peer, its certificate first and
    the trust anchor last; empty when it verified none."""
    public = getattr(ssl_object, "get_verified_chain", None)  # ssl.SSLObject, Python 3.13+
    if public is not None:
        return list(public() or ())
    inner = getattr(ssl_object, "_sslobj", None)  # _ssl._SSLSocket: the same method since 3.10
    chain = inner.get_verified_chain() if inner is not None else None
    return [cert.public_bytes(_ssl.ENCODING_DER) for cert in chain or ()]


def subject_names(peercert: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """(first common name or "", organizations in order) of ``ssl``'s decoded peer certificate."""
    cns: list[str] = []
    orgs: list[str] = []
    for rdn in peercert.get("subject", ()):
        for kind, value in rdn:
            if kind == "commonName":
                cns.append(value)
            elif kind == "organizationName":
                orgs.append(value)
    return (cns[0] if cns else ""), tuple(orgs)


@dataclass(frozen=True, slots=True)
class PeerCert:
    """What the server knows about a TLS connection's client certificate."""

    common_name: str
    organizations: tuple[str, ...]
    from_requestheader_ca: bool
    from_client_ca: bool


@dataclass(frozen=True, slots=True)
class AuthnResult:
    """The outcome of authentication: a user (None when nobody matched) and how."""

    user: UserInfo | None
    method: str  # requestheader, x509, token, anonymous, none, invalid-token


def _add_authenticated(user: UserInfo) -> UserInfo:
    if AUTHENTICATED_GROUP in user.groups:
        return user
    return UserInfo(
        name=user.name, uid=user.uid, groups=(*user.groups, AUTHENTICATED_GROUP), extra=user.extra
    )


class Authenticator:
    """Authenticates aiohttp requests arriving over TLS."""

    def __init__(
        self, config: ResolvedAuthn, token_reviewer: TokenAuthenticator | None, allow_anonymous: bool
    ) -> None:
        self.token_reviewer = token_reviewer
        self.allow_anonymous = allow_anonymous
        self._last_warning = -1e9
        self.update(config)

    def update(self, config: ResolvedAuthn) -> None:
        """Use a new configuration (CAs, allowed names, headers); raises ValueError on unparseable CAs.

        Connections already open are re-evaluated against the new CAs on their next request.
        """
        rh_cas = frozenset(load_ca_certs(config.requestheader_ca_pems))
        client_cas = frozenset(load_ca_certs(config.client_ca_pems))
        self.config = config
        self._rh_cas = rh_cas
        self._client_cas = client_cas
        self._allowed = set(config.allowed_names)
        self._peers: weakref.WeakKeyDictionary[Any, PeerCert | None] = weakref.WeakKeyDictionary()
        # TLS 1.2 session id -> what its full handshake's chain said (see peer_cert); emptied with
        # every new configuration, so a session from before a CA change identifies nobody.
        self._sessions: dict[bytes, PeerCert] = {}

    def _warn(self, msg: str, *args: Any) -> None:
        """Log a rejected request-header identity: a warning at most every 10 s, debug in between."""
        now = time.monotonic()
        if now - self._last_warning >= 10.0:
            self._last_warning = now
            log.warning(msg, *args)
        else:
            log.debug(msg, *args)

    def peer_cert(self, request: web.Request) -> PeerCert | None:
        """The verified client certificate of the request's connection, if any (cached per connection)."""
        transport = request.transport
        if transport is None:
            return None
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is None:
            return None
        try:
            return self._peers[ssl_object]
        except KeyError:
            pass
        peer: PeerCert | None = None
        chain = verified_chain(ssl_object)
        session = getattr(ssl_object, "session", None)
        session_id = session.id if session is not None else b""
        if chain:
            anchor = chain[-1]
            common_name, organizations = subject_names(ssl_object.getpeercert() or {})
            peer = PeerCert(
                common_name=common_name,
                organizations=organizations,
                from_requestheader_ca=anchor in self._rh_cas,
                from_client_ca=anchor in self._client_cas,
            )
            if session_id:
                self._remember_session(session_id, peer)
        elif session_id and getattr(ssl_object, "session_reused", False):
            # A resumed TLS 1.2 session: no chain was verified now, so what was found when its
            # full handshake was made (unknown since the CAs changed, or forgotten: nobody).
            peer = self._sessions.get(session_id)
        self._peers[ssl_object] = peer
        return peer

    def _remember_session(self, session_id: bytes, peer: PeerCert) -> None:
        sessions = self._sessions
        sessions[session_id] = peer
        if len(sessions) > MAX_SESSIONS:
            del sessions[next(iter(sessions))]  # the oldest: a dict keeps insertion order

    def _from_headers(self, request: web.Request, peer: PeerCert | None) -> UserInfo | None:
        headers = request.headers
        name = ""
        for h in self.config.username_headers:
            for v in headers.getall(h, []):
                if v.strip():
                    name = v.strip()
                    break
            if name:
                break
        if not name:
            return None
        if peer is None or not peer.from_requestheader_ca:
            SPOOFED_HEADERS.inc()
            self._warn(
                "ignoring request-header identity %s from %s: no client certificate from the request-header CA",
                printable(name, 80),
                printable(request.remote or "", 60),
            )
            return None
        if self._allowed and peer.common_name not in self._allowed:
            SPOOFED_HEADERS.inc()
            self._warn(
                "ignoring request-header identity %s: front-proxy certificate CN %s is not in the allowed names",
                printable(name, 80),
                printable(peer.common_name, 80),
            )
            return None
        groups: list[str] = []
        for h in self.config.group_headers:
            groups.extend(v for v in headers.getall(h, []) if v)
        extra: dict[str, list[str]] = {}
        for key, value in headers.items():
            lower = key.lower()
            for prefix in self.config.extra_prefixes:
                if lower.startswith(prefix.lower()) and len(lower) > len(prefix):
                    extra_key = urllib.parse.unquote(lower[len(prefix) :])
                    extra.setdefault(extra_key, []).append(value)
                    break
        uid = ""
        for h in self.config.uid_headers:
            v = headers.get(h, "")
            if v:
                uid = v
                break
        return UserInfo(
            name=name,
            uid=uid,
            groups=tuple(groups),
            extra=tuple(sorted((k, tuple(v)) for k, v in extra.items())),
        )

    async def authenticate(self, request: web.Request) -> AuthnResult:
        """Try request-header, client certificate, then bearer token; see the module docstring."""
        peer = self.peer_cert(request)
        user = self._from_headers(request, peer)
        if user is not None:
            return AuthnResult(_add_authenticated(user), "requestheader")
        if peer is not None and peer.from_client_ca and peer.common_name:
            user = UserInfo(name=peer.common_name, groups=peer.organizations)
            return AuthnResult(_add_authenticated(user), "x509")
        auth = request.headers.get("Authorization", "")
        scheme, _, token = auth.strip().partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and token:
            if self.token_reviewer is None:
                return AuthnResult(None, "invalid-token")
            try:
                user = await self.token_reviewer.authenticate(token)
            except Exception as e:  # the review could not be made: kube answers 401 too
                log.error("token review failed: %s", printable(e, 200))
                user = None
            if user is None:
                return AuthnResult(None, "invalid-token")
            return AuthnResult(_add_authenticated(user), "token")
        if self.allow_anonymous:
            return AuthnResult(ANONYMOUS, "anonymous")
        return AuthnResult(None, "none")
