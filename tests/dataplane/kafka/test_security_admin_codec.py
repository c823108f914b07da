"""The KAFKA listener's ACL and SCRAM credential APIs without a cluster: every advertised
version of each request is read, forwarded as the controller's RPC and answered in an encodable
response; no authorizer is SECURITY_DISABLED; a client without ALTER on the cluster is refused
before anything is forwarded."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from kio.index import load_request_schema

from dataplane.kafka import codec as kc
from dataplane.kafka.security_admin import KafkaSecurityAdmin
from metadata_quorum.image import MetadataImage
from metadata_quorum.security.authorization import ALLOW_ALL, AccessControl, AuthorizerSettings
from metadata_quorum.security.principal import KafkaPrincipal, Session, acting_as
from protos import controller_pb2 as cpb
from protos import metadata_pb2 as mpb
from raftlog.errors import ErrorCode

ENTRY = mpb.AclBindingEntry(
    resource_type=2, resource_name="orders", pattern_type=3, principal="User:alice", host="*",
    operation=3, permission_type=3,
)  # fmt: skip
ANSWERS: dict[str, Any] = {
    "CreateAcls": cpb.CreateAclsResponse(
        results=[cpb.AclOutcome(), cpb.AclOutcome(error_code=42, error_message="bad")]
    ),
    "DescribeAcls": cpb.DescribeAclsResponse(acls=[ENTRY]),
    "DeleteAcls": cpb.DeleteAclsResponse(
        filter_results=[cpb.DeleteAclsFilterResult(matching_acls=[ENTRY])]
    ),
    "DescribeUserScramCredentials": cpb.DescribeUserScramCredentialsResponse(
        results=[
            cpb.DescribeUserScramCredentialsResult(
                user="alice",
                credential_infos=[cpb.ScramCredentialInfo(mechanism=2, iterations=4096)],
            )
        ]
    ),
    "AlterUserScramCredentials": cpb.AlterUserScramCredentialsResponse(
        results=[cpb.ScramUserResult(user="alice")]
    ),
}


class FakeControllerClient:
    def __init__(self) -> None:
        self.forwarded: list[tuple[str, Any]] = []

    def checked(self, method: str, request: Any, deadline_s: float) -> Any:
        self.forwarded.append((method, request))
        return ANSWERS[method]


def secured() -> AccessControl:
    settings = AuthorizerSettings(frozenset({KafkaPrincipal.user("admin")}))
    return AccessControl(MetadataImage, settings)


def body(api_key: int, version: int) -> Any:
    schema = load_request_schema(api_key, version)
    data: dict[int, dict[str, Any]] = {
        kc.API_CREATE_ACLS: {"creations": [{
            "resource_type": 2, "resource_name": "orders", "resource_pattern_type": 3,
            "principal": "User:alice", "host": "*", "operation": 3, "permission_type": 3,
        }] * 2},
        kc.API_DESCRIBE_ACLS: {
            "resource_type_filter": 2, "resource_name_filter": None, "pattern_type_filter": 1,
            "principal_filter": "User:alice", "host_filter": None, "operation": 1,
            "permission_type": 1,
        },
        kc.API_DELETE_ACLS: {"filters": [{
            "resource_type_filter": 2, "resource_name_filter": "orders", "pattern_type_filter": 3,
            "principal_filter": None, "host_filter": None, "operation": 1, "permission_type": 1,
        }]},
        kc.API_DESCRIBE_USER_SCRAM_CREDENTIALS: {"users": [{"name": "alice"}]},
        kc.API_ALTER_USER_SCRAM_CREDENTIALS: {
            "deletions": [{"name": "bob", "mechanism": 1}],
            "upsertions": [{
                "name": "alice", "mechanism": 2, "iterations": 4096, "salt": b"s",
                "salted_password": b"p",
            }],
        },
    }  # fmt: skip
    return kc.to_entity(schema, data[api_key])


APIS = [
    kc.API_CREATE_ACLS,
    kc.API_DESCRIBE_ACLS,
    kc.API_DELETE_ACLS,
    kc.API_DESCRIBE_USER_SCRAM_CREDENTIALS,
    kc.API_ALTER_USER_SCRAM_CREDENTIALS,
]
VERSIONS = [(k, v) for k in APIS for v in range(kc.SUPPORTED[k][0], kc.SUPPORTED[k][1] + 1)]


@pytest.mark.parametrize(("api_key", "version"), VERSIONS, ids=str)
def test_every_version_is_forwarded_and_answered(api_key: int, version: int) -> None:
    controller = FakeControllerClient()
    admin = KafkaSecurityAdmin(controller, secured())  # type: ignore[arg-type]
    request = kc.Request(api_key, version, 7, "test", body(api_key, version))
    answer = admin.handlers()[api_key](request)
    frame = kc.encode_response(api_key, version, 7, answer)
    assert len(frame) > 8
    (method, forwarded), = controller.forwarded  # fmt: skip
    if api_key == kc.API_CREATE_ACLS:
        assert [c.pattern_type for c in forwarded.creations] == [3, 3]
        assert [r["error_code"] for r in answer["results"]] == [0, 42]
    if api_key == kc.API_DESCRIBE_ACLS:
        assert forwarded.filter.pattern_type == 1
        assert not forwarded.filter.HasField("resource_name")
        assert forwarded.filter.principal == "User:alice"
        (resource,) = answer["resources"]
        assert resource["resource_name"] == "orders" and len(resource["acls"]) == 1
    if api_key == kc.API_DELETE_ACLS:
        assert forwarded.filters[0].resource_name == "orders"
        assert len(answer["filter_results"][0]["matching_acls"]) == 1
    if api_key == kc.API_ALTER_USER_SCRAM_CREDENTIALS:
        assert method == "AlterUserScramCredentials"
        assert forwarded.upsertions[0].salted_password == b"p"


@pytest.mark.parametrize("api_key", APIS[:3])
def test_acl_apis_answer_security_disabled_without_an_authorizer(api_key: int) -> None:
    controller = FakeControllerClient()
    admin = KafkaSecurityAdmin(controller, ALLOW_ALL)  # type: ignore[arg-type]
    answer = admin.handlers()[api_key](kc.Request(api_key, 1, 7, "t", body(api_key, 1)))
    codes = {
        kc.API_CREATE_ACLS: lambda: {r["error_code"] for r in answer["results"]},
        kc.API_DESCRIBE_ACLS: lambda: {answer["error_code"]},
        kc.API_DELETE_ACLS: lambda: {r["error_code"] for r in answer["filter_results"]},
    }[api_key]()
    assert codes == {ErrorCode.SECURITY_DISABLED.code}
    assert controller.forwarded == []


def test_credentials_work_without_an_authorizer_and_need_alter_with_one() -> None:
    key = kc.API_ALTER_USER_SCRAM_CREDENTIALS
    controller = FakeControllerClient()
    open_admin = KafkaSecurityAdmin(controller, ALLOW_ALL)  # type: ignore[arg-type]
    answer = open_admin.handlers()[key](kc.Request(key, 0, 7, "t", body(key, 0)))
    assert answer["results"] == [{"user": "alice", "error_code": 0, "error_message": None}]
    secured_admin = KafkaSecurityAdmin(controller, secured())  # type: ignore[arg-type]
    mallory = Session(KafkaPrincipal.user("mallory"), "127.0.0.9", "KAFKA")
    with acting_as(mallory):
        refused = secured_admin.handlers()[key](kc.Request(key, 0, 7, "t", body(key, 0)))
        describe = kc.API_DESCRIBE_USER_SCRAM_CREDENTIALS
        hidden = secured_admin.handlers()[describe](
            kc.Request(describe, 0, 7, "t", body(describe, 0))
        )
    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code
    assert [(r["user"], r["error_code"]) for r in refused["results"]] == [
        ("bob", code),
        ("alice", code),
    ]
    assert hidden["error_code"] == code and hidden["results"] == []
    assert len(controller.forwarded) == 1  # only the open admin's request


@pytest.mark.parametrize(
    ("api_key", "expected"),
    [
        (kc.API_CREATE_ACLS, "CreateAcls via the KAFKA listener: ALLOW User:alice READ from * on "
         "TOPIC:LITERAL:orders: ok"),
        (kc.API_DELETE_ACLS, "DeleteAcls via the KAFKA listener: ALLOW User:alice READ from * "
         "on TOPIC:LITERAL:orders: deleted"),
        (kc.API_ALTER_USER_SCRAM_CREDENTIALS, "AlterUserScramCredentials via the KAFKA listener: "
         "user 'alice': ok"),
    ],
)  # fmt: skip
def test_forwarded_changes_are_audited_with_the_clients_principal(
    api_key: int, expected: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The controller's audit line names the broker that forwarded (it forwards as itself);
    the broker's own line names the client."""
    admin = KafkaSecurityAdmin(FakeControllerClient(), secured())  # type: ignore[arg-type]
    version = kc.SUPPORTED[api_key][0]
    with (
        caplog.at_level(logging.INFO, logger="raftlog.audit"),
        acting_as(Session(KafkaPrincipal.user("admin"), "127.0.0.9", "KAFKA")),
    ):
        admin.handlers()[api_key](kc.Request(api_key, version, 7, "t", body(api_key, version)))
    lines = [r.getMessage() for r in caplog.records if r.name == "raftlog.audit"]
    assert any("principal=User:admin host=127.0.0.9" in line and expected in line for line in lines)
