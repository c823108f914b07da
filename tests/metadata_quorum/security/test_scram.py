"""SCRAM and PLAIN exchanges (pure): RFC 7677's test vector, both mechanisms end to end, and
every way a client can get it wrong failing with SASL_AUTHENTICATION_FAILED."""

from __future__ import annotations

import base64
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metadata_quorum.security.scram import (
    ScramClient,
    ScramCredential,
    ScramMechanism,
    ScramServer,
    credential_from_salted_password,
    make_credential,
    parse_plain,
    password_matches,
    plain_message,
    salted_password,
)
from raftlog.errors import ErrorCode, KafkaError

SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512

# RFC 7677 section 3
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def _lookup(users: dict[str, ScramCredential]) -> Callable[[str], ScramCredential | None]:
    return users.get


def test_client_matches_rfc_7677() -> None:
    client = ScramClient(SHA256, "user", "pencil", RFC_CLIENT_NONCE)
    assert client.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    assert client.final(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    client.verify(RFC_SERVER_FINAL)


def test_server_matches_rfc_7677() -> None:
    credential = make_credential(SHA256, "pencil", RFC_SALT, 4096)
    server = ScramServer(SHA256, _lookup({"user": credential}), RFC_SERVER_NONCE)
    assert server.first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO") == RFC_SERVER_FIRST
    assert server.final(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert server.complete and server.username == "user"


def _exchange(server: ScramServer, client: ScramClient) -> None:
    client.verify(server.final(client.final(server.first(client.first()))))


@pytest.mark.parametrize("mechanism", [SHA256, SHA512])
@pytest.mark.parametrize("user", ["alice", "a,b=c", "ünï"])
def test_both_mechanisms_round_trip(mechanism: ScramMechanism, user: str) -> None:
    credential = make_credential(mechanism, "s3cret", b"salt-of-16-bytes", 4096)
    server = ScramServer(mechanism, _lookup({user: credential}), "server-nonce")
    _exchange(server, ScramClient(mechanism, user, "s3cret", "client-nonce"))
    assert server.complete and server.username == user


def test_salted_password_is_what_the_admin_sends() -> None:
    salted = salted_password(SHA512, "pw", b"0123456789abcdef", 8192)
    assert credential_from_salted_password(SHA512, b"0123456789abcdef", salted, 8192) == (
        make_credential(SHA512, "pw", b"0123456789abcdef", 8192)
    )


@pytest.mark.parametrize(
    ("user", "password", "mechanism"),
    [
        ("alice", "wrong", SHA256),  # wrong password
        ("mallory", "s3cret", SHA256),  # unknown user: fails the same way, at the proof
        ("alice", "s3cret", SHA512),  # a credential for the other mechanism only
    ],
)
def test_bad_credentials_fail_at_the_proof(
    user: str, password: str, mechanism: ScramMechanism
) -> None:
    credential = make_credential(SHA256, "s3cret", b"salt-of-16-bytes", 4096)
    server = ScramServer(mechanism, _lookup({"alice": credential}), "server-nonce")
    client = ScramClient(mechanism, user, password, "client-nonce")
    server_first = server.first(client.first())  # no early answer that tells users apart
    with pytest.raises(KafkaError) as failure:
        server.final(client.final(server_first))
    assert failure.value.error == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert not server.complete


def test_out_of_order_messages_are_illegal_state() -> None:
    server = ScramServer(SHA256, _lookup({}), "n")
    with pytest.raises(KafkaError) as failure:
        server.final(b"c=biws,r=x,p=AAAA")
    assert failure.value.error == ErrorCode.ILLEGAL_SASL_STATE


def test_server_signature_proves_the_server() -> None:
    """A server that does not know the credential cannot forge server-final."""
    credential = make_credential(SHA256, "pw", b"salt-of-16-bytes", 4096)
    server = ScramServer(SHA256, _lookup({"u": credential}), "sn")
    client = ScramClient(SHA256, "u", "pw", "cn")
    server.final(client.final(server.first(client.first())))
    with pytest.raises(KafkaError):
        client.verify(b"v=" + base64.b64encode(b"\0" * 32))


@given(st.binary(max_size=300))
def test_garbage_client_first_never_authenticates(message: bytes) -> None:
    server = ScramServer(SHA512, _lookup({}), "n")
    try:
        server.first(message)
    except KafkaError as error:
        assert error.error == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert not server.complete


@given(st.binary(max_size=300))
def test_garbage_client_final_never_authenticates(message: bytes) -> None:
    credential = make_credential(SHA512, "pw", b"salt-of-16-bytes", 4096)
    server = ScramServer(SHA512, _lookup({"u": credential}), "sn")
    server.first(ScramClient(SHA512, "u", "pw", "cn").first())
    with pytest.raises(KafkaError):
        server.final(message)
    assert not server.complete


def test_plain() -> None:
    assert parse_plain(plain_message("alice", "pw")) == ("alice", "pw")
    assert parse_plain(b"alice\0alice\0pw") == ("alice", "pw")
    for bad in (b"", b"alice\0pw", b"\0\0pw", b"bob\0alice\0pw", b"\0a\0b\0c", b"\0\xff\0pw"):
        with pytest.raises(KafkaError):
            parse_plain(bad)
    credential = make_credential(SHA256, "pw", b"salt-of-16-bytes", 4096)
    assert password_matches(credential, "pw") and not password_matches(credential, "pW")
