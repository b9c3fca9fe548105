"""TLS material for the simulated kubelets: a server certificate for every node address."""

from __future__ import annotations

import os
import ssl
import tempfile
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from kcms.certs import cert_pem, issue, key_pem, new_ca


class ServerCertificates:
    """Serving certificates for simulated kubelets, one per node as real kubelets have.

    Issued by ``ca`` (a ``trustme.CA``) or by a fresh throw-away CA. One certificate listing every
    node address would make each client connection decode thousands of SANs (and hold them in
    asyncio's peercert dict): at 1000 nodes that was ~180 KiB per connection on the scraper.
    """

    def __init__(self, ca: Any | None = None) -> None:
        self._trustme = ca
        if ca is not None:
            self.ca_pem: bytes = ca.cert_pem.bytes()
            return
        self._ca_key, self._ca_cert = new_ca("kcms simulated kubelet CA")
        self.ca_pem = cert_pem(self._ca_cert)
        # One key for every leaf: signing is cheap, key generation is what costs at 5000 nodes.
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._key_pem = key_pem(self._key)

    def _leaf_pem(self, identities: list[str]) -> bytes:
        _, cert = issue(self._ca_key, self._ca_cert, identities[0], identities=identities, key=self._key)
        return cert_pem(cert)

    def context(self, identities: list[str]) -> ssl.SSLContext:
        """A server SSLContext with a certificate for ``identities`` (IP addresses or DNS names)."""
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        if self._trustme is not None:
            self._trustme.issue_cert(*identities).configure_cert(ctx)
            return ctx
        with tempfile.TemporaryDirectory() as d:
            cpath, kpath = os.path.join(d, "tls.crt"), os.path.join(d, "tls.key")
            with open(cpath, "wb") as f:
                f.write(self._leaf_pem(identities))
            with open(kpath, "wb") as f:
                f.write(self._key_pem)
            ctx.load_cert_chain(cpath, kpath)
        return ctx


def client_context(ca_pem: bytes) -> ssl.SSLContext:
    """A client SSLContext that trusts ``ca_pem``."""
    return ssl.create_default_context(cadata=ca_pem.decode())
