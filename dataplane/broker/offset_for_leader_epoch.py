"""OffsetForLeaderEpoch (Kafka API 23) for consumers (KIP-320): where an epoch ends on the leader.

After a leader change a consumer asks the new leader for the end offset of the epoch of the
last record it consumed; an end offset below its position means the log it read from was
truncated (an unclean election) and its position would skip or re-read records
(``dataplane.client._validation``). Kafka's ``KafkaApis.handleOffsetForLeaderEpochRequest``:
CLUSTER_ACTION on the cluster (the API began as an inter-broker one) or else DESCRIBE on each
topic, TOPIC_AUTHORIZATION_FAILED for the others; each partition is answered by its leader
(``Partition.end_offset_for_epoch``: FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH for a stale or
newer ``current_leader_epoch``, NOT_LEADER_OR_FOLLOWER on a follower, UNKNOWN_TOPIC_OR_PARTITION
for a partition the cluster does not have).
"""

from __future__ import annotations

from dataplane.broker import authorization as authz
from dataplane.broker.partition import NotLeader
from dataplane.broker.replica_manager import ReplicaManager
from metadata_quorum.security.acl import CLUSTER_NAME, AclOperation
from metadata_quorum.security.authorization import AccessControl
from protos import broker_pb2 as pb
from raftlog.epoch import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
from raftlog.errors import KafkaError


def answer(
    request: pb.OffsetForLeaderEpochRequest, replicas: ReplicaManager, access: AccessControl
) -> pb.OffsetForLeaderEpochResponse:
    names = [t.name for t in request.topics]
    denied: frozenset[str] = frozenset()
    # CLUSTER_ACTION asked silently (a consumer lacking it is the usual case, not a denial
    # to audit: Kafka asks with logIfDenied=false), then DESCRIBE on each topic
    if access.enabled and not access.allowed(
        AclOperation.CLUSTER_ACTION, authz.CLUSTER, CLUSTER_NAME, log_denial=False
    ):
        denied = authz.denied_topics(access, AclOperation.DESCRIBE, names)
    response = pb.OffsetForLeaderEpochResponse()
    for topic in request.topics:
        out = response.topics.add(name=topic.name)
        for item in topic.partitions:
            result = out.partitions.add(
                partition=item.partition, leader_epoch=UNDEFINED_EPOCH,
                end_offset=UNDEFINED_EPOCH_OFFSET, leader_id=-1, current_leader_epoch=-1,
            )  # fmt: skip
            try:
                if topic.name in denied:
                    raise authz.topic_denied(AclOperation.DESCRIBE, topic.name)
                partition = replicas.get(topic.name, item.partition)
                epoch, end_offset = partition.end_offset_for_epoch(
                    item.current_leader_epoch, item.leader_epoch
                )
            except KafkaError as error:
                result.error_code, result.error_message = error.error.code, error.message
                if isinstance(error, NotLeader):
                    result.leader_id = error.leader_id
                    result.current_leader_epoch = error.leader_epoch
                continue
            if end_offset != UNDEFINED_EPOCH_OFFSET:
                result.leader_epoch, result.end_offset = epoch, end_offset
    return response
