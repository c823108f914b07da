"""gRPC authentication end to end in one process: a real gRPC server with `GrpcAuthenticator`
on TLS (127.0.0.10, ephemeral ports) and clients made by `open_channel`. Each call answers the
Session it ran as, so the tests see the principal the server computed."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataplane.tools.certificates import CertFiles, make_ca, make_cert
from metadata_quorum.security.channels import (
    SESSION_TOKEN_KEY,
    ClientSecurity,
    SaslSession,
    open_channel,
)
from metadata_quorum.security.grpc_auth import GrpcAuthenticator, client_host
from metadata_quorum.security.principal import PrincipalMappingRules, current_session
from metadata_quorum.security.scram import ScramCredential, ScramMechanism, make_credential
from metadata_quorum.security.tls import TlsSettings
from protos import auth_pb2 as apb
from protos import auth_pb2_grpc as apb_grpc
from raftlog.errors import ErrorCode, KafkaError

HOST = "127.0.0.10"
CLIENT = "127.0.0.1"  # the source address of a loopback connection
WHO = "/test.Echo/Who"
WHO_STREAM = "/test.Echo/WhoStream"
SALT = b"0123456789abcdef"


def _who(request: bytes, context: grpc.ServicerContext) -> bytes:
    session = current_session()
    assert session is not None
    return f"{session.principal}|{session.client_host}|{session.listener}".encode()


def _who_stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
    for _ in range(3):
        yield _who(request, context)


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Pki:
    ca: CertFiles
    server: Path
    alice: Path
    stranger: Path
    directory: Path


@dataclass
class Server:
    address: str
    authenticator: GrpcAuthenticator
    clock: Clock
    credentials: dict[tuple[str, ScramMechanism], ScramCredential] = field(default_factory=dict)
    handshakes: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(directory)
    other = make_ca(directory / "other", name="other-ca")
    return Pki(
        ca,
        make_cert(ca, directory, "node-1", ips=(HOST,)),
        make_cert(ca, directory, "alice", server=False),
        make_cert(other, directory / "other", "mallory", server=False),
        directory,
    )


def _serve(
    pki: Pki, protocol: str, client_auth: str = "none", rules: str = "DEFAULT", reauth_ms: int = 0
) -> Iterator[Server]:
    clock = Clock()
    credentials: dict[tuple[str, ScramMechanism], ScramCredential] = {}
    for mechanism in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512):
        credentials["alice", mechanism] = make_credential(mechanism, "alice-secret", SALT, 4096)
    authenticator = GrpcAuthenticator(
        "BROKER",
        protocol,
        ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"],
        reauth_ms,
        PrincipalMappingRules(rules),
        lambda user, mechanism: credentials.get((user, mechanism)),
        clock=clock,
    )
    handshakes: list[str] = []
    servicer = authenticator.servicer()
    original = servicer.SaslHandshake

    def counted(request: apb.SaslHandshakeRequest, context: Any) -> Any:
        handshakes.append(request.mechanism)
        return original(request, context)

    servicer.SaslHandshake = counted  # type: ignore[method-assign]
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8), interceptors=[authenticator.interceptor()]
    )
    apb_grpc.add_AuthenticationServiceServicer_to_server(servicer, server)
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "test.Echo",
                {
                    "Who": grpc.unary_unary_rpc_method_handler(_who),
                    "WhoStream": grpc.unary_stream_rpc_method_handler(_who_stream),
                },
            ),
        )
    )
    tls = TlsSettings(pki.server, pki.ca.cert, client_auth=client_auth)  # type: ignore[arg-type]
    port = server.add_secure_port(f"{HOST}:0", tls.grpc_server_credentials())
    server.start()
    try:
        yield Server(f"{HOST}:{port}", authenticator, clock, credentials, handshakes)
    finally:
        server.stop(None)


@pytest.fixture
def sasl_ssl(pki: Pki) -> Iterator[Server]:
    yield from _serve(pki, "SASL_SSL", client_auth="requested")


@pytest.fixture
def ssl_required(pki: Pki) -> Iterator[Server]:
    yield from _serve(pki, "SSL", client_auth="required", rules="RULE:^CN=(.*)$/$1/L,DEFAULT")


def _who_am_i(channel: grpc.Channel) -> str:
    answer: bytes = channel.unary_unary(WHO)(b"", timeout=30)
    return answer.decode()


def _scram(pki: Pki, password: str = "alice-secret", **more: Any) -> ClientSecurity:
    fields: dict[str, Any] = {
        "security_protocol": "SASL_SSL",
        "ssl_ca_location": pki.ca.cert,
        "sasl_username": "alice",
        "sasl_password": password,
    }
    return ClientSecurity(**(fields | more))


def test_tls_without_client_certificate_is_anonymous(pki: Pki) -> None:
    for server in _serve(pki, "SSL"):
        security = ClientSecurity(security_protocol="SSL", ssl_ca_location=pki.ca.cert)
        with open_channel(server.address, security) as channel:
            assert _who_am_i(channel) == f"User:ANONYMOUS|{CLIENT}|BROKER"


def test_mutual_tls_principal_is_the_mapped_subject(pki: Pki, ssl_required: Server) -> None:
    security = ClientSecurity(
        security_protocol="SSL",
        ssl_ca_location=pki.ca.cert,
        ssl_certificate_location=pki.alice,
        ssl_key_location=pki.alice,
    )
    with open_channel(ssl_required.address, security) as channel:
        assert _who_am_i(channel).startswith("User:alice|")
        streamed = [m.decode() for m in channel.unary_stream(WHO_STREAM)(b"", timeout=30)]
        assert streamed == [f"User:alice|{CLIENT}|BROKER"] * 3


def test_separate_certificate_and_key_files(pki: Pki, ssl_required: Server) -> None:
    pem = pki.alice.read_text()
    key_end = pem.index("-----END PRIVATE KEY-----") + len("-----END PRIVATE KEY-----\n")
    (pki.directory / "alice.key").write_text(pem[:key_end])
    (pki.directory / "alice.crt").write_text(pem[key_end:])
    security = ClientSecurity.from_properties(
        {
            "security.protocol": "ssl",
            "ssl.ca.location": str(pki.ca.cert),
            "ssl.certificate.location": str(pki.directory / "alice.crt"),
            "ssl.key.location": str(pki.directory / "alice.key"),
        }
    )
    with open_channel(ssl_required.address, security) as channel:
        assert _who_am_i(channel).startswith("User:alice|")


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_sasl_token_principal(pki: Pki, sasl_ssl: Server, mechanism: str) -> None:
    with open_channel(sasl_ssl.address, _scram(pki, sasl_mechanism=mechanism)) as channel:
        assert _who_am_i(channel) == f"User:alice|{CLIENT}|BROKER"
        streamed = [m.decode() for m in channel.unary_stream(WHO_STREAM)(b"", timeout=30)]
        assert streamed == [f"User:alice|{CLIENT}|BROKER"] * 3
        assert _who_am_i(channel).startswith("User:alice|")
    assert sasl_ssl.handshakes == [mechanism]  # one exchange serves every call


def test_concurrent_first_calls_share_one_exchange(pki: Pki, sasl_ssl: Server) -> None:
    with open_channel(sasl_ssl.address, _scram(pki)) as channel:
        answers: list[str] = []
        threads = [
            threading.Thread(target=lambda: answers.append(_who_am_i(channel))) for _ in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert answers == [f"User:alice|{CLIENT}|BROKER"] * 8
    assert len(sasl_ssl.handshakes) == 1


@pytest.mark.parametrize(
    ("user", "password"), [("alice", "wrong"), ("bob", "alice-secret")], ids=["wrong", "unknown"]
)
@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
def test_bad_credentials_fail_and_are_audited(
    pki: Pki,
    sasl_ssl: Server,
    caplog: pytest.LogCaptureFixture,
    user: str,
    password: str,
    mechanism: str,
) -> None:
    security = _scram(pki, password=password, sasl_username=user, sasl_mechanism=mechanism)
    with (
        caplog.at_level(logging.WARNING, logger="raftlog.audit"),
        open_channel(sasl_ssl.address, security) as channel,
        pytest.raises(KafkaError) as failure,
    ):
        _who_am_i(channel)
    assert failure.value.error is ErrorCode.SASL_AUTHENTICATION_FAILED
    assert not failure.value.retriable
    audited = [r.getMessage() for r in caplog.records if r.name == "raftlog.audit"]
    assert any(f"user={user} host={CLIENT}" in line and "FAILED" in line for line in audited)


def test_no_credentials_on_sasl_listener_is_unauthenticated(
    pki: Pki, sasl_ssl: Server, caplog: pytest.LogCaptureFixture
) -> None:
    security = ClientSecurity(security_protocol="SSL", ssl_ca_location=pki.ca.cert)
    with (
        caplog.at_level(logging.WARNING, logger="raftlog.audit"),
        open_channel(sasl_ssl.address, security) as channel,
        pytest.raises(grpc.RpcError) as failure,
    ):
        _who_am_i(channel)
    assert failure.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "authenticate first" in (failure.value.details() or "")
    assert any("User:ANONYMOUS" in r.getMessage() for r in caplog.records)


def test_client_certificate_authenticates_on_sasl_listener(pki: Pki) -> None:
    """Nodes reach a SASL_SSL listener that requires certificates with their certificates; a
    SASL client there presents one too, and its token names it."""
    alice_cert: dict[str, Any] = {
        "ssl_certificate_location": pki.alice,
        "ssl_key_location": pki.alice,
    }
    for server in _serve(pki, "SASL_SSL", client_auth="required"):
        security = ClientSecurity(
            security_protocol="SSL", ssl_ca_location=pki.ca.cert, **alice_cert
        )
        with open_channel(server.address, security) as channel:
            assert _who_am_i(channel).startswith("User:CN=alice|")
        bob = _scram(pki, **alice_cert)
        with open_channel(server.address, bob) as channel:
            assert _who_am_i(channel).startswith("User:alice|")


def test_requested_client_auth_asks_grpc_clients_for_no_certificate(
    pki: Pki, sasl_ssl: Server
) -> None:
    """grpcio's server credentials either require a client certificate or ask for none."""
    security = ClientSecurity(
        security_protocol="SSL",
        ssl_ca_location=pki.ca.cert,
        ssl_certificate_location=pki.alice,
        ssl_key_location=pki.alice,
    )
    with (
        open_channel(sasl_ssl.address, security) as channel,
        pytest.raises(grpc.RpcError) as failure,
    ):
        _who_am_i(channel)
    assert failure.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_expired_token_is_refused_and_the_client_exchanges_again(
    pki: Pki, sasl_ssl: Server
) -> None:
    with open_channel(sasl_ssl.address, _scram(pki)) as channel:
        assert _who_am_i(channel).startswith("User:alice|")
        sasl_ssl.clock.now += 3601  # the server's hour passed; the client's clock did not
        assert _who_am_i(channel).startswith("User:alice|")
    assert len(sasl_ssl.handshakes) == 2
    # a stale token sent by hand is UNAUTHENTICATED
    secure = grpc.ssl_channel_credentials(root_certificates=pki.ca.cert.read_bytes())
    with (
        grpc.secure_channel(sasl_ssl.address, secure) as raw,
        pytest.raises(grpc.RpcError) as failure,
    ):
        raw.unary_unary(WHO)(b"", timeout=30, metadata=((SESSION_TOKEN_KEY, "stale"),))
    assert failure.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "expired or unknown" in (failure.value.details() or "")


def test_client_renews_before_the_lifetime_ends(pki: Pki) -> None:
    for server in _serve(pki, "SASL_SSL", reauth_ms=60_000):
        clock = Clock()
        secure = grpc.ssl_channel_credentials(root_certificates=pki.ca.cert.read_bytes())
        with grpc.secure_channel(server.address, secure) as channel:
            session = SaslSession(channel, _scram(pki), clock=clock)
            first = session.token()
            clock.now += 50  # before 90 % of 60 s
            assert session.token() == first
            clock.now += 5  # past it
            assert session.token() != first
        assert len(server.handshakes) == 2


def test_unsupported_mechanism_and_unknown_exchange(pki: Pki) -> None:
    for server in _serve(pki, "SASL_SSL"):
        authenticator = server.authenticator
        answer = authenticator.handshake("GSSAPI")
        assert answer.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM.code
        assert list(answer.mechanisms) == ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]
        request = apb.SaslAuthenticateRequest(
            mechanism="SCRAM-SHA-256", exchange_id="nope", auth_bytes=b"c=biws,r=x,p=eA=="
        )
        answer2 = authenticator.authenticate(request, "ipv4:127.0.0.1:1")
        assert answer2.error_code == ErrorCode.ILLEGAL_SASL_STATE.code
    for server in _serve(pki, "SSL"):  # no SASL on an SSL listener
        assert server.authenticator.handshake("SCRAM-SHA-256").error_code != 0


def test_plaintext_client_cannot_use_the_tls_port(pki: Pki, sasl_ssl: Server) -> None:
    with open_channel(sasl_ssl.address, None) as channel, pytest.raises(grpc.RpcError) as failure:
        _who_am_i(channel)
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE


def test_certificate_of_another_ca_is_refused(pki: Pki, ssl_required: Server) -> None:
    security = ClientSecurity(
        security_protocol="SSL",
        ssl_ca_location=pki.ca.cert,
        ssl_certificate_location=pki.stranger,
        ssl_key_location=pki.stranger,
    )
    with (
        open_channel(ssl_required.address, security) as channel,
        pytest.raises(grpc.RpcError) as failure,
    ):
        _who_am_i(channel)
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
    # and a client trusting another CA refuses our server
    other = ClientSecurity(security_protocol="SSL", ssl_ca_location=pki.stranger)
    with (
        open_channel(ssl_required.address, other) as channel,
        pytest.raises(grpc.RpcError) as failure,
    ):
        _who_am_i(channel)
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE


def test_client_host_drops_the_port() -> None:
    assert client_host("ipv4:127.0.0.1:5000") == "127.0.0.1"
    assert client_host("ipv6:[::1]:5000") == "::1"
    assert client_host("unix:/tmp/socket") == "unix:/tmp/socket"


# -- ClientSecurity -------------------------------------------------------------------------------
def test_from_properties_reads_librdkafka_and_java_names(tmp_path: Path) -> None:
    security = ClientSecurity.from_properties(
        {
            "bootstrap.servers": "127.0.0.1:9092",  # not security: ignored
            "security.protocol": "SASL_SSL",
            "ssl.truststore.location": str(tmp_path / "ca.crt"),
            "ssl.truststore.type": "PEM",
            "ssl.keystore.location": str(tmp_path / "me.pem"),
            "sasl.mechanism": "scram-sha-256",
            "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required"
            ' username="alice" password="a\\"b";',
        }
    )
    assert security.ssl_ca_location == tmp_path / "ca.crt"
    assert security.ssl_certificate_location == security.ssl_key_location == tmp_path / "me.pem"
    assert (security.sasl_mechanism, security.sasl_username) == ("SCRAM-SHA-256", "alice")
    assert security.sasl_password == 'a"b'
    plain = ClientSecurity.from_properties(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required "
            'username="bob" password="pw";',
        }
    )
    assert (plain.sasl_mechanism, plain.sasl_username, plain.sasl_password) == (
        "PLAIN",
        "bob",
        "pw",
    )
    assert ClientSecurity.from_properties({}).security_protocol == "PLAINTEXT"


@pytest.mark.parametrize(
    ("properties", "message"),
    [
        ({"security.protocol": "SSL"}, "needs ssl.ca.location"),
        (
            {"security.protocol": "SASL_SSL", "ssl.ca.location": "ca", "sasl.username": "a"},
            "needs sasl.username and sasl.password",
        ),
        ({"security.protocol": "TLS"}, "security.protocol"),
        ({"sasl.mechanism": "GSSAPI"}, "sasl.mechanism"),
        ({"ssl.cipher.suites": "x"}, "ssl.cipher.suites: not a supported"),
        ({"ssl.certificate.location": "c"}, "go together"),
        ({"sasl.jaas.config": "com.example.Login required;"}, "sasl.jaas.config"),
    ],
)
def test_from_properties_errors_name_the_key(properties: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ClientSecurity.from_properties(properties)


# -- hostile input ----------------------------------------------------------------------------
EXCHANGE_STEPS = st.lists(
    st.tuples(
        st.sampled_from(["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN", "RAFTLOG-NODE-CERT", "", "x"]),
        st.one_of(st.just(""), st.just("previous"), st.text(max_size=40)),  # the exchange id
        st.one_of(
            st.binary(max_size=300),
            st.binary(min_size=60_000, max_size=70_000),  # oversized
            st.sampled_from([b"n,,n=alice,r=abc", b"\0alice\0wrong", b"n,,n=alice", b"c=biws"]),
        ),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=EXCHANGE_STEPS)
def test_garbage_exchanges_get_no_token_and_leave_the_listener_serving(
    pki: Pki, sasl_ssl: Server, steps: list[tuple[str, str, bytes]]
) -> None:
    """Truncated, oversized and out-of-order SaslAuthenticate messages, unknown mechanisms and
    exchange ids: each is answered with an error (or the next step of a SCRAM exchange that
    cannot complete without the password), never a session token; the listener then
    authenticates a good client as before."""
    anonymous = ClientSecurity(security_protocol="SSL", ssl_ca_location=pki.ca.cert)
    with open_channel(sasl_ssl.address, anonymous) as channel:
        stub = apb_grpc.AuthenticationServiceStub(channel)
        previous = ""
        for mechanism, exchange_id, auth_bytes in steps:
            request = apb.SaslAuthenticateRequest(
                mechanism=mechanism,
                exchange_id=previous if exchange_id == "previous" else exchange_id,
                auth_bytes=auth_bytes,
            )
            answer = stub.SaslAuthenticate(request, timeout=30)
            assert not answer.session_token, (request, answer)
            previous = answer.exchange_id
        with pytest.raises(grpc.RpcError) as refused:
            _who_am_i(channel)  # still nobody
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with open_channel(sasl_ssl.address, _scram(pki)) as channel:
        assert _who_am_i(channel).startswith("User:alice|")
