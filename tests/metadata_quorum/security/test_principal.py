"""Principals, sessions, and ssl.principal.mapping.rules (Kafka's examples)."""

from __future__ import annotations

import threading

import pytest

from metadata_quorum.security.principal import (
    ANONYMOUS,
    KafkaPrincipal,
    PrincipalMappingRules,
    Session,
    acting_as,
    current_session,
)


def test_parse_and_print() -> None:
    assert KafkaPrincipal.parse("User:alice") == KafkaPrincipal("User", "alice")
    assert str(KafkaPrincipal.parse("User:CN=a,O=b")) == "User:CN=a,O=b"
    assert str(ANONYMOUS) == "User:ANONYMOUS"
    for bad in ("alice", ":alice", "User:"):
        with pytest.raises(ValueError, match="type:name"):
            KafkaPrincipal.parse(bad)


@pytest.mark.parametrize(
    ("rules", "subject", "name"),
    [
        ("DEFAULT", "CN=alice,OU=eng,O=acme", "CN=alice,OU=eng,O=acme"),
        (r"RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,DEFAULT", "CN=svc,OU=ServiceUsers,O=x", "svc"),
        (r"RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,DEFAULT", "CN=bob,O=x", "CN=bob,O=x"),
        (r"RULE:^CN=(.*?),OU=(.*?)$/$1@$2/L", "CN=Alice,OU=ENG", "alice@eng"),
        (r"RULE:^CN=(.*?),OU=(.*?)$/$1@$2/U", "CN=Alice,OU=eng", "ALICE@ENG"),
        (r"RULE:^CN=([^,]+).*$/$1/, DEFAULT", "CN=node-1,O=raftlog", "node-1"),
        (r"RULE:^CN=(.*)$/a\/$1/", "CN=x", "a/x"),
    ],
)
def test_mapping_rules(rules: str, subject: str, name: str) -> None:
    assert PrincipalMappingRules(rules).principal_of(subject) == KafkaPrincipal.user(name)


def test_no_rule_matches_is_refused() -> None:
    with pytest.raises(ValueError, match=r"no ssl\.principal\.mapping\.rules rule matches"):
        PrincipalMappingRules(r"RULE:^CN=(.*)$/$1/").principal_of("O=acme")


@pytest.mark.parametrize("rules", ["", "NOPE", "RULE:^(x$/$1/", "RULE:a/b/ DEFAULT"])
def test_bad_rules_are_refused(rules: str) -> None:
    with pytest.raises(ValueError, match=r"ssl\.principal\.mapping\.rules"):
        PrincipalMappingRules(rules)


def test_sessions_are_per_thread_and_nest() -> None:
    alice = Session(KafkaPrincipal.user("alice"), "127.0.0.1", "KAFKA")
    bob = Session(KafkaPrincipal.user("bob"), "127.0.0.2", "BROKER")
    seen: list[Session | None] = []
    with acting_as(alice):
        thread = threading.Thread(target=lambda: seen.append(current_session()))
        thread.start()
        thread.join()
        with acting_as(bob):
            assert current_session() == bob
        assert current_session() == alice
    assert current_session() is None
    assert seen == [None]  # another thread is not in this request
