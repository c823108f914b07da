"""The test PKI: certificates make_ca/make_cert write pass a real TLS handshake between Python
``ssl`` endpoints (both sides verified, the address checked against the IP SAN), and a
certificate from another CA is refused."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509

from dataplane.tools.certificates import make_ca, make_cert
from metadata_quorum.security.tls import TlsSettings, socket_peer_subject


def _handshake(
    server: TlsSettings, client: TlsSettings, host: str = "127.0.0.1", check_hostname: bool = True
) -> str | None:
    """Run one handshake on loopback; the server's view of the client's subject, or raise the
    client's ssl error. The server's error (if any) is raised when the client succeeded."""
    server_context = server.server_context()
    client_context = client.client_context(check_hostname=check_hostname)
    seen: list[str | None] = []
    failures: list[BaseException] = []
    with socket.create_server((host, 0)) as listening:
        listening.settimeout(30)
        port = listening.getsockname()[1]

        def serve() -> None:
            try:
                connection, _ = listening.accept()
                with server_context.wrap_socket(connection, server_side=True) as tls:
                    seen.append(socket_peer_subject(tls))
                    tls.sendall(b"ok")
            except (ssl.SSLError, OSError) as error:
                failures.append(error)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with (
                socket.create_connection((host, port), timeout=30) as raw,
                client_context.wrap_socket(raw, server_hostname=host) as tls,
            ):
                assert tls.recv(2) == b"ok"
        finally:
            thread.join(timeout=30)
    if failures:
        raise failures[0]
    return seen[0]


def test_mutual_tls_handshake_names_the_client(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    server_pem = make_cert(ca, tmp_path, "node-1", ips=("127.0.0.1",), client=False)
    client_pem = make_cert(ca, tmp_path, "alice", server=False)
    server = TlsSettings(server_pem, ca.cert, client_auth="required")
    client = TlsSettings(client_pem, ca.cert)
    assert _handshake(server, client) == "CN=alice"


def test_keystore_holds_key_cert_and_ca_chain(tmp_path: Path) -> None:
    ca = make_ca(tmp_path, name="test-ca")
    pem = make_cert(ca, tmp_path, "node-2", ips=("127.0.0.6", "::1"))
    assert pem.name == "node-2.pem"
    assert pem.stat().st_mode & 0o077 == 0
    certificates = x509.load_pem_x509_certificates(pem.read_bytes())
    assert [c.subject.rfc4514_string() for c in certificates] == ["CN=node-2", "CN=test-ca"]
    names = certificates[0].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.6", "::1"]
    key, chain = TlsSettings(pem, ca.truststore).key_and_chain()
    assert b"PRIVATE KEY" in key and chain.count(b"BEGIN CERTIFICATE") == 2
    assert ca.bundle == ca.cert


def test_encrypted_key_opens_with_its_password(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    pem = make_cert(ca, tmp_path, "node-1", ips=("127.0.0.1",), key_password="s3cret")
    assert b"ENCRYPTED PRIVATE KEY" in pem.read_bytes()
    server = TlsSettings(pem, ca.cert, key_password="s3cret")
    assert _handshake(server, TlsSettings(None, ca.cert)) is None


def test_certificate_of_another_ca_is_refused(tmp_path: Path) -> None:
    ca = make_ca(tmp_path / "ours")
    other = make_ca(tmp_path / "theirs", name="other-ca")
    server_pem = make_cert(ca, tmp_path / "ours", "node-1", ips=("127.0.0.1",))
    stranger = make_cert(other, tmp_path / "theirs", "mallory")
    server = TlsSettings(server_pem, ca.cert, client_auth="required")
    # the server refuses the stranger's client certificate
    with pytest.raises((ssl.SSLError, OSError)):
        _handshake(server, TlsSettings(stranger, ca.cert))
    # and a client trusting only the other CA refuses our server
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(server, TlsSettings(None, other.cert))


def test_server_address_must_be_in_the_certificate(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    pem = make_cert(ca, tmp_path, "node-1", ips=("127.0.0.2",), dns=())
    with pytest.raises(ssl.SSLCertVerificationError, match="IP address mismatch"):
        _handshake(TlsSettings(pem, ca.cert), TlsSettings(None, ca.cert), host="127.0.0.1")


def test_a_certificate_is_for_something(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    with pytest.raises(ValueError, match="client, a server or both"):
        make_cert(ca, tmp_path, "nobody", client=False, server=False)
