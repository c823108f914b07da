"""What each broker request needs, as Kafka's KafkaApis asks its authorizer (issue 28).

The servicers (BrokerServicer, GroupCoordinator, TransactionServicer) call these small functions
before they touch state; the answer comes from the node's `AccessControl` over its own image,
for the session the listener set (`current_session()`). Kafka's rules, per request:

- a partition-level API (Produce, Fetch, ListOffsets, DescribeProducers, offset commits) answers
  each topic it may not use with TOPIC_AUTHORIZATION_FAILED and serves the others;
- an inter-broker API (a follower's Fetch, WriteTxnMarkers) needs CLUSTER_ACTION on the cluster;
- a listing (Metadata for all topics, ListGroups, ListTransactions) silently leaves out what the
  principal may not DESCRIBE, so that it learns nothing of it;
- a group API needs READ on the group (DESCRIBE to describe or find it, DELETE to delete it),
  a transactional one WRITE on the transactional id.

A denial is audited by `AccessControl` with its resource (``raftlog.audit``).
"""

from __future__ import annotations

from collections.abc import Iterable

from metadata_quorum.security.acl import CLUSTER_NAME, AclOperation, ResourceType
from metadata_quorum.security.authorization import AccessControl
from raftlog.errors import ErrorCode, KafkaError

TOPIC = ResourceType.TOPIC
GROUP = ResourceType.GROUP
CLUSTER = ResourceType.CLUSTER
TRANSACTIONAL_ID = ResourceType.TRANSACTIONAL_ID


# What each resource type's ACLs may name (Kafka's AclEntry.supportedOperations): the bits of
# an "authorized operations" field (Metadata, DescribeCluster, DescribeGroups, ...)
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[AclOperation, ...]] = {
    TOPIC: (
        AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DESCRIBE,
        AclOperation.DELETE, AclOperation.ALTER, AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    ),
    GROUP: (AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE),
    CLUSTER: (
        AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER,
        AclOperation.DESCRIBE,
    ),
    TRANSACTIONAL_ID: (AclOperation.DESCRIBE, AclOperation.WRITE),
}  # fmt: skip
# Kafka's value when a request did not ask for the authorized operations
NOT_REQUESTED = -(2**31)


def authorized_operations(
    access: AccessControl, resource_type: ResourceType, name: str, requested: bool = True
) -> int:
    """Kafka's authorized-operations bit field (bit n: the operation with code n): what the
    session may do on the resource, every supported operation without an authorizer; asked
    silently (no audit line per operation). NOT_REQUESTED when not ``requested``."""
    if not requested:
        return NOT_REQUESTED
    bits = 0
    for operation in SUPPORTED_OPERATIONS[resource_type]:
        if access.allowed(operation, resource_type, name, log_denial=False):
            bits |= 1 << operation
    return bits


def denied_topics(
    access: AccessControl, operation: AclOperation, names: Iterable[str]
) -> frozenset[str]:
    """The topics among ``names`` the session may not ``operation`` (each asked, and a denial
    audited, once)."""
    if not access.enabled:
        return frozenset()
    return frozenset(n for n in set(names) if not access.allowed(operation, TOPIC, n))


def topic_denied(operation: AclOperation, topic: str) -> KafkaError:
    return KafkaError(
        ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"not authorized to {operation.name} topic {topic!r}"
    )


def cluster_action_denied(access: AccessControl, what: str) -> KafkaError | None:
    """Inter-broker requests (a follower's Fetch, WriteTxnMarkers): CLUSTER_ACTION on the
    cluster, which the nodes' principals hold (super users); None when allowed."""
    if access.allowed(AclOperation.CLUSTER_ACTION, CLUSTER, CLUSTER_NAME):
        return None
    return KafkaError(
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
        f"{what} is an inter-broker request: it needs CLUSTER_ACTION on the cluster",
    )


def transactional_id_denied(
    access: AccessControl, transactional_id: str, operation: AclOperation = AclOperation.WRITE
) -> KafkaError | None:
    if access.allowed(operation, TRANSACTIONAL_ID, transactional_id):
        return None
    return KafkaError(
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        f"not authorized to {operation.name} transactional id {transactional_id!r}",
    )


def idempotent_write_denied(access: AccessControl) -> KafkaError | None:
    """InitProducerId without a transactional id: IDEMPOTENT_WRITE on the cluster, or WRITE on
    some topic (KIP-679: an idempotent producer needs no more than a plain one)."""
    if access.allowed(AclOperation.IDEMPOTENT_WRITE, CLUSTER, CLUSTER_NAME, log_denial=False):
        return None
    if access.allowed_any(AclOperation.WRITE, TOPIC):
        return None
    access.allowed(AclOperation.IDEMPOTENT_WRITE, CLUSTER, CLUSTER_NAME)  # audits the denial
    return KafkaError(
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
        "an idempotent producer needs IDEMPOTENT_WRITE on the cluster or WRITE on a topic",
    )


def group_denied(
    access: AccessControl, group_id: str, operation: AclOperation = AclOperation.READ
) -> KafkaError | None:
    if access.allowed(operation, GROUP, group_id):
        return None
    return KafkaError(
        ErrorCode.GROUP_AUTHORIZATION_FAILED,
        f"not authorized to {operation.name} group {group_id!r}",
    )


def check_group(
    access: AccessControl, group_id: str, operation: AclOperation = AclOperation.READ
) -> None:
    error = group_denied(access, group_id, operation)
    if error is not None:
        raise error


def described_groups(access: AccessControl, group_ids: Iterable[str]) -> list[str]:
    """ListGroups: every group with DESCRIBE on the cluster, else those the principal may
    DESCRIBE (silently, as Kafka lists)."""
    if not access.enabled or access.allowed(
        AclOperation.DESCRIBE, CLUSTER, CLUSTER_NAME, log_denial=False
    ):
        return list(group_ids)
    return access.filter(AclOperation.DESCRIBE, GROUP, group_ids)


def metadata_topics(
    access: AccessControl, names: list[str], all_topics: bool
) -> tuple[list[str], frozenset[str]]:
    """Metadata: the topics to describe and those answered TOPIC_AUTHORIZATION_FAILED. Asked
    for all topics, those not described are left out; named ones are refused (Kafka does not
    say whether they exist)."""
    if not access.enabled:
        return names, frozenset()
    if all_topics:
        return access.filter(AclOperation.DESCRIBE, TOPIC, names), frozenset()
    return names, denied_topics(access, AclOperation.DESCRIBE, names)
