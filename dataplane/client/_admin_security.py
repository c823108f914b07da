"""The admin client's ACL and SCRAM credential calls (Kafka's ``Admin.createAcls``,
``describeAcls``, ``deleteAcls``, ``alterUserScramCredentials``,
``describeUserScramCredentials``), over the controllers.

As Kafka's Admin does (KIP-554), the client salts and hashes the password itself: the request
carries a random 32-byte salt, the iteration count and Hi(password, salt, iterations), never
the password, and the controller keeps only StoredKey and ServerKey.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from metadata_quorum.codec import acl_binding_from_proto, acl_binding_to_proto, acl_filter_to_proto
from metadata_quorum.security.acl import AclBinding, AclFilter
from metadata_quorum.security.scram import ScramMechanism, salted_password
from protos import controller_pb2 as pb
from raftlog.errors import ErrorCode, KafkaError

__all__ = [
    "AclDeleteResult",
    "ScramCredentialInfo",
    "UserScramCredentialDeletion",
    "UserScramCredentialUpsertion",
]

Checked = Callable[[str, Any], Any]  # the admin client's call of a controller RPC
DEFAULT_ITERATIONS = 4096  # Kafka's Admin default (ScramCredentialInfo)
SALT_BYTES = 32


def _item_error(code: int, message: str) -> KafkaError | None:
    return None if code == ErrorCode.NONE.code else KafkaError(ErrorCode.from_code(code), message)


@dataclass(frozen=True)
class AclDeleteResult:
    """One DeleteAcls filter's outcome: the ACLs it deleted, or its error."""

    error: KafkaError | None
    deleted: tuple[AclBinding, ...] = ()


@dataclass(frozen=True)
class UserScramCredentialUpsertion:
    """Set (or replace) `user`'s credential for `mechanism`. The salt is random unless given."""

    user: str
    mechanism: ScramMechanism
    password: str = field(repr=False)
    iterations: int = DEFAULT_ITERATIONS
    salt: bytes | None = field(default=None, repr=False)

    def to_proto(self) -> pb.ScramCredentialUpsertion:
        salt = self.salt if self.salt is not None else secrets.token_bytes(SALT_BYTES)
        salted = b""
        if self.mechanism in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512):
            # an iteration count the controller will refuse is not worth hashing
            iterations = min(max(self.iterations, 1), self.mechanism.max_iterations)
            salted = salted_password(self.mechanism, self.password, salt, iterations)
        return pb.ScramCredentialUpsertion(
            name=self.user, mechanism=int(self.mechanism), iterations=self.iterations,
            salt=salt, salted_password=salted,
        )  # fmt: skip


@dataclass(frozen=True)
class UserScramCredentialDeletion:
    user: str
    mechanism: ScramMechanism


class ScramCredentialInfo(NamedTuple):
    mechanism: ScramMechanism
    iterations: int


def create_acls(
    checked: Checked, bindings: Iterable[AclBinding]
) -> dict[AclBinding, KafkaError | None]:
    wanted = list(bindings)
    request = pb.CreateAclsRequest(creations=[acl_binding_to_proto(b) for b in wanted])
    response = checked("CreateAcls", request)
    return {
        b: _item_error(r.error_code, r.error_message)
        for b, r in zip(wanted, response.results, strict=True)
    }


def describe_acls(checked: Checked, acl_filter: AclFilter) -> list[AclBinding]:
    response = checked(
        "DescribeAcls", pb.DescribeAclsRequest(filter=acl_filter_to_proto(acl_filter))
    )
    return [acl_binding_from_proto(m) for m in response.acls]


def delete_acls(checked: Checked, filters: Iterable[AclFilter]) -> dict[AclFilter, AclDeleteResult]:
    wanted = list(filters)
    request = pb.DeleteAclsRequest(filters=[acl_filter_to_proto(f) for f in wanted])
    response = checked("DeleteAcls", request)
    return {
        f: AclDeleteResult(
            _item_error(r.error_code, r.error_message),
            tuple(acl_binding_from_proto(m) for m in r.matching_acls),
        )
        for f, r in zip(wanted, response.filter_results, strict=True)
    }


def alter_user_scram_credentials(
    checked: Checked,
    upsertions: Iterable[UserScramCredentialUpsertion],
    deletions: Iterable[UserScramCredentialDeletion],
) -> dict[str, KafkaError | None]:
    request = pb.AlterUserScramCredentialsRequest(
        upsertions=[u.to_proto() for u in upsertions],
        deletions=[
            pb.ScramCredentialDeletion(name=d.user, mechanism=int(d.mechanism)) for d in deletions
        ],
    )
    response = checked("AlterUserScramCredentials", request)
    return {r.user: _item_error(r.error_code, r.error_message) for r in response.results}


def describe_user_scram_credentials(
    checked: Checked, users: Iterable[str] | None
) -> dict[str, tuple[ScramCredentialInfo, ...]]:
    request = pb.DescribeUserScramCredentialsRequest(users=list(users or ()))
    response = checked("DescribeUserScramCredentials", request)
    out: dict[str, tuple[ScramCredentialInfo, ...]] = {}
    for r in response.results:
        error = _item_error(r.error_code, r.error_message)
        if error is not None:
            raise error
        out[r.user] = tuple(
            ScramCredentialInfo(ScramMechanism(c.mechanism), c.iterations)
            for c in r.credential_infos
        )
    return out
