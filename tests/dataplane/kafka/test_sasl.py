"""The KAFKA listener's per-connection authentication (dataplane/kafka/sasl.py) as a pure state
machine: fed parsed requests and a time, it answers serve / answer / close. Table-driven cases
follow Kafka's SaslServerAuthenticator; hypothesis feeds it garbage, truncated, oversized and
out-of-order SASL input and checks it never authenticates without the password, never raises,
and stays closed once closed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.kafka import codec as kc
from dataplane.kafka.sasl import (
    SERVE,
    Answer,
    Close,
    ConnectionAuthenticator,
    KafkaListenerSecurity,
    RawToken,
    SaslState,
    Step,
)
from metadata_quorum.security.principal import ANONYMOUS, KafkaPrincipal
from metadata_quorum.security.scram import (
    ScramClient,
    ScramCredential,
    ScramMechanism,
    make_credential,
    plain_message,
)
from metadata_quorum.security.tls import TlsSettings
from raftlog.errors import ErrorCode, KafkaError

SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512
ALL = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
STORE: dict[tuple[str, ScramMechanism], ScramCredential] = {
    ("alice", SHA256): make_credential(SHA256, "alice-secret", b"salt-a-256", 4096),
    ("alice", SHA512): make_credential(SHA512, "alice-secret", b"salt-a-512", 4096),
    ("bob", SHA512): make_credential(SHA512, "bob-secret", b"salt-b-512", 4096),
}


def lookup(user: str, mechanism: ScramMechanism) -> ScramCredential | None:
    return STORE.get((user, mechanism))


def authenticator(
    mechanisms: tuple[str, ...] = ALL, reauth_ms: int = 0, protocol: str = "SASL_PLAINTEXT"
) -> ConnectionAuthenticator:
    security = KafkaListenerSecurity(protocol, None, mechanisms, reauth_ms)
    return ConnectionAuthenticator(security, lookup, "127.0.0.1", nonce=lambda: "servernonce")


def request(api_key: int, version: int, **data: Any) -> kc.Request:
    body = kc.to_entity(kc.request_schema(api_key, version), data)
    return kc.Request(api_key, version, 7, "test", body, "/127.0.0.1")


def versions() -> kc.Request:
    return request(kc.API_VERSIONS, 3, client_software_name="t", client_software_version="1")


def handshake(mechanism: str) -> kc.Request:
    return request(kc.API_SASL_HANDSHAKE, 1, mechanism=mechanism)


def authenticate(token: bytes, version: int = 2) -> kc.Request:
    return request(kc.API_SASL_AUTHENTICATE, version, auth_bytes=token)


def metadata() -> kc.Request:
    return request(
        kc.API_METADATA, 12, topics=None, allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )  # fmt: skip


def answer(step: Step) -> Answer:
    assert isinstance(step, Answer), step
    return step


def scram_login(
    auth: ConnectionAuthenticator, mechanism: ScramMechanism, user: str, password: str, now: int = 0
) -> Answer:
    """A whole SCRAM exchange; the last answer (the server-final or the failure)."""
    answer(auth.receive(handshake(mechanism.mechanism_name), now))
    client = ScramClient(mechanism, user, password, "clientnonce")
    first = answer(auth.receive(authenticate(client.first()), now))
    if first.close:
        return first
    assert first.data["error_code"] == 0
    final = answer(auth.receive(authenticate(client.final(first.data["auth_bytes"])), now))
    if final.data["error_code"] == 0:
        client.verify(final.data["auth_bytes"])  # the server proved it knows the credential
    return final


@pytest.mark.parametrize("mechanism", [SHA256, SHA512])
def test_scram_login_authenticates_the_user(mechanism: ScramMechanism) -> None:
    auth = authenticator()
    assert auth.receive(versions(), 0) is SERVE
    final = scram_login(auth, mechanism, "alice", "alice-secret")
    assert final.data["error_code"] == 0 and not final.close
    assert final.data["session_lifetime"] == 0
    assert auth.authenticated and auth.principal == KafkaPrincipal.user("alice")
    assert auth.session.principal == KafkaPrincipal.user("alice")
    assert auth.session.listener == "KAFKA" and auth.session.client_host == "127.0.0.1"
    assert auth.receive(metadata(), 1) is SERVE


def test_handshake_without_api_versions_first_is_allowed() -> None:
    auth = authenticator()
    assert scram_login(auth, SHA512, "bob", "bob-secret").data["error_code"] == 0


@pytest.mark.parametrize(
    "user, password", [("alice", "wrong"), ("nobody", "alice-secret"), ("bob", "alice-secret")]
)
def test_scram_failures_answer_authentication_failed_then_close(user: str, password: str) -> None:
    auth = authenticator()
    final = scram_login(auth, SHA256, user, password)
    assert final.data["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED.code
    assert final.close and auth.state is SaslState.CLOSED
    assert final.failure is not None and final.failure.user == user
    assert final.failure.mechanism == "SCRAM-SHA-256"
    # an unknown user reads exactly as a wrong password: names cannot be probed
    assert "bad credentials" in final.data["error_message"]
    assert isinstance(auth.receive(metadata(), 0), Close)


def test_plain_checks_the_stored_scram_credential() -> None:
    auth = authenticator()
    answer(auth.receive(handshake("PLAIN"), 0))
    done = answer(auth.receive(authenticate(plain_message("bob", "bob-secret")), 0))
    assert done.data["error_code"] == 0 and auth.principal == KafkaPrincipal.user("bob")


@pytest.mark.parametrize(
    "token", [plain_message("bob", "wrong"), plain_message("nobody", "x"), b"no-nul-bytes"]
)
def test_plain_failures_close(token: bytes) -> None:
    auth = authenticator()
    answer(auth.receive(handshake("PLAIN"), 0))
    failed = answer(auth.receive(authenticate(token, version=0), 0))
    assert failed.data["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED.code
    assert failed.close and failed.failure is not None and failed.failure.mechanism == "PLAIN"


@pytest.mark.parametrize("mechanism", ["GSSAPI", "PLAIN", "scram-sha-1", ""])
def test_an_unsupported_mechanism_is_answered_with_the_enabled_list(mechanism: str) -> None:
    auth = authenticator(mechanisms=("SCRAM-SHA-512",))
    refused = answer(auth.receive(handshake(mechanism), 0))
    assert refused.data == {
        "error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM.code,
        "mechanisms": ["SCRAM-SHA-512"],
    }
    assert refused.close and auth.state is SaslState.CLOSED


@pytest.mark.parametrize(
    "sequence",
    [
        [metadata()],  # a request before authentication
        [versions(), versions()],  # ApiVersions only once, first
        [versions(), authenticate(b"n,,n=alice,r=x")],  # SaslAuthenticate before SaslHandshake
        [handshake("SCRAM-SHA-256"), metadata()],  # mid-exchange
        [handshake("SCRAM-SHA-256"), handshake("SCRAM-SHA-256")],
    ],
)
def test_anything_but_the_handshake_before_authentication_closes(
    sequence: list[kc.Request],
) -> None:
    auth = authenticator()
    steps = [auth.receive(r, 0) for r in sequence]
    assert isinstance(steps[-1], Close) and "during SASL handshake" in steps[-1].reason
    assert auth.state is SaslState.CLOSED


def test_sasl_requests_after_authentication_are_illegal_state_without_closing() -> None:
    auth = authenticator()
    scram_login(auth, SHA512, "alice", "alice-secret")
    again = answer(auth.receive(handshake("SCRAM-SHA-512"), 1))
    assert again.data["error_code"] == ErrorCode.ILLEGAL_SASL_STATE.code and not again.close
    more = answer(auth.receive(authenticate(b"x"), 1))
    assert more.data["error_code"] == ErrorCode.ILLEGAL_SASL_STATE.code and not more.close
    assert auth.receive(metadata(), 2) is SERVE


@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SSL"])
def test_without_sasl_the_connection_is_authenticated_from_the_start(protocol: str) -> None:
    principal = KafkaPrincipal.user("CN=client-1")
    security = KafkaListenerSecurity(protocol, None if protocol == "PLAINTEXT" else _tls())
    auth = ConnectionAuthenticator(security, lookup, "10.0.0.1", principal)
    assert auth.receive(metadata(), 0) is SERVE and auth.session.principal == principal
    refused = answer(auth.receive(handshake("PLAIN"), 0))
    assert refused.data["error_code"] == ErrorCode.ILLEGAL_SASL_STATE.code
    assert ConnectionAuthenticator(security, lookup, "h").principal == ANONYMOUS


def _tls() -> TlsSettings:
    return TlsSettings(Path("unused.pem"), Path("unused-ca.pem"))


# -- KIP-368: re-authentication ---------------------------------------------------------------
def test_session_lifetime_is_connections_max_reauth_ms_and_expiry_closes() -> None:
    auth = authenticator(reauth_ms=1000)
    final = scram_login(auth, SHA256, "alice", "alice-secret", now=100)
    assert final.data["session_lifetime"] == 1000 and auth.session_expiry_ms == 1100
    assert auth.receive(metadata(), 1100) is SERVE
    closed = auth.receive(metadata(), 1101)
    assert isinstance(closed, Close) and "expired" in closed.reason


def test_reauthentication_renews_the_session() -> None:
    auth = authenticator(reauth_ms=1000)
    scram_login(auth, SHA512, "alice", "alice-secret", now=0)
    # librdkafka re-authenticates at 85-95% of the lifetime; any time after the lifetime
    # has passed too, as long as SaslHandshake is the next request
    final = scram_login(auth, SHA512, "alice", "alice-secret", now=1500)
    assert final.data["error_code"] == 0 and auth.session_expiry_ms == 2500
    assert auth.receive(metadata(), 2400) is SERVE


def test_reauthentication_as_someone_else_fails() -> None:
    auth = authenticator(reauth_ms=1000)
    scram_login(auth, SHA512, "alice", "alice-secret", now=0)
    final = scram_login(auth, SHA512, "bob", "bob-secret", now=900)
    assert final.data["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED.code and final.close
    assert "cannot change principals" in final.data["error_message"]


def test_reauthentication_cannot_change_mechanism() -> None:
    auth = authenticator(reauth_ms=1000)
    scram_login(auth, SHA512, "alice", "alice-secret", now=0)
    refused = answer(auth.receive(handshake("SCRAM-SHA-256"), 900))
    assert refused.data["error_code"] == ErrorCode.UNSUPPORTED_SASL_MECHANISM.code
    assert refused.close


def test_reauthentication_only_once_a_second() -> None:
    auth = authenticator(reauth_ms=60_000)
    scram_login(auth, SHA512, "alice", "alice-secret", now=0)
    scram_login(auth, SHA512, "alice", "alice-secret", now=5000)
    too_soon = answer(auth.receive(handshake("SCRAM-SHA-512"), 5500))
    assert too_soon.data["error_code"] == ErrorCode.ILLEGAL_SASL_STATE.code


def test_a_v0_client_still_expires() -> None:
    auth = authenticator(reauth_ms=500)
    answer(auth.receive(handshake("PLAIN"), 0))
    done = answer(auth.receive(authenticate(plain_message("bob", "bob-secret"), version=0), 0))
    assert done.data["error_code"] == 0
    assert isinstance(auth.receive(metadata(), 501), Close)


def test_illegal_transitions_are_refused() -> None:
    auth = authenticator()
    with pytest.raises(AssertionError, match="cannot move"):
        auth._transition_to(SaslState.AUTHENTICATED)


# -- hypothesis: any order, any bytes -------------------------------------------------------------
VALID = "valid"  # the next token of a correct exchange for alice
actions = st.one_of(
    st.just(("versions", None)),
    st.just(("metadata", None)),
    st.tuples(st.just("handshake"), st.sampled_from([*ALL, "GSSAPI", "", "SCRAM-SHA-1"])),
    st.tuples(st.just("handshake"), st.text(max_size=30)),
    st.tuples(st.just("auth"), st.just(VALID)),
    st.tuples(st.just("auth"), st.binary(max_size=200)),
    st.tuples(st.just("auth"), st.binary(min_size=70_000, max_size=70_000)),  # oversized
    st.tuples(st.just("auth"), st.integers(min_value=0, max_value=60)),  # a valid one, truncated
    st.tuples(st.just("auth"), st.sampled_from([plain_message("alice", "x"), b"\0\0", b"n,,"])),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(actions, max_size=12), st.booleans())
def test_no_input_authenticates_without_the_password_or_breaks_the_rules(
    sequence: list[tuple[str, Any]], right_password: bool
) -> None:
    auth = authenticator(reauth_ms=10_000)
    password = "alice-secret" if right_password else "not-it"
    client: ScramClient | None = None
    server_first = b""
    closed = False
    for now, (kind, arg) in enumerate(sequence):
        was_authenticated = auth.authenticated
        if kind == "versions":
            req = versions()
        elif kind == "metadata":
            req = metadata()
        elif kind == "handshake":
            req = handshake(arg)
            client = (
                ScramClient(SHA512, "alice", password, "cn") if arg == "SCRAM-SHA-512" else None
            )
            server_first = b""
        else:
            req = authenticate(_token(arg, client, server_first, password))
        step = auth.receive(req, now)
        if closed:
            assert isinstance(step, Close), "a closed connection stays closed"
            continue
        if isinstance(step, Close) or (isinstance(step, Answer) and step.close):
            closed = True
            assert auth.state is SaslState.CLOSED
        if step is SERVE and kind != "versions":
            assert was_authenticated, "nothing but ApiVersions is served before authentication"
        if isinstance(step, Answer) and kind == "auth" and step.data["error_code"] == 0:
            server_first = bytes(step.data["auth_bytes"])
        if auth.authenticated:
            assert right_password and auth.principal == KafkaPrincipal.user("alice")


def _token(arg: Any, client: ScramClient | None, server_first: bytes, password: str) -> bytes:
    if isinstance(arg, bytes):
        return arg
    if client is None:
        return plain_message("alice", password) if arg == VALID else b""
    whole = client.first() if not server_first else _final(client, server_first)
    return whole if arg == VALID else whole[: int(arg)]


def _final(client: ScramClient, server_first: bytes) -> bytes:
    try:
        return client.final(server_first)
    except KafkaError:  # a server-final fed back in as server-first: send garbage instead
        return b"c=biws,r=x,p=AAAA"


# -- SaslHandshake v0: bare tokens --------------------------------------------------------------
def test_a_v0_handshake_takes_bare_tokens() -> None:
    auth = authenticator()
    done = answer(auth.receive(request(kc.API_SASL_HANDSHAKE, 0, mechanism="SCRAM-SHA-256"), 0))
    assert done.data["error_code"] == 0 and auth.expects_raw_token
    client = ScramClient(SHA256, "alice", "alice-secret", "clientnonce")
    first = auth.receive_token(client.first(), 0)
    assert isinstance(first, RawToken)
    final = auth.receive_token(client.final(first.token), 0)
    assert isinstance(final, RawToken)
    client.verify(final.token)
    assert auth.authenticated and not auth.expects_raw_token
    assert auth.receive(metadata(), 1) is SERVE


def test_a_failed_v0_exchange_closes_without_an_answer() -> None:
    auth = authenticator()
    answer(auth.receive(request(kc.API_SASL_HANDSHAKE, 0, mechanism="PLAIN"), 0))
    closed = auth.receive_token(plain_message("alice", "wrong"), 0)
    assert isinstance(closed, Close) and closed.failure is not None
    assert closed.failure.user == "alice" and auth.state is SaslState.CLOSED
