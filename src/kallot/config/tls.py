"""The serving certificate of a secure port: the operator's files, or a self-signed one.

Where it sits: at start-up, before any listener opens. The scheduler's secure port
(``--secure-address``, kube-scheduler's 10259) and the node agent's exporter with
``--metrics-auth delegated`` build their ``ssl.SSLContext`` here. With ``--tls-cert-file`` and
``--tls-private-key-file`` the files are loaded (bad ones are one ConfigError line); without
them a self-signed certificate is made in memory, as kube-scheduler does when it has no
certificate: Prometheus scrapes such a port with ``insecure_skip_verify`` and a bearer token,
which is what authenticates (``k8sclient.delegated``), not the certificate.

The self-signed key never touches a disk: ``ssl`` only loads certificates from paths, so it is
handed over through an anonymous memory file (``memfd_create``), which also works under a
read-only root filesystem.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import ssl
from collections.abc import Sequence
from pathlib import Path

from kallot.core.errors import ConfigError

SELF_SIGNED_DAYS = 365


def server_context(
    cert_file: Path | None,
    key_file: Path | None,
    *,
    hosts: Sequence[str] = (),
) -> ssl.SSLContext:
    """A TLS 1.2+ server context: from ``cert_file`` + ``key_file``, else self-signed for
    ``hosts`` (plus this host's name, ``localhost`` and the loopback addresses)."""
    if (cert_file is None) != (key_file is None):
        given, missing = (
            ("--tls-cert-file", "--tls-private-key-file")
            if cert_file is not None
            else ("--tls-private-key-file", "--tls-cert-file")
        )
        raise ConfigError(missing, "", f"a file too, since {given} is given (or neither)")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file is not None and key_file is not None:
        for flag, path in (("--tls-cert-file", cert_file), ("--tls-private-key-file", key_file)):
            if not path.is_file():
                raise ConfigError(flag, str(path), "a readable PEM file (no such file)")
        try:
            ctx.load_cert_chain(str(cert_file), str(key_file))
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                "--tls-cert-file",
                str(cert_file),
                f"a PEM certificate matching --tls-private-key-file ({exc.strerror or exc})",
            ) from None
        return ctx
    cert_pem, key_pem = self_signed(hosts)
    _load_from_memory(ctx, cert_pem + key_pem)
    return ctx


def self_signed(hosts: Sequence[str]) -> tuple[bytes, bytes]:
    """A self-signed ECDSA P-256 certificate and its key (PEM), valid ``SELF_SIGNED_DAYS``
    days, for ``hosts`` plus this host's name, ``localhost``, 127.0.0.1 and ::1."""
    # Imported here: only a start without certificate files pays for it.
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    names: list[str] = []
    for h in (*hosts, socket.gethostname(), "localhost", "127.0.0.1", "::1"):
        if h and h not in ("0.0.0.0", "::") and h not in names:
            names.append(h)
    alt: list[x509.GeneralName] = []
    for h in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            alt.append(x509.DNSName(h))
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    # kube-scheduler names its self-signed certificate "host@timestamp": so does kallot.
    subject = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, f"{names[0]}@{int(now.timestamp())}")]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # a little clock skew
        .not_valid_after(now + datetime.timedelta(days=SELF_SIGNED_DAYS))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    return (
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def _load_from_memory(ctx: ssl.SSLContext, pem: bytes) -> None:
    fd = os.memfd_create("kallot-serving-cert", os.MFD_CLOEXEC)
    try:
        os.write(fd, pem)
        ctx.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
