"""The KAFKA listener's ACL and SCRAM credential APIs: DescribeAcls (29), CreateAcls (30),
DeleteAcls (31), v1-3 as Kafka 4 serves them, DescribeUserScramCredentials (50) and
AlterUserScramCredentials (51, KIP-554).

ACLs and credentials are metadata (docs/security.md), so as a KRaft broker forwards them
(KIP-590) each request becomes the controller's RPC, sent through the broker's controller
client. The broker forwards with its own identity, so it first checks the client's permission
itself, with its own `AccessControl`, exactly as the controller would: ALTER on the CLUSTER for
CreateAcls, DeleteAcls and AlterUserScramCredentials, DESCRIBE on it for DescribeAcls and
DescribeUserScramCredentials. Without an authorizer the ACL APIs answer SECURITY_DISABLED, as
Kafka's do; credentials work regardless (SASL/SCRAM needs them with or without ACLs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dataplane.kafka import codec as kc
from metadata_quorum.client import ControllerClient
from metadata_quorum.security.acl import (
    CLUSTER_NAME,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)
from metadata_quorum.security.authorization import AccessControl, audit_change
from protos import controller_pb2 as cpb
from protos import metadata_pb2 as mpb
from raftlog.errors import ErrorCode, KafkaError

FORWARD_DEADLINE_S = 15.0
LITERAL = int(PatternType.LITERAL)  # a request without a pattern type (v0, not served) means it


def _error(error: KafkaError) -> dict[str, Any]:
    return {"error_code": error.error.code, "error_message": error.message}


def _outcome(code: int, message: str) -> dict[str, Any]:
    return {"error_code": code, "error_message": message or None}


def _filter(item: Any) -> cpb.AclFilter:
    """DescribeAcls' body or a DeleteAcls filter (fields ``*_filter``) as the controller's."""
    message = cpb.AclFilter(
        resource_type=item.resource_type_filter,
        pattern_type=kc.field(item, "pattern_type_filter", LITERAL),
        operation=item.operation,
        permission_type=item.permission_type,
    )
    for ours, theirs in (("resource_name", "resource_name_filter"),
                         ("principal", "principal_filter"), ("host", "host_filter")):  # fmt: skip
        value = getattr(item, theirs)
        if value is not None:
            setattr(message, ours, value)
    return message


def _binding(m: mpb.AclBindingEntry) -> dict[str, Any]:
    return {
        "resource_type": m.resource_type,
        "resource_name": m.resource_name,
        "pattern_type": m.pattern_type,
        "principal": m.principal,
        "host": m.host,
        "operation": m.operation,
        "permission_type": m.permission_type,
    }


def _name(kind: type[Any], code: int) -> str:
    try:
        return str(kind(code).name)
    except ValueError:
        return str(code)


def _acl_text(m: mpb.AclBindingEntry) -> str:
    return (
        f"{_name(PermissionType, m.permission_type)} {m.principal} "
        f"{_name(AclOperation, m.operation)} from {m.host} on "
        f"{_name(ResourceType, m.resource_type)}:{_name(PatternType, m.pattern_type)}:"
        f"{m.resource_name}"
    )


def _result(code: int) -> str:
    return "ok" if code == 0 else ErrorCode.from_code(code).name


def _users_named(request_body: Any) -> list[str]:
    names = [d.name for d in request_body.deletions] + [u.name for u in request_body.upsertions]
    return list(dict.fromkeys(names))


class KafkaSecurityAdmin:
    """ACL and credential requests of the KAFKA listener, forwarded to the controller quorum."""

    def __init__(self, controller: ControllerClient, access: AccessControl) -> None:
        self.controller = controller
        self.access = access

    def handlers(self) -> dict[int, Callable[[kc.Request], kc.Data]]:
        return {
            kc.API_DESCRIBE_ACLS: self.describe_acls,
            kc.API_CREATE_ACLS: self.create_acls,
            kc.API_DELETE_ACLS: self.delete_acls,
            kc.API_DESCRIBE_USER_SCRAM_CREDENTIALS: self.describe_user_scram_credentials,
            kc.API_ALTER_USER_SCRAM_CREDENTIALS: self.alter_user_scram_credentials,
        }

    def _check(self, operation: AclOperation, acls: bool) -> None:
        if acls and not self.access.enabled:
            raise KafkaError(ErrorCode.SECURITY_DISABLED, "No Authorizer is configured.")
        self.access.check(operation, ResourceType.CLUSTER, CLUSTER_NAME)

    def _forward(self, method: str, request: Any) -> Any:
        return self.controller.checked(method, request, deadline_s=FORWARD_DEADLINE_S)

    # -- ACLs -------------------------------------------------------------------------------------
    def describe_acls(self, request: kc.Request) -> kc.Data:
        try:
            self._check(AclOperation.DESCRIBE, acls=True)
            forwarded = cpb.DescribeAclsRequest(filter=_filter(request.body))
            answer = self._forward("DescribeAcls", forwarded)
        except KafkaError as error:
            return {"throttle_time": 0, **_error(error), "resources": []}
        resources: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
        for m in answer.acls:
            key = (m.resource_type, m.resource_name, m.pattern_type)
            resources.setdefault(key, []).append({
                "principal": m.principal, "host": m.host, "operation": m.operation,
                "permission_type": m.permission_type,
            })  # fmt: skip
        return {
            "throttle_time": 0,
            "error_code": 0,
            "error_message": None,
            "resources": [
                {"resource_type": t, "resource_name": n, "pattern_type": p, "acls": acls}
                for (t, n, p), acls in resources.items()
            ],
        }

    def create_acls(self, request: kc.Request) -> kc.Data:
        creations = request.body.creations
        forwarded = cpb.CreateAclsRequest(
            creations=[
                mpb.AclBindingEntry(
                    resource_type=c.resource_type,
                    resource_name=c.resource_name,
                    pattern_type=kc.field(c, "resource_pattern_type", LITERAL),
                    principal=c.principal,
                    host=c.host,
                    operation=c.operation,
                    permission_type=c.permission_type,
                )
                for c in creations
            ]
        )
        try:
            self._check(AclOperation.ALTER, acls=True)
            answer = self._forward("CreateAcls", forwarded)
        except KafkaError as error:
            return {"throttle_time": 0, "results": [_error(error) for _ in creations]}
        # the controller's audit line names this broker (it forwards as itself): name the client
        for entry, result in zip(forwarded.creations, answer.results, strict=False):
            audit_change(f"CreateAcls via the KAFKA listener: {_acl_text(entry)}: "
                         f"{_result(result.error_code)}")  # fmt: skip
        return {
            "throttle_time": 0,
            "results": [_outcome(r.error_code, r.error_message) for r in answer.results],
        }

    def delete_acls(self, request: kc.Request) -> kc.Data:
        filters = request.body.filters
        forwarded = cpb.DeleteAclsRequest(filters=[_filter(f) for f in filters])
        try:
            self._check(AclOperation.ALTER, acls=True)
            answer = self._forward("DeleteAcls", forwarded)
        except KafkaError as error:
            failed = {**_error(error), "matching_acls": []}
            return {"throttle_time": 0, "filter_results": [failed for _ in filters]}
        for r in answer.filter_results:
            for m in r.matching_acls:
                audit_change(f"DeleteAcls via the KAFKA listener: {_acl_text(m)}: deleted")
        return {
            "throttle_time": 0,
            "filter_results": [
                {
                    **_outcome(r.error_code, r.error_message),
                    "matching_acls": [
                        {"error_code": 0, "error_message": None, **_binding(m)}
                        for m in r.matching_acls
                    ],
                }
                for r in answer.filter_results
            ],
        }

    # -- SCRAM credentials ------------------------------------------------------------------------
    def describe_user_scram_credentials(self, request: kc.Request) -> kc.Data:
        users = [u.name for u in request.body.users or ()]
        try:
            self._check(AclOperation.DESCRIBE, acls=False)
            answer = self._forward(
                "DescribeUserScramCredentials",
                cpb.DescribeUserScramCredentialsRequest(users=users),
            )
        except KafkaError as error:
            return {"throttle_time": 0, **_error(error), "results": []}
        return {
            "throttle_time": 0,
            "error_code": 0,
            "error_message": None,
            "results": [
                {
                    "user": r.user,
                    **_outcome(r.error_code, r.error_message),
                    "credential_infos": [
                        {"mechanism": c.mechanism, "iterations": c.iterations}
                        for c in r.credential_infos
                    ],
                }
                for r in answer.results
            ],
        }

    def alter_user_scram_credentials(self, request: kc.Request) -> kc.Data:
        body = request.body
        forwarded = cpb.AlterUserScramCredentialsRequest(
            deletions=[
                cpb.ScramCredentialDeletion(name=d.name, mechanism=d.mechanism)
                for d in body.deletions
            ],
            upsertions=[
                cpb.ScramCredentialUpsertion(
                    name=u.name,
                    mechanism=u.mechanism,
                    iterations=u.iterations,
                    salt=u.salt,
                    salted_password=u.salted_password,
                )
                for u in body.upsertions
            ],
        )
        try:
            self._check(AclOperation.ALTER, acls=False)
            answer = self._forward("AlterUserScramCredentials", forwarded)
            for r in answer.results:
                audit_change(
                    f"AlterUserScramCredentials via the KAFKA listener: user {r.user!r}: "
                    f"{_result(r.error_code)}"
                )
        except KafkaError as error:
            failed = _error(error)
            return {"throttle_time": 0, "results": [
                {"user": name, **failed} for name in _users_named(body)
            ]}  # fmt: skip
        return {
            "throttle_time": 0,
            "results": [
                {"user": r.user, **_outcome(r.error_code, r.error_message)} for r in answer.results
            ],
        }
