"""Throw-away X.509 material for simulations and demos: a CA and the leaves it signs.

Production serving certificates come from files (or the apiserver kit's self-signed pair);
this is for the simulator's kubelets and the demo's kubectl identity.
"""

from __future__ import annotations

import datetime
import ipaddress
import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

Key = ec.EllipticCurvePrivateKey


def subject_alt_names(identities: list[str]) -> list[x509.GeneralName]:
    """IP addresses as IP SANs, anything else as DNS SANs."""
    out: list[x509.GeneralName] = []
    for ident in identities:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(ident)))
        except ValueError:
            out.append(x509.DNSName(ident))
    return out


def _builder(subject: x509.Name, issuer: x509.Name, public_key, days: int) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def new_ca(common_name: str, days: int = 365) -> tuple[Key, x509.Certificate]:
    """A self-signed CA that may sign leaves (not other CAs)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    cert = (
        _builder(name, name, key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def issue(
    ca_key: Key,
    ca_cert: x509.Certificate,
    common_name: str,
    *,
    organizations: tuple[str, ...] = (),
    identities: list[str] | None = None,
    client: bool = False,
    key: Key | None = None,
    days: int = 365,
) -> tuple[Key, x509.Certificate]:
    """A leaf signed by the CA: a server certificate for ``identities``, or with ``client`` a
    client certificate (Kubernetes reads the user from CN and the groups from O)."""
    key = key or ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    purpose = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (
        _builder(x509.Name(attrs), ca_cert.subject, key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([purpose]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if identities:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(subject_alt_names(identities)), critical=False
        )
    return key, builder.sign(ca_key, hashes.SHA256())


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: Key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def write_private(path: str, data: bytes) -> None:
    """Write a private key readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
