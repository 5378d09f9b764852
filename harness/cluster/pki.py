"""The one-node cluster's certificates, made with the ``openssl`` command line (OpenSSL 3: ``req -x509 -CA``).

One CA signs the API server's serving certificate (names: 127.0.0.1, the ``kubernetes`` Service's first address
10.96.0.1 and its DNS names) and one client certificate, ``admin`` in group ``system:masters``, that kubectl and
every component use: a test cluster on loopback, one user, no per-component identities. The service-account token
key pair is a separate P-256 key. Every key is P-256 (ECDSA), valid :data:`DAYS` days.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

#: Validity of every certificate, days: a cluster lives for a test session.
DAYS = 7
#: The Service range's first address (the ``kubernetes`` Service), in the API server's certificate.
SERVICE_IP = "10.96.0.1"
SERVICE_RANGE = "10.96.0.0/24"
_NEW_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make(pki: Path) -> None:
    """Write ``ca.{crt,key}``, ``apiserver.{crt,key}``, ``admin.{crt,key}`` and ``sa.{key,pub}`` into ``pki``
    (kept where they exist). Raises :class:`subprocess.CalledProcessError` when openssl fails."""
    pki.mkdir(parents=True, exist_ok=True)
    if (pki / "sa.pub").exists():
        return
    ca, ca_key = str(pki / "ca.crt"), str(pki / "ca.key")
    _openssl(
        "req",
        "-x509",
        *_NEW_KEY,
        "-keyout",
        ca_key,
        "-out",
        ca,
        "-days",
        str(DAYS),
        "-subj",
        "/CN=streaminfer-cluster-ca",
    )
    sans = ",".join(
        [
            "IP:127.0.0.1",
            f"IP:{SERVICE_IP}",
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
        ]
    )
    leaves = {
        "apiserver": ("/CN=kube-apiserver", f"subjectAltName={sans}", "extendedKeyUsage=serverAuth"),
        "admin": ("/O=system:masters/CN=admin", "extendedKeyUsage=clientAuth", "keyUsage=digitalSignature"),
    }
    for name, (subject, *extensions) in leaves.items():
        ext = [arg for e in extensions for arg in ("-addext", e)]
        _openssl(
            "req",
            "-x509",
            *_NEW_KEY,
            "-keyout",
            str(pki / f"{name}.key"),
            "-out",
            str(pki / f"{name}.crt"),
            "-days",
            str(DAYS),
            "-subj",
            subject,
            "-CA",
            ca,
            "-CAkey",
            ca_key,
            *ext,
        )
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", str(pki / "sa.key"))
    _openssl("pkey", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
