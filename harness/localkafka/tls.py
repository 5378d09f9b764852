"""Throwaway TLS material for the local broker's SSL and SASL_SSL listeners, made with ``cryptography``.

A fresh CA (EC P-256, one day back-dated, valid 365 days) signs one server certificate whose subject alternative
names are every node's IP address and ``localhost``, so clients verify the hostname against the CA. The broker gets
a PKCS12 keystore (key + chain, PBES2/AES-256 with a SHA-256 MAC, which Java 17 reads); clients get the CA as PEM.
The CA's key is never written to disk.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: How long the certificates are valid, days (back-dated one day against clock skew).
VALID_DAYS = 365


@dataclass(frozen=True)
class TlsMaterial:
    """Where the material is: ``keystore`` (PKCS12, mode 600, password ``password``) and ``ca_file`` (PEM)."""

    keystore: Path
    password: str
    ca_file: Path


def make_tls_material(folder: Path, hosts: Sequence[str], password: str, ca_name: str) -> TlsMaterial:
    """Write ``server.p12`` and ``ca.pem`` into ``folder`` (made with mode 700).

    Args:
        hosts: IP addresses or DNS names the server certificate names (``localhost`` is always added).
        password: the keystore's password.
        ca_name: the CA's common name (random per start, so two brokers' CAs never look alike).
    """
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(days=1), now + datetime.timedelta(days=VALID_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_name)])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_subject)
        .issuer_name(ca_subject)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    encryption = (
        serialization.PrivateFormat.PKCS12.encryption_builder()
        .kdf_rounds(10_000)
        .key_cert_algorithm(pkcs12.PBES.PBESv2SHA256AndAES256CBC)
        .hmac_hash(hashes.SHA256())
        .build(password.encode())
    )
    keystore, ca_file = folder / "server.p12", folder / "ca.pem"
    blob = pkcs12.serialize_key_and_certificates(b"server", key, server, [ca], encryption)
    fd = os.open(keystore, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(blob)
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    ca_file.chmod(0o644)
    return TlsMaterial(keystore, password, ca_file)


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )
