"""The authorizer's rules (Kafka's StandardAuthorizer), table-driven, and a hypothesis model:
the indexed authorizer answers as a plain scan over every ACL does."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metadata_quorum.security.acl import (
    CLUSTER_NAME,
    AclBinding,
    AclFilter,
    AclOperation,
    Authorizer,
    PatternType,
    PermissionType,
    ResourceType,
)
from metadata_quorum.security.principal import KafkaPrincipal, Session

TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
Op = AclOperation
ALLOW, DENY = PermissionType.ALLOW, PermissionType.DENY
ALICE = Session(KafkaPrincipal.user("alice"), "127.0.0.1", "KAFKA")
BOB = Session(KafkaPrincipal.user("bob"), "127.0.0.2", "KAFKA")


def acl(
    name: str,
    op: AclOperation,
    perm: PermissionType = ALLOW,
    *,
    rtype: ResourceType = TOPIC,
    pattern: PatternType = LIT,
    principal: str = "User:alice",
    host: str = "*",
) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, host, op, perm)


CASES = [
    # (acls, session, operation, resource name, allowed)
    ([acl("orders", Op.READ)], ALICE, Op.READ, "orders", True),
    ([acl("orders", Op.READ)], ALICE, Op.WRITE, "orders", False),  # read, not write
    ([acl("orders", Op.READ)], ALICE, Op.DESCRIBE, "orders", True),  # READ implies DESCRIBE
    ([acl("orders", Op.WRITE)], ALICE, Op.DESCRIBE, "orders", True),
    ([acl("orders", Op.ALTER_CONFIGS)], ALICE, Op.DESCRIBE_CONFIGS, "orders", True),
    ([acl("orders", Op.DESCRIBE)], ALICE, Op.READ, "orders", False),  # no implication upwards
    ([acl("orders", Op.READ)], BOB, Op.READ, "orders", False),  # another principal
    ([acl("orders-", Op.WRITE, pattern=PRE)], ALICE, Op.WRITE, "orders-eu", True),
    ([acl("orders-", Op.WRITE, pattern=PRE)], ALICE, Op.WRITE, "orders", False),  # no match
    ([acl("*", Op.READ)], ALICE, Op.READ, "anything", True),  # the wildcard
    ([acl("orders", Op.ALL)], ALICE, Op.DELETE, "orders", True),
    ([acl("orders", Op.READ, principal="User:*")], BOB, Op.READ, "orders", True),
    ([acl("orders", Op.READ, host="127.0.0.1")], ALICE, Op.READ, "orders", True),
    ([acl("orders", Op.READ, host="127.0.0.9")], ALICE, Op.READ, "orders", False),
    # DENY beats ALLOW, whatever the pattern
    ([acl("orders", Op.READ), acl("orders", Op.READ, DENY)], ALICE, Op.READ, "orders", False),
    (
        [acl("*", Op.ALL), acl("orders-", Op.READ, DENY, pattern=PRE)],
        ALICE,
        Op.READ,
        "orders-1",
        False,
    ),
    ([acl("orders", Op.ALL), acl("orders", Op.ALL, DENY)], ALICE, Op.DESCRIBE, "orders", False),
    # a DENY implies nothing: DENY READ does not deny the DESCRIBE that ALLOW READ implies
    ([acl("orders", Op.READ), acl("orders", Op.READ, DENY)], ALICE, Op.DESCRIBE, "orders", True),
    ([acl("g", Op.READ, rtype=GROUP)], ALICE, Op.READ, "g", True),
    ([acl("g", Op.READ, rtype=GROUP)], ALICE, Op.READ, "other", False),  # another group
    ([acl(CLUSTER_NAME, Op.CREATE, rtype=CLUSTER)], ALICE, Op.CREATE, CLUSTER_NAME, True),
    ([], ALICE, Op.READ, "orders", False),  # no ACL for the resource: denied by default
    ([acl("other", Op.READ, principal="User:bob")], ALICE, Op.READ, "orders", False),
]


@pytest.mark.parametrize(("acls", "session", "operation", "name", "allowed"), CASES)
def test_rules(
    acls: list[AclBinding], session: Session, operation: AclOperation, name: str, allowed: bool
) -> None:
    resource_type = acls[0].resource_type if acls else TOPIC
    assert Authorizer(acls).authorize(session, operation, resource_type, name) is allowed


def test_super_users_and_the_node_itself() -> None:
    authorizer = Authorizer(
        [acl("orders", Op.READ, DENY)], super_users=frozenset({ALICE.principal})
    )
    assert authorizer.authorize(ALICE, Op.WRITE, TOPIC, "orders")
    assert authorizer.authorize(None, Op.WRITE, TOPIC, "orders")  # a call made inside the node
    assert not authorizer.authorize(BOB, Op.WRITE, TOPIC, "orders")


def test_allow_everyone_if_no_acl_found() -> None:
    authorizer = Authorizer([acl("orders", Op.READ)], allow_everyone_if_no_acl_found=True)
    assert authorizer.authorize(BOB, Op.WRITE, TOPIC, "payments")  # no ACL names payments
    assert not authorizer.authorize(BOB, Op.WRITE, TOPIC, "orders")  # orders has ACLs


def test_authorize_any() -> None:
    """An idempotent producer needs IDEMPOTENT_WRITE on the cluster or WRITE on some topic."""
    assert Authorizer([acl("orders-", Op.WRITE, pattern=PRE)]).authorize_any(ALICE, Op.WRITE, TOPIC)
    assert not Authorizer([acl("orders", Op.READ)]).authorize_any(ALICE, Op.WRITE, TOPIC)
    denied = [acl("orders", Op.WRITE), acl("*", Op.WRITE, DENY)]
    assert not Authorizer(denied).authorize_any(ALICE, Op.WRITE, TOPIC)
    covered = [acl("orders-eu", Op.WRITE), acl("orders-", Op.WRITE, DENY, pattern=PRE)]
    assert not Authorizer(covered).authorize_any(ALICE, Op.WRITE, TOPIC)
    assert Authorizer([*covered, acl("pay", Op.WRITE)]).authorize_any(ALICE, Op.WRITE, TOPIC)


@pytest.mark.parametrize(
    ("binding", "message"),
    [
        (acl("g", Op.WRITE, rtype=GROUP), "does not apply"),
        (acl("orders", Op.ANY), "only for filters"),
        (acl("orders", Op.READ, pattern=PatternType.MATCH), "LITERAL or PREFIXED"),
        (acl("orders", Op.READ, principal="alice"), "type:name"),
        (acl("x", Op.CREATE, rtype=CLUSTER), "kafka-cluster"),
        (acl("", Op.READ), "empty"),
        (acl("orders", Op.READ, PermissionType.ANY), "ALLOW or DENY"),
    ],
)
def test_validate_refuses(binding: AclBinding, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        binding.validate()


def test_filters() -> None:
    bindings = [
        acl("orders", Op.READ),
        acl("orders-", Op.WRITE, pattern=PRE),
        acl("*", Op.DESCRIBE, principal="User:bob"),
        acl("g", Op.READ, rtype=GROUP),
    ]
    assert [b for b in bindings if AclFilter().matches(b)] == bindings
    match = AclFilter(TOPIC, "orders-eu", PatternType.MATCH)
    assert [b.resource_name for b in bindings if match.matches(b)] == ["orders-", "*"]
    literal = AclFilter(TOPIC, "orders", LIT)
    assert [b for b in bindings if literal.matches(b)] == [bindings[0]]
    by_principal = AclFilter(principal="User:bob")
    assert [b for b in bindings if by_principal.matches(b)] == [bindings[2]]
    assert [b for b in bindings if AclFilter(permission=DENY).matches(b)] == []


# -- the index against a scan -------------------------------------------------------------------
NAMES = st.sampled_from(["a", "ab", "abc", "b", "*", "abd"])
BINDINGS = st.builds(
    AclBinding,
    st.sampled_from([TOPIC, GROUP]),
    NAMES,
    st.sampled_from([LIT, PRE]),
    st.sampled_from(["User:alice", "User:bob", "User:*"]),
    st.sampled_from(["*", "127.0.0.1"]),
    st.sampled_from([Op.READ, Op.WRITE, Op.DESCRIBE, Op.ALL, Op.DELETE]),
    st.sampled_from([ALLOW, DENY]),
)


def _scan(
    bindings: list[AclBinding],
    session: Session,
    op: AclOperation,
    rtype: ResourceType,
    name: str,
) -> bool:
    applicable = [
        b
        for b in bindings
        if b.resource_type == rtype
        and (
            name.startswith(b.resource_name)
            if b.pattern_type == PRE
            else b.resource_name in (name, "*")
        )
    ]
    if not applicable:
        return False
    implied = {Op.DESCRIBE: {Op.READ, Op.WRITE, Op.DELETE, Op.ALTER}}.get(op, set())
    matching = [
        b
        for b in applicable
        if b.principal in (str(session.principal), "User:*")
        and b.host in ("*", session.client_host)
        and (b.operation in (op, Op.ALL) or (b.permission == ALLOW and b.operation in implied))
    ]
    if any(b.permission == DENY for b in matching):
        return False
    return any(b.permission == ALLOW for b in matching)


@given(
    st.lists(BINDINGS, max_size=12, unique=True),
    st.sampled_from([ALICE, BOB]),
    st.sampled_from([Op.READ, Op.WRITE, Op.DESCRIBE, Op.DELETE]),
    st.sampled_from([TOPIC, GROUP]),
    st.sampled_from(["a", "ab", "abc", "abd", "b", "c", "*"]),
)
def test_index_answers_as_a_scan(
    bindings: list[AclBinding],
    session: Session,
    op: AclOperation,
    rtype: ResourceType,
    name: str,
) -> None:
    assert Authorizer(bindings).authorize(session, op, rtype, name) == _scan(
        bindings, session, op, rtype, name
    )
