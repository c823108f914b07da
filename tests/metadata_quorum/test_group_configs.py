"""Group configs (Kafka 4's GROUP config resource): names, validators, bounds, describe, and
the controller's AlterConfigs arithmetic and DescribeQuorum / ListConfigResources mappings."""

from __future__ import annotations

import pytest

from dataplane.kafka.config_resources import BROKER, GROUP, TOPIC, list_config_resources
from dataplane.kafka.describe_quorum import quorum_nodes, quorum_partition
from metadata_quorum.configs import AlterOp, alter_dynamic_configs
from metadata_quorum.group_configs import (
    GroupConfigBounds,
    GroupConfigs,
    GroupRules,
    describe_group,
    reset_duration_ms,
    validate_group_configs,
)
from metadata_quorum.image import MetadataDelta, MetadataImage
from metadata_quorum.records import ConfigRecord, ConfigResourceType
from protos import controller_pb2 as cpb
from raftlog.config import ConfigError
from raftlog.errors import ErrorCode, KafkaError

DEFAULTS, BOUNDS = GroupConfigs(), GroupConfigBounds()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"consumer.session.timeout.ms": "50000"}, None),
        ({"share.auto.offset.reset": "earliest"}, None),
        ({"share.auto.offset.reset": "by_duration:PT1H"}, None),
        ({"share.record.lock.duration.ms": "20000"}, None),
        ({"group.id": "x"}, "Unknown group config name: group.id"),
        ({"consumer.session.timeout.ms": "abc"}, "Not a number"),
        ({"consumer.session.timeout.ms": "0"}, "at least 1"),
        ({"consumer.session.timeout.ms": "1000"}, "group.consumer.min.session.timeout.ms"),
        ({"consumer.session.timeout.ms": "70000"}, "group.consumer.max.session.timeout.ms"),
        ({"share.heartbeat.interval.ms": "16000"}, "group.share.max.heartbeat.interval.ms"),
        ({"share.record.lock.duration.ms": "999"}, "at least 1000"),
        ({"share.record.lock.duration.ms": "10000"}, "group.share.min.record.lock.duration.ms"),
        ({"share.auto.offset.reset": "none"}, "earliest, latest or by_duration"),
        ({"share.auto.offset.reset": "by_duration:-PT1H"}, "earliest, latest or by_duration"),
        ({"share.isolation.level": "read_committed"}, None),
        ({"share.isolation.level": "read_uncommitted"}, None),
        ({"share.isolation.level": "READ_COMMITTED"}, "one of: read_committed, read_uncommitted"),
        ({"share.isolation.level": "hello"}, "one of: read_committed, read_uncommitted"),
    ],
)
def test_validation_follows_kafkas_group_config(overrides: dict[str, str], message: str) -> None:
    if message is None:
        validate_group_configs(overrides, DEFAULTS, BOUNDS)
        return
    with pytest.raises(ConfigError, match=message) as raised:
        validate_group_configs(overrides, DEFAULTS, BOUNDS)
    assert raised.value.error is ErrorCode.INVALID_CONFIG


def test_a_session_must_exceed_its_heartbeat_interval() -> None:
    bounds = GroupConfigBounds(consumer_session_timeout_ms=(1, 60_000))
    with pytest.raises(ConfigError, match=r"must be greater than consumer\.heartbeat"):
        validate_group_configs({"consumer.session.timeout.ms": "5000"}, DEFAULTS, bounds)
    # a broker default outside the bounds does not spoil other keys' overrides
    short = GroupConfigs(consumer_session_timeout_ms=6_000)
    validate_group_configs({"share.auto.offset.reset": "earliest"}, short, BOUNDS)


def test_duration_parsing() -> None:
    assert reset_duration_ms("by_duration:PT1H") == 3_600_000
    assert reset_duration_ms("by_duration:P1DT1.5S") == 86_401_500
    assert reset_duration_ms("by_duration:P") is None
    assert reset_duration_ms("latest") is None


def test_overrides_lay_over_the_brokers_defaults() -> None:
    defaults = GroupConfigs(consumer_session_timeout_ms=6_000)
    effective = defaults.with_overrides({"consumer.session.timeout.ms": "3000"})
    assert effective.consumer_session_timeout_ms == 3_000
    assert effective.share_auto_offset_reset == "latest"
    rows = {r.name: r for r in describe_group(
        {"share.auto.offset.reset": "earliest"}, defaults,
        frozenset({"group.consumer.session.timeout.ms"}),
    )}  # fmt: skip
    assert (rows["share.auto.offset.reset"].value, rows["share.auto.offset.reset"].origin) == (
        "earliest", "group",
    )  # fmt: skip
    session = rows["consumer.session.timeout.ms"]
    assert (session.value, session.origin, session.synonym) == (
        "6000", "static", "group.consumer.session.timeout.ms",
    )  # fmt: skip
    assert rows["share.session.timeout.ms"].origin == "default"
    isolation = rows["share.isolation.level"]  # Kafka 4.1's, no broker synonym
    assert (isolation.value, isolation.origin, isolation.synonym) == (
        "read_uncommitted", "default", None,
    )  # fmt: skip
    committed = defaults.with_overrides({"share.isolation.level": "read_committed"})
    assert committed.share_isolation_level == "read_committed"


def test_the_controller_alters_a_group_with_its_rules() -> None:
    rules = GroupRules(bounds=GroupConfigBounds(consumer_session_timeout_ms=(1_000, 60_000)))
    new = alter_dynamic_configs(
        ConfigResourceType.GROUP, "g", {}, [(AlterOp.SET, "consumer.session.timeout.ms", "8000"),
                                            (AlterOp.SET, "consumer.heartbeat.interval.ms",
                                             "5000")],
        group_rules=rules,
    )  # fmt: skip
    assert new == {"consumer.session.timeout.ms": "8000", "consumer.heartbeat.interval.ms": "5000"}
    with pytest.raises(KafkaError, match="unknown group configuration key"):
        alter_dynamic_configs(
            ConfigResourceType.GROUP, "g", {}, [(AlterOp.SET, "retention.ms", "1")]
        )
    with pytest.raises(KafkaError, match="not allowed"):
        alter_dynamic_configs(
            ConfigResourceType.GROUP, "g", {},
            [(AlterOp.APPEND, "share.auto.offset.reset", "earliest")],
        )  # fmt: skip


def test_list_config_resources_from_the_image() -> None:
    delta = MetadataDelta(MetadataImage())
    delta.replay(
        ConfigRecord(ConfigResourceType.GROUP, "g1", "share.auto.offset.reset", "earliest")
    )
    image = delta.image()
    assert list_config_resources(image, [GROUP]) == [("g1", GROUP)]
    assert list_config_resources(image, [TOPIC, BROKER]) == []
    assert ("g1", GROUP) in list_config_resources(image, [])


def test_describe_quorum_maps_raft_numbers() -> None:
    answer = cpb.DescribeQuorumResponse(
        leader_id=2, term=7, commit_index=120,
        voters=[cpb.VoterState(node_id=1, address="127.0.0.1:9093", match_index=118),
                cpb.VoterState(node_id=2, address="127.0.0.2:9093", match_index=121)],
        observers=[cpb.ObserverState(node_id=1, metadata_offset=99)],
    )  # fmt: skip
    partition = quorum_partition(answer, now_ms=1_000)
    assert (partition["leader_id"], partition["leader_epoch"], partition["high_watermark"]) == (
        2, 7, 120,
    )  # fmt: skip
    voters = {v["replica_id"]: v for v in partition["current_voters"]}
    assert voters[1]["log_end_offset"] == 118 and voters[1]["last_caught_up_timestamp"] == -1
    assert voters[2]["last_caught_up_timestamp"] == 1_000
    assert partition["observers"][0]["log_end_offset"] == 99
    nodes = quorum_nodes(answer)
    assert nodes[0]["listeners"] == [{"name": "CONTROLLER", "host": "127.0.0.1", "port": 9093}]
    leaderless = quorum_partition(cpb.DescribeQuorumResponse(leader_id=-1), now_ms=0)
    assert leaderless["error_code"] == ErrorCode.NOT_LEADER_OR_FOLLOWER.code
