"""HTTPS for a workshop hub: a certificate and key the proxy serves (``make hub TLS_CERT=... TLS_KEY=...``).

For a room on a network nobody else uses, :func:`self_signed` makes a pair on request
(``multigpu workshop tls --host BOX``; ``make hub-tls``): the browser warns once ("not private")
because no authority signed it, and the connection is encrypted all the same. Anywhere else use a
certificate from the site's authority or an ACME client. :func:`check` says whether a pair can be
served (both readable, the key the certificate's, not expired) before the hub starts on it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

#: A self-signed pair is made for a workshop, not for years.
DAYS = 90


def self_signed(cert: Path, key: Path, hosts: list[str], days: int = DAYS) -> None:
    """Write a self-signed certificate for ``hosts`` (names or IP addresses; localhost and
    127.0.0.1 are always added) to ``cert`` and its private key (mode 600) to ``key``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    names: list[x509.GeneralName] = []
    for host in dict.fromkeys([*hosts, "localhost", "127.0.0.1"]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    private = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0] if hosts else "localhost"),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "multigpu workshop (self-signed)")])
    now = dt.datetime.now(dt.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                   .public_key(private.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
                   .add_extension(x509.SubjectAlternativeName(names), critical=False)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .sign(private, hashes.SHA256()))
    for path in (cert, key):
        path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))


def check(cert: str | os.PathLike, key: str | os.PathLike) -> str | None:
    """None when the pair can be served, else what is wrong with it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        certificate = x509.load_pem_x509_certificate(Path(cert).read_bytes())
    except (OSError, ValueError) as e:
        return f"cannot read the certificate {cert}: {e}"
    try:
        private = serialization.load_pem_private_key(Path(key).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        return f"cannot read the key {key} (an unencrypted PEM key): {e}"
    pem = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    if private.public_key().public_bytes(*pem) != certificate.public_key().public_bytes(*pem):
        return f"{key} is not the key of {cert}"
    if certificate.not_valid_after_utc < dt.datetime.now(dt.timezone.utc):
        return f"{cert} expired on {certificate.not_valid_after_utc:%Y-%m-%d}"
    return None
