"""Kafka 4's topic configs: every one known, validated, with its broker synonyms (``log.*``)
setting its default statically, per broker or cluster-wide, and DescribeConfigs' sources and
synonyms in Kafka's order."""

from __future__ import annotations

import uuid

import pytest

from metadata_quorum import configs
from metadata_quorum.configs import ConfigSource
from metadata_quorum.image import MetadataImage, apply
from metadata_quorum.records import (
    ConfigRecord,
    ConfigResourceType,
    MetadataRecord,
    RegisterBroker,
    TopicRecord,
)
from metadata_quorum.topic_config_defs import (
    TOPIC_CONFIG_DEFS,
    ConfigType,
    config_type,
    topic_values_from_broker,
)
from raftlog.config import ConfigError

TOPIC, BROKER = ConfigResourceType.TOPIC, ConfigResourceType.BROKER
KAFKA_4_TOPIC_CONFIGS = {
    "cleanup.policy", "compression.gzip.level", "compression.lz4.level", "compression.type",
    "compression.zstd.level", "delete.retention.ms", "file.delete.delay.ms", "flush.messages",
    "flush.ms", "follower.replication.throttled.replicas", "index.interval.bytes",
    "leader.replication.throttled.replicas", "local.retention.bytes", "local.retention.ms",
    "max.compaction.lag.ms", "max.message.bytes", "message.downconversion.enable",
    "message.timestamp.after.max.ms", "message.timestamp.before.max.ms",
    "message.timestamp.type", "min.cleanable.dirty.ratio", "min.compaction.lag.ms",
    "min.insync.replicas", "preallocate", "remote.log.copy.disable",
    "remote.log.delete.on.disable", "remote.storage.enable", "retention.bytes", "retention.ms",
    "segment.bytes", "segment.index.bytes", "segment.jitter.ms", "segment.ms",
    "unclean.leader.election.enable",
}  # fmt: skip


def _image(*records: MetadataRecord) -> MetadataImage:
    image, _ = apply(MetadataImage(), [TopicRecord("t", uuid.UUID(int=7)), *records])
    return image


def test_every_kafka_4_topic_config_is_known_and_described() -> None:
    assert KAFKA_4_TOPIC_CONFIGS <= configs.TOPIC_KEYS
    assert set(TOPIC_CONFIG_DEFS) == configs.TOPIC_KEYS
    described = {row.name for row in configs.describe_topic(_image(), "t")}
    assert described == configs.TOPIC_KEYS


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"compression.type": "brotli"}, "compression.type"),
        ({"compression.gzip.level": "0"}, "compression.gzip.level"),
        ({"compression.lz4.level": "18"}, "compression.lz4.level"),
        ({"compression.zstd.level": "23"}, "compression.zstd.level"),
        ({"segment.jitter.ms": "-1"}, "segment.jitter.ms"),
        ({"max.compaction.lag.ms": "0"}, "max.compaction.lag.ms"),
        ({"min.compaction.lag.ms": "9", "max.compaction.lag.ms": "5"}, "min.compaction.lag.ms"),
        ({"local.retention.ms": "-3"}, "local.retention.ms"),
        ({"preallocate": "maybe"}, "preallocate"),
        ({"remote.storage.enable": "true"}, "Tiered Storage functionality is disabled"),
        ({"message.format.version": "3.0"}, "message.format.version: unknown"),
    ],
)
def test_bad_topic_configs_are_invalid_config_naming_the_key(
    values: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        configs.validate_topic_configs(values)


def test_good_values_of_the_new_configs_pass() -> None:
    configs.validate_topic_configs({
        "compression.type": "zstd", "compression.zstd.level": "-5", "compression.gzip.level": "-1",
        "segment.jitter.ms": "100", "max.compaction.lag.ms": "1000", "preallocate": "true",
        "message.downconversion.enable": "false", "file.delete.delay.ms": "0",
        "local.retention.bytes": "-2", "remote.storage.enable": "false",
    })  # fmt: skip


def test_broker_synonyms_convert_units_and_the_first_set_wins() -> None:
    assert topic_values_from_broker({"log.retention.hours": "2"}) == {
        "retention.ms": ("7200000", "log.retention.hours", "2")
    }
    both = topic_values_from_broker({"log.roll.hours": "1", "log.roll.ms": "500"})
    assert both["segment.ms"] == ("500", "log.roll.ms", "500")
    assert config_type("log.retention.hours") is ConfigType.LONG
    assert config_type("cleanup.policy") is ConfigType.LIST
    assert config_type("min.cleanable.dirty.ratio") is ConfigType.DOUBLE


def test_log_keys_are_dynamic_per_broker_and_cluster_wide_but_hours_only_static() -> None:
    configs.validate_dynamic_configs(BROKER, "", {"log.retention.ms": "1000"})
    configs.validate_dynamic_configs(BROKER, "3", {"log.roll.ms": "1000"})
    with pytest.raises(ConfigError, match=r"log\.retention\.hours"):
        configs.validate_dynamic_configs(BROKER, "", {"log.retention.hours": "1"})
    with pytest.raises(ConfigError, match=r"log\.cleaner\.min\.cleanable\.ratio"):
        configs.validate_dynamic_configs(BROKER, "", {"log.cleaner.min.cleanable.ratio": "2"})
    configs.validate_static_broker_configs({"log.retention.hours": "1", "compression.type": "lz4"})
    with pytest.raises(ConfigError, match=r"log\.roll\.hours"):
        configs.validate_static_broker_configs({"log.roll.hours": "soon"})


def test_precedence_and_synonyms_follow_kafka() -> None:
    registration = RegisterBroker(1, "inc", (), None, (("log.retention.hours", "2"),))
    image = _image(
        registration,
        ConfigRecord(BROKER, "", "log.retention.ms", "5000"),
        ConfigRecord(BROKER, "1", "log.retention.ms", "6000"),
        ConfigRecord(TOPIC, "t", "retention.ms", "7000"),
        ConfigRecord(BROKER, "", "log.roll.ms", "8000"),
    )
    rows = {row.name: row for row in configs.describe_topic(image, "t", 1)}
    retention = rows["retention.ms"]
    assert (retention.value, retention.source) == ("7000", ConfigSource.DYNAMIC_TOPIC_CONFIG)
    assert [(s.name, s.value, s.source) for s in retention.synonyms] == [
        ("retention.ms", "7000", ConfigSource.DYNAMIC_TOPIC_CONFIG),
        ("log.retention.ms", "6000", ConfigSource.DYNAMIC_BROKER_CONFIG),
        ("log.retention.ms", "5000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG),
        ("log.retention.hours", "2", ConfigSource.STATIC_BROKER_CONFIG),
        ("log.retention.ms", "604800000", ConfigSource.DEFAULT_CONFIG),
    ]
    assert rows["segment.ms"].value == "8000"
    assert rows["segment.ms"].source is ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG
    assert rows["compression.type"].source is ConfigSource.DEFAULT_CONFIG
    # the broker applies the same: its log.* defaults below the topic's own
    assert configs.log_config(image, "t", 1).segment_ms == 8000
    static_only = _image(registration)
    assert configs.log_config(static_only, "t", 1).retention_ms == 7_200_000
    assert configs.log_config(static_only, "t").retention_ms == 7 * 24 * 3600 * 1000
