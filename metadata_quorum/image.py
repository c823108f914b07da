"""The metadata image: the cluster's state, immutable, changed only by replaying records.

``replay(image, offset, record)`` and ``apply(image, records)`` are the only mutators, and they
are pure: the same records give the same image on every node. A :class:`MetadataDelta` collects
the changes of a batch of records against a base image and builds the next image once, copying
only the topics it touched (Kafka's ``MetadataDelta`` → ``MetadataImage``).

A record whose preconditions no longer hold (a stale broker epoch, a partition epoch that moved
on, a topic that is gone) is *rejected*: the image does not change, the offset still advances, and
the reason is reported. Rejection is deterministic, so every node rejects the same records.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from metadata_quorum.records import (
    NO_LEADER,
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
from metadata_quorum.security.acl import AclBinding
from metadata_quorum.security.scram import ScramCredential, ScramMechanism

PRODUCER_ID_BLOCK_SIZE = 1000


@dataclass(frozen=True)
class BrokerRegistration:
    broker_id: int
    incarnation_id: str
    broker_epoch: int
    endpoints: tuple[Endpoint, ...]
    rack: str | None
    fenced: bool = True
    in_controlled_shutdown: bool = False
    cordoned: bool = False  # no new replicas (CordonBroker); survives re-registration
    static_configs: tuple[tuple[str, str], ...] = ()  # its config file's dynamic broker configs

    def endpoint(self, name: str) -> Endpoint | None:
        return next((e for e in self.endpoints if e.name == name), None)


@dataclass(frozen=True)
class PartitionRegistration:
    """Invariants: leader ∈ ISR ⊆ replicas (or leader = -1), epochs never go down.

    While a reassignment is in progress (KIP-455) ``replicas`` is the target replicas followed
    by the ones leaving: ``adding_replicas`` are in the target and not in the original set,
    ``removing_replicas`` in the original set and not in the target; both are subsets of
    ``replicas`` and disjoint. The reassignment completes when every target replica is in the
    ISR.

    KIP-966 (eligible.leader.replicas.version 1): while the ISR is smaller than the topic's
    min.insync.replicas, ``elr`` (eligible leader replicas) holds the replicas that left the ISR
    but still hold every committed record (the leader's high watermark does not advance under
    min ISR, so none was committed without them); one may lead when the ISR is empty.
    ``last_known_elr`` is the rest of the replicas that were in the ISR or ELR since the ISR
    dropped below min ISR (a replica that restarted uncleanly lands there): reported to
    operators, never elected automatically. Invariants: ``elr`` and ``last_known_elr`` are
    distinct subsets of ``replicas``, disjoint from each other and from the ISR."""

    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()
    elr: tuple[int, ...] = ()
    last_known_elr: tuple[int, ...] = ()

    @property
    def preferred_leader(self) -> int:
        return self.replicas[0] if self.replicas else NO_LEADER

    @property
    def reassigning(self) -> bool:
        return bool(self.adding_replicas or self.removing_replicas)

    @property
    def target_replicas(self) -> tuple[int, ...]:
        """Where the partition is going: its replicas without the ones leaving."""
        return tuple(b for b in self.replicas if b not in self.removing_replicas)

    @property
    def original_replicas(self) -> tuple[int, ...]:
        """Where the partition was before the reassignment: without the ones being added."""
        return tuple(b for b in self.replicas if b not in self.adding_replicas)


@dataclass(frozen=True)
class TopicImage:
    name: str
    topic_id: uuid.UUID
    partitions: Mapping[int, PartitionRegistration]


ConfigKey = tuple[ConfigResourceType, str]


@dataclass(frozen=True)
class MetadataImage:
    """Everything the quorum agrees on, as of metadata ``offset`` (-1 = nothing applied)."""

    offset: int = -1
    brokers: Mapping[int, BrokerRegistration] = field(default_factory=dict)
    topics: Mapping[uuid.UUID, TopicImage] = field(default_factory=dict)
    topic_ids: Mapping[str, uuid.UUID] = field(default_factory=dict)
    configs: Mapping[ConfigKey, Mapping[str, str]] = field(default_factory=dict)
    next_producer_id: int = 0
    controller_id: int = NO_LEADER
    controller_term: int = -1
    # broker id -> partitions whose first replica (preferred leader) it is; kept by replay so
    # placement never rescans every partition
    preferred_leaders: Mapping[int, int] = field(default_factory=dict)
    # the metadata quorum's voters, ordered by node id; empty until the first active controller
    # records them (until then the static controller.quorum.voters are the set)
    voters: tuple[ControllerVoter, ...] = ()
    # security (docs/security.md): the ACLs, and each user's SCRAM credentials by mechanism
    acls: frozenset[AclBinding] = frozenset()
    scram_credentials: Mapping[str, Mapping[ScramMechanism, ScramCredential]] = field(
        default_factory=dict
    )
    # finalized feature levels by feature name (metadata_quorum.features), empty until the
    # first active controller writes the bootstrap levels
    features: Mapping[str, int] = field(default_factory=dict)

    def scram_credential(self, user: str, mechanism: ScramMechanism) -> ScramCredential | None:
        return self.scram_credentials.get(user, {}).get(mechanism)

    def voter(self, node_id: int) -> ControllerVoter | None:
        return next((v for v in self.voters if v.node_id == node_id), None)

    def topic(self, name: str) -> TopicImage | None:
        topic_id = self.topic_ids.get(name)
        return None if topic_id is None else self.topics[topic_id]

    def partition(self, topic_id: uuid.UUID, partition_id: int) -> PartitionRegistration | None:
        topic = self.topics.get(topic_id)
        return None if topic is None else topic.partitions.get(partition_id)

    def unfenced_brokers(self) -> list[BrokerRegistration]:
        return [b for _, b in sorted(self.brokers.items()) if not b.fenced]

    def usable_broker_ids(self) -> set[int]:
        """Brokers that may lead: registered, unfenced, not shutting down."""
        return {
            b.broker_id
            for b in self.brokers.values()
            if not b.fenced and not b.in_controlled_shutdown
        }

    def placeable_broker_ids(self) -> set[int]:
        """Brokers that may take new replicas: usable and not cordoned."""
        return {b for b in self.usable_broker_ids() if not self.brokers[b].cordoned}

    def cordoned_broker_ids(self) -> set[int]:
        return {b.broker_id for b in self.brokers.values() if b.cordoned}

    def topic_configs(self, name: str) -> Mapping[str, str]:
        return self.configs.get((ConfigResourceType.TOPIC, name), {})


@dataclass(frozen=True)
class Rejected:
    """A record that was not applied, and why. The offset was consumed all the same."""

    offset: int
    record: MetadataRecord
    reason: str


class MetadataDelta:
    """Changes of a batch of records against ``base``; ``image()`` builds the result once."""

    def __init__(self, base: MetadataImage) -> None:
        self.base = base
        self.offset = base.offset
        self._brokers = dict(base.brokers)
        self._topic_ids = dict(base.topic_ids)
        self._topics = dict(base.topics)
        self._touched: dict[uuid.UUID, dict[int, PartitionRegistration]] = {}
        self._configs = dict(base.configs)
        self._next_producer_id = base.next_producer_id
        self._controller = (base.controller_id, base.controller_term)
        self._preferred = dict(base.preferred_leaders)
        self._voters = base.voters
        self._acls: set[AclBinding] | None = None  # copied from base on the first change
        self._scram: dict[str, Mapping[ScramMechanism, ScramCredential]] | None = None
        self._features: dict[str, int] | None = None  # copied from base on the first change
        self.rejected: list[Rejected] = []

    # -- replay --------------------------------------------------------------------------
    def replay(self, record: MetadataRecord) -> Rejected | None:
        """Apply one record at the next offset; return the rejection if it was refused."""
        self.offset += 1
        reason = self._dispatch(record)
        if reason is None:
            return None
        rejected = Rejected(self.offset, record, reason)
        self.rejected.append(rejected)
        return rejected

    def _dispatch(self, record: MetadataRecord) -> str | None:
        match record:
            case RegisterBroker():
                return self._register_broker(record)
            case UnregisterBroker():
                return self._unregister_broker(record)
            case FenceBroker():
                return self._change_broker(record.broker_id, record.broker_epoch, fenced=True)
            case UnfenceBroker():
                return self._change_broker(record.broker_id, record.broker_epoch, fenced=False)
            case BrokerRegistrationChange():
                return self._change_broker(
                    record.broker_id,
                    record.broker_epoch,
                    in_controlled_shutdown=record.in_controlled_shutdown,
                )
            case CordonBroker():
                return self._cordon_broker(record)
            case TopicRecord():
                return self._add_topic(record)
            case PartitionRecord():
                return self._add_partition(record)
            case PartitionChange():
                return self._change_partition(record)
            case RemoveTopic():
                return self._remove_topic(record)
            case ConfigRecord():
                return self._set_config(record)
            case ProducerIdsRecord():
                return self._producer_ids(record)
            case LeaderChange():
                return self._leader_change(record)
            case VotersRecord():
                return self._set_voters(record)
            case AccessControlEntryRecord() | RemoveAccessControlEntryRecord():
                return self._change_acl(record)
            case UserScramCredentialRecord() | RemoveUserScramCredentialRecord():
                return self._change_scram(record)
            case FeatureLevelRecord():
                return self._set_feature(record)
        raise AssertionError(f"exhaustive dispatch: unknown record type {type(record).__name__}")

    def _register_broker(self, record: RegisterBroker) -> str | None:
        previous = self._brokers.get(record.broker_id)
        self._brokers[record.broker_id] = BrokerRegistration(
            broker_id=record.broker_id,
            incarnation_id=record.incarnation_id,
            broker_epoch=self.offset,
            endpoints=record.endpoints,
            rack=record.rack,
            cordoned=previous is not None and previous.cordoned,  # until uncordoned
            static_configs=record.static_configs,
        )
        return None

    def _cordon_broker(self, record: CordonBroker) -> str | None:
        current = self._brokers.get(record.broker_id)
        if current is None:
            return f"broker {record.broker_id} is not registered"
        self._brokers[record.broker_id] = replace(current, cordoned=record.cordoned)
        return None

    def _unregister_broker(self, record: UnregisterBroker) -> str | None:
        current = self._brokers.get(record.broker_id)
        if current is None or current.broker_epoch != record.broker_epoch:
            return f"broker {record.broker_id} epoch {record.broker_epoch} is not registered"
        del self._brokers[record.broker_id]
        return None

    def _change_broker(
        self,
        broker_id: int,
        broker_epoch: int,
        *,
        fenced: bool | None = None,
        in_controlled_shutdown: bool | None = None,
    ) -> str | None:
        current = self._brokers.get(broker_id)
        if current is None:
            return f"broker {broker_id} is not registered"
        if current.broker_epoch != broker_epoch:
            return f"broker {broker_id} epoch is {current.broker_epoch}, not {broker_epoch}"
        changed = current
        if fenced is not None:
            changed = replace(changed, fenced=fenced)
            if not fenced:
                changed = replace(changed, in_controlled_shutdown=False)
        if in_controlled_shutdown is not None:
            changed = replace(changed, in_controlled_shutdown=in_controlled_shutdown)
        self._brokers[broker_id] = changed
        return None

    def _add_topic(self, record: TopicRecord) -> str | None:
        if record.name in self._topic_ids:
            return f"topic {record.name} already exists"
        if record.topic_id in self._topics:
            return f"topic id {record.topic_id} already exists"
        self._topic_ids[record.name] = record.topic_id
        self._topics[record.topic_id] = TopicImage(record.name, record.topic_id, {})
        self._touched[record.topic_id] = {}
        return None

    def _partitions(self, topic_id: uuid.UUID) -> dict[int, PartitionRegistration] | None:
        """The touched (copied-on-write) partition map of a topic, or None if it is unknown."""
        touched = self._touched.get(topic_id)
        if touched is not None:
            return touched
        topic = self._topics.get(topic_id)
        if topic is None:
            return None
        touched = dict(topic.partitions)
        self._touched[topic_id] = touched
        return touched

    def _add_partition(self, record: PartitionRecord) -> str | None:
        partitions = self._partitions(record.topic_id)
        if partitions is None:
            return f"topic id {record.topic_id} does not exist"
        if record.partition_id in partitions:
            return f"partition {record.topic_id}:{record.partition_id} already exists"
        problem = _check_partition(
            record.replicas, record.isr, record.leader, record.adding_replicas,
            record.removing_replicas,
        ) or _check_elr(record.replicas, record.isr, record.elr, record.last_known_elr)  # fmt: skip
        if problem:
            return problem
        partitions[record.partition_id] = PartitionRegistration(
            record.replicas, record.isr, record.leader, record.leader_epoch, record.partition_epoch,
            record.adding_replicas, record.removing_replicas, record.elr, record.last_known_elr,
        )  # fmt: skip
        self._count_preferred(record.replicas[0], 1)
        return None

    def _count_preferred(self, broker_id: int, change: int) -> None:
        count = self._preferred.get(broker_id, 0) + change
        if count < 0:
            raise AssertionError(f"preferred-leader count of broker {broker_id} went negative")
        if count:
            self._preferred[broker_id] = count
        else:
            self._preferred.pop(broker_id, None)

    def _change_partition(self, record: PartitionChange) -> str | None:
        partitions = self._partitions(record.topic_id)
        current = None if partitions is None else partitions.get(record.partition_id)
        if partitions is None or current is None:
            return f"partition {record.topic_id}:{record.partition_id} does not exist"
        if current.partition_epoch != record.expected_partition_epoch:
            return (
                f"partition epoch is {current.partition_epoch}, "
                f"not {record.expected_partition_epoch}"
            )
        replicas = current.replicas if record.replicas is None else record.replicas
        isr = current.isr if record.isr is None else record.isr
        leader = current.leader if record.leader is None else record.leader
        adding = (
            current.adding_replicas if record.adding_replicas is None else record.adding_replicas
        )
        removing = (
            current.removing_replicas if record.removing_replicas is None
            else record.removing_replicas
        )  # fmt: skip
        elr = current.elr if record.elr is None else record.elr
        last_known_elr = (
            current.last_known_elr if record.last_known_elr is None else record.last_known_elr
        )
        problem = _check_partition(replicas, isr, leader, adding, removing) or _check_elr(
            replicas, isr, elr, last_known_elr
        )
        if problem:
            return problem
        if replicas[0] != current.replicas[0]:
            self._count_preferred(current.replicas[0], -1)
            self._count_preferred(replicas[0], 1)
        # an ELR-only change bumps the partition epoch, not the leader epoch (as in Kafka)
        leader_epoch = current.leader_epoch + (1 if leader != current.leader else 0)
        partitions[record.partition_id] = PartitionRegistration(
            replicas, isr, leader, leader_epoch, current.partition_epoch + 1, adding, removing,
            elr, last_known_elr,
        )  # fmt: skip
        return None

    def _remove_topic(self, record: RemoveTopic) -> str | None:
        topic = self._topics.pop(record.topic_id, None)
        if topic is None:
            return f"topic id {record.topic_id} does not exist"
        del self._topic_ids[topic.name]
        partitions = self._touched.pop(record.topic_id, None) or topic.partitions
        for registration in partitions.values():
            self._count_preferred(registration.replicas[0], -1)
        self._configs.pop((ConfigResourceType.TOPIC, topic.name), None)
        return None

    def _set_config(self, record: ConfigRecord) -> str | None:
        key = (record.resource_type, record.resource_name)
        if record.resource_type is ConfigResourceType.TOPIC and (
            record.resource_name not in self._topic_ids
        ):
            return f"topic {record.resource_name} does not exist"
        values = dict(self._configs.get(key, {}))
        if record.value is None:
            values.pop(record.name, None)
        else:
            values[record.name] = record.value
        if values:
            self._configs[key] = values
        else:
            self._configs.pop(key, None)
        return None

    def _producer_ids(self, record: ProducerIdsRecord) -> str | None:
        broker = self._brokers.get(record.broker_id)
        if broker is None or broker.broker_epoch != record.broker_epoch:
            return f"broker {record.broker_id} epoch {record.broker_epoch} is not registered"
        if record.next_producer_id != self._next_producer_id + PRODUCER_ID_BLOCK_SIZE:
            return f"producer ids already allocated up to {self._next_producer_id}"
        self._next_producer_id = record.next_producer_id
        return None

    def _leader_change(self, record: LeaderChange) -> str | None:
        if record.term < self._controller[1]:
            return f"term {record.term} is older than {self._controller[1]}"
        self._controller = (record.leader_id, record.term)
        return None

    def _set_voters(self, record: VotersRecord) -> str | None:
        voters = record.voters
        if not voters:
            return "a quorum has at least one voter"
        if len({v.node_id for v in voters}) != len(voters):
            return f"voter ids {[v.node_id for v in voters]} are not distinct"
        addresses = [a for v in voters for a in (v.address, v.raft_address)]
        if len(set(addresses)) != len(addresses):
            return f"voter addresses {addresses} are not distinct"
        self._voters = tuple(sorted(voters, key=lambda v: v.node_id))
        return None

    def _change_acl(
        self, record: AccessControlEntryRecord | RemoveAccessControlEntryRecord
    ) -> str | None:
        if self._acls is None:
            self._acls = set(self.base.acls)
        present = record.binding in self._acls
        if isinstance(record, AccessControlEntryRecord):
            if present:
                return f"ACL {record.binding} exists"
            self._acls.add(record.binding)
        else:
            if not present:
                return f"ACL {record.binding} does not exist"
            self._acls.remove(record.binding)
        return None

    def _change_scram(
        self, record: UserScramCredentialRecord | RemoveUserScramCredentialRecord
    ) -> str | None:
        if self._scram is None:
            self._scram = dict(self.base.scram_credentials)
        credentials = dict(self._scram.get(record.name, {}))
        if isinstance(record, UserScramCredentialRecord):
            credentials[record.credential.mechanism] = record.credential
        elif credentials.pop(record.mechanism, None) is None:
            return f"user {record.name!r} has no {record.mechanism.mechanism_name} credential"
        if credentials:
            self._scram[record.name] = credentials
        else:
            self._scram.pop(record.name, None)
        return None

    def _set_feature(self, record: FeatureLevelRecord) -> str | None:
        if record.feature_level < 0:
            return f"feature {record.name} level {record.feature_level} < 0"
        if self._features is None:
            self._features = dict(self.base.features)
        self._features[record.name] = record.feature_level
        return None

    # -- result --------------------------------------------------------------------------
    def image(self) -> MetadataImage:
        topics = dict(self._topics)
        for topic_id, partitions in self._touched.items():
            topic = topics.get(topic_id)
            if topic is not None:
                topics[topic_id] = replace(topic, partitions=partitions)
        return MetadataImage(
            offset=self.offset,
            brokers=self._brokers,
            topics=topics,
            topic_ids=self._topic_ids,
            configs=self._configs,
            next_producer_id=self._next_producer_id,
            controller_id=self._controller[0],
            controller_term=self._controller[1],
            preferred_leaders=self._preferred,
            voters=self._voters,
            acls=self.base.acls if self._acls is None else frozenset(self._acls),
            scram_credentials=self.base.scram_credentials if self._scram is None else self._scram,
            features=self.base.features if self._features is None else self._features,
        )


def _check_partition(
    replicas: tuple[int, ...],
    isr: tuple[int, ...],
    leader: int,
    adding: tuple[int, ...] = (),
    removing: tuple[int, ...] = (),
) -> str | None:
    if not replicas or len(set(replicas)) != len(replicas):
        return f"replicas {list(replicas)} must be non-empty and distinct"
    if len(set(isr)) != len(isr) or not set(isr) <= set(replicas):
        return f"ISR {list(isr)} must be a distinct subset of replicas {list(replicas)}"
    if leader != NO_LEADER and leader not in isr:
        return f"leader {leader} must be in the ISR {list(isr)}"
    if not set(adding) <= set(replicas) or not set(removing) <= set(replicas):
        return f"adding {list(adding)} and removing {list(removing)} must be among the replicas"
    if set(adding) & set(removing) or len(set(removing)) == len(replicas):
        return f"adding {list(adding)} and removing {list(removing)} overlap or leave no target"
    return None


def _check_elr(
    replicas: tuple[int, ...],
    isr: tuple[int, ...],
    elr: tuple[int, ...],
    last_known_elr: tuple[int, ...],
) -> str | None:
    for name, members in (("ELR", elr), ("last known ELR", last_known_elr)):
        if len(set(members)) != len(members) or not set(members) <= set(replicas):
            return f"{name} {list(members)} must be a distinct subset of replicas {list(replicas)}"
    if set(elr) & set(isr) or set(last_known_elr) & (set(isr) | set(elr)):
        return (
            f"ISR {list(isr)}, ELR {list(elr)} and last known ELR {list(last_known_elr)} must "
            "be disjoint"
        )
    return None


def apply(
    image: MetadataImage, records: Iterable[MetadataRecord]
) -> tuple[MetadataImage, list[Rejected]]:
    """Replay records in order; return the new image and the records that were rejected."""
    delta = MetadataDelta(image)
    for record in records:
        delta.replay(record)
    return delta.image(), delta.rejected


def replay(image: MetadataImage, record: MetadataRecord) -> MetadataImage:
    """One record; the image at the next offset (unchanged but for the offset if rejected)."""
    return apply(image, [record])[0]


def to_records(image: MetadataImage) -> tuple[list[BrokerRegistration], list[MetadataRecord]]:
    """The image as broker registrations plus records that rebuild the rest (a snapshot)."""
    records: list[MetadataRecord] = []
    for topic in sorted(image.topics.values(), key=lambda t: t.name):
        records.append(TopicRecord(topic.name, topic.topic_id))
        for partition_id, p in sorted(topic.partitions.items()):
            records.append(
                PartitionRecord(
                    topic.topic_id,
                    partition_id,
                    p.replicas,
                    p.isr,
                    p.leader,
                    p.leader_epoch,
                    p.partition_epoch,
                    p.adding_replicas,
                    p.removing_replicas,
                    p.elr,
                    p.last_known_elr,
                )
            )
    for (resource_type, name), values in sorted(image.configs.items()):
        for key, value in sorted(values.items()):
            records.append(ConfigRecord(resource_type, name, key, value))
    if image.controller_term >= 0:
        records.append(LeaderChange(image.controller_id, image.controller_term))
    if image.voters:
        records.append(VotersRecord(image.voters))
    records.extend(AccessControlEntryRecord(b) for b in sorted(image.acls))
    for user, credentials in sorted(image.scram_credentials.items()):
        records.extend(UserScramCredentialRecord(user, c) for _, c in sorted(credentials.items()))
    records.extend(FeatureLevelRecord(name, lv) for name, lv in sorted(image.features.items()))
    brokers = [b for _, b in sorted(image.brokers.items())]
    return brokers, records


def from_records(
    offset: int,
    brokers: Iterable[BrokerRegistration],
    records: Iterable[MetadataRecord],
    next_producer_id: int,
) -> MetadataImage:
    """Rebuild an image from a snapshot (inverse of ``to_records``), at ``offset``."""
    base = MetadataImage(brokers={b.broker_id: b for b in brokers})
    image, rejected = apply(base, records)
    if rejected:
        raise AssertionError(f"snapshot records must replay cleanly: {rejected[0].reason}")
    return replace(image, offset=offset, next_producer_id=next_producer_id)
