"""X.509 material KCMS makes: a CA and the leaves it signs, for the simulator's kubelets and the
demo's kubectl identity; and the self-signed serving pair of ``--cert-dir`` when no certificate
is given, which the server has a child process make (``python -m kcms.certs self-signed CERT KEY
[NAME...]``, run by :func:`kcms.apiserver.serving.generate_self_signed`).

Why a child for that pair: this module needs the ``cryptography`` package, whose Rust extension
stays mapped for the life of a process that imports it (7.8 MB of RSS of an idle `kcms
standalone` at 50 nodes, ~68 MiB in all; its Python modules add more). The serving process needs
it for nothing else (client certificates are told apart by the chain OpenSSL verified:
kcms/apiserver/authn.py), and a child that imports only this module takes ~0.16 s, once, when the
files are first made.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import sys

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


def _signing_usage(*, key_encipherment: bool, crl_sign: bool) -> x509.KeyUsage:
    """Key usage of a certificate that signs certificates (a CA, or a self-signed server's)."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=crl_sign,
        encipher_only=False,
        decipher_only=False,
    )


def new_ca(common_name: str, days: int = 365) -> tuple[Key, x509.Certificate]:
    """A self-signed CA that may sign leaves (not other CAs)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    usage = _signing_usage(key_encipherment=False, crl_sign=True)
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


def write_self_signed(cert_path: str, key_path: str, alternate_names: tuple[str, ...] = ()) -> None:
    """Write a self-signed serving certificate and its key (PEM) for localhost, 127.0.0.1 and
    ``alternate_names`` (IP addresses become IP SANs, everything else DNS SANs)."""
    key = ec.generate_private_key(ec.SECP256R1())
    names = subject_alt_names(["localhost", "127.0.0.1"])
    names += [n for n in subject_alt_names(list(alternate_names)) if n not in names]
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"localhost@{int(now.timestamp())}")])
    usage = _signing_usage(key_encipherment=True, crl_sign=False)
    cert = (
        _builder(subject, subject, key.public_key(), 365)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    os.makedirs(os.path.dirname(os.path.abspath(cert_path)), exist_ok=True)
    write_private(key_path, key_pem(key))
    with open(cert_path, "wb") as f:
        f.write(cert_pem(cert))


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "self-signed":
        print("usage: python -m kcms.certs self-signed CERT KEY [ALTERNATE_NAME...]", file=sys.stderr)
        return 2
    write_self_signed(argv[1], argv[2], tuple(argv[3:]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
