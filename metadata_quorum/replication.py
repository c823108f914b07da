"""Replication control: topics, partitions, ISR changes and leader elections, as pure functions.

Each ``generate_*`` takes the image (and plain request values) and returns the records to
propose plus the per-item results to answer with. Nothing here mutates anything; the controller
shell proposes the records and replays them.
"""

from __future__ import annotations

import random
import re
import uuid
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from metadata_quorum.configs import (
    cluster_config,
    replication_config,
    validate_topic_configs,
)
from metadata_quorum.features import elr_enabled
from metadata_quorum.image import MetadataImage, PartitionRegistration, TopicImage
from metadata_quorum.placement import (
    BrokerSlot,
    Election,
    ElrPartition,
    check_assignment,
    elect,
    elect_with_elr,
    eligible_replicas,
    place_replicas,
)
from metadata_quorum.records import (
    NO_LEADER,
    ConfigRecord,
    ConfigResourceType,
    MetadataRecord,
    PartitionChange,
    PartitionRecord,
    RemoveTopic,
    TopicRecord,
)
from raftlog.errors import ErrorCode, KafkaError

MAX_TOPIC_NAME_LENGTH = 249
MAX_PARTITIONS_PER_TOPIC = 100_000
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
# Kafka's internal topics that raftlog keeps (Topic.isInternal): the group, transaction and
# share coordinators' state. Only the coordinators write them; they cannot be deleted nor grown
# (a group's or transactional id's partition is hash(id) mod the partition count).
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})


@dataclass(frozen=True)
class ItemResult:
    """The outcome for one topic / partition / resource of a request."""

    name: str
    error: ErrorCode = ErrorCode.NONE
    message: str = ""
    topic_id: uuid.UUID | None = None
    num_partitions: int = -1
    replication_factor: int = -1
    partition: int = -1
    state: PartitionRegistration | None = None


@dataclass
class Generated:
    """Records to propose and the results to answer with once they commit."""

    records: list[MetadataRecord] = field(default_factory=list)
    results: list[ItemResult] = field(default_factory=list)


@dataclass(frozen=True)
class NewTopic:
    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    assignments: Mapping[int, Sequence[int]] | None = None
    configs: Mapping[str, str] = field(default_factory=dict)


def validate_topic_name(name: str) -> None:
    if not name or name in {".", ".."}:
        raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic name {name!r} is illegal")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise KafkaError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name is {len(name)} characters, the limit is {MAX_TOPIC_NAME_LENGTH}",
        )
    if not _LEGAL_TOPIC.match(name):
        raise KafkaError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name {name!r} may contain only ASCII letters, digits, '.', '_' and '-'",
        )


def _slots(image: MetadataImage) -> list[BrokerSlot]:
    """The brokers new replicas may go to: usable and not cordoned."""
    placeable = image.placeable_broker_ids()
    return [
        BrokerSlot(b.broker_id, b.rack) for b in image.brokers.values() if b.broker_id in placeable
    ]


def check_not_cordoned(image: MetadataImage, added: Collection[int], partition: int) -> None:
    """Refuse new replicas on cordoned brokers (INVALID_REPLICA_ASSIGNMENT)."""
    cordoned = sorted(set(added) & image.cordoned_broker_ids())
    if cordoned:
        raise KafkaError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"partition {partition} would place a new replica on cordoned brokers {cordoned}: "
            "a cordoned broker takes no new replicas (raftlog cluster uncordon lifts it)",
        )


def _all_preferred_counts(image: MetadataImage) -> dict[int, int]:
    return dict(image.preferred_leaders)


def _new_partition(
    topic_id: uuid.UUID, partition_id: int, replicas: tuple[int, ...], usable: Collection[int]
) -> PartitionRecord:
    isr = tuple(b for b in replicas if b in usable)
    leader = isr[0] if isr else NO_LEADER
    return PartitionRecord(topic_id, partition_id, replicas, isr or replicas[:1], leader)


def _assign(
    image: MetadataImage,
    topic: NewTopic | None,
    count: int,
    rf: int,
    explicit: Mapping[int, Sequence[int]] | None,
    first_partition: int,
    counts: dict[int, int],
    seed: int = 0,
) -> list[tuple[int, ...]]:
    if explicit:
        wanted = set(range(first_partition, first_partition + count))
        if set(explicit) != wanted:
            raise KafkaError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"the assignment must name partitions {sorted(wanted)}, got {sorted(explicit)}",
            )
        lists = [check_assignment(explicit[p], image.brokers.keys(), p) for p in sorted(explicit)]
        for p, replicas in zip(sorted(explicit), lists, strict=True):
            check_not_cordoned(image, replicas, p)
        if any(len(replicas) != rf for replicas in lists):
            raise KafkaError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"every partition needs the topic's replication factor {rf}",
            )
        usable = image.usable_broker_ids()
        offline = [p for p in sorted(explicit) if not usable & set(explicit[p])]
        if offline:
            raise KafkaError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"every broker assigned to partitions {offline} is fenced or shutting down",
            )
    else:
        lists = place_replicas(_slots(image), count, rf, counts, first_partition, seed)
    for replicas in lists:
        counts[replicas[0]] = counts.get(replicas[0], 0) + 1
    return lists


def generate_create_topics(
    image: MetadataImage, topics: Sequence[NewTopic], validate_only: bool, rng: random.Random
) -> Generated:
    out = Generated()
    defaults = cluster_config(image)
    counts = _all_preferred_counts(image)
    names = [t.name for t in topics]
    usable = image.usable_broker_ids()
    for topic in topics:
        try:
            if names.count(topic.name) > 1:
                raise KafkaError(ErrorCode.INVALID_REQUEST, f"topic {topic.name} is listed twice")
            validate_topic_name(topic.name)
            if topic.name in image.topic_ids:
                raise KafkaError(
                    ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {topic.name} already exists"
                )
            validate_topic_configs(topic.configs)
            count, rf = _sizes(topic, defaults.num_partitions, defaults.default_replication_factor)
            seed = rng.randrange(2**30)
            lists = _assign(image, topic, count, rf, topic.assignments, 0, counts, seed)
        except KafkaError as error:
            out.results.append(ItemResult(topic.name, error.error, error.message))
            continue
        topic_id = uuid.UUID(int=rng.getrandbits(128), version=4)
        out.results.append(
            ItemResult(topic.name, topic_id=topic_id, num_partitions=count,
                       replication_factor=len(lists[0]))
        )  # fmt: skip
        if validate_only:
            continue
        out.records.append(TopicRecord(topic.name, topic_id))
        out.records.extend(
            ConfigRecord(ConfigResourceType.TOPIC, topic.name, key, value)
            for key, value in sorted(topic.configs.items())
        )
        out.records.extend(
            _new_partition(topic_id, p, replicas, usable) for p, replicas in enumerate(lists)
        )
    return out


def _sizes(topic: NewTopic, default_partitions: int, default_rf: int) -> tuple[int, int]:
    if topic.assignments:
        return len(topic.assignments), len(next(iter(topic.assignments.values())))
    count = default_partitions if topic.num_partitions == -1 else topic.num_partitions
    rf = default_rf if topic.replication_factor == -1 else topic.replication_factor
    if not 1 <= count <= MAX_PARTITIONS_PER_TOPIC:
        raise KafkaError(
            ErrorCode.INVALID_PARTITIONS,
            f"partition count must be in [1, {MAX_PARTITIONS_PER_TOPIC}], got {count}",
        )
    if rf < 1:
        raise KafkaError(ErrorCode.INVALID_REPLICATION_FACTOR, f"replication factor {rf} < 1")
    return count, rf


def generate_delete_topics(image: MetadataImage, names: Sequence[str]) -> Generated:
    out = Generated()
    for name in dict.fromkeys(names):
        topic = image.topic(name)
        if topic is None:
            out.results.append(
                ItemResult(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name}")
            )
            continue
        if name in INTERNAL_TOPICS:
            refused = _internal_refused(name, "deleted")
            out.results.append(ItemResult(name, refused.error, refused.message, topic.topic_id))
            continue
        out.records.append(RemoveTopic(topic.topic_id))
        out.results.append(ItemResult(name, topic_id=topic.topic_id))
    return out


def generate_create_partitions(
    image: MetadataImage,
    requests: Sequence[tuple[str, int, Mapping[int, Sequence[int]] | None]],
    validate_only: bool,
    rng: random.Random | None = None,
) -> Generated:
    """Grow topics to a new total partition count (never shrink, as Kafka)."""
    out = Generated()
    counts = _all_preferred_counts(image)
    usable = image.usable_broker_ids()
    names = [name for name, _, _ in requests]
    for name, total, explicit in requests:
        topic = image.topic(name)
        try:
            if names.count(name) > 1:
                raise KafkaError(ErrorCode.INVALID_REQUEST, f"topic {name} is listed twice")
            if topic is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name}")
            if name in INTERNAL_TOPICS:
                raise _internal_refused(name, "given more partitions")
            current = len(topic.partitions)
            if total <= current or total > MAX_PARTITIONS_PER_TOPIC:
                raise KafkaError(
                    ErrorCode.INVALID_PARTITIONS,
                    f"topic {name} has {current} partitions; the new count must be larger "
                    f"(and at most {MAX_PARTITIONS_PER_TOPIC}), got {total}",
                )
            rf = len(topic.partitions[0].replicas)
            seed = rng.randrange(2**30) if rng is not None else 0
            lists = _assign(image, None, total - current, rf, explicit, current, counts, seed)
        except KafkaError as error:
            out.results.append(ItemResult(name, error.error, error.message))
            continue
        out.results.append(ItemResult(name, topic_id=topic.topic_id, num_partitions=total))
        if not validate_only:
            out.records.extend(
                _new_partition(topic.topic_id, current + n, replicas, usable)
                for n, replicas in enumerate(lists)
            )
    return out


def _internal_refused(name: str, what: str) -> KafkaError:
    """INVALID_TOPIC_EXCEPTION, Kafka's answer to a write into an internal topic. Kafka 4's
    controller itself would delete or grow one (its old kafka-topics tool refused deletion),
    losing every group's offsets or transaction; raftlog refuses both."""
    return KafkaError(
        ErrorCode.INVALID_TOPIC_EXCEPTION,
        f"{name} is an internal topic (its coordinators' state) and cannot be {what}",
    )


@dataclass(frozen=True)
class IsrRequest:
    topic_id: uuid.UUID
    partition: int
    leader_epoch: int
    new_isr: tuple[int, ...]
    partition_epoch: int


def generate_alter_partition(
    image: MetadataImage, broker_id: int, broker_epoch: int, items: Sequence[IsrRequest]
) -> Generated:
    """ISR changes from a partition leader, compare-and-set on the partition epoch."""
    out = Generated()
    broker = image.brokers.get(broker_id)
    usable = image.usable_broker_ids()
    listed = Counter((item.topic_id, item.partition) for item in items)
    for item in items:
        name = _topic_name(image, item.topic_id)
        try:
            if listed[item.topic_id, item.partition] > 1:
                raise KafkaError(ErrorCode.INVALID_REQUEST, "the partition is listed twice")
            if broker is None or broker.broker_epoch != broker_epoch:
                raise KafkaError(
                    ErrorCode.STALE_BROKER_EPOCH,
                    f"broker {broker_id} epoch {broker_epoch} is not the registered one",
                )
            current = _check_isr_request(image, broker_id, item, usable)
        except KafkaError as error:
            out.results.append(
                ItemResult(
                    name, error.error, error.message, item.topic_id, partition=item.partition
                )
            )
            continue
        if current.isr != item.new_isr:
            wanted = _with_isr(image, name, current, item.new_isr)
            out.records.append(partition_change(item.topic_id, item.partition, current, wanted))
            current = _advanced(current, wanted)
            finished = complete_reassignment(current, usable)
            if finished is not None:
                out.records.append(
                    partition_change(item.topic_id, item.partition, current, finished)
                )
                current = _advanced(current, finished)
        out.results.append(
            ItemResult(name, topic_id=item.topic_id, partition=item.partition, state=current)
        )
    return out


def _with_isr(
    image: MetadataImage, name: str, current: PartitionRegistration, isr: tuple[int, ...]
) -> PartitionRegistration:
    """``current`` with the leader's new ISR; with KIP-966, a shrink below min ISR moves the
    leavers into the ELR, and reaching min ISR clears it (a member that rejoins leaves it)."""
    if not elr_enabled(image):
        return replace(current, isr=isr)
    min_isr = replication_config(image, name).min_insync_replicas
    elr, last_known = eligible_replicas(_elr_partition(current, min_isr), isr, ())
    return replace(current, isr=isr, elr=elr, last_known_elr=last_known)


def _elr_partition(current: PartitionRegistration, min_isr: int) -> ElrPartition:
    """With Kafka's effective min ISR: never more than the replicas (``getTopicEffectiveMinIsr``),
    so a topic whose min.insync.replicas exceeds its replication factor still clears its ELR."""
    return ElrPartition(
        current.replicas, current.isr, current.elr, current.last_known_elr, current.leader,
        min(min_isr, len(current.replicas)),
    )  # fmt: skip


def elect_partition(
    image: MetadataImage,
    current: PartitionRegistration,
    usable: Collection[int],
    *,
    min_isr: int,
    unclean_allowed: bool,
    unclean_shutdown: Collection[int] = (),
) -> Election:
    """The election of ``current`` under the finalized rules: KIP-966's when
    eligible.leader.replicas.version is 1, else the keep-last ISR (its ELR left as it is)."""
    if elr_enabled(image):
        return elect_with_elr(
            _elr_partition(current, min_isr), usable, unclean_allowed, unclean_shutdown
        )
    election = elect(current.replicas, current.isr, current.leader, usable, unclean_allowed)
    return replace(election, elr=current.elr, last_known_elr=current.last_known_elr)


def _elected(current: PartitionRegistration, election: Election) -> PartitionRegistration:
    return replace(
        current,
        leader=election.leader,
        isr=election.isr,
        elr=election.elr,
        last_known_elr=election.last_known_elr,
    )


def _check_isr_request(
    image: MetadataImage, broker_id: int, item: IsrRequest, usable: Collection[int]
) -> PartitionRegistration:
    current = image.partition(item.topic_id, item.partition)
    if current is None:
        raise KafkaError(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            f"no partition {item.partition} of topic id {item.topic_id}",
        )
    if current.leader != broker_id:
        raise KafkaError(
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            f"broker {broker_id} does not lead it; the leader is {current.leader}",
        )
    if item.leader_epoch != current.leader_epoch:
        error = (
            ErrorCode.FENCED_LEADER_EPOCH
            if item.leader_epoch < current.leader_epoch
            else ErrorCode.UNKNOWN_LEADER_EPOCH
        )
        raise KafkaError(error, f"leader epoch {item.leader_epoch} != {current.leader_epoch}")
    if item.partition_epoch != current.partition_epoch:
        raise KafkaError(
            ErrorCode.INVALID_UPDATE_VERSION,
            f"partition epoch {item.partition_epoch} != {current.partition_epoch}",
        )
    isr = item.new_isr
    if broker_id not in isr or len(set(isr)) != len(isr) or not set(isr) <= set(current.replicas):
        raise KafkaError(
            ErrorCode.INVALID_REQUEST,
            f"ISR {list(isr)} must hold the leader and be a subset of {list(current.replicas)}",
        )
    ineligible = [b for b in isr if b not in usable and b not in current.isr]
    if ineligible:
        raise KafkaError(
            ErrorCode.INELIGIBLE_REPLICA, f"brokers {ineligible} are fenced or shutting down"
        )
    return current


def complete_reassignment(
    current: PartitionRegistration, usable: Collection[int]
) -> PartitionRegistration | None:
    """The partition once its reassignment (metadata_quorum.reassignment) completes, if every
    target replica is in the ISR: the leaving replicas drop out, and a leader that is leaving
    gives way to the first usable target replica. None if it is not due (or not reassigning)."""
    if not current.reassigning:
        return None
    target = current.target_replicas
    if not set(target) <= set(current.isr):
        return None
    isr = tuple(b for b in current.isr if b in target)
    leader = current.leader
    if leader not in target:
        leader = next((b for b in target if b in usable), NO_LEADER)
        if leader == NO_LEADER and current.leader != NO_LEADER:
            return None  # no target replica can lead yet: the current leader stays
    return PartitionRegistration(
        target, isr, leader, current.leader_epoch, current.partition_epoch, (), (),
        *eligible_within(current, target),
    )  # fmt: skip


def eligible_within(
    current: PartitionRegistration, replicas: Collection[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The partition's (ELR, last known ELR) without the replicas that leave it (KIP-966: a
    replica a reassignment removes is no longer eligible)."""
    elr = tuple(b for b in current.elr if b in replicas)
    return elr, tuple(b for b in current.last_known_elr if b in replicas)


def partition_change(
    topic_id: uuid.UUID,
    partition_id: int,
    current: PartitionRegistration,
    wanted: PartitionRegistration,
) -> PartitionChange:
    """One compare-and-set record from ``current`` to ``wanted`` (unchanged fields left out)."""

    def differs(name: str) -> bool:
        return bool(getattr(current, name) != getattr(wanted, name))

    return PartitionChange(
        topic_id,
        partition_id,
        current.partition_epoch,
        leader=wanted.leader if differs("leader") else None,
        isr=wanted.isr if differs("isr") else None,
        replicas=wanted.replicas if differs("replicas") else None,
        adding_replicas=wanted.adding_replicas if differs("adding_replicas") else None,
        removing_replicas=wanted.removing_replicas if differs("removing_replicas") else None,
        elr=wanted.elr if differs("elr") else None,
        last_known_elr=wanted.last_known_elr if differs("last_known_elr") else None,
    )


def _advanced(
    current: PartitionRegistration, wanted: PartitionRegistration
) -> PartitionRegistration:
    """``wanted`` as replaying a change from ``current`` leaves it (the epochs move on)."""
    leader_epoch = current.leader_epoch + (1 if wanted.leader != current.leader else 0)
    return replace(wanted, leader_epoch=leader_epoch, partition_epoch=current.partition_epoch + 1)


def _topic_name(image: MetadataImage, topic_id: uuid.UUID) -> str:
    topic = image.topics.get(topic_id)
    return "" if topic is None else topic.name


def _partitions(
    image: MetadataImage, wanted: Sequence[tuple[str, int]] | None
) -> Iterator[tuple[str, int, TopicImage | None, PartitionRegistration | None]]:
    if wanted is None:
        for topic in sorted(image.topics.values(), key=lambda t: t.name):
            for p, registration in sorted(topic.partitions.items()):
                yield topic.name, p, topic, registration
        return
    for name, p in wanted:
        found = image.topic(name)
        yield name, p, found, None if found is None else found.partitions.get(p)


def generate_elect_leaders(
    image: MetadataImage, unclean: bool, wanted: Sequence[tuple[str, int]] | None
) -> Generated:
    """ElectLeaders: PREFERRED moves leadership to the first replica when it is in the ISR;
    UNCLEAN elects any live replica for partitions that have no leader."""
    out = Generated()
    usable = image.usable_broker_ids()
    listed = Counter(wanted or ())
    for name, p, topic, current in _partitions(image, wanted):
        if listed[name, p] > 1:
            out.results.append(
                ItemResult(name, ErrorCode.INVALID_REQUEST, "the partition is listed twice",
                           partition=p)
            )  # fmt: skip
            continue
        if topic is None or current is None:
            out.results.append(
                ItemResult(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "no such partition",
                           partition=p)
            )  # fmt: skip
            continue
        if unclean:
            error, elected = _unclean(image, name, current, usable)
        else:
            error, elected = _preferred(current, usable)
        result = ItemResult(name, error, "", topic.topic_id, partition=p, state=current)
        if elected is not None:
            change = partition_change(topic.topic_id, p, current, elected)
            # the ISR is written even when unchanged, as it always was
            out.records.append(replace(change, isr=elected.isr))
        out.results.append(result)
    return out


def _preferred(
    current: PartitionRegistration, usable: Collection[int]
) -> tuple[ErrorCode, PartitionRegistration | None]:
    preferred = current.preferred_leader
    if current.leader == preferred:
        return ErrorCode.ELECTION_NOT_NEEDED, None
    if preferred not in usable or preferred not in current.isr:
        return ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE, None
    return ErrorCode.NONE, replace(current, leader=preferred)


def _unclean(
    image: MetadataImage, name: str, current: PartitionRegistration, usable: Collection[int]
) -> tuple[ErrorCode, PartitionRegistration | None]:
    """UNCLEAN: an ISR member, then (KIP-966, ISR empty) an ELR member, else any usable replica,
    which alone becomes the ISR and clears the ELR and last known ELR."""
    if current.leader != NO_LEADER:
        return ErrorCode.ELECTION_NOT_NEEDED, None
    min_isr = replication_config(image, name).min_insync_replicas
    election = elect_partition(image, current, usable, min_isr=min_isr, unclean_allowed=True)
    if election.leader == NO_LEADER:
        return ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE, None
    return ErrorCode.NONE, _elected(current, election)


def generate_leadership_changes(
    image: MetadataImage,
    usable: Collection[int],
    affected: Collection[int],
    *,
    unclean_shutdown: Collection[int] = (),
) -> list[MetadataRecord]:
    """Re-elect every partition that has a replica in ``affected`` brokers, given that exactly
    ``usable`` brokers may lead or stay in the ISR: the changes after a broker is fenced, starts
    a controlled shutdown, or comes back (unfenced). ``unclean_shutdown`` brokers (KIP-966: a
    new incarnation without proof of a clean shutdown) also leave every ELR."""
    records: list[MetadataRecord] = []
    for topic in image.topics.values():
        config = replication_config(image, topic.name)
        for p, current in sorted(topic.partitions.items()):
            if not set(current.replicas) & set(affected):
                continue
            election = elect_partition(
                image, current, usable, min_isr=config.min_insync_replicas,
                unclean_allowed=config.unclean_leader_election_enable,
                unclean_shutdown=unclean_shutdown,
            )  # fmt: skip
            wanted = _elected(current, election)
            if wanted != current:
                records.append(partition_change(topic.topic_id, p, current, wanted))
    return records


def imbalanced_partitions(image: MetadataImage, percentage: int) -> list[tuple[str, int]]:
    """The partitions whose preferred leader (first replica) does not lead them, for each broker
    whose share of such partitions, among those it is the preferred leader of, exceeds
    ``percentage`` (Kafka's ``leader.imbalance.per.broker.percentage``; 0 = any), in order."""
    preferred: Counter[int] = Counter()
    not_led: dict[int, list[tuple[str, int]]] = {}
    for topic in sorted(image.topics.values(), key=lambda t: t.name):
        for p, current in sorted(topic.partitions.items()):
            broker = current.preferred_leader
            preferred[broker] += 1
            if current.leader != broker:
                not_led.setdefault(broker, []).append((topic.name, p))
    return sorted(
        tp
        for broker, partitions in not_led.items()
        if len(partitions) * 100 > percentage * preferred[broker]
        for tp in partitions
    )


def generate_preferred_rebalance(image: MetadataImage) -> list[MetadataRecord]:
    """auto.leader.rebalance.enable: move leadership back to the preferred replicas that can
    take it, of the brokers over ``leader.imbalance.per.broker.percentage`` (Kafka's
    ``checkAndTriggerAutoLeaderRebalance``: a broker within the share is left alone)."""
    percentage = cluster_config(image).leader_imbalance_per_broker_percentage
    wanted = imbalanced_partitions(image, percentage)
    if not wanted:
        return []
    return generate_elect_leaders(image, unclean=False, wanted=wanted).records
