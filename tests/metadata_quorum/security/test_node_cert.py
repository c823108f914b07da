"""RAFTLOG-NODE-CERT: the pure challenge/answer/verify functions, then the exchange end to end on
a real gRPC server over TLS (127.0.0.9, ephemeral ports) with clients made by `open_channel`."""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from dataplane.tools.certificates import CertFiles, make_ca, make_cert
from metadata_quorum.security import node_cert
from metadata_quorum.security.channels import ClientSecurity, SecurityProtocol, open_channel
from metadata_quorum.security.grpc_auth import GrpcAuthenticator
from metadata_quorum.security.node_cert import NODE_CERT_MECHANISM
from metadata_quorum.security.principal import PrincipalMappingRules, current_session
from metadata_quorum.security.tls import ClientAuth, TlsSettings
from protos import auth_pb2 as apb
from protos import auth_pb2_grpc as apb_grpc
from raftlog.errors import ErrorCode, KafkaError

HOST = "127.0.0.9"
WHO = "/test.Echo/Who"
RULES = "RULE:^CN=([^,]+).*$/$1/,DEFAULT"
CHALLENGE = node_cert.challenge("BROKER", "nonce-1")


@dataclass
class Pki:
    ca: CertFiles
    server: Path
    node: Path
    stranger: Path  # node-9, of another CA
    expired: Path
    directory: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(directory)
    other = make_ca(directory / "other", name="other-ca")
    return Pki(
        ca,
        make_cert(ca, directory, "broker-1", ips=(HOST,)),
        make_cert(ca, directory, "node-1", ips=(HOST,)),
        make_cert(other, directory / "other", "node-9", ips=(HOST,)),
        make_cert(ca, directory / "old", "node-2", ips=(HOST,), days=0),
        directory,
    )


def _split(keystore: Path) -> tuple[bytes, bytes]:
    return TlsSettings(keystore, None).key_and_chain()


def _authorities(pki: Pki) -> list[x509.Certificate]:
    return list(x509.load_pem_x509_certificates(pki.ca.cert.read_bytes()))


def _now() -> datetime.datetime:
    """A minute ahead: the days=0 certificate, valid until it was made, has expired then."""
    return datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=1)


# -- the pure functions -------------------------------------------------------------------------
def test_a_good_certificate_yields_its_subject(pki: Pki) -> None:
    key, chain = _split(pki.node)
    message = node_cert.answer(CHALLENGE, chain, key)
    assert node_cert.verify(message, CHALLENGE, _authorities(pki), _now()) == "CN=node-1"


@pytest.mark.parametrize(
    ("which", "challenge", "reason"),
    [
        ("stranger", CHALLENGE, "not trusted"),  # another CA
        ("expired", CHALLENGE, "not trusted"),  # days=0: expired a minute later
        ("node", node_cert.challenge("BROKER", "nonce-2"), "signature does not match"),
    ],
)
def test_refused(pki: Pki, which: str, challenge: bytes, reason: str) -> None:
    key, chain = _split(getattr(pki, which))
    message = node_cert.answer(challenge, chain, key)
    with pytest.raises(KafkaError) as caught:
        node_cert.verify(message, CHALLENGE, _authorities(pki), _now())
    assert caught.value.error is ErrorCode.SASL_AUTHENTICATION_FAILED
    assert reason in caught.value.message


def test_a_key_that_is_not_the_certificates_is_refused(pki: Pki) -> None:
    _, chain = _split(pki.node)
    other_key, _ = _split(pki.server)
    message = node_cert.answer(CHALLENGE, chain, other_key)
    with pytest.raises(KafkaError, match="signature does not match"):
        node_cert.verify(message, CHALLENGE, _authorities(pki), _now())


def test_malformed_messages_and_foreign_challenges(pki: Pki) -> None:
    for message in (b"", b"{}", b'{"chain": "x", "signature": "!!"}', b"x" * 70_000):
        with pytest.raises(KafkaError) as caught:
            node_cert.verify(message, CHALLENGE, _authorities(pki), _now())
        assert caught.value.error is ErrorCode.SASL_AUTHENTICATION_FAILED
    key, chain = _split(pki.node)
    with pytest.raises(KafkaError, match="not a RAFTLOG-NODE-CERT challenge"):
        node_cert.answer(b"sign this contract", chain, key)
    good = json.loads(node_cert.answer(CHALLENGE, chain, key))
    assert set(good) == {"chain", "signature"}


# -- end to end ---------------------------------------------------------------------------------
def _who(request: bytes, context: grpc.ServicerContext) -> bytes:
    session = current_session()
    assert session is not None
    return f"{session.principal}|{session.listener}".encode()


@dataclass
class Server:
    address: str
    authenticator: GrpcAuthenticator


def _serve(pki: Pki, protocol: str, client_auth: ClientAuth) -> Iterator[Server]:
    authenticator = GrpcAuthenticator(
        "BROKER", protocol, ["SCRAM-SHA-512"], 0, PrincipalMappingRules(RULES),
        lambda user, mechanism: None, certificate_authorities=pki.ca.cert.read_bytes(),
        wall_clock=_now,
    )  # fmt: skip
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4), interceptors=[authenticator.interceptor()]
    )
    apb_grpc.add_AuthenticationServiceServicer_to_server(authenticator.servicer(), server)
    handler = grpc.method_handlers_generic_handler(
        "test.Echo", {"Who": grpc.unary_unary_rpc_method_handler(_who)}
    )
    server.add_generic_rpc_handlers((handler,))
    tls = TlsSettings(pki.server, pki.ca.cert, client_auth=client_auth)
    port = server.add_secure_port(f"{HOST}:0", tls.grpc_server_credentials())
    server.start()
    try:
        yield Server(f"{HOST}:{port}", authenticator)
    finally:
        server.stop(None)


@pytest.fixture
def sasl_ssl(pki: Pki) -> Iterator[Server]:
    yield from _serve(pki, "SASL_SSL", "none")


def _node(pki: Pki, keystore: Path, protocol: SecurityProtocol = "SASL_SSL") -> ClientSecurity:
    return ClientSecurity(
        security_protocol=protocol,
        ssl_ca_location=pki.ca.cert,
        ssl_certificate_location=keystore,
        ssl_key_location=keystore,
        sasl_mechanism=NODE_CERT_MECHANISM,
    )


def test_a_node_authenticates_by_certificate_on_sasl_ssl(pki: Pki, sasl_ssl: Server) -> None:
    assert NODE_CERT_MECHANISM in sasl_ssl.authenticator.mechanisms
    with open_channel(sasl_ssl.address, _node(pki, pki.node)) as channel:
        assert channel.unary_unary(WHO)(b"", timeout=30) == b"User:node-1|BROKER"
    anonymous = ClientSecurity(security_protocol="SSL", ssl_ca_location=pki.ca.cert)
    with open_channel(sasl_ssl.address, anonymous) as channel, pytest.raises(grpc.RpcError) as e:
        channel.unary_unary(WHO)(b"", timeout=30)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_on_ssl_with_requested_client_auth_too(pki: Pki) -> None:
    """grpcio cannot request an optional certificate: `requested` lets nodes prove theirs in
    the exchange, and leaves everyone else ANONYMOUS."""
    for server in _serve(pki, "SSL", "requested"):
        with open_channel(server.address, _node(pki, pki.node, "SSL")) as channel:
            assert channel.unary_unary(WHO)(b"", timeout=30) == b"User:node-1|BROKER"
        anonymous = ClientSecurity(security_protocol="SSL", ssl_ca_location=pki.ca.cert)
        with open_channel(server.address, anonymous) as channel:
            assert channel.unary_unary(WHO)(b"", timeout=30) == b"User:ANONYMOUS|BROKER"


@pytest.mark.parametrize("which", ["stranger", "expired"])
def test_untrusted_certificates_are_refused_and_audited(
    pki: Pki, sasl_ssl: Server, which: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "raftlog.audit")
    security = _node(pki, getattr(pki, which))
    with open_channel(sasl_ssl.address, security) as channel, pytest.raises(KafkaError) as caught:
        channel.unary_unary(WHO)(b"", timeout=30)
    assert caught.value.error is ErrorCode.SASL_AUTHENTICATION_FAILED
    assert "not trusted" in caught.value.message
    assert any(
        "AUTHENTICATION FAILED" in r.getMessage() and NODE_CERT_MECHANISM in r.getMessage()
        for r in caplog.records
    )


def test_a_replayed_answer_is_refused(
    pki: Pki, sasl_ssl: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "raftlog.audit")
    key, chain = _split(pki.node)
    credentials = grpc.ssl_channel_credentials(root_certificates=pki.ca.cert.read_bytes())
    with grpc.secure_channel(sasl_ssl.address, credentials) as channel:
        stub = apb_grpc.AuthenticationServiceStub(channel)

        def send(exchange_id: str, auth_bytes: bytes) -> apb.SaslAuthenticateResponse:
            request = apb.SaslAuthenticateRequest(
                mechanism=NODE_CERT_MECHANISM, exchange_id=exchange_id, auth_bytes=auth_bytes
            )
            answer: apb.SaslAuthenticateResponse = stub.SaslAuthenticate(request, timeout=30)
            return answer

        first = send("", b"")
        assert first.auth_bytes.startswith(node_cert.CHALLENGE_PREFIX + b"listener=BROKER ")
        message = node_cert.answer(first.auth_bytes, chain, key)
        assert send(first.exchange_id, message).session_token
        replayed = send(first.exchange_id, message)
        assert replayed.error_code == ErrorCode.ILLEGAL_SASL_STATE.code
        assert not replayed.session_token
        # a fresh challenge differs, so the old answer's signature does not fit it
        second = send("", b"")
        assert second.auth_bytes != first.auth_bytes
        refused = send(second.exchange_id, message)
        assert refused.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED.code
    assert sum("AUTHENTICATION FAILED" in r.getMessage() for r in caplog.records) == 2


def test_the_client_needs_a_certificate_and_tls(pki: Pki) -> None:
    with pytest.raises(ValueError, match=r"ssl\.certificate\.location"):
        ClientSecurity(
            security_protocol="SASL_SSL", ssl_ca_location=pki.ca.cert,
            sasl_mechanism=NODE_CERT_MECHANISM,
        )  # fmt: skip
