"""The secure ports' certificate (config.tls) and the delegated-auth answer cache.

The self-signed certificate names the hosts it is for and loads into a server context that a
real TLS client completes a handshake with; bad certificate flags are one line each. The cache
of review answers (k8sclient.delegated) expires and stays bounded.
"""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509

from kallot.config import tls
from kallot.core.errors import ConfigError
from kallot.k8sclient.delegated import _TtlCache


def test_self_signed_names_its_hosts_and_serves_tls() -> None:
    cert, _ = tls.self_signed(["kallot.kallot-system.svc", "10.0.0.7"])
    san = x509.load_pem_x509_certificate(cert).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert "kallot.kallot-system.svc" in san.value.get_values_for_type(x509.DNSName)
    assert "localhost" in san.value.get_values_for_type(x509.DNSName)
    ips = {str(ip) for ip in san.value.get_values_for_type(x509.IPAddress)}
    assert {"10.0.0.7", "127.0.0.1", "::1"} <= ips

    server = tls.server_context(None, None, hosts=["localhost"])
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def accept() -> None:
        conn, _ = listener.accept()
        with server.wrap_socket(conn, server_side=True) as s:
            s.sendall(b"hello")

    t = threading.Thread(target=accept)
    t.start()
    client = ssl.create_default_context()
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", port)) as raw,
        client.wrap_socket(raw, server_hostname="localhost") as s,
    ):
        assert s.version() in ("TLSv1.2", "TLSv1.3")
        assert s.recv(5) == b"hello"
    t.join()
    listener.close()


def test_bad_certificate_files_are_one_line(tmp_path: Path) -> None:
    crt, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    with pytest.raises(ConfigError, match=r"^--tls-private-key-file: got '', expected a file"):
        tls.server_context(crt, None)
    crt.write_text("not a certificate\n")
    key.write_text("not a key\n")
    with pytest.raises(ConfigError, match=r"^--tls-cert-file: got '.*tls.crt', expected a PEM"):
        tls.server_context(crt, key)
    other_cert, _ = tls.self_signed([])
    _, other_key = tls.self_signed([])
    crt.write_bytes(other_cert)
    key.write_bytes(other_key)  # a key that is not the certificate's
    with pytest.raises(ConfigError, match="matching --tls-private-key-file"):
        tls.server_context(crt, key)


def test_review_cache_expires_and_is_bounded() -> None:
    now = [0.0]
    cache: _TtlCache[str, int] = _TtlCache(10.0, 3, lambda: now[0])
    cache.put("a", 1)
    now[0] = 9.9
    assert cache.get("a") == 1
    now[0] = 10.1
    assert cache.get("a") is None  # expired: asked again
    for k in "bcde":
        cache.put(k, 0)
    assert len(cache) == 3 and cache.get("b") is None  # least recently used went first
