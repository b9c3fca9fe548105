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


def self_signed_server(identities: list[str]) -> tuple[bytes, bytes, bytes]:
    """Make a throw-away CA and a server certificate for ``identities`` (IP addresses or DNS names).

    Returns ``(ca_pem, cert_chain_pem, key_pem)``.
    """
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
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kcms-simulated-kubelet")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(_san(identities)), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return ca_cert.public_bytes(pem), cert.public_bytes(pem), key_pem


def server_context(identities: list[str], ca: Any | None) -> tuple[ssl.SSLContext, bytes]:
    """A server SSLContext for ``identities``, issued by ``ca`` (a ``trustme.CA``) or a fresh CA.

    Returns ``(context, ca_pem)``.
    """
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    if ca is not None:
        leaf = ca.issue_cert(*identities)
        leaf.configure_cert(ctx)
        return ctx, ca.cert_pem.bytes()
    ca_pem, chain_pem, key_pem = self_signed_server(identities)
    with tempfile.TemporaryDirectory() as d:
        cpath, kpath = os.path.join(d, "tls.crt"), os.path.join(d, "tls.key")
        with open(cpath, "wb") as f:
            f.write(chain_pem)
        with open(kpath, "wb") as f:
            f.write(key_pem)
        ctx.load_cert_chain(cpath, kpath)
    return ctx, ca_pem


def client_context(ca_pem: bytes) -> ssl.SSLContext:
    """A client SSLContext that trusts ``ca_pem``."""
    return ssl.create_default_context(cadata=ca_pem.decode())
