"""TLS material for the simulated kubelets: a server certificate for every node address."""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _san(identities: list[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for ident in identities:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(ident)))
        except ValueError:
            out.append(x509.DNSName(ident))
    return out


def _new_ca() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kcms simulated kubelet CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return ca_key, ca_cert


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
        self._ca_key, self._ca_cert = _new_ca()
        self.ca_pem = self._ca_cert.public_bytes(serialization.Encoding.PEM)
        # One key for every leaf: signing is cheap, key generation is what costs at 5000 nodes.
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._key_pem = self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def _leaf_pem(self, identities: list[str]) -> bytes:
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identities[0])]))
            .issuer_name(self._ca_cert.subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(_san(identities)), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._ca_key.public_key()), critical=False
            )
            .sign(self._ca_key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM)

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
