"""ACLs and SCRAM credentials as metadata: the controller's decisions (pure).

Kafka's AclControlManager and ScramControlManager: each request becomes records
(``AccessControlEntryRecord``, ``RemoveAccessControlEntryRecord``, ``UserScramCredentialRecord``,
``RemoveUserScramCredentialRecord``) plus per-item results, computed against an image; the
controller commits the records and every node replays them into its own image, where the
authorizer and the SCRAM servers read them. The Describe calls read an image and write nothing.

Kafka's rules kept here:
- CreateAcls: each creation is validated on its own (INVALID_REQUEST with the reason); an ACL
  that exists already, or twice in one request, is a success with one record at most.
- DeleteAcls: each filter deletes the ACLs it matches and reports them; an ACL two filters match
  is reported by both and removed once. A filter with an UNKNOWN code is INVALID_REQUEST.
- AlterUserScramCredentials (KIP-554): one result per user; a user named twice in one request
  (in deletions or upsertions, whatever the mechanism) is DUPLICATE_RESOURCE and nothing of it
  changes; UNSUPPORTED_SASL_MECHANISM for an unknown mechanism; UNACCEPTABLE_CREDENTIAL for an
  empty name or salt or iterations outside [4096, 16384]; RESOURCE_NOT_FOUND for deleting a
  credential that does not exist. The request carries the salted password; only the salt,
  iterations, StoredKey and ServerKey are recorded.
- DescribeUserScramCredentials: mechanisms and iterations, never keys; no names = every user;
  an unknown user is RESOURCE_NOT_FOUND, a user named twice DUPLICATE_RESOURCE.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from metadata_quorum.image import MetadataImage
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
from metadata_quorum.security.authorization import audit_change
from metadata_quorum.security.scram import ScramMechanism, credential_from_salted_password
from raftlog.errors import ErrorCode, KafkaError


@dataclass(frozen=True)
class Outcome:
    """One item's result: NONE or an error with its message."""

    error: ErrorCode = ErrorCode.NONE
    message: str = ""


@dataclass(frozen=True)
class AclDeletion:
    """One DeleteAcls filter's result: the ACLs it deleted, or its error."""

    outcome: Outcome
    deleted: tuple[AclBinding, ...] = ()


@dataclass(frozen=True)
class ScramUpsertion:
    name: str
    mechanism: int  # Kafka's code, as the request carries it (0 = UNKNOWN)
    iterations: int
    salt: bytes
    salted_password: bytes


@dataclass(frozen=True)
class ScramDeletion:
    name: str
    mechanism: int


@dataclass(frozen=True)
class UserOutcome:
    user: str
    outcome: Outcome


@dataclass(frozen=True)
class UserCredentials:
    """DescribeUserScramCredentials of one user: (mechanism, iterations) pairs, or its error."""

    user: str
    outcome: Outcome
    credentials: tuple[tuple[ScramMechanism, int], ...] = ()


def _code(enum_type: type, value: int) -> object:
    """Kafka's code as the enum, UNKNOWN (0) for a code this version does not know."""
    try:
        return enum_type(value)
    except ValueError:
        return enum_type(0)


def acl_binding(
    resource_type: int, resource_name: str, pattern_type: int, principal: str, host: str,
    operation: int, permission: int,
) -> AclBinding:  # fmt: skip
    """A binding from the wire's codes (unknown codes become UNKNOWN, which validate refuses)."""
    return AclBinding(
        _code(ResourceType, resource_type),  # type: ignore[arg-type]
        resource_name,
        _code(PatternType, pattern_type),  # type: ignore[arg-type]
        principal,
        host,
        _code(AclOperation, operation),  # type: ignore[arg-type]
        _code(PermissionType, permission),  # type: ignore[arg-type]
    )


def acl_filter(
    resource_type: int, resource_name: str | None, pattern_type: int, principal: str | None,
    host: str | None, operation: int, permission: int,
) -> AclFilter:  # fmt: skip
    return AclFilter(
        _code(ResourceType, resource_type),  # type: ignore[arg-type]
        resource_name,
        _code(PatternType, pattern_type),  # type: ignore[arg-type]
        principal,
        host,
        _code(AclOperation, operation),  # type: ignore[arg-type]
        _code(PermissionType, permission),  # type: ignore[arg-type]
    )


def validate_filter(acl: AclFilter) -> None:
    """Kafka refuses a filter with an UNKNOWN code (INVALID_REQUEST)."""
    for name, value in (
        ("resource type", acl.resource_type),
        ("pattern type", acl.pattern_type),
        ("operation", acl.operation),
        ("permission type", acl.permission),
    ):
        if value == 0:
            raise KafkaError(ErrorCode.INVALID_REQUEST, f"the filter's {name} is unknown")


# -- ACLs ------------------------------------------------------------------------------------------
def generate_create_acls(
    image: MetadataImage, bindings: Sequence[AclBinding]
) -> tuple[list[MetadataRecord], list[Outcome]]:
    records: list[MetadataRecord] = []
    results: list[Outcome] = []
    added: set[AclBinding] = set()
    for binding in bindings:
        try:
            binding.validate()
        except ValueError as error:
            results.append(Outcome(ErrorCode.INVALID_REQUEST, str(error)))
            continue
        if binding not in image.acls and binding not in added:
            added.add(binding)
            records.append(AccessControlEntryRecord(binding))
        results.append(Outcome())
    return records, results


def generate_delete_acls(
    image: MetadataImage, filters: Sequence[AclFilter]
) -> tuple[list[MetadataRecord], list[AclDeletion]]:
    removed: set[AclBinding] = set()
    results: list[AclDeletion] = []
    for acl in filters:
        try:
            validate_filter(acl)
        except KafkaError as error:
            results.append(AclDeletion(Outcome(error.error, error.message)))
            continue
        matches = tuple(sorted(b for b in image.acls if acl.matches(b)))
        removed.update(matches)
        results.append(AclDeletion(Outcome(), matches))
    records: list[MetadataRecord] = [RemoveAccessControlEntryRecord(b) for b in sorted(removed)]
    return records, results


def describe_acls(image: MetadataImage, acl: AclFilter) -> list[AclBinding]:
    validate_filter(acl)
    return sorted(b for b in image.acls if acl.matches(b))


def audit_acl_records(records: Sequence[MetadataRecord]) -> None:
    """One audit line per committed ACL change, with who made it."""
    for record in records:
        if isinstance(record, AccessControlEntryRecord):
            audit_change(f"CreateAcls {record.binding}")
        elif isinstance(record, RemoveAccessControlEntryRecord):
            audit_change(f"DeleteAcls {record.binding}")


# -- SCRAM credentials -----------------------------------------------------------------------------
def _mechanism(code: int) -> ScramMechanism:
    if code not in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512):
        raise KafkaError(ErrorCode.UNSUPPORTED_SASL_MECHANISM, f"unknown SCRAM mechanism {code}")
    return ScramMechanism(code)


def _check_name(name: str) -> None:
    if not name:
        raise KafkaError(ErrorCode.UNACCEPTABLE_CREDENTIAL, "the user name is empty")


def _validate_deletion(image: MetadataImage, deletion: ScramDeletion) -> ScramMechanism:
    _check_name(deletion.name)
    mechanism = _mechanism(deletion.mechanism)
    if image.scram_credential(deletion.name, mechanism) is None:
        raise KafkaError(
            ErrorCode.RESOURCE_NOT_FOUND,
            f"user {deletion.name!r} has no {mechanism.mechanism_name} credential to delete",
        )
    return mechanism


def _validate_upsertion(upsertion: ScramUpsertion) -> ScramMechanism:
    _check_name(upsertion.name)
    mechanism = _mechanism(upsertion.mechanism)
    if not mechanism.min_iterations <= upsertion.iterations <= mechanism.max_iterations:
        raise KafkaError(
            ErrorCode.UNACCEPTABLE_CREDENTIAL,
            f"{upsertion.iterations} iterations: {mechanism.mechanism_name} takes "
            f"{mechanism.min_iterations} to {mechanism.max_iterations}",
        )
    if not upsertion.salt:
        raise KafkaError(ErrorCode.UNACCEPTABLE_CREDENTIAL, "the salt is empty")
    if not upsertion.salted_password:
        raise KafkaError(ErrorCode.UNACCEPTABLE_CREDENTIAL, "the salted password is empty")
    return mechanism


def _duplicates(names: Sequence[str]) -> set[str]:
    seen: set[str] = set()
    twice: set[str] = set()
    for name in names:
        (twice if name in seen else seen).add(name)
    return twice


def generate_alter_user_scram_credentials(
    image: MetadataImage,
    deletions: Sequence[ScramDeletion],
    upsertions: Sequence[ScramUpsertion],
) -> tuple[list[MetadataRecord], list[UserOutcome]]:
    """Deletions first, then upsertions, one result per user in the order first named."""
    twice = _duplicates([d.name for d in deletions] + [u.name for u in upsertions])
    records: list[MetadataRecord] = []
    results: dict[str, Outcome] = {}
    items: list[ScramDeletion | ScramUpsertion] = [*deletions, *upsertions]
    for item in items:
        if item.name in results:
            continue
        if item.name in twice:
            results[item.name] = Outcome(
                ErrorCode.DUPLICATE_RESOURCE,
                "a user's credentials cannot be altered twice in the same request",
            )
            continue
        try:
            records.append(_credential_record(image, item))
        except KafkaError as error:
            results[item.name] = Outcome(error.error, error.message)
            continue
        results[item.name] = Outcome()
    return records, [UserOutcome(user, outcome) for user, outcome in results.items()]


def _credential_record(
    image: MetadataImage, item: ScramDeletion | ScramUpsertion
) -> MetadataRecord:
    if isinstance(item, ScramDeletion):
        return RemoveUserScramCredentialRecord(item.name, _validate_deletion(image, item))
    mechanism = _validate_upsertion(item)
    credential = credential_from_salted_password(
        mechanism, item.salt, item.salted_password, item.iterations
    )
    return UserScramCredentialRecord(item.name, credential)


def describe_user_scram_credentials(
    image: MetadataImage, users: Sequence[str]
) -> list[UserCredentials]:
    """Empty `users`: every user that has a credential."""
    names = list(users) or sorted(image.scram_credentials)
    twice = _duplicates(names)
    out: list[UserCredentials] = []
    for name in dict.fromkeys(names):
        if name in twice:
            message = "a user cannot be described twice in one request"
            out.append(UserCredentials(name, Outcome(ErrorCode.DUPLICATE_RESOURCE, message)))
            continue
        credentials = image.scram_credentials.get(name)
        if not credentials:
            message = f"user {name!r} has no SCRAM credential"
            out.append(UserCredentials(name, Outcome(ErrorCode.RESOURCE_NOT_FOUND, message)))
            continue
        infos = tuple((m, c.iterations) for m, c in sorted(credentials.items()))
        out.append(UserCredentials(name, Outcome(), infos))
    return out


def audit_scram_records(records: Sequence[MetadataRecord]) -> None:
    for record in records:
        if isinstance(record, UserScramCredentialRecord):
            c = record.credential
            audit_change(
                f"AlterUserScramCredentials upsert user={record.name} "
                f"mechanism={c.mechanism.mechanism_name} iterations={c.iterations}"
            )
        elif isinstance(record, RemoveUserScramCredentialRecord):
            audit_change(
                f"AlterUserScramCredentials delete user={record.name} "
                f"mechanism={record.mechanism.mechanism_name}"
            )
