"""KIP-966, eligible leader replicas (metadata_quorum/placement.py ``elect_with_elr``, the
controller paths in cluster.py and replication.py): Kafka's PartitionChangeBuilderTest cases as
a table, then the power-loss chaos run (seed 1, default durability) replayed as records, with
and without the feature."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from metadata_quorum.cluster import (
    BrokerSessions,
    generate_heartbeat,
    generate_register_broker,
    generate_session_expiry,
    generate_unregister_broker,
)
from metadata_quorum.features import (
    ELIGIBLE_LEADER_REPLICAS_VERSION,
    FeatureUpdate,
    UpgradeType,
    generate_bootstrap_features,
    generate_update_features,
)
from metadata_quorum.image import MetadataImage, PartitionRegistration, apply
from metadata_quorum.placement import Election, ElrPartition, elect_with_elr, eligible_replicas
from metadata_quorum.records import (
    NO_LEADER,
    ConfigResourceType,
    Endpoint,
    FeatureLevelRecord,
    MetadataRecord,
    PartitionChange,
)
from metadata_quorum.replication import (
    IsrRequest,
    NewTopic,
    generate_alter_partition,
    generate_create_topics,
    generate_elect_leaders,
)
from metadata_quorum.service import _config_changes
from protos import controller_pb2 as pb
from protos import metadata_pb2
from raftlog.errors import ErrorCode

TOPIC = "chaos-events"


def part(
    isr: tuple[int, ...],
    elr: tuple[int, ...] = (),
    last_known: tuple[int, ...] = (),
    leader: int = NO_LEADER,
    min_isr: int = 2,
) -> ElrPartition:
    return ElrPartition((1, 2, 3), isr, elr, last_known, leader, min_isr)


@pytest.mark.parametrize(
    ("case", "partition", "usable", "unclean_allowed", "unclean_shutdown", "expected"),
    [
        ("a shrink below min ISR fills the ELR",
         part((1, 2, 3), leader=1), {1}, False, (), Election(1, (1,), elr=(2, 3))),
        ("a shrink to min ISR leaves it empty",
         part((1, 2, 3), leader=1), {1, 2}, False, (), Election(1, (1, 2))),
        ("fencing the last ISR member empties the ISR (no keep-last)",
         part((3,), elr=(1,), leader=3), set(), False, (), Election(NO_LEADER, (), elr=(1, 3))),
        ("a fenced ELR member stays in the ELR",
         part((3,), elr=(1,), leader=3), {3}, False, (), Election(3, (3,), elr=(1,))),
        ("an unfenced ELR member leads the empty ISR alone",
         part((), elr=(1, 3)), {1}, False, (), Election(1, (1,), elr=(3,))),
        ("the ELR goes in replica order",
         part((), elr=(1, 3)), {1, 3}, False, (), Election(1, (1,), elr=(3,))),
        ("an unclean shutdown leaves the ISR and the ELR for the last known ELR",
         part((), elr=(1, 3)), set(), False, {1},
         Election(NO_LEADER, (), elr=(3,), last_known_elr=(1,))),
        ("an unclean shutdown of an ISR member",
         part((1, 3), leader=1), {3}, False, {1}, Election(3, (3,), last_known_elr=(1,))),
        ("the last known ELR is never elected, even when it is all that is left",
         part((), last_known=(1, 3)), {1, 3}, False, (),
         Election(NO_LEADER, (), last_known_elr=(1, 3))),
        ("an ELR member is preferred to an unclean election",
         part((), elr=(3,)), {2, 3}, True, (), Election(3, (3,))),
        ("an unclean election clears the ELR and the last known ELR",
         part((), elr=(3,), last_known=(1,)), {2}, True, (), Election(2, (2,), unclean=True)),
        ("an unclean election prefers a replica of the last known ELR to one never in sync",
         part((), last_known=(3,)), {2, 3}, True, (), Election(3, (3,), unclean=True)),
        ("an unclean election with no usable replica elects nobody",
         part((), last_known=(3,)), set(), True, (),
         Election(NO_LEADER, (), last_known_elr=(3,))),
        ("an ISR at min ISR clears the last known ELR too",
         part((1,), elr=(3,), last_known=(2,), leader=1, min_isr=1), {1}, False, (),
         Election(1, (1,))),
    ],
)  # fmt: skip
def test_election_with_eligible_leader_replicas(
    case: str,
    partition: ElrPartition,
    usable: set[int],
    unclean_allowed: bool,
    unclean_shutdown: tuple[int, ...] | set[int],
    expected: Election,
) -> None:
    assert elect_with_elr(partition, usable, unclean_allowed, unclean_shutdown) == expected, case


def test_reaching_min_isr_clears_the_elr_and_a_rejoining_member_leaves_it() -> None:
    below = part((1,), elr=(2, 3), leader=1)
    assert eligible_replicas(below, (1, 2), ()) == ((), ())
    three = part((1,), elr=(2, 3), leader=1, min_isr=3)
    assert eligible_replicas(three, (1, 2), ()) == ((3,), ())


# -- the controller paths, as records ------------------------------------------------------------
@dataclass
class Cluster:
    """A pure controller: the image, the sessions and a clock, fed by the cluster.py and
    replication.py generators; every record is replayed and none may be rejected."""

    image: MetadataImage
    sessions: BrokerSessions
    now_ms: int = 0

    def apply(self, records: list[MetadataRecord]) -> None:
        self.image, rejected = apply(self.image, records)
        assert rejected == []

    def register(self, broker_id: int, incarnation: str, previous_epoch: int = -1) -> None:
        endpoints = (Endpoint("BROKER", "127.0.0.1", 9000 + broker_id),)
        self.apply(
            generate_register_broker(
                self.image, self.sessions, self.now_ms, broker_id, incarnation, endpoints, None,
                previous_broker_epoch=previous_epoch,
            )
        )  # fmt: skip

    def unfence(self, broker_id: int) -> None:
        epoch = self.image.brokers[broker_id].broker_epoch
        result = generate_heartbeat(
            self.image,
            self.sessions,
            self.now_ms,
            broker_id,
            epoch,
            self.image.offset,
            False,
            False,
        )
        assert not result.is_fenced
        self.apply(result.records)

    def expire(self, *broker_ids: int) -> None:
        """The brokers' sessions lapse; every other one heartbeats."""
        self.now_ms += 10 * self.sessions.session_timeout_ms
        for broker_id in self.image.brokers:
            if broker_id not in broker_ids:
                self.sessions.touch(broker_id, self.now_ms)
        self.apply(generate_session_expiry(self.image, self.sessions, self.now_ms))

    def epoch(self, broker_id: int) -> int:
        return self.image.brokers[broker_id].broker_epoch

    def partition(self) -> PartitionRegistration:
        topic = self.image.topic(TOPIC)
        assert topic is not None
        return topic.partitions[0]

    def state(self) -> tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        p = self.partition()
        return p.leader, p.isr, p.elr, p.last_known_elr


def cluster(elr: bool = True, min_isr: int = 2) -> Cluster:
    """Brokers 1-3 unfenced, one partition of ``TOPIC`` on (1, 2, 3) led by 1."""
    image, rejected = apply(MetadataImage(), generate_bootstrap_features(MetadataImage()))
    assert rejected == []
    c = Cluster(image, BrokerSessions(1_000))
    if not elr:
        c.apply([FeatureLevelRecord(ELIGIBLE_LEADER_REPLICAS_VERSION, 0)])
    for broker_id in (1, 2, 3):
        c.register(broker_id, f"b{broker_id}-1")
        c.unfence(broker_id)
    topic = NewTopic(TOPIC, assignments={0: (1, 2, 3)},
                     configs={"min.insync.replicas": str(min_isr)})  # fmt: skip
    c.apply(generate_create_topics(c.image, [topic], False, random.Random(1)).records)
    assert c.state() == (1, (1, 2, 3), (), ())
    return c


def test_the_power_loss_run_leaves_the_partition_offline_instead_of_losing_records() -> None:
    """/tmp/power-runs/default, metadata offsets 241-393: 2 is fenced, then 1 and 3; node 3
    loses power; 2, 1 and 3 come back after a SIGKILL or a power cut, so none proves a clean
    shutdown. Before KIP-966, 3 kept its ISR seat and was re-elected with an empty log."""
    c = cluster()
    c.expire(2)
    assert c.state() == (1, (1, 3), (), ())
    c.expire(1)
    assert c.state() == (3, (3,), (1,), ())
    c.expire(3)
    assert c.state() == (NO_LEADER, (), (1, 3), ())
    c.register(2, "b2-2")  # SIGKILLed: no marker; it was in neither set
    c.unfence(2)
    assert c.state() == (NO_LEADER, (), (1, 3), ())
    c.register(1, "b1-2")
    assert c.state() == (NO_LEADER, (), (3,), (1,))
    c.unfence(1)
    c.register(3, "b3-2")
    assert c.state() == (NO_LEADER, (), (), (1, 3))
    c.unfence(3)
    assert c.state() == (NO_LEADER, (), (), (1, 3)), "offline: only an unclean election"
    result = generate_elect_leaders(c.image, unclean=True, wanted=[(TOPIC, 0)])
    c.apply(result.records)
    assert c.state() == (1, (1,), (), ())


def test_a_clean_shutdown_keeps_the_broker_eligible() -> None:
    """The same run with node 1 stopped cleanly: its marker names its registered epoch, it
    stays in the ELR and leads with nothing lost; 3's power cut drops it from the ELR."""
    c = cluster()
    c.expire(2)
    c.expire(1)
    c.expire(3)
    c.register(1, "b1-2", previous_epoch=c.epoch(1))
    assert c.state() == (NO_LEADER, (), (1, 3), ())
    c.unfence(1)
    assert c.state() == (1, (1,), (3,), ())
    c.register(3, "b3-2", previous_epoch=c.epoch(3) - 1)  # a stale marker is no proof
    assert c.state() == (1, (1,), (), (3,))


def test_without_the_feature_the_last_isr_member_is_re_elected() -> None:
    """eligible.leader.replicas.version 0 keeps raftlog's old rule (and this run's loss)."""
    c = cluster(elr=False)
    c.expire(2)
    c.expire(1)
    c.expire(3)
    assert c.state() == (NO_LEADER, (3,), (), ())
    c.register(3, "b3-2")
    c.unfence(3)
    assert c.state() == (3, (3,), (), ())


def test_alter_partition_feeds_and_clears_the_elr() -> None:
    c = cluster()
    p = c.partition()
    topic_id = c.image.topic_ids[TOPIC]
    shrink = IsrRequest(topic_id, 0, p.leader_epoch, (1,), p.partition_epoch)
    c.apply(generate_alter_partition(c.image, 1, c.epoch(1), [shrink]).records)
    assert c.state() == (1, (1,), (2, 3), ())
    p = c.partition()
    expand = IsrRequest(topic_id, 0, p.leader_epoch, (1, 2), p.partition_epoch)
    c.apply(generate_alter_partition(c.image, 1, c.epoch(1), [expand]).records)
    assert c.state() == (1, (1, 2), (), ())


def test_unregistering_a_broker_drops_it_from_the_elr() -> None:
    c = cluster()
    c.expire(2)
    c.expire(1)
    assert c.state() == (3, (3,), (1,), ())
    c.apply(generate_unregister_broker(c.image, 1, force=True))
    assert c.state() == (3, (3,), (), (1,))


def _min_isr_change(
    name: str,
    value: str,
    kind: metadata_pb2.ConfigResourceType.ValueType = metadata_pb2.CONFIG_RESOURCE_TOPIC,
    op: pb.AlterConfigOp.ValueType = pb.SET,
) -> pb.AlterConfigsResource:
    return pb.AlterConfigsResource(
        resource=pb.ConfigResource(resource_type=kind, resource_name=name),
        configs=[pb.AlterableConfig(name="min.insync.replicas", value=value, op=op)],
    )


def test_a_min_isr_change_clears_the_elr() -> None:
    c = cluster()
    c.expire(2)
    c.expire(1)
    assert c.state() == (3, (3,), (1,), ())
    error, _, records = _config_changes(c.image, _min_isr_change(TOPIC, "1"))
    assert error.code == 0
    c.apply(records)
    assert c.state() == (3, (3,), (), ())
    assert c.image.configs[(ConfigResourceType.TOPIC, TOPIC)]["min.insync.replicas"] == "1"


def test_min_isr_is_a_topics_or_the_clusters_while_elr_is_on() -> None:
    """Kafka 4.1's ConfigurationControlManager: one broker's min.insync.replicas may not be
    set, the cluster's may be changed (clearing every ELR) but not removed."""
    c = cluster()
    c.expire(2)
    c.expire(1)
    broker = metadata_pb2.CONFIG_RESOURCE_BROKER
    error, message, records = _config_changes(c.image, _min_isr_change("1", "1", broker))
    assert (error, records) == (ErrorCode.INVALID_CONFIG, [])
    assert message == "Broker-level min.insync.replicas cannot be altered while ELR is enabled."
    error, _, records = _config_changes(c.image, _min_isr_change("", "2", broker))
    assert error.code == 0
    c.apply(records)
    assert c.state() == (3, (3,), (), ()), "the cluster default changed: every ELR cleared"
    removal = _min_isr_change("", "", broker, op=pb.DELETE)
    error, message, records = _config_changes(c.image, removal)
    assert (error, records) == (ErrorCode.INVALID_CONFIG, [])
    assert message == "Cluster-level min.insync.replicas cannot be removed while ELR is enabled."


def test_turning_the_feature_off_clears_every_elr() -> None:
    c = cluster()
    c.expire(2)
    c.expire(1)
    records, results = generate_update_features(
        c.image,
        [FeatureUpdate(ELIGIBLE_LEADER_REPLICAS_VERSION, 0, UpgradeType.SAFE_DOWNGRADE)],
        validate_only=False,
    )
    assert [r.error.code for r in results] == [0]
    c.apply(records)
    assert c.state() == (3, (3,), (), ())
    assert c.image.features[ELIGIBLE_LEADER_REPLICAS_VERSION] == 0


def test_replay_refuses_an_elr_that_overlaps_the_isr_or_leaves_the_replicas() -> None:
    c = cluster()
    topic_id = c.image.topic_ids[TOPIC]
    epoch = c.partition().partition_epoch
    for bad, reason in [
        (PartitionChange(topic_id, 0, epoch, elr=(1,)), "disjoint"),
        (PartitionChange(topic_id, 0, epoch, isr=(1,), elr=(2,), last_known_elr=(2,)), "disjoint"),
        (PartitionChange(topic_id, 0, epoch, isr=(1,), elr=(4,)), "subset of replicas"),
    ]:
        _, rejected = apply(c.image, [bad])
        assert len(rejected) == 1 and reason in rejected[0].reason
