"""Kafka 4's topic configs as DescribeConfigs shows them: each one's type, a short doc string,
its broker synonyms (the ``log.*`` names that set its default for a broker or the cluster,
Kafka's ``ServerTopicConfigSynonyms``) and whether raftlog honours it.

A topic's value comes from the first of these that sets it (Kafka's precedence):
DYNAMIC_TOPIC_CONFIG (the topic's own) ← DYNAMIC_BROKER_CONFIG (a broker's dynamic ``log.*``)
← DYNAMIC_DEFAULT_BROKER_CONFIG (the cluster-wide ``log.*``, resource BROKER "") ←
STATIC_BROKER_CONFIG (the broker's node config file) ← DEFAULT_CONFIG (Kafka's default). Within
one layer the first synonym set wins: ``log.roll.ms`` before ``log.roll.hours``. Dynamically
(AlterConfigs on a broker or the cluster) only each config's first synonym may be set, as in
Kafka's ``DynamicLogConfig``; a node config file may use any of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum

HOUR_MS = 60 * 60 * 1000
MINUTE_MS = 60 * 1000


class ConfigType(IntEnum):
    """Kafka's DescribeConfigs ``config_type`` (v3+)."""

    UNKNOWN = 0
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


@dataclass(frozen=True)
class Synonym:
    """A broker config that sets a topic config's default; its value times ``ms_per_unit``
    (``log.retention.hours``: 3_600_000) is the topic config's."""

    name: str
    ms_per_unit: int = 1


@dataclass(frozen=True)
class TopicConfigDef:
    name: str
    type: ConfigType
    doc: str
    synonyms: tuple[Synonym, ...] = ()
    # None: honoured. Else why it is accepted and validated but changes nothing here.
    no_effect: str | None = None


def _log(name: str) -> Synonym:
    return Synonym(f"log.{name}")


_NO_REMOTE = "no tiered storage here (remote.storage.enable=true is refused)"
_T = ConfigType
TOPIC_CONFIG_DEFS: dict[str, TopicConfigDef] = {
    d.name: d
    for d in (
        TopicConfigDef("cleanup.policy", _T.LIST, "delete and/or compact old segments",
                       (_log("cleanup.policy"),)),
        TopicConfigDef("compression.type", _T.STRING,
                       "producer (keep each batch's codec) or the codec the leader stores "
                       "batches in: uncompressed, gzip, snappy, lz4, zstd",
                       (Synonym("compression.type"),)),
        TopicConfigDef("compression.gzip.level", _T.INT, "gzip level of compression.type=gzip",
                       (Synonym("compression.gzip.level"),)),
        TopicConfigDef("compression.lz4.level", _T.INT, "lz4 level of compression.type=lz4",
                       (Synonym("compression.lz4.level"),)),
        TopicConfigDef("compression.zstd.level", _T.INT, "zstd level of compression.type=zstd",
                       (Synonym("compression.zstd.level"),)),
        TopicConfigDef("delete.retention.ms", _T.LONG,
                       "how long a compacted topic keeps tombstones and markers",
                       (Synonym("log.cleaner.delete.retention.ms"),)),
        TopicConfigDef("file.delete.delay.ms", _T.LONG,
                       "wait before a deleted segment's files are removed",
                       (_log("segment.delete.delay.ms"),)),
        TopicConfigDef("flush.messages", _T.LONG, "fsync after this many records",
                       (_log("flush.interval.messages"),)),
        TopicConfigDef("flush.ms", _T.LONG, "fsync when the last one is this old",
                       (_log("flush.interval.ms"), _log("flush.scheduler.interval.ms"))),
        TopicConfigDef("flush.on.ack", _T.BOOLEAN,
                       "raftlog's: fsync before acknowledging acks=all"),
        TopicConfigDef("follower.replication.throttled.replicas", _T.LIST,
                       "replicas whose follower fetches are throttled"),
        TopicConfigDef("index.interval.bytes", _T.INT, "bytes between offset index entries",
                       (_log("index.interval.bytes"),)),
        TopicConfigDef("leader.replication.throttled.replicas", _T.LIST,
                       "replicas whose leader-side catch-up traffic is throttled"),
        TopicConfigDef("key.schema.validation", _T.BOOLEAN,
                       "raftlog's: the leader refuses a record whose key does not carry a "
                       "schema id its node's schema registry knows (INVALID_RECORD)"),
        TopicConfigDef("local.retention.bytes", _T.LONG, "local bytes kept with tiered storage",
                       (_log("local.retention.bytes"),), _NO_REMOTE),
        TopicConfigDef("local.retention.ms", _T.LONG, "local time kept with tiered storage",
                       (_log("local.retention.ms"),), _NO_REMOTE),
        TopicConfigDef("max.compaction.lag.ms", _T.LONG,
                       "longest a record stays uncompacted",
                       (Synonym("log.cleaner.max.compaction.lag.ms"),)),
        TopicConfigDef("max.message.bytes", _T.INT, "largest record batch accepted",
                       (Synonym("message.max.bytes"),)),
        TopicConfigDef("message.downconversion.enable", _T.BOOLEAN,
                       "down-convert fetched batches for old consumers",
                       (_log("message.downconversion.enable"),),
                       "as in Kafka 4: only message format v2 is served"),
        TopicConfigDef("message.timestamp.after.max.ms", _T.LONG,
                       "how far ahead of the broker a CreateTime timestamp may be",
                       (_log("message.timestamp.after.max.ms"),)),
        TopicConfigDef("message.timestamp.before.max.ms", _T.LONG,
                       "how far behind the broker a CreateTime timestamp may be",
                       (_log("message.timestamp.before.max.ms"),)),
        TopicConfigDef("message.timestamp.type", _T.STRING,
                       "CreateTime or LogAppendTime (the leader stamps its clock)",
                       (_log("message.timestamp.type"),)),
        TopicConfigDef("min.cleanable.dirty.ratio", _T.DOUBLE,
                       "dirty share of the log that starts a compaction",
                       (Synonym("log.cleaner.min.cleanable.ratio"),)),
        TopicConfigDef("min.compaction.lag.ms", _T.LONG,
                       "shortest a record stays uncompacted",
                       (Synonym("log.cleaner.min.compaction.lag.ms"),)),
        TopicConfigDef("min.insync.replicas", _T.INT,
                       "in-sync replicas an acks=all produce needs; below it the high "
                       "watermark holds and leavers stay eligible leaders (KIP-966)",
                       (Synonym("min.insync.replicas"),)),
        TopicConfigDef("preallocate", _T.BOOLEAN, "preallocate segment files",
                       (_log("preallocate"),)),
        TopicConfigDef("producer.id.expiration.ms", _T.LONG,
                       "idle time after which a producer id's state is dropped",
                       (Synonym("producer.id.expiration.ms"),)),
        TopicConfigDef("remote.log.copy.disable", _T.BOOLEAN,
                       "stop copying segments to tiered storage", (), _NO_REMOTE),
        TopicConfigDef("remote.log.delete.on.disable", _T.BOOLEAN,
                       "delete tiered data when tiered storage is turned off", (), _NO_REMOTE),
        TopicConfigDef("remote.storage.enable", _T.BOOLEAN, "tiered storage for the topic",
                       (), _NO_REMOTE),
        TopicConfigDef("retention.bytes", _T.LONG, "largest a partition grows (-1: no bound)",
                       (_log("retention.bytes"),)),
        TopicConfigDef("retention.ms", _T.LONG, "how long segments are kept (-1: forever)",
                       (_log("retention.ms"), Synonym("log.retention.minutes", MINUTE_MS),
                        Synonym("log.retention.hours", HOUR_MS))),
        TopicConfigDef("segment.bytes", _T.INT, "size at which a segment rolls",
                       (_log("segment.bytes"),)),
        TopicConfigDef("segment.index.bytes", _T.INT, "size of a segment's offset index",
                       (_log("index.size.max.bytes"),)),
        TopicConfigDef("segment.jitter.ms", _T.LONG, "up to this much earlier rolls by time",
                       (_log("roll.jitter.ms"), Synonym("log.roll.jitter.hours", HOUR_MS))),
        TopicConfigDef("segment.ms", _T.LONG, "age at which a segment rolls",
                       (_log("roll.ms"), Synonym("log.roll.hours", HOUR_MS))),
        TopicConfigDef("unclean.leader.election.enable", _T.BOOLEAN,
                       "elect an out-of-sync replica when no in-sync one is left",
                       (Synonym("unclean.leader.election.enable"),)),
        TopicConfigDef("value.schema.validation", _T.BOOLEAN,
                       "raftlog's: the leader refuses a record whose value does not carry a "
                       "schema id its node's schema registry knows (INVALID_RECORD)"),
    )
}  # fmt: skip

# the topic configs above that Kafka 4.1 does not define, each with why raftlog takes it; the
# rest are Kafka 4.1's (its released documentation, generated/topic_config.html)
NOT_KAFKA_TOPIC_CONFIGS: dict[str, str] = {
    "flush.on.ack": "raftlog's own",
    "key.schema.validation": "raftlog's own, after Redpanda's redpanda.key.schema.id.validation",
    "value.schema.validation": "raftlog's own, after Redpanda's "
    "redpanda.value.schema.id.validation",
    "message.downconversion.enable": "removed by Kafka 4.0; still taken so that topics "
    "created with it stay valid",
    "producer.id.expiration.ms": "raftlog's own: Kafka's broker config, here also per topic",
}
KAFKA_TOPIC_CONFIGS = frozenset(TOPIC_CONFIG_DEFS) - NOT_KAFKA_TOPIC_CONFIGS.keys()

# broker config -> (topic config, ms per unit); every synonym a node config file may set
BROKER_SYNONYMS: dict[str, tuple[str, int]] = {
    s.name: (d.name, s.ms_per_unit) for d in TOPIC_CONFIG_DEFS.values() for s in d.synonyms
}
# the ones AlterConfigs may set on a broker or the cluster: each topic config's first synonym
DYNAMIC_BROKER_SYNONYMS = frozenset(
    d.synonyms[0].name for d in TOPIC_CONFIG_DEFS.values() if d.synonyms
)


def topic_values_from_broker(values: Mapping[str, str]) -> dict[str, tuple[str, str, str]]:
    """The topic configs that broker configs ``values`` set: topic config -> (its value, the
    broker config it came from, that one's own value), the first synonym set winning; hours and
    minutes become ms.
    A value that is no integer where a unit is converted is passed on as it is, for the
    topic config's validation to refuse it by name."""
    out: dict[str, tuple[str, str, str]] = {}
    for topic_key, definition in TOPIC_CONFIG_DEFS.items():
        for synonym in definition.synonyms:
            value = values.get(synonym.name)
            if value is None:
                continue
            out[topic_key] = (_in_ms(value, synonym.ms_per_unit), synonym.name, value)
            break
    return out


def _in_ms(value: str, ms_per_unit: int) -> str:
    if ms_per_unit == 1:
        return value
    try:
        return str(int(value.strip()) * ms_per_unit)
    except ValueError:
        return value


# the types of the other configs DescribeConfigs shows (a broker's and the cluster's)
OTHER_CONFIG_TYPES: dict[str, ConfigType] = {
    "num.partitions": ConfigType.INT,
    "default.replication.factor": ConfigType.INT,
    "auto.leader.rebalance.enable": ConfigType.BOOLEAN,
    "leader.imbalance.per.broker.percentage": ConfigType.INT,
    "leader.replication.throttled.rate": ConfigType.LONG,
    "follower.replication.throttled.rate": ConfigType.LONG,
    # group configs (metadata_quorum/group_configs.py)
    "consumer.session.timeout.ms": ConfigType.INT,
    "consumer.heartbeat.interval.ms": ConfigType.INT,
    "share.session.timeout.ms": ConfigType.INT,
    "share.heartbeat.interval.ms": ConfigType.INT,
    "share.record.lock.duration.ms": ConfigType.INT,
    "share.auto.offset.reset": ConfigType.STRING,
    # client metrics subscriptions (metadata_quorum/client_metrics_configs.py)
    "metrics": ConfigType.LIST,
    "interval.ms": ConfigType.INT,
    "match": ConfigType.LIST,
    "share.isolation.level": ConfigType.STRING,
}


def definition_of(name: str) -> TopicConfigDef | None:
    """The topic config ``name`` is, or sets the default of (a broker synonym)."""
    found = TOPIC_CONFIG_DEFS.get(name)
    if found is None and name in BROKER_SYNONYMS:
        found = TOPIC_CONFIG_DEFS[BROKER_SYNONYMS[name][0]]
    return found


def config_type(name: str) -> ConfigType:
    """DescribeConfigs' ``config_type`` of a topic, broker or cluster config (UNKNOWN if none)."""
    found = definition_of(name)
    if found is not None:
        return found.type
    return OTHER_CONFIG_TYPES.get(name, ConfigType.UNKNOWN)


def documentation(name: str) -> str | None:
    """A short doc string for DescribeConfigs' ``include_documentation``."""
    found = definition_of(name)
    return found.doc if found is not None else None
