"""TLS from PEM files, for both front doors: Python `ssl` contexts for the KAFKA listener and
its clients, gRPC credentials for BROKER and CONTROLLER and theirs, and the principal a verified
client certificate names (through ``ssl.principal.mapping.rules``).

A keystore is one PEM file holding a private key and its certificate chain (Kafka's
``ssl.keystore.type=PEM``); a truststore a PEM file of CA certificates. TLS 1.2 is the floor.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import grpc
from cryptography.hazmat.primitives import serialization

ClientAuth = Literal["none", "requested", "required"]


class TlsError(ValueError):
    """A keystore or truststore that cannot be read or used."""


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise TlsError(f"{what} {path}: {error.strerror}") from None


@dataclass(frozen=True)
class TlsSettings:
    """What a TLS endpoint needs: its own key and certificates (a server always, a client when
    it authenticates by certificate), the CAs it trusts, and (servers) whether clients must
    present a certificate."""

    keystore: Path | None
    truststore: Path | None
    key_password: str | None = None
    client_auth: ClientAuth = "none"

    def key_and_chain(self) -> tuple[bytes, bytes]:
        """(private key PEM, certificate chain PEM) from the keystore file."""
        if self.keystore is None:
            raise TlsError("no keystore: ssl.keystore.location is needed")
        pem = _read(self.keystore, "ssl.keystore.location")
        key = _blocks(pem, "PRIVATE KEY")
        chain = _blocks(pem, "CERTIFICATE")
        if not key or not chain:
            raise TlsError(
                f"ssl.keystore.location {self.keystore}: needs a private key and a certificate"
            )
        if self.key_password is not None:
            key = _decrypt_key(key, self.key_password)
        return key, chain

    def trusted(self) -> bytes:
        if self.truststore is None:
            raise TlsError("no truststore: ssl.truststore.location is needed")
        pem = _read(self.truststore, "ssl.truststore.location")
        if not _blocks(pem, "CERTIFICATE"):
            raise TlsError(f"ssl.truststore.location {self.truststore}: no certificate in it")
        return pem

    # -- Python ssl (the KAFKA listener and its clients) ----------------------------------------
    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._load_key(context)
        if self.client_auth != "none":
            context.load_verify_locations(cadata=self.trusted().decode())
            context.verify_mode = (
                ssl.CERT_REQUIRED if self.client_auth == "required" else ssl.CERT_OPTIONAL
            )
        return context

    def client_context(self, check_hostname: bool = True) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = check_hostname
        context.load_verify_locations(cadata=self.trusted().decode())
        if self.keystore is not None:
            self._load_key(context)
        return context

    def _load_key(self, context: ssl.SSLContext) -> None:
        if self.keystore is None:
            raise TlsError("no keystore: ssl.keystore.location is needed")
        try:
            context.load_cert_chain(self.keystore, password=self.key_password)
        except (ssl.SSLError, OSError) as error:
            raise TlsError(f"ssl.keystore.location {self.keystore}: {error}") from None

    # -- gRPC (BROKER, CONTROLLER) ---------------------------------------------------------------
    def grpc_server_credentials(self) -> grpc.ServerCredentials:
        key, chain = self.key_and_chain()
        if self.client_auth == "none":
            return grpc.ssl_server_credentials([(key, chain)])
        return grpc.ssl_server_credentials(
            [(key, chain)],
            root_certificates=self.trusted(),
            require_client_auth=self.client_auth == "required",
        )

    def grpc_channel_credentials(self) -> grpc.ChannelCredentials:
        if self.keystore is None:
            return grpc.ssl_channel_credentials(root_certificates=self.trusted())
        key, chain = self.key_and_chain()
        return grpc.ssl_channel_credentials(
            root_certificates=self.trusted(), private_key=key, certificate_chain=chain
        )


def _blocks(pem: bytes, kind: str) -> bytes:
    """The PEM blocks of one kind (``PRIVATE KEY`` also matches RSA/EC/ENCRYPTED keys)."""
    out: list[bytes] = []
    for block in pem.split(b"-----END ")[:-1]:
        begin = block.rfind(b"-----BEGIN ")
        if begin < 0:
            continue
        header = block[begin + len(b"-----BEGIN ") :].split(b"-----", 1)[0].decode()
        if header.endswith(kind):
            end = header + "-----\n"
            out.append(block[begin:] + b"-----END " + end.encode())
    return b"".join(out)


def _decrypt_key(key: bytes, password: str) -> bytes:
    """gRPC takes an unencrypted key: decrypt an encrypted PEM key with ssl.key.password."""
    try:
        loaded = serialization.load_pem_private_key(key, password=password.encode())
    except (ValueError, TypeError) as error:
        raise TlsError(f"ssl.key.password does not open the keystore's key: {error}") from None
    return loaded.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


# -- principals from certificates -----------------------------------------------------------------
def grpc_peer_subject(context: grpc.ServicerContext) -> str | None:
    """The verified client certificate's subject (RFC 2253) of a gRPC call, None without one.
    gRPC fills ``x509_subject`` only for a certificate that chained to the truststore, and asks
    for one only when client authentication is required: grpcio's server credentials cannot
    request a certificate without requiring it, so on a gRPC listener ``ssl.client.auth=requested``
    asks for none."""
    auth: dict[str, Any] = context.auth_context()
    subjects = auth.get("x509_subject") or []
    return subjects[0].decode() if subjects else None


def socket_peer_subject(connection: ssl.SSLSocket | ssl.SSLObject) -> str | None:
    """The verified peer certificate's subject of a TLS socket (or of the Raft transport's
    SSLObject), RFC 2253 with the most specific name first (``CN=alice,OU=eng,O=acme``, as
    Java's X500Principal.getName())."""
    certificate = connection.getpeercert()
    if not certificate:
        return None
    subject = certificate.get("subject", ())
    parts = [f"{_SHORT.get(k, k)}={_escape(v)}" for rdn in reversed(subject) for k, v in rdn]
    return ",".join(parts)


_SHORT = {
    "commonName": "CN",
    "organizationalUnitName": "OU",
    "organizationName": "O",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "countryName": "C",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}


def _escape(value: str) -> str:
    out = "".join("\\" + c if c in ',+"\\<>;=' else c for c in value)
    if out.startswith((" ", "#")):
        out = "\\" + out
    return out[:-1] + "\\ " if out.endswith(" ") else out
