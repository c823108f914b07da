"""ControllerService's ACL and SCRAM credential RPCs: protobuf in, the pure core
(`metadata_quorum.security_control`), protobuf out.

A mixin of `ControllerServicer` (service.py), which brings the controller, the node's
`AccessControl` and the error plumbing. As Kafka's ControllerApis: CreateAcls, DeleteAcls and
AlterUserScramCredentials need ALTER on the CLUSTER, DescribeAcls and
DescribeUserScramCredentials DESCRIBE on it; without an authorizer the ACL RPCs answer
SECURITY_DISABLED while credentials work regardless (SASL needs them with or without ACLs).
Writes go through the active controller, and so do the Describe RPCs (a standby answers
NOT_CONTROLLER): the active controller's committed image holds every change it has answered
for, so a client reads its own writes, even one that asked a standby a moment ago.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from metadata_quorum.codec import acl_binding_to_proto
from metadata_quorum.controller import NotControllerError, QuorumController
from metadata_quorum.image import MetadataImage
from metadata_quorum.records import MetadataRecord
from metadata_quorum.security.acl import CLUSTER_NAME, AclFilter, AclOperation, ResourceType
from metadata_quorum.security.authorization import AccessControl
from metadata_quorum.security_control import (
    AclDeletion,
    Outcome,
    ScramDeletion,
    ScramUpsertion,
    UserOutcome,
    acl_binding,
    acl_filter,
    audit_acl_records,
    audit_scram_records,
    describe_acls,
    describe_user_scram_credentials,
    generate_alter_user_scram_credentials,
    generate_create_acls,
    generate_delete_acls,
)
from protos import controller_pb2 as pb
from protos import metadata_pb2 as mpb
from raftlog.errors import ErrorCode, KafkaError

R = TypeVar("R")
T = TypeVar("T")


def filter_from_proto(m: pb.AclFilter) -> AclFilter:
    return acl_filter(
        m.resource_type,
        m.resource_name if m.HasField("resource_name") else None,
        m.pattern_type,
        m.principal if m.HasField("principal") else None,
        m.host if m.HasField("host") else None,
        m.operation,
        m.permission_type,
    )


def _wire_binding(m: mpb.AclBindingEntry) -> Any:
    """The binding as sent (codes unknown to this version become UNKNOWN, which the
    validation refuses) rather than the codec's strict reading, which refuses the request."""
    return acl_binding(
        m.resource_type, m.resource_name, m.pattern_type, m.principal, m.host, m.operation,
        m.permission_type,
    )  # fmt: skip


def _outcome(outcome: Outcome) -> pb.AclOutcome:
    return pb.AclOutcome(error_code=outcome.error.code, error_message=outcome.message)


def _deletion(result: AclDeletion) -> pb.DeleteAclsFilterResult:
    return pb.DeleteAclsFilterResult(
        error_code=result.outcome.error.code,
        error_message=result.outcome.message,
        matching_acls=[acl_binding_to_proto(b) for b in result.deleted],
    )


def _user(result: UserOutcome) -> pb.ScramUserResult:
    return pb.ScramUserResult(
        user=result.user, error_code=result.outcome.error.code, error_message=result.outcome.message
    )


class SecurityRpcs:
    """The ACL and credential RPCs of ControllerServicer."""

    controller: QuorumController
    access_control: AccessControl
    _guard: Callable[..., Any]
    _status: Callable[..., pb.Status]

    def _active_image(self) -> MetadataImage:
        if not self.controller.is_active:
            raise NotControllerError(self.controller.active_controller_id())
        return self.controller.state.image

    def _authorize(self, operation: AclOperation, acls: bool) -> None:
        if acls and not self.access_control.enabled:
            raise KafkaError(ErrorCode.SECURITY_DISABLED, "No Authorizer is configured.")
        self.access_control.check(operation, ResourceType.CLUSTER, CLUSTER_NAME)

    def _write(
        self,
        generate: Callable[[MetadataImage], tuple[list[MetadataRecord], T]],
        audit: Callable[[list[MetadataRecord]], None],
    ) -> T:
        """Commit the generated records, then audit them (a change is audited once it holds)."""
        written: list[MetadataRecord] = []

        def generate_and_keep(image: MetadataImage) -> tuple[list[MetadataRecord], T]:
            records, response = generate(image)
            written[:] = records
            return records, response

        response, _ = self.controller.write(generate_and_keep)
        audit(written)
        return response

    def CreateAcls(self, request: pb.CreateAclsRequest, context: Any) -> Any:
        bindings = [_wire_binding(m) for m in request.creations]

        def body() -> pb.CreateAclsResponse:
            self._authorize(AclOperation.ALTER, acls=True)
            results = self._write(lambda i: generate_create_acls(i, bindings), audit_acl_records)
            return pb.CreateAclsResponse(
                status=self._status(), results=[_outcome(r) for r in results]
            )

        return self._guard(pb.CreateAclsResponse, body)

    def DeleteAcls(self, request: pb.DeleteAclsRequest, context: Any) -> Any:
        filters = [filter_from_proto(m) for m in request.filters]

        def body() -> pb.DeleteAclsResponse:
            self._authorize(AclOperation.ALTER, acls=True)
            results = self._write(lambda i: generate_delete_acls(i, filters), audit_acl_records)
            return pb.DeleteAclsResponse(
                status=self._status(), filter_results=[_deletion(r) for r in results]
            )

        return self._guard(pb.DeleteAclsResponse, body)

    def DescribeAcls(self, request: pb.DescribeAclsRequest, context: Any) -> Any:
        def body() -> pb.DescribeAclsResponse:
            self._authorize(AclOperation.DESCRIBE, acls=True)
            found = describe_acls(self._active_image(), filter_from_proto(request.filter))
            return pb.DescribeAclsResponse(
                status=self._status(), acls=[acl_binding_to_proto(b) for b in found]
            )

        return self._guard(pb.DescribeAclsResponse, body)

    def AlterUserScramCredentials(
        self, request: pb.AlterUserScramCredentialsRequest, context: Any
    ) -> Any:
        deletions = [ScramDeletion(d.name, d.mechanism) for d in request.deletions]
        upsertions = [
            ScramUpsertion(u.name, u.mechanism, u.iterations, u.salt, u.salted_password)
            for u in request.upsertions
        ]

        def body() -> pb.AlterUserScramCredentialsResponse:
            self._authorize(AclOperation.ALTER, acls=False)
            results = self._write(
                lambda i: generate_alter_user_scram_credentials(i, deletions, upsertions),
                audit_scram_records,
            )
            return pb.AlterUserScramCredentialsResponse(
                status=self._status(), results=[_user(r) for r in results]
            )

        return self._guard(pb.AlterUserScramCredentialsResponse, body)

    def DescribeUserScramCredentials(
        self, request: pb.DescribeUserScramCredentialsRequest, context: Any
    ) -> Any:
        def body() -> pb.DescribeUserScramCredentialsResponse:
            self._authorize(AclOperation.DESCRIBE, acls=False)
            found = describe_user_scram_credentials(self._active_image(), request.users)
            return pb.DescribeUserScramCredentialsResponse(
                status=self._status(),
                results=[
                    pb.DescribeUserScramCredentialsResult(
                        user=r.user,
                        error_code=r.outcome.error.code,
                        error_message=r.outcome.message,
                        credential_infos=[
                            pb.ScramCredentialInfo(mechanism=int(m), iterations=n)
                            for m, n in r.credentials
                        ],
                    )
                    for r in found
                ],
            )

        return self._guard(pb.DescribeUserScramCredentialsResponse, body)
