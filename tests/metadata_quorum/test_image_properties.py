"""Properties of the metadata image, its replay and its codec, with hypothesis.

(a) replay is deterministic, and one batch == the same records one by one or in any batches;
(b) a snapshot of a prefix plus the tail == replaying everything (offsets included);
(c) every record type survives encode/decode;
(d) random request sequences, turned into records by the ``generate_*`` functions and applied,
    keep Kafka's partition invariants, and every generated record applies without rejection.
"""

from __future__ import annotations

import collections
import random
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from metadata_quorum.cluster import (
    BrokerSessions,
    generate_allocate_producer_ids,
    generate_heartbeat,
    generate_register_broker,
    generate_session_expiry,
)
from metadata_quorum.codec import decode_batch, decode_snapshot, encode_batch, encode_snapshot
from metadata_quorum.configs import replication_config
from metadata_quorum.image import MetadataImage, Rejected, apply, replay
from metadata_quorum.records import (
    NO_LEADER,
    RECORD_TYPES,
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
from metadata_quorum.replication import (
    IsrRequest,
    NewTopic,
    generate_alter_partition,
    generate_create_partitions,
    generate_create_topics,
    generate_delete_topics,
    generate_elect_leaders,
    generate_preferred_rebalance,
)
from metadata_quorum.security.acl import (
    AclBinding,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)
from metadata_quorum.security.scram import ScramCredential, ScramMechanism
from raftlog.errors import KafkaError

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
# The codec writes "no rack" as "" (proto3 has no null string), so "" is not a rack name.
RACK = st.none() | st.text(st.characters(codec="utf-8"), min_size=1, max_size=6)


def canonical(image: MetadataImage) -> tuple[Any, ...]:
    """Everything the image holds, in sorted plain tuples: equal iff the images agree."""
    return (
        image.offset,
        sorted(image.brokers.items()),
        sorted(
            (
                str(topic_id),
                topic.name,
                sorted(topic.partitions.items()),
            )
            for topic_id, topic in image.topics.items()
        ),
        sorted((name, str(topic_id)) for name, topic_id in image.topic_ids.items()),
        sorted((key, sorted(values.items())) for key, values in image.configs.items()),
        image.next_producer_id,
        image.controller_id,
        image.controller_term,
        image.voters,
        sorted(image.acls),
        sorted((user, sorted(c.items())) for user, c in image.scram_credentials.items()),
        sorted(image.features.items()),
    )


# -- (c) any value of every record type, for the codec -------------------------------------
def _int_lists(size: int = 5) -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(INT32, max_size=size).map(tuple)


ENDPOINTS = st.lists(st.builds(Endpoint, TEXT, TEXT, INT32), max_size=3).map(tuple)
ACL = st.builds(
    AclBinding,
    st.sampled_from(ResourceType),
    TEXT,
    st.sampled_from(PatternType),
    TEXT,
    TEXT,
    st.sampled_from(AclOperation),
    st.sampled_from(PermissionType),
)
MECHANISM = st.sampled_from([ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512])
CREDENTIAL = st.builds(
    ScramCredential, MECHANISM, st.binary(max_size=32), st.binary(max_size=64),
    st.binary(max_size=64), INT32,
)  # fmt: skip
ANY_RECORD: dict[type, st.SearchStrategy[Any]] = {
    RegisterBroker: st.builds(RegisterBroker, INT32, TEXT, ENDPOINTS, RACK),
    UnregisterBroker: st.builds(UnregisterBroker, INT32, INT64),
    FenceBroker: st.builds(FenceBroker, INT32, INT64),
    UnfenceBroker: st.builds(UnfenceBroker, INT32, INT64),
    BrokerRegistrationChange: st.builds(BrokerRegistrationChange, INT32, INT64, st.booleans()),
    CordonBroker: st.builds(CordonBroker, INT32, st.booleans()),
    TopicRecord: st.builds(TopicRecord, TEXT, st.uuids()),
    PartitionRecord: st.builds(
        PartitionRecord, st.uuids(), INT32, _int_lists(), _int_lists(), INT32, INT32, INT32
    ),
    PartitionChange: st.builds(
        PartitionChange,
        st.uuids(),
        INT32,
        INT32,
        leader=st.none() | INT32,
        isr=st.none() | _int_lists(),
        replicas=st.none() | _int_lists(),
    ),
    RemoveTopic: st.builds(RemoveTopic, st.uuids()),
    ConfigRecord: st.builds(
        ConfigRecord, st.sampled_from(ConfigResourceType), TEXT, TEXT, st.none() | TEXT
    ),
    ProducerIdsRecord: st.builds(ProducerIdsRecord, INT32, INT64, INT64),
    LeaderChange: st.builds(LeaderChange, INT32, INT64),
    VotersRecord: st.builds(
        VotersRecord,
        st.lists(st.builds(ControllerVoter, INT32, TEXT, INT32, INT32), max_size=3).map(tuple),
    ),
    AccessControlEntryRecord: st.builds(AccessControlEntryRecord, ACL),
    RemoveAccessControlEntryRecord: st.builds(RemoveAccessControlEntryRecord, ACL),
    UserScramCredentialRecord: st.builds(UserScramCredentialRecord, TEXT, CREDENTIAL),
    RemoveUserScramCredentialRecord: st.builds(RemoveUserScramCredentialRecord, TEXT, MECHANISM),
    FeatureLevelRecord: st.builds(FeatureLevelRecord, TEXT, INT32),
}


def test_every_record_type_has_a_strategy() -> None:
    assert set(ANY_RECORD) == set(RECORD_TYPES)


@pytest.mark.parametrize("record_type", RECORD_TYPES, ids=lambda t: t.__name__)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_codec_round_trip(record_type: type, data: st.DataObject) -> None:
    records = data.draw(st.lists(ANY_RECORD[record_type], min_size=1, max_size=3))
    assert decode_batch(encode_batch(records)) == records


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(*ANY_RECORD.values()), max_size=12))
def test_codec_round_trip_mixed_batch(records: list[MetadataRecord]) -> None:
    assert decode_batch(encode_batch(records)) == records


# -- (a), (b): small-domain records, so that many apply and many are rejected --------------
BROKER = st.integers(0, 3)
EPOCH = st.integers(0, 12)
TOPIC_IDS = [uuid.UUID(int=n + 1) for n in range(3)]
TOPIC_ID = st.sampled_from(TOPIC_IDS)
PARTITION = st.integers(0, 2)
REPLICAS = st.lists(BROKER, min_size=0, max_size=3).map(tuple)  # sometimes invalid on purpose


@st.composite
def _partition_record(draw: st.DrawFn) -> PartitionRecord:
    replicas = draw(st.lists(BROKER, min_size=1, max_size=3, unique=True).map(tuple))
    isr = draw(st.sampled_from([replicas, replicas[:1], replicas[1:], (9,)]))
    leader = draw(st.sampled_from([*isr, NO_LEADER, 7]))
    return PartitionRecord(
        draw(TOPIC_ID), draw(PARTITION), replicas, isr, leader, draw(EPOCH), draw(EPOCH)
    )


SMALL_ACLS = [
    AclBinding(
        ResourceType.TOPIC, name, PatternType.LITERAL, "User:a", "*", op, PermissionType.ALLOW
    )
    for name in ("a", "b")
    for op in (AclOperation.READ, AclOperation.WRITE)
]
CREDS = [
    ScramCredential(m, b"salt", bytes([n]), bytes([n + 1]), 4096)
    for m in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512)
    for n in (1, 2)
]
SMALL_RECORD = st.one_of(
    st.builds(
        RegisterBroker,
        BROKER,
        st.sampled_from(["x", "y"]),
        st.just((Endpoint("BROKER", "127.0.0.1", 9092),)),
        st.sampled_from([None, "r1", "r2"]),
    ),
    st.builds(UnregisterBroker, BROKER, EPOCH),
    st.builds(FenceBroker, BROKER, EPOCH),
    st.builds(UnfenceBroker, BROKER, EPOCH),
    st.builds(BrokerRegistrationChange, BROKER, EPOCH, st.booleans()),
    st.builds(CordonBroker, BROKER, st.booleans()),
    st.builds(TopicRecord, st.sampled_from(["a", "b", "c"]), TOPIC_ID),
    _partition_record(),
    st.builds(
        PartitionChange,
        TOPIC_ID,
        PARTITION,
        st.integers(0, 4),
        leader=st.none() | BROKER | st.just(NO_LEADER),
        isr=st.none() | REPLICAS,
        replicas=st.none() | REPLICAS,
    ),
    st.builds(RemoveTopic, TOPIC_ID),
    st.builds(
        ConfigRecord,
        st.sampled_from(ConfigResourceType),
        st.sampled_from(["a", "b", ""]),
        st.sampled_from(["retention.ms", "unclean.leader.election.enable"]),
        st.none() | st.sampled_from(["1", "true"]),
    ),
    st.builds(ProducerIdsRecord, BROKER, EPOCH, st.sampled_from([1000, 2000, 3000, 1500])),
    st.builds(LeaderChange, BROKER, st.integers(0, 4)),
    st.builds(AccessControlEntryRecord, st.sampled_from(SMALL_ACLS)),
    st.builds(RemoveAccessControlEntryRecord, st.sampled_from(SMALL_ACLS)),
    st.builds(UserScramCredentialRecord, st.sampled_from(["u", "v"]), st.sampled_from(CREDS)),
    st.builds(RemoveUserScramCredentialRecord, st.sampled_from(["u", "v"]), MECHANISM),
    st.builds(FeatureLevelRecord, st.sampled_from(["group.version", "x"]), st.integers(-1, 2)),
)
HISTORY = st.lists(SMALL_RECORD, max_size=60)


def _fold(image: MetadataImage, records: list[MetadataRecord]) -> MetadataImage:
    for record in records:
        image = replay(image, record)
    return image


@settings(max_examples=150, deadline=None)
@given(HISTORY, st.data())
def test_replay_is_deterministic(records: list[MetadataRecord], data: st.DataObject) -> None:
    once, rejected_once = apply(MetadataImage(), records)
    twice, rejected_twice = apply(MetadataImage(), list(records))
    assert canonical(once) == canonical(twice)
    assert rejected_once == rejected_twice
    assert once.offset == len(records) - 1
    assert canonical(_fold(MetadataImage(), records)) == canonical(once)
    # Any split into batches gives the same image and the same rejections.
    cuts = sorted(data.draw(st.sets(st.integers(0, len(records)), max_size=4)))
    image, rejected = MetadataImage(), []
    for start, end in zip([0, *cuts], [*cuts, len(records)], strict=True):
        image, batch_rejected = apply(image, records[start:end])
        rejected.extend(batch_rejected)
    assert canonical(image) == canonical(once)
    assert rejected == rejected_once


@settings(max_examples=150, deadline=None)
@given(HISTORY, st.data())
def test_snapshot_plus_tail_equals_full_replay(
    records: list[MetadataRecord], data: st.DataObject
) -> None:
    split = data.draw(st.integers(0, len(records)))
    prefix, _ = apply(MetadataImage(), records[:split])
    restored = decode_snapshot(encode_snapshot(prefix))
    assert canonical(restored) == canonical(prefix)
    assert restored.offset == split - 1
    resumed, rejected_tail = apply(restored, records[split:])
    full, rejected_all = apply(MetadataImage(), records)
    assert canonical(resumed) == canonical(full)
    assert rejected_tail == [r for r in rejected_all if r.offset >= split]


# -- (d) random requests through the generate_* functions ----------------------------------
NAMES = ["a", "b", "c", "d"]
SESSION_TIMEOUT_MS = 5000


class ControllerMachine(RuleBasedStateMachine):
    """The active controller driven by random requests; every record applies cleanly."""

    def __init__(self) -> None:
        super().__init__()
        self.image = MetadataImage()
        self.sessions = BrokerSessions(SESSION_TIMEOUT_MS)
        self.rng = random.Random(0)
        self.now_ms = 0
        self.incarnations = 0
        self.log: list[list[MetadataRecord]] = []
        self.epochs: dict[tuple[uuid.UUID, int], tuple[int, int]] = {}

    # -- plumbing --------------------------------------------------------------------------
    def propose(self, records: list[MetadataRecord], unclean_requested: bool = False) -> None:
        before = self.image
        self.image, rejected = apply(before, records)
        assert rejected == [], f"a record generated against the image was rejected: {rejected}"
        self.log.append(list(records))
        self._check_elections(before, unclean_requested)

    def _check_elections(self, before: MetadataImage, unclean_requested: bool) -> None:
        """Epochs move with every change; a new leader comes from the previous ISR unless
        unclean election is allowed, and then it starts a new ISR of its own."""
        for topic_id, topic in self.image.topics.items():
            old_topic = before.topics.get(topic_id)
            if old_topic is None:
                continue
            unclean = unclean_requested or (
                replication_config(before, topic.name).unclean_leader_election_enable
            )
            for p, now in topic.partitions.items():
                old = old_topic.partitions.get(p)
                if old is None:
                    continue
                if (now.replicas, now.isr, now.leader) != (old.replicas, old.isr, old.leader):
                    assert now.partition_epoch > old.partition_epoch, f"{old} -> {now}"
                if now.leader != old.leader:
                    assert now.leader_epoch == old.leader_epoch + 1, f"{old} -> {now}"
                if now.leader in (NO_LEADER, old.leader):
                    continue
                if not unclean:
                    assert now.leader in old.isr, f"unclean election of {now.leader}: {old}"
                elif now.leader not in old.isr:
                    assert now.isr == (now.leader,), "an unclean leader starts a new ISR"

    def _partitions(self) -> list[tuple[str, uuid.UUID, int]]:
        return sorted(
            (t.name, t.topic_id, p) for t in self.image.topics.values() for p in t.partitions
        )

    # -- brokers ---------------------------------------------------------------------------
    @initialize(racks=st.lists(st.sampled_from([None, "a", "b"]), min_size=2, max_size=5))
    def start_brokers(self, racks: list[str | None]) -> None:
        """Most histories start with live brokers, so that topics and elections happen."""
        for broker, rack in enumerate(racks):
            self.register(broker, rack, new=True)
        for broker in range(len(racks)):
            epoch = self.image.brokers[broker].broker_epoch
            result = generate_heartbeat(
                self.image, self.sessions, self.now_ms, broker, epoch, self.image.offset,
                False, False,
            )  # fmt: skip
            self.propose(result.records)

    @rule(broker=st.integers(0, 4), rack=st.sampled_from([None, "a", "b"]), new=st.booleans())
    def register(self, broker: int, rack: str | None, new: bool) -> None:
        current = self.image.brokers.get(broker)
        if current is None or new:
            self.incarnations += 1
            incarnation = f"{broker}-{self.incarnations}"
        else:
            incarnation = current.incarnation_id
        endpoints = (Endpoint("BROKER", "127.0.0.1", 9000 + broker),)
        try:
            records = generate_register_broker(
                self.image, self.sessions, self.now_ms, broker, incarnation, endpoints, rack
            )
        except KafkaError:
            return
        self.propose(records)

    @precondition(lambda self: self.image.brokers)
    @rule(
        data=st.data(),
        advance_ms=st.integers(0, 3000),
        behind=st.sampled_from([False, False, False, True]),
        want_fence=st.sampled_from([False, False, False, False, True]),
        want_shutdown=st.sampled_from([False, False, False, True]),
    )
    def heartbeat(
        self,
        data: st.DataObject,
        advance_ms: int,
        behind: bool,
        want_fence: bool,
        want_shutdown: bool,
    ) -> None:
        self.now_ms += advance_ms
        broker = data.draw(st.sampled_from(sorted(self.image.brokers)))
        epoch = self.image.brokers[broker].broker_epoch
        offset = -1 if behind else self.image.offset
        result = generate_heartbeat(
            self.image, self.sessions, self.now_ms, broker, epoch, offset, want_fence,
            want_shutdown,
        )  # fmt: skip
        self.propose(result.records)

    @rule(advance_ms=st.integers(0, 2000), behind=st.sets(st.integers(0, 4), max_size=1))
    def heartbeat_all(self, advance_ms: int, behind: set[int]) -> None:
        """Every registered broker heartbeats (as live brokers do); fenced ones may unfence."""
        self.now_ms += advance_ms
        for broker in sorted(self.image.brokers):
            epoch = self.image.brokers[broker].broker_epoch
            offset = -1 if broker in behind else self.image.offset
            result = generate_heartbeat(
                self.image, self.sessions, self.now_ms, broker, epoch, offset, False, False
            )
            self.propose(result.records)

    @rule(advance_ms=st.integers(0, 4000))
    def expire_sessions(self, advance_ms: int) -> None:
        self.now_ms += advance_ms
        self.propose(generate_session_expiry(self.image, self.sessions, self.now_ms))

    @precondition(lambda self: self.image.brokers)
    @rule(data=st.data())
    def allocate_producer_ids(self, data: st.DataObject) -> None:
        broker = data.draw(st.sampled_from(sorted(self.image.brokers)))
        epoch = self.image.brokers[broker].broker_epoch
        before = self.image.next_producer_id
        record, first, length = generate_allocate_producer_ids(self.image, broker, epoch)
        self.propose([record])
        assert first == before and self.image.next_producer_id == first + length

    # -- topics ----------------------------------------------------------------------------
    @rule(
        name=st.sampled_from(NAMES),
        partitions=st.integers(1, 4),
        rf=st.integers(1, 4),
        unclean=st.booleans(),
    )
    def create_topic(self, name: str, partitions: int, rf: int, unclean: bool) -> None:
        configs = {"unclean.leader.election.enable": "true"} if unclean else {}
        topic = NewTopic(name, partitions, rf, configs=configs)
        self.propose(generate_create_topics(self.image, [topic], False, self.rng).records)

    @precondition(lambda self: self.image.brokers)
    @rule(name=st.sampled_from(NAMES), data=st.data())
    def create_topic_manually(self, name: str, data: st.DataObject) -> None:
        brokers = sorted(self.image.brokers)
        rf = data.draw(st.integers(1, len(brokers)))
        replicas = st.lists(st.sampled_from(brokers), min_size=rf, max_size=rf, unique=True)
        assignments = data.draw(st.lists(replicas, min_size=1, max_size=3))
        topic = NewTopic(name, assignments=dict(enumerate(assignments)))
        self.propose(generate_create_topics(self.image, [topic], False, self.rng).records)

    @rule(name=st.sampled_from(NAMES), extra=st.integers(1, 3))
    def create_partitions(self, name: str, extra: int) -> None:
        topic = self.image.topic(name)
        total = extra + (len(topic.partitions) if topic else 0)
        self.propose(generate_create_partitions(self.image, [(name, total, None)], False).records)

    @rule(names=st.lists(st.sampled_from(NAMES), max_size=2))
    def delete_topics(self, names: list[str]) -> None:
        self.propose(generate_delete_topics(self.image, names).records)

    # -- partitions ------------------------------------------------------------------------
    @precondition(lambda self: self.image.topics)
    @rule(data=st.data(), stale=st.sampled_from([0, 0, 0, -1]))
    def alter_partition(self, data: st.DataObject, stale: int) -> None:
        _, topic_id, p = data.draw(st.sampled_from(self._partitions()))
        current = self.image.partition(topic_id, p)
        assert current is not None
        if current.leader == NO_LEADER:
            return
        followers = [b for b in current.replicas if b != current.leader]
        chosen = data.draw(st.lists(st.sampled_from(followers), unique=True)) if followers else []
        request = IsrRequest(
            topic_id,
            p,
            current.leader_epoch,
            (current.leader, *chosen),
            current.partition_epoch + stale,
        )
        epoch = self.image.brokers[current.leader].broker_epoch
        generated = generate_alter_partition(self.image, current.leader, epoch, [request])
        self.propose(generated.records)

    @precondition(lambda self: self.image.topics)
    @rule(data=st.data(), unclean=st.booleans(), everything=st.booleans())
    def elect_leaders(self, data: st.DataObject, unclean: bool, everything: bool) -> None:
        wanted = None
        if not everything:
            chosen = data.draw(st.lists(st.sampled_from(self._partitions()), max_size=4))
            wanted = [(name, p) for name, _, p in chosen]
        generated = generate_elect_leaders(self.image, unclean, wanted)
        self.propose(generated.records, unclean_requested=unclean)

    @rule()
    def preferred_rebalance(self) -> None:
        self.propose(generate_preferred_rebalance(self.image))

    # -- invariants ------------------------------------------------------------------------
    @invariant()
    def partitions_are_sound(self) -> None:
        usable = self.image.usable_broker_ids()
        for topic in self.image.topics.values():
            for p, reg in topic.partitions.items():
                where = f"{topic.name}-{p} {reg}"
                assert reg.replicas and len(set(reg.replicas)) == len(reg.replicas), where
                assert set(reg.replicas) <= set(self.image.brokers), where
                assert reg.isr, f"empty ISR: {where}"
                assert len(set(reg.isr)) == len(reg.isr), where
                assert set(reg.isr) <= set(reg.replicas), where
                if reg.leader != NO_LEADER:
                    assert reg.leader in reg.isr, where
                    assert reg.leader in usable, f"leader is fenced or shutting down: {where}"
                    assert set(reg.isr) <= usable, f"ISR holds an unusable broker: {where}"
                key = (topic.topic_id, p)
                old_leader_epoch, old_partition_epoch = self.epochs.get(key, (0, 0))
                assert reg.leader_epoch >= old_leader_epoch, where
                assert reg.partition_epoch >= old_partition_epoch, where
                self.epochs[key] = (reg.leader_epoch, reg.partition_epoch)

    @invariant()
    def preferred_leader_counts_match_a_recount(self) -> None:
        recount = collections.Counter(
            reg.replicas[0] for t in self.image.topics.values() for reg in t.partitions.values()
        )
        assert dict(self.image.preferred_leaders) == dict(recount)

    @invariant()
    def snapshot_round_trips(self) -> None:
        assert canonical(decode_snapshot(encode_snapshot(self.image))) == canonical(self.image)

    def teardown(self) -> None:
        # (a) on a realistic history: replaying the log (through the codec) rebuilds the image.
        image = MetadataImage()
        for batch in self.log:
            image, rejected = apply(image, decode_batch(encode_batch(batch)))
            assert rejected == []
        assert canonical(image) == canonical(self.image)


ControllerMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestController = ControllerMachine.TestCase


def test_rejected_records_keep_their_offset() -> None:
    """A rejection is reported at the record's offset and leaves only the offset changed."""
    records: list[MetadataRecord] = [FenceBroker(1, 0), LeaderChange(1, 2), LeaderChange(2, 1)]
    image, rejected = apply(MetadataImage(), records)
    assert [(r.offset, type(r.record).__name__) for r in rejected] == [
        (0, "FenceBroker"),
        (2, "LeaderChange"),
    ]
    assert all(isinstance(r, Rejected) for r in rejected)
    assert (image.offset, image.controller_id, image.controller_term) == (2, 1, 2)
