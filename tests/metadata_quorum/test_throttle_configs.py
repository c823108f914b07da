"""The replication throttles' configs at the controller: the throttled-replicas format (Kafka's
ThrottledReplicaListValidator), the dynamic broker rates per broker (resource BROKER, name = the
id) over the cluster-wide default (name ""), refusals that name the key, and what AlterConfigs
and DescribeConfigs make of broker resources."""

from __future__ import annotations

import pytest

from metadata_quorum import configs
from metadata_quorum.configs import ConfigSource, ThrottledReplicas
from metadata_quorum.image import MetadataImage, apply
from metadata_quorum.records import ConfigRecord, ConfigResourceType
from metadata_quorum.service import _config_changes, _describe_configs
from protos import controller_pb2 as pb
from protos import metadata_pb2 as mpb
from raftlog.config import ConfigError
from raftlog.errors import ErrorCode

UNTHROTTLED = 2**63 - 1
LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"
LEADER_REPLICAS = "leader.replication.throttled.replicas"


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("", ThrottledReplicas()),
        ("*", ThrottledReplicas(every=True)),
        (" * ", ThrottledReplicas(every=True)),
        ("0:1", ThrottledReplicas(replicas=frozenset({(0, 1)}))),
        ("0:1, 0:2 ,,3:104", ThrottledReplicas(replicas=frozenset({(0, 1), (0, 2), (3, 104)}))),
    ],
)
def test_throttled_replicas_in_kafkas_format(value: str, parsed: ThrottledReplicas) -> None:
    assert ThrottledReplicas.parse(value) == parsed
    assert ThrottledReplicas.parse(str(parsed)) == parsed


@pytest.mark.parametrize("value", ["x", "0", "0:", ":1", "0:1:2", "-1:2", "0:1,*", "0;1", "٣:1"])
def test_a_bad_throttled_replicas_list_is_invalid_config_naming_the_key(value: str) -> None:
    with pytest.raises(ConfigError) as raised:
        configs.validate_topic_configs({LEADER_REPLICAS: value})
    assert raised.value.error is ErrorCode.INVALID_CONFIG
    assert raised.value.message.startswith(f"{LEADER_REPLICAS}: ")
    assert "partitionId" in raised.value.message


def test_which_replicas_a_broker_throttles() -> None:
    listed = ThrottledReplicas.parse("0:1,0:2,1:3")
    assert listed.covers(0, 1) and listed.covers(1, 3)
    assert not listed.covers(0, 3) and not listed.covers(1, 1)
    assert ThrottledReplicas.parse("*").covers(7, 9)
    assert not ThrottledReplicas().covers(0, 1)


def image_with(*records: ConfigRecord) -> MetadataImage:
    image, rejected = apply(MetadataImage(), list(records))
    assert not rejected
    return image


def broker(name: str, key: str, value: str | None) -> ConfigRecord:
    return ConfigRecord(ConfigResourceType.BROKER, name, key, value)


def test_a_broker_takes_its_own_rate_over_the_cluster_default_over_kafkas() -> None:
    assert configs.broker_config(MetadataImage(), 1).leader_replication_throttled_rate == (
        UNTHROTTLED
    )
    image = image_with(
        broker("", LEADER_RATE, "1000"), broker("", FOLLOWER_RATE, "2000"),
        broker("2", LEADER_RATE, "30"),
    )  # fmt: skip
    one, two = configs.broker_config(image, 1), configs.broker_config(image, 2)
    assert (one.leader_replication_throttled_rate, one.follower_replication_throttled_rate) == (
        1000, 2000,
    )  # fmt: skip
    assert (two.leader_replication_throttled_rate, two.follower_replication_throttled_rate) == (
        30, 2000,
    )  # fmt: skip

    def rates(described: list[configs.DescribedConfig]) -> list[tuple[object, ...]]:
        """The throttle rates among a broker's described keys (the log.* defaults follow)."""
        kept = [d for d in described if d.name in (FOLLOWER_RATE, LEADER_RATE)]
        return [(d.name, d.value, d.is_default, d.source) for d in kept]

    assert rates(configs.describe_broker(image, 2)) == [
        (FOLLOWER_RATE, "2000", False, ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG),
        (LEADER_RATE, "30", False, ConfigSource.DYNAMIC_BROKER_CONFIG),
    ]
    assert rates(configs.describe_broker(MetadataImage(), 2)) == [
        (FOLLOWER_RATE, str(UNTHROTTLED), True, ConfigSource.DEFAULT_CONFIG),
        (LEADER_RATE, str(UNTHROTTLED), True, ConfigSource.DEFAULT_CONFIG),
    ]


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({LEADER_RATE: "-1"}, LEADER_RATE),
        ({FOLLOWER_RATE: "fast"}, FOLLOWER_RATE),
        ({LEADER_RATE: str(2**63)}, LEADER_RATE),
        ({"num.partitions": "3"}, "num.partitions"),  # cluster-wide only
        ({"retention.ms": "1000"}, "retention.ms"),  # a topic default: cluster-wide only
    ],
)
def test_a_bad_per_broker_config_is_invalid_config_naming_the_key(
    values: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        configs.validate_broker_configs(values)
    assert raised.value.message.startswith(f"{named}: ")


def test_the_rates_are_cluster_wide_defaults_too() -> None:
    configs.validate_cluster_configs({LEADER_RATE: "0", FOLLOWER_RATE: str(UNTHROTTLED)})
    with pytest.raises(ConfigError, match=LEADER_RATE):
        configs.validate_cluster_configs({LEADER_RATE: "-5"})
    described = {row.name: row.value for row in configs.describe_cluster(MetadataImage())}
    assert described[LEADER_RATE] == str(UNTHROTTLED)


def alter(name: str, key: str, value: str) -> pb.AlterConfigsResource:
    return pb.AlterConfigsResource(
        resource=pb.ConfigResource(resource_type=mpb.CONFIG_RESOURCE_BROKER, resource_name=name),
        configs=[pb.AlterableConfig(name=key, value=value)],
    )


def test_alter_configs_of_a_broker_resource() -> None:
    error, _, records = _config_changes(MetadataImage(), alter("4", LEADER_RATE, "1048576"))
    assert (error, records) == (ErrorCode.NONE, [broker("4", LEADER_RATE, "1048576")])
    error, _, records = _config_changes(MetadataImage(), alter("004", FOLLOWER_RATE, "5"))
    assert (error, records) == (ErrorCode.NONE, [broker("4", FOLLOWER_RATE, "5")]), "broker 4's"
    error, message, records = _config_changes(MetadataImage(), alter("four", LEADER_RATE, "1"))
    assert (error, records) == (ErrorCode.INVALID_REQUEST, []) and "'four'" in message
    error, message, records = _config_changes(MetadataImage(), alter("4", LEADER_RATE, "-1"))
    assert (error, records) == (ErrorCode.INVALID_CONFIG, []) and LEADER_RATE in message
    error, message, _ = _config_changes(MetadataImage(), alter("4", "num.partitions", "2"))
    # read-only in Kafka (only the cluster-wide default takes it here)
    assert error is ErrorCode.INVALID_REQUEST and "num.partitions" in message
    error, _, records = _config_changes(MetadataImage(), alter("", LEADER_RATE, "7"))
    assert (error, records) == (ErrorCode.NONE, [broker("", LEADER_RATE, "7")])


def test_describe_configs_of_a_broker_resource() -> None:
    image = image_with(broker("3", FOLLOWER_RATE, "99"))
    resource = pb.ConfigResource(resource_type=mpb.CONFIG_RESOURCE_BROKER, resource_name="3")
    entries = {e.name: (e.value, e.is_default) for e in _describe_configs(image, resource, 3)}
    assert {k: v for k, v in entries.items() if k in (FOLLOWER_RATE, LEADER_RATE)} == {
        FOLLOWER_RATE: ("99", False),
        LEADER_RATE: (str(UNTHROTTLED), True),
    }
    assert entries["log.retention.ms"] == ("604800000", True), "and the log.* defaults"
