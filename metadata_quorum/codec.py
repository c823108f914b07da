"""Metadata records and snapshots to and from their protobuf bytes.

The only module of the quorum's core that touches the generated record classes; the rest works
on the dataclasses of ``metadata_quorum.records``. Every record is written with its current
version; a record of a newer version than this code knows is refused rather than half-read.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence

from google.protobuf.message import DecodeError

from metadata_quorum.image import BrokerRegistration, MetadataImage, from_records, to_records
from metadata_quorum.records import (
    AccessControlEntryRecord,
    BrokerRegistrationChange,
    ConfigRecord,
    ConfigResourceType,
    ControllerVoter,
    CordonBroker,
    Endpoint,
    FeatureLevelRecord,
    FenceBroker,
    LeaderChange,
    MetadataRecord,
    PartitionChange,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBroker,
    RemoveAccessControlEntryRecord,
    RemoveTopic,
    RemoveUserScramCredentialRecord,
    TopicRecord,
    UnfenceBroker,
    UnregisterBroker,
    UserScramCredentialRecord,
    VotersRecord,
)
from metadata_quorum.security.acl import (
    AclBinding,
    AclFilter,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)
from metadata_quorum.security.scram import ScramCredential, ScramMechanism
from protos import controller_pb2 as cpb
from protos import metadata_pb2 as pb

RECORD_VERSION = 1
SNAPSHOT_VERSION = 1


class CodecError(ValueError):
    """Bytes that are not a metadata record batch or snapshot this code can read."""


def endpoint_to_proto(endpoint: Endpoint) -> pb.Endpoint:
    return pb.Endpoint(name=endpoint.name, host=endpoint.host, port=endpoint.port)


def endpoint_from_proto(message: pb.Endpoint) -> Endpoint:
    return Endpoint(message.name, message.host, message.port)


def _uuid(raw: bytes) -> uuid.UUID:
    if len(raw) != 16:
        raise CodecError(f"a topic id has 16 bytes, not {len(raw)}")
    return uuid.UUID(bytes=raw)


def record_to_proto(record: MetadataRecord) -> pb.MetadataRecord:
    v = RECORD_VERSION
    match record:
        case RegisterBroker():
            return pb.MetadataRecord(
                register_broker=pb.RegisterBrokerRecord(
                    version=v,
                    broker_id=record.broker_id,
                    incarnation_id=record.incarnation_id,
                    endpoints=[endpoint_to_proto(e) for e in record.endpoints],
                    rack=record.rack or "",
                    static_configs=dict(record.static_configs),
                )
            )
        case UnregisterBroker():
            return pb.MetadataRecord(
                unregister_broker=pb.UnregisterBrokerRecord(
                    version=v, broker_id=record.broker_id, broker_epoch=record.broker_epoch
                )
            )
        case FenceBroker():
            return pb.MetadataRecord(
                fence_broker=pb.FenceBrokerRecord(
                    version=v, broker_id=record.broker_id, broker_epoch=record.broker_epoch
                )
            )
        case UnfenceBroker():
            return pb.MetadataRecord(
                unfence_broker=pb.UnfenceBrokerRecord(
                    version=v, broker_id=record.broker_id, broker_epoch=record.broker_epoch
                )
            )
        case BrokerRegistrationChange():
            return pb.MetadataRecord(
                broker_registration_change=pb.BrokerRegistrationChangeRecord(
                    version=v,
                    broker_id=record.broker_id,
                    broker_epoch=record.broker_epoch,
                    in_controlled_shutdown=record.in_controlled_shutdown,
                )
            )
        case CordonBroker():
            return pb.MetadataRecord(
                cordon_broker=pb.CordonBrokerRecord(
                    version=v, broker_id=record.broker_id, cordoned=record.cordoned
                )
            )
        case TopicRecord():
            return pb.MetadataRecord(
                topic=pb.TopicRecord(version=v, name=record.name, topic_id=record.topic_id.bytes)
            )
        case PartitionRecord():
            return pb.MetadataRecord(partition=_partition_to_proto(record))
        case PartitionChange():
            return pb.MetadataRecord(partition_change=_partition_change_to_proto(record))
        case RemoveTopic():
            return pb.MetadataRecord(
                remove_topic=pb.RemoveTopicRecord(version=v, topic_id=record.topic_id.bytes)
            )
        case ConfigRecord():
            config = pb.ConfigRecord(
                version=v,
                resource_type=pb.ConfigResourceType.ValueType(int(record.resource_type)),
                resource_name=record.resource_name,
                name=record.name,
            )
            if record.value is not None:
                config.value = record.value
            return pb.MetadataRecord(config=config)
        case ProducerIdsRecord():
            return pb.MetadataRecord(
                producer_ids=pb.ProducerIdsRecord(
                    version=v,
                    broker_id=record.broker_id,
                    broker_epoch=record.broker_epoch,
                    next_producer_id=record.next_producer_id,
                )
            )
        case LeaderChange():
            return pb.MetadataRecord(
                leader_change=pb.LeaderChangeRecord(
                    version=v, leader_id=record.leader_id, term=record.term
                )
            )
        case VotersRecord():
            voters = [voter_to_proto(voter) for voter in record.voters]
            return pb.MetadataRecord(voters=pb.VotersRecord(version=v, voters=voters))
        case AccessControlEntryRecord() | RemoveAccessControlEntryRecord():
            return _acl_record_to_proto(record)
        case UserScramCredentialRecord():
            c = record.credential
            return pb.MetadataRecord(
                user_scram_credential=pb.UserScramCredentialRecord(
                    version=v,
                    name=record.name,
                    mechanism=int(c.mechanism),
                    salt=c.salt,
                    stored_key=c.stored_key,
                    server_key=c.server_key,
                    iterations=c.iterations,
                )
            )
        case RemoveUserScramCredentialRecord():
            return pb.MetadataRecord(
                remove_user_scram_credential=pb.RemoveUserScramCredentialRecord(
                    version=v, name=record.name, mechanism=int(record.mechanism)
                )
            )
        case FeatureLevelRecord():
            return pb.MetadataRecord(
                feature_level=pb.FeatureLevelRecord(
                    version=v, name=record.name, feature_level=record.feature_level
                )
            )
    raise AssertionError(f"exhaustive dispatch: unknown record type {type(record).__name__}")


def acl_binding_to_proto(binding: AclBinding) -> pb.AclBindingEntry:
    return pb.AclBindingEntry(
        resource_type=int(binding.resource_type),
        resource_name=binding.resource_name,
        pattern_type=int(binding.pattern_type),
        principal=binding.principal,
        host=binding.host,
        operation=int(binding.operation),
        permission_type=int(binding.permission),
    )


def acl_filter_to_proto(acl: AclFilter) -> cpb.AclFilter:
    """DescribeAcls' and DeleteAcls' filter; None fields stay unset (they match anything)."""
    message = cpb.AclFilter(
        resource_type=int(acl.resource_type),
        pattern_type=int(acl.pattern_type),
        operation=int(acl.operation),
        permission_type=int(acl.permission),
    )
    for name in ("resource_name", "principal", "host"):
        value = getattr(acl, name)
        if value is not None:
            setattr(message, name, value)
    return message


def acl_binding_from_proto(m: pb.AclBindingEntry) -> AclBinding:
    try:
        return AclBinding(
            ResourceType(m.resource_type),
            m.resource_name,
            PatternType(m.pattern_type),
            m.principal,
            m.host,
            AclOperation(m.operation),
            PermissionType(m.permission_type),
        )
    except ValueError as error:
        raise CodecError(f"an ACL with an unknown code: {error}") from error


def _acl_record_to_proto(
    record: AccessControlEntryRecord | RemoveAccessControlEntryRecord,
) -> pb.MetadataRecord:
    binding = acl_binding_to_proto(record.binding)
    if isinstance(record, AccessControlEntryRecord):
        return pb.MetadataRecord(
            access_control_entry=pb.AccessControlEntryRecord(
                version=RECORD_VERSION, binding=binding
            )
        )
    return pb.MetadataRecord(
        remove_access_control_entry=pb.RemoveAccessControlEntryRecord(
            version=RECORD_VERSION, binding=binding
        )
    )


def _mechanism(code: int) -> ScramMechanism:
    if code not in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512):
        raise CodecError(f"unknown SCRAM mechanism {code}")
    return ScramMechanism(code)


def _from_scram(m: pb.UserScramCredentialRecord) -> MetadataRecord:
    credential = ScramCredential(
        _mechanism(m.mechanism), m.salt, m.stored_key, m.server_key, m.iterations
    )
    return UserScramCredentialRecord(m.name, credential)


def voter_to_proto(voter: ControllerVoter) -> pb.ControllerVoter:
    return pb.ControllerVoter(
        node_id=voter.node_id, host=voter.host, port=voter.port, raft_port=voter.raft_port
    )


def voter_from_proto(message: pb.ControllerVoter) -> ControllerVoter:
    return ControllerVoter(message.node_id, message.host, message.port, message.raft_port)


def _partition_to_proto(record: PartitionRecord) -> pb.PartitionRecord:
    return pb.PartitionRecord(
        version=RECORD_VERSION,
        topic_id=record.topic_id.bytes,
        partition_id=record.partition_id,
        replicas=list(record.replicas),
        isr=list(record.isr),
        leader=record.leader,
        leader_epoch=record.leader_epoch,
        partition_epoch=record.partition_epoch,
        adding_replicas=list(record.adding_replicas),
        removing_replicas=list(record.removing_replicas),
        eligible_leader_replicas=list(record.elr),
        last_known_elr=list(record.last_known_elr),
    )


def _partition_change_to_proto(record: PartitionChange) -> pb.PartitionChangeRecord:
    message = pb.PartitionChangeRecord(
        version=RECORD_VERSION,
        topic_id=record.topic_id.bytes,
        partition_id=record.partition_id,
        expected_partition_epoch=record.expected_partition_epoch,
    )
    if record.leader is not None:
        message.leader = record.leader
    if record.isr is not None:
        message.isr.values.extend(record.isr)
        message.isr.SetInParent()
    fields = (
        ("replicas", "replicas"),
        ("adding_replicas", "adding_replicas"),
        ("removing_replicas", "removing_replicas"),
        ("elr", "eligible_leader_replicas"),
        ("last_known_elr", "last_known_elr"),
    )
    for name, proto_name in fields:
        values: tuple[int, ...] | None = getattr(record, name)
        if values is not None:
            field = getattr(message, proto_name)
            field.values.extend(values)
            field.SetInParent()
    return message


def _from_register(m: pb.RegisterBrokerRecord) -> MetadataRecord:
    endpoints = tuple(endpoint_from_proto(e) for e in m.endpoints)
    static_configs = tuple(sorted(m.static_configs.items()))
    return RegisterBroker(m.broker_id, m.incarnation_id, endpoints, m.rack or None, static_configs)


def _from_partition(m: pb.PartitionRecord) -> MetadataRecord:
    return PartitionRecord(
        _uuid(m.topic_id),
        m.partition_id,
        tuple(m.replicas),
        tuple(m.isr),
        m.leader,
        m.leader_epoch,
        m.partition_epoch,
        tuple(m.adding_replicas),
        tuple(m.removing_replicas),
        tuple(m.eligible_leader_replicas),
        tuple(m.last_known_elr),
    )


def _from_partition_change(m: pb.PartitionChangeRecord) -> MetadataRecord:
    return PartitionChange(
        _uuid(m.topic_id),
        m.partition_id,
        m.expected_partition_epoch,
        leader=m.leader if m.HasField("leader") else None,
        isr=tuple(m.isr.values) if m.HasField("isr") else None,
        replicas=tuple(m.replicas.values) if m.HasField("replicas") else None,
        adding_replicas=(
            tuple(m.adding_replicas.values) if m.HasField("adding_replicas") else None
        ),
        removing_replicas=(
            tuple(m.removing_replicas.values) if m.HasField("removing_replicas") else None
        ),
        elr=(
            tuple(m.eligible_leader_replicas.values)
            if m.HasField("eligible_leader_replicas")
            else None
        ),
        last_known_elr=(tuple(m.last_known_elr.values) if m.HasField("last_known_elr") else None),
    )


def _from_config(m: pb.ConfigRecord) -> MetadataRecord:
    try:
        resource_type = ConfigResourceType(m.resource_type)
    except ValueError as error:
        raise CodecError(f"unknown config resource type {m.resource_type}") from error
    value = m.value if m.HasField("value") else None
    return ConfigRecord(resource_type, m.resource_name, m.name, value)


_DECODERS: dict[str, Callable[[pb.MetadataRecord], MetadataRecord]] = {
    "register_broker": lambda m: _from_register(m.register_broker),
    "unregister_broker": lambda m: UnregisterBroker(
        m.unregister_broker.broker_id, m.unregister_broker.broker_epoch
    ),
    "fence_broker": lambda m: FenceBroker(m.fence_broker.broker_id, m.fence_broker.broker_epoch),
    "unfence_broker": lambda m: UnfenceBroker(
        m.unfence_broker.broker_id, m.unfence_broker.broker_epoch
    ),
    "broker_registration_change": lambda m: BrokerRegistrationChange(
        m.broker_registration_change.broker_id,
        m.broker_registration_change.broker_epoch,
        m.broker_registration_change.in_controlled_shutdown,
    ),
    "cordon_broker": lambda m: CordonBroker(m.cordon_broker.broker_id, m.cordon_broker.cordoned),
    "topic": lambda m: TopicRecord(m.topic.name, _uuid(m.topic.topic_id)),
    "partition": lambda m: _from_partition(m.partition),
    "partition_change": lambda m: _from_partition_change(m.partition_change),
    "remove_topic": lambda m: RemoveTopic(_uuid(m.remove_topic.topic_id)),
    "config": lambda m: _from_config(m.config),
    "producer_ids": lambda m: ProducerIdsRecord(
        m.producer_ids.broker_id, m.producer_ids.broker_epoch, m.producer_ids.next_producer_id
    ),
    "leader_change": lambda m: LeaderChange(m.leader_change.leader_id, m.leader_change.term),
    "voters": lambda m: VotersRecord(tuple(voter_from_proto(v) for v in m.voters.voters)),
    "access_control_entry": lambda m: AccessControlEntryRecord(
        acl_binding_from_proto(m.access_control_entry.binding)
    ),
    "remove_access_control_entry": lambda m: RemoveAccessControlEntryRecord(
        acl_binding_from_proto(m.remove_access_control_entry.binding)
    ),
    "user_scram_credential": lambda m: _from_scram(m.user_scram_credential),
    "remove_user_scram_credential": lambda m: RemoveUserScramCredentialRecord(
        m.remove_user_scram_credential.name,
        _mechanism(m.remove_user_scram_credential.mechanism),
    ),
    "feature_level": lambda m: FeatureLevelRecord(
        m.feature_level.name, m.feature_level.feature_level
    ),
}


def record_from_proto(message: pb.MetadataRecord) -> MetadataRecord:
    kind = message.WhichOneof("record")
    if kind is None:
        raise CodecError("a metadata record with no type (written by a newer version?)")
    version = getattr(message, kind).version
    if version < 1:  # every writer sets it; 0 = absent, i.e. not a record of ours
        raise CodecError(f"{kind} record without a version")
    if version > RECORD_VERSION:
        raise CodecError(f"{kind} record version {version} is newer than {RECORD_VERSION}")
    return _DECODERS[kind](message)


def encode_batch(records: Sequence[MetadataRecord]) -> bytes:
    """One Raft entry's payload."""
    batch = pb.MetadataRecordBatch(records=[record_to_proto(r) for r in records])
    return batch.SerializeToString()


def decode_batch(payload: bytes) -> list[MetadataRecord]:
    batch = pb.MetadataRecordBatch()
    try:
        batch.ParseFromString(payload)
    except DecodeError as error:
        raise CodecError(f"not a metadata record batch: {error}") from error
    return [record_from_proto(m) for m in batch.records]


def _broker_to_proto(broker: BrokerRegistration) -> pb.BrokerSnapshotRecord:
    return pb.BrokerSnapshotRecord(
        broker_id=broker.broker_id,
        incarnation_id=broker.incarnation_id,
        broker_epoch=broker.broker_epoch,
        endpoints=[endpoint_to_proto(e) for e in broker.endpoints],
        rack=broker.rack or "",
        fenced=broker.fenced,
        in_controlled_shutdown=broker.in_controlled_shutdown,
        cordoned=broker.cordoned,
        static_configs=dict(broker.static_configs),
    )


def _broker_from_proto(m: pb.BrokerSnapshotRecord) -> BrokerRegistration:
    return BrokerRegistration(
        broker_id=m.broker_id,
        incarnation_id=m.incarnation_id,
        broker_epoch=m.broker_epoch,
        endpoints=tuple(endpoint_from_proto(e) for e in m.endpoints),
        rack=m.rack or None,
        fenced=m.fenced,
        in_controlled_shutdown=m.in_controlled_shutdown,
        cordoned=m.cordoned,
        static_configs=tuple(sorted(m.static_configs.items())),
    )


def snapshot_to_proto(image: MetadataImage) -> pb.MetadataSnapshot:
    brokers, records = to_records(image)
    return pb.MetadataSnapshot(
        version=SNAPSHOT_VERSION,
        offset=image.offset,
        brokers=[_broker_to_proto(b) for b in brokers],
        records=[record_to_proto(r) for r in records],
        next_producer_id=image.next_producer_id,
    )


def snapshot_from_proto(message: pb.MetadataSnapshot) -> MetadataImage:
    if message.version < 1:  # every writer sets it; 0 = absent, i.e. not a snapshot of ours
        raise CodecError("a metadata snapshot without a version")
    if message.version > SNAPSHOT_VERSION:
        raise CodecError(f"snapshot version {message.version} is newer than {SNAPSHOT_VERSION}")
    return from_records(
        message.offset,
        [_broker_from_proto(b) for b in message.brokers],
        [record_from_proto(r) for r in message.records],
        message.next_producer_id,
    )


def encode_snapshot(image: MetadataImage) -> bytes:
    return snapshot_to_proto(image).SerializeToString()


def decode_snapshot(data: bytes) -> MetadataImage:
    message = pb.MetadataSnapshot()
    try:
        message.ParseFromString(data)
    except DecodeError as error:
        raise CodecError(f"not a metadata snapshot: {error}") from error
    return snapshot_from_proto(message)
