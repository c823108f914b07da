"""The controller's ACL and SCRAM credential decisions (pure): records and per-item results,
table-driven, and the ControllerService RPCs over a fake controller (authorization,
SECURITY_DISABLED, audit lines)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from metadata_quorum.codec import acl_binding_to_proto
from metadata_quorum.codec import acl_filter_to_proto as filter_to_proto
from metadata_quorum.image import MetadataImage, apply
from metadata_quorum.records import (
    AccessControlEntryRecord,
    MetadataRecord,
    RemoveAccessControlEntryRecord,
    RemoveUserScramCredentialRecord,
    UserScramCredentialRecord,
)
from metadata_quorum.security.acl import (
    AclBinding,
    AclFilter,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)
from metadata_quorum.security.authorization import AccessControl, AuthorizerSettings
from metadata_quorum.security.principal import KafkaPrincipal, Session, acting_as
from metadata_quorum.security.scram import (
    ScramMechanism,
    make_credential,
    password_matches,
    salted_password,
)
from metadata_quorum.security_control import (
    AclDeletion,
    Outcome,
    ScramDeletion,
    ScramUpsertion,
    UserCredentials,
    UserOutcome,
    acl_binding,
    describe_acls,
    describe_user_scram_credentials,
    generate_alter_user_scram_credentials,
    generate_create_acls,
    generate_delete_acls,
)
from metadata_quorum.security_service import SecurityRpcs
from protos import controller_pb2 as pb
from protos import metadata_pb2 as mpb
from raftlog.errors import ErrorCode, KafkaError

T, G, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = PermissionType.ALLOW, PermissionType.DENY
OP = AclOperation
SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512
NONE = Outcome()


def acl(
    rtype: ResourceType = T, name: str = "orders", pattern: PatternType = LIT,
    principal: str = "User:alice", host: str = "*", op: AclOperation = OP.READ,
    permission: PermissionType = ALLOW,
) -> AclBinding:  # fmt: skip
    return AclBinding(rtype, name, pattern, principal, host, op, permission)


READ_ORDERS = acl()
WRITE_ORDERS = acl(op=OP.WRITE)
DENY_APP_GROUPS = acl(G, "app-", PRE, "User:*", op=OP.ALL, permission=DENY)
EXISTING = frozenset({READ_ORDERS, DENY_APP_GROUPS})


def image_with(records: Sequence[MetadataRecord]) -> MetadataImage:
    image, rejected = apply(MetadataImage(), list(records))
    assert rejected == []
    return image


BASE = image_with([AccessControlEntryRecord(b) for b in sorted(EXISTING)])


@pytest.mark.parametrize(
    ("bindings", "records", "results"),
    [
        pytest.param([WRITE_ORDERS], [WRITE_ORDERS], [NONE], id="new"),
        pytest.param([READ_ORDERS], [], [NONE], id="exists: success, no record"),
        pytest.param([WRITE_ORDERS, WRITE_ORDERS], [WRITE_ORDERS], [NONE, NONE], id="twice"),
        pytest.param(
            [acl(op=OP.CLUSTER_ACTION), WRITE_ORDERS],
            [WRITE_ORDERS],
            [
                Outcome(
                    ErrorCode.INVALID_REQUEST,
                    "operation CLUSTER_ACTION does not apply to a TOPIC resource",
                ),
                NONE,
            ],
            id="invalid operation, the rest created",
        ),
        pytest.param(
            [acl(C, "other", op=OP.ALTER)],
            [],
            [Outcome(ErrorCode.INVALID_REQUEST, "the CLUSTER resource is named 'kafka-cluster'")],
            id="cluster name",
        ),
        pytest.param(
            [acl(pattern=PatternType.MATCH)],
            [],
            [Outcome(ErrorCode.INVALID_REQUEST, "pattern type MATCH: use LITERAL or PREFIXED")],
            id="filter pattern",
        ),
        pytest.param(
            [acl(principal="alice")],
            [],
            [
                Outcome(
                    ErrorCode.INVALID_REQUEST,
                    "principal 'alice' is not type:name (e.g. User:alice)",
                )
            ],
            id="principal",
        ),
        pytest.param(
            [acl_binding(99, "x", 3, "User:a", "*", 3, 3)],
            [],
            [Outcome(ErrorCode.INVALID_REQUEST, "resource type UNKNOWN cannot carry an ACL")],
            id="unknown code",
        ),
    ],
)
def test_create_acls(
    bindings: list[AclBinding], records: list[AclBinding], results: list[Outcome]
) -> None:
    got_records, got_results = generate_create_acls(BASE, bindings)
    assert got_records == [AccessControlEntryRecord(b) for b in records]
    assert [r.error for r in got_results] == [r.error for r in results]
    for got, want in zip(got_results, results, strict=True):
        assert got.message == want.message


def test_an_invalid_principal_names_itself() -> None:
    _, results = generate_create_acls(BASE, [acl(principal="alice")])
    assert results[0].error is ErrorCode.INVALID_REQUEST and "alice" in results[0].message


@pytest.mark.parametrize(
    ("filters", "removed", "results"),
    [
        pytest.param([AclFilter()], sorted(EXISTING), [sorted(EXISTING)], id="match all"),
        pytest.param(
            [AclFilter(T, "orders", LIT), AclFilter(principal="User:alice")],
            [READ_ORDERS],
            [[READ_ORDERS], [READ_ORDERS]],
            id="two filters, one record",
        ),
        pytest.param(
            [AclFilter(G, "app-prod", PatternType.MATCH)],
            [DENY_APP_GROUPS],
            [[DENY_APP_GROUPS]],
            id="MATCH selects the prefix",
        ),
        pytest.param([AclFilter(T, "payments")], [], [[]], id="nothing matches"),
        pytest.param(
            [AclFilter(T, pattern_type=PatternType.UNKNOWN), AclFilter(G)],
            [DENY_APP_GROUPS],
            [None, [DENY_APP_GROUPS]],
            id="unknown code refused, the rest deleted",
        ),
    ],
)
def test_delete_acls(
    filters: list[AclFilter], removed: list[AclBinding], results: list[list[AclBinding] | None]
) -> None:
    records, got = generate_delete_acls(BASE, filters)
    assert records == [RemoveAccessControlEntryRecord(b) for b in removed]
    for result, want in zip(got, results, strict=True):
        if want is None:
            assert result.outcome.error is ErrorCode.INVALID_REQUEST
        else:
            assert result == AclDeletion(NONE, tuple(want))
    after, rejected = apply(BASE, records)
    assert rejected == [] and after.acls == EXISTING - set(removed)


@pytest.mark.parametrize(
    ("acl_filter", "found"),
    [
        (AclFilter(), sorted(EXISTING)),
        (AclFilter(T), [READ_ORDERS]),
        (AclFilter(G, "app-", PRE), [DENY_APP_GROUPS]),
        (AclFilter(G, "app-", LIT), []),
        (AclFilter(permission=DENY), [DENY_APP_GROUPS]),
        (AclFilter(operation=OP.READ), [READ_ORDERS]),
        (AclFilter(host="10.0.0.1"), []),
    ],
)
def test_describe_acls(acl_filter: AclFilter, found: list[AclBinding]) -> None:
    assert describe_acls(BASE, acl_filter) == found


def test_describe_acls_refuses_an_unknown_code() -> None:
    with pytest.raises(KafkaError) as raised:
        describe_acls(BASE, AclFilter(operation=OP.UNKNOWN))
    assert raised.value.error is ErrorCode.INVALID_REQUEST


# -- SCRAM credentials -------------------------------------------------------------------------
SALT = b"0123456789abcdef0123456789abcdef"


def upsert(
    name: str, mechanism: int = SHA512, iterations: int = 4096, salt: bytes = SALT,
    password: str = "secret",
) -> ScramUpsertion:  # fmt: skip
    m = ScramMechanism(mechanism) if mechanism in (1, 2) else SHA512
    salted = salted_password(m, password, salt or b"x", iterations if iterations > 0 else 1)
    return ScramUpsertion(name, mechanism, iterations, salt, salted)


BOB_512 = make_credential(SHA512, "bob-pw", SALT, 4096)
SCRAM_BASE = image_with([UserScramCredentialRecord("bob", BOB_512)])


@pytest.mark.parametrize(
    ("deletions", "upsertions", "results"),
    [
        pytest.param([], [upsert("alice")], [("alice", ErrorCode.NONE)], id="new user"),
        pytest.param([ScramDeletion("bob", SHA512)], [], [("bob", ErrorCode.NONE)], id="delete"),
        pytest.param(
            [ScramDeletion("bob", SHA256)],
            [],
            [("bob", ErrorCode.RESOURCE_NOT_FOUND)],
            id="delete a missing mechanism",
        ),
        pytest.param(
            [ScramDeletion("carol", SHA512)],
            [],
            [("carol", ErrorCode.RESOURCE_NOT_FOUND)],
            id="delete a missing user",
        ),
        pytest.param(
            [],
            [upsert("alice", iterations=4095)],
            [("alice", ErrorCode.UNACCEPTABLE_CREDENTIAL)],
            id="too few iterations",
        ),
        pytest.param(
            [],
            [upsert("alice", iterations=16385)],
            [("alice", ErrorCode.UNACCEPTABLE_CREDENTIAL)],
            id="too many iterations",
        ),
        pytest.param(
            [],
            [upsert("alice", iterations=16384)],
            [("alice", ErrorCode.NONE)],
            id="max",
        ),
        pytest.param(
            [],
            [upsert("alice", salt=b"")],
            [("alice", ErrorCode.UNACCEPTABLE_CREDENTIAL)],
            id="empty salt",
        ),
        pytest.param([], [upsert("")], [("", ErrorCode.UNACCEPTABLE_CREDENTIAL)], id="no name"),
        pytest.param(
            [],
            [upsert("alice", mechanism=0)],
            [("alice", ErrorCode.UNSUPPORTED_SASL_MECHANISM)],
            id="UNKNOWN mechanism",
        ),
        pytest.param(
            [ScramDeletion("bob", 0)],
            [],
            [("bob", ErrorCode.UNSUPPORTED_SASL_MECHANISM)],
            id="delete UNKNOWN mechanism",
        ),
        pytest.param(
            [],
            [upsert("alice", SHA256), upsert("alice", SHA512), upsert("carol")],
            [("alice", ErrorCode.DUPLICATE_RESOURCE), ("carol", ErrorCode.NONE)],
            id="a user twice, whatever the mechanism",
        ),
        pytest.param(
            [ScramDeletion("bob", SHA512)],
            [upsert("bob")],
            [("bob", ErrorCode.DUPLICATE_RESOURCE)],
            id="deleted and upserted",
        ),
    ],
)
def test_alter_user_scram_credentials(
    deletions: list[ScramDeletion],
    upsertions: list[ScramUpsertion],
    results: list[tuple[str, ErrorCode]],
) -> None:
    records, got = generate_alter_user_scram_credentials(SCRAM_BASE, deletions, upsertions)
    assert [(r.user, r.outcome.error) for r in got] == results
    succeeded = {user for user, error in results if error is ErrorCode.NONE}
    assert {getattr(r, "name", None) for r in records} == succeeded
    after, rejected = apply(SCRAM_BASE, records)
    assert rejected == []
    for record in records:
        if isinstance(record, RemoveUserScramCredentialRecord):
            assert after.scram_credential(record.name, record.mechanism) is None


def test_an_upserted_credential_checks_the_password_and_keeps_no_password() -> None:
    records, results = generate_alter_user_scram_credentials(
        SCRAM_BASE, [], [upsert("bob", SHA512, 8192, password="new-pw")]
    )
    assert results == [UserOutcome("bob", NONE)]
    (record,) = records
    assert isinstance(record, UserScramCredentialRecord)
    assert record.credential.iterations == 8192 and record.credential.salt == SALT
    assert password_matches(record.credential, "new-pw")
    assert not password_matches(record.credential, "bob-pw")
    assert b"new-pw" not in repr(record).encode()


def test_describe_user_scram_credentials() -> None:
    image = image_with([
        UserScramCredentialRecord("bob", BOB_512),
        UserScramCredentialRecord("alice", make_credential(SHA256, "a", SALT, 8192)),
        UserScramCredentialRecord("alice", make_credential(SHA512, "a", SALT, 4096)),
    ])  # fmt: skip
    everyone = describe_user_scram_credentials(image, [])
    assert everyone == [
        UserCredentials("alice", NONE, ((SHA256, 8192), (SHA512, 4096))),
        UserCredentials("bob", NONE, ((SHA512, 4096),)),
    ]
    named = describe_user_scram_credentials(image, ["bob", "carol", "alice", "alice"])
    assert [(u.user, u.outcome.error) for u in named] == [
        ("bob", ErrorCode.NONE),
        ("carol", ErrorCode.RESOURCE_NOT_FOUND),
        ("alice", ErrorCode.DUPLICATE_RESOURCE),
    ]
    assert describe_user_scram_credentials(MetadataImage(), []) == []


# -- the RPCs: authorization, SECURITY_DISABLED, audit ---------------------------------------
class FakeController:
    """Commits generated records into its image at once (the write path's contract)."""

    is_active = True

    def __init__(self) -> None:
        self.state = self
        self.image = MetadataImage()

    def write(self, generate: Callable[[MetadataImage], Any]) -> tuple[Any, int]:
        records, response = generate(self.image)
        self.image, rejected = apply(self.image, records)
        assert rejected == []
        return response, 0


class Servicer(SecurityRpcs):
    def __init__(self, access: AccessControl | None) -> None:
        self.controller = FakeController()  # type: ignore[assignment]
        self.access_control = access or AccessControl(lambda: self.controller.state.image, None)

    def _status(self, error: ErrorCode = ErrorCode.NONE, message: str = "") -> pb.Status:
        return pb.Status(error_code=error.code, error_message=message)

    def _guard(self, response_type: Any, body: Callable[[], Any]) -> Any:
        try:
            return body()
        except KafkaError as error:
            return response_type(status=self._status(error.error, error.message))


ADMIN = Session(KafkaPrincipal.user("admin"), "127.0.0.1", "CONTROLLER")
MALLORY = Session(KafkaPrincipal.user("mallory"), "127.0.0.9", "CONTROLLER")


def secured() -> Servicer:
    servicer = Servicer(None)
    settings = AuthorizerSettings(frozenset({KafkaPrincipal.user("admin")}))
    servicer.access_control = AccessControl(lambda: servicer.controller.state.image, settings)
    return servicer


def entry(binding: AclBinding) -> mpb.AclBindingEntry:
    return acl_binding_to_proto(binding)


def test_acl_rpcs_answer_security_disabled_without_an_authorizer() -> None:
    servicer = Servicer(None)
    create = servicer.CreateAcls(pb.CreateAclsRequest(creations=[entry(READ_ORDERS)]), None)
    assert create.status.error_code == ErrorCode.SECURITY_DISABLED.code
    describe = servicer.DescribeAcls(
        pb.DescribeAclsRequest(filter=filter_to_proto(AclFilter())), None
    )
    assert describe.status.error_code == ErrorCode.SECURITY_DISABLED.code
    delete = servicer.DeleteAcls(pb.DeleteAclsRequest(filters=[filter_to_proto(AclFilter())]), None)
    assert delete.status.error_code == ErrorCode.SECURITY_DISABLED.code
    alter = servicer.AlterUserScramCredentials(
        pb.AlterUserScramCredentialsRequest(
            upsertions=[pb.ScramCredentialUpsertion(
                name="alice", mechanism=2, iterations=4096, salt=SALT, salted_password=b"x" * 64
            )]
        ),
        None,
    )  # fmt: skip
    assert alter.status.error_code == 0 and alter.results[0].error_code == 0
    described = servicer.DescribeUserScramCredentials(
        pb.DescribeUserScramCredentialsRequest(), None
    )
    assert [(r.user, [(c.mechanism, c.iterations) for c in r.credential_infos]) for r in
            described.results] == [("alice", [(2, 4096)])]  # fmt: skip


def test_acl_rpcs_need_alter_or_describe_on_the_cluster_and_are_audited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    servicer = secured()
    request = pb.CreateAclsRequest(creations=[entry(READ_ORDERS)])
    with acting_as(MALLORY):
        denied = servicer.CreateAcls(request, None)
        described = servicer.DescribeAcls(pb.DescribeAclsRequest(filter=pb.AclFilter(
            resource_type=1, pattern_type=1, operation=1, permission_type=1)), None)  # fmt: skip
        scram = servicer.DescribeUserScramCredentials(
            pb.DescribeUserScramCredentialsRequest(), None
        )
    assert denied.status.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code
    assert described.status.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code
    assert scram.status.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code
    assert servicer.controller.state.image.acls == frozenset()
    with caplog.at_level(logging.INFO, logger="raftlog.audit"), acting_as(ADMIN):
        created = servicer.CreateAcls(request, None)
        again = servicer.CreateAcls(request, None)  # exists: success, nothing to audit
        found = servicer.DescribeAcls(
            pb.DescribeAclsRequest(filter=filter_to_proto(AclFilter(T))), None
        )
        deleted = servicer.DeleteAcls(
            pb.DeleteAclsRequest(filters=[filter_to_proto(AclFilter(principal="User:alice"))]), None
        )
    assert [r.error_code for r in created.results] == [0]
    assert [r.error_code for r in again.results] == [0]
    assert [(a.resource_name, a.principal) for a in found.acls] == [("orders", "User:alice")]
    assert [len(r.matching_acls) for r in deleted.filter_results] == [1]
    assert servicer.controller.state.image.acls == frozenset()
    changes = [r.getMessage() for r in caplog.records if "CHANGE" in r.getMessage()]
    assert len(changes) == 2
    assert "principal=User:admin" in changes[0] and "CreateAcls ALLOW User:alice READ" in changes[0]
    assert "DeleteAcls" in changes[1]
    denials = [r.getMessage() for r in caplog.records if "DENIED" in r.getMessage()]
    assert len(denials) == 3 and all("principal=User:mallory" in d for d in denials)


def test_credential_changes_are_audited_without_secrets(caplog: pytest.LogCaptureFixture) -> None:
    servicer = secured()
    salted = salted_password(SHA256, "s3cret", SALT, 4096)
    with caplog.at_level(logging.INFO, logger="raftlog.audit"), acting_as(ADMIN):
        servicer.AlterUserScramCredentials(
            pb.AlterUserScramCredentialsRequest(upsertions=[pb.ScramCredentialUpsertion(
                name="alice", mechanism=1, iterations=4096, salt=SALT, salted_password=salted
            )]),
            None,
        )  # fmt: skip
    (line,) = [r.getMessage() for r in caplog.records if "CHANGE" in r.getMessage()]
    assert "user=alice mechanism=SCRAM-SHA-256 iterations=4096" in line
    assert salted.hex() not in line and "s3cret" not in line
