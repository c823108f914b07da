"""Test and demo certificates: a private CA and the PEM keystores Kafka's ``ssl.keystore.type=PEM``
reads (one file: private key, certificate, CA chain), written with the ``cryptography`` package.

Keys are EC P-256: fast to make (a test cluster makes several) and accepted by gRPC, Python's
``ssl`` and librdkafka. A node's certificate names its loopback address as an IP SAN, because
both gRPC and Python's ``ssl`` check the address dialled against the certificate and nobody
turns that check off here (see docs/security.md). For production use your own PKI.

    ca = make_ca(directory)                       # raftlog-ca.crt (the truststore), raftlog-ca.key
    keystore = make_cert(ca, directory, "node-1", ips=("127.0.0.6",))  # node-1.pem
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
CERT_DAYS = 825  # the longest validity browsers and most PKIs still accept


@dataclass(frozen=True)
class CertFiles:
    """A CA's certificate (PEM; it is the truststore clients and servers load) and its private
    key (PEM, unencrypted: keep it out of a real deployment). ``bundle`` is the file of CA
    certificates to trust: the certificate itself for a root CA."""

    cert: Path
    key: Path
    bundle: Path = field(default=Path())

    def __post_init__(self) -> None:
        if self.bundle == Path():
            object.__setattr__(self, "bundle", self.cert)

    @property
    def truststore(self) -> Path:
        return self.bundle


def _private_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey, password: str | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode())
        if password
        else serialization.NoEncryption()
    )
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )


def _write(path: Path, data: bytes) -> Path:
    """Write a file only its owner can read (it may hold a private key)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(data)
    return path


def make_ca(directory: Path | str, name: str = "raftlog-ca", days: int = CA_DAYS) -> CertFiles:
    """A self-signed CA: ``<name>.crt`` and ``<name>.key`` in `directory`."""
    directory = Path(directory)
    key = _private_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path = _write(
        directory / f"{name}.crt", certificate.public_bytes(serialization.Encoding.PEM)
    )
    key_path = _write(directory / f"{name}.key", _key_pem(key))
    return CertFiles(cert_path, key_path)


def _subject_alt_names(ips: Iterable[str], dns: Iterable[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    return x509.SubjectAlternativeName(names)


def make_cert(
    ca: CertFiles,
    directory: Path | str,
    common_name: str,
    *,
    ips: Iterable[str] = (),
    dns: Iterable[str] = ("localhost",),
    client: bool = True,
    server: bool = True,
    days: int = CERT_DAYS,
    key_password: str | None = None,
) -> Path:
    """A certificate for ``CN=<common_name>`` signed by `ca`, written with its private key and the
    CA's certificate as ``<common_name>.pem`` (Kafka's PEM keystore). `ips` and `dns` become the
    subject alternative names a server is checked against; `client`/`server` choose the extended
    key usages. With `key_password` the key is encrypted (``ssl.key.password`` opens it)."""
    if not client and not server:
        raise ValueError("a certificate is for a client, a server or both")
    directory = Path(directory)
    ca_certificate = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca.key}: not an EC key made by make_ca")
    key = _private_key()
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    usages += [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
    now = datetime.datetime.now(datetime.UTC)
    builder = x509.CertificateBuilder()
    names = _subject_alt_names(ips, dns)
    if len(names):
        builder = builder.add_extension(names, critical=False)
    certificate = (
        builder.subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = (
        _key_pem(key, key_password)
        + certificate.public_bytes(serialization.Encoding.PEM)
        + ca_certificate.public_bytes(serialization.Encoding.PEM)
    )
    return _write(directory / f"{common_name}.pem", pem)
