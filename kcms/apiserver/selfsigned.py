"""The self-signed serving certificate `kcms` makes when it is given none, written by a short-lived
child process (``python -m kcms.apiserver.selfsigned CERT KEY [NAME...]``, run by
:func:`kcms.apiserver.serving.generate_self_signed`).

Why a child: making a key and a certificate needs the ``cryptography`` package, whose Rust
extension stays mapped for the life of the process that imports it (7.8 MB of RSS in an idle
`kcms standalone` at 50 nodes, where the whole process is ~68 MiB; its Python modules add more).
The serving process needs it for nothing else: client certificates are matched against the CAs
from the verified chain OpenSSL built (kcms/apiserver/authn.py). A one-off child costs a Python
start-up once, when the files are first made.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import sys

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def write_self_signed(cert_path: str, key_path: str, alternate_names: tuple[str, ...] = ()) -> None:
    """Write a self-signed serving certificate and its key (PEM) for localhost, 127.0.0.1 and
    ``alternate_names`` (IP addresses become IP SANs, everything else DNS SANs)."""
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    for alt in alternate_names:
        try:
            ip: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(alt))
        except ValueError:
            ip = x509.DNSName(alt)
        if ip not in names:
            names.append(ip)
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"localhost@{int(now.timestamp())}")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=True,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    os.makedirs(os.path.dirname(os.path.abspath(cert_path)), exist_ok=True)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key_pem)
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m kcms.apiserver.selfsigned CERT KEY [ALTERNATE_NAME...]", file=sys.stderr)
        return 2
    write_self_signed(argv[0], argv[1], tuple(argv[2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
