"""Topic and cluster configuration the controller validates and stores (Kafka's dotted names).

A topic's effective config = Kafka's default ← cluster-wide override (resource BROKER, name "")
← the topic's own override. A broker's dynamic configs (the replication throttles) = Kafka's
default ← the cluster-wide default (resource BROKER, name "") ← the broker's own (resource
BROKER, name = its id). Values are stored as strings, exactly as the user gave them, after
validation; ``describe`` shows every key with its effective value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from metadata_quorum.image import MetadataImage
from metadata_quorum.records import ConfigResourceType
from raftlog.config import INT64_MAX, ConfigError, LogConfig, describe_validation_error

THROTTLED_REPLICAS_MAX_CHARS = 1_000_000
THROTTLED_REPLICAS_FORMAT = (
    "must be the literal '*' or a list of replicas in the format "
    "[partitionId]:[brokerId],[partitionId]:[brokerId],..."
)


@dataclass(frozen=True)
class ThrottledReplicas:
    """A topic's ``leader.replication.throttled.replicas`` or
    ``follower.replication.throttled.replicas``: every replica (``*``) or the listed
    ``partition:broker`` pairs. A broker throttles partition P on its side when ``P:<its id>`` is
    listed (Kafka's ``parseThrottledPartitions``)."""

    every: bool = False
    replicas: frozenset[tuple[int, int]] = frozenset()  # (partition, broker id)

    def covers(self, partition: int, broker_id: int) -> bool:
        return self.every or (partition, broker_id) in self.replicas

    @classmethod
    def parse(cls, value: str) -> ThrottledReplicas:
        """Kafka's ThrottledReplicaListValidator: ``*``, or ``partition:broker`` entries
        separated by commas (blanks around them and empty entries allowed); ValueError else."""
        entries = [entry.strip() for entry in value.split(",")]
        if "".join(entries) == "*":
            return cls(every=True)
        replicas = set()
        for entry in filter(None, entries):
            partition, colon, broker = entry.partition(":")
            if not (colon and partition.isascii() and partition.isdigit()):
                raise ValueError(THROTTLED_REPLICAS_FORMAT)
            if not (broker.isascii() and broker.isdigit()):
                raise ValueError(THROTTLED_REPLICAS_FORMAT)
            replicas.add((int(partition), int(broker)))
        return cls(replicas=frozenset(replicas))

    def __str__(self) -> str:
        return "*" if self.every else ",".join(f"{p}:{b}" for p, b in sorted(self.replicas))


class ReplicationConfig(BaseModel):
    """Topic configs that belong to replication rather than to the log on disk."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    min_insync_replicas: int = Field(1, alias="min.insync.replicas", ge=1, le=2**31 - 1)
    unclean_leader_election_enable: bool = Field(False, alias="unclean.leader.election.enable")
    # the replicas whose catch-up traffic the brokers' replication throttles bound
    leader_replication_throttled_replicas: str = Field(
        "", alias="leader.replication.throttled.replicas", max_length=THROTTLED_REPLICAS_MAX_CHARS
    )
    follower_replication_throttled_replicas: str = Field(
        "",
        alias="follower.replication.throttled.replicas",
        max_length=THROTTLED_REPLICAS_MAX_CHARS,
    )

    @field_validator(
        "leader_replication_throttled_replicas", "follower_replication_throttled_replicas"
    )
    @classmethod
    def _throttled_replicas(cls, value: str) -> str:
        ThrottledReplicas.parse(value)
        return value


class BrokerConfig(BaseModel):
    """Broker configs that change at run time (Kafka's dynamic broker configs), per broker
    (resource BROKER, name = the broker id) or cluster-wide (name "")."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    # bytes/s of throttled replicas' catch-up traffic a leader sends / a follower fetches
    leader_replication_throttled_rate: int = Field(
        INT64_MAX, alias="leader.replication.throttled.rate", ge=0, le=INT64_MAX
    )
    follower_replication_throttled_rate: int = Field(
        INT64_MAX, alias="follower.replication.throttled.rate", ge=0, le=INT64_MAX
    )


class ClusterConfig(BaseModel):
    """Cluster-wide settings of the controller (resource BROKER, name "")."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    num_partitions: int = Field(1, alias="num.partitions", ge=1, le=100_000)
    default_replication_factor: int = Field(1, alias="default.replication.factor", ge=1, le=32)
    auto_leader_rebalance_enable: bool = Field(True, alias="auto.leader.rebalance.enable")
    # a broker whose preferred partitions it does not lead exceed this share gets them back
    leader_imbalance_per_broker_percentage: int = Field(
        10, alias="leader.imbalance.per.broker.percentage", ge=0, le=100
    )


def _aliases(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(f.alias or name for name, f in model.model_fields.items())


LOG_KEYS = _aliases(LogConfig)
REPLICATION_KEYS = _aliases(ReplicationConfig)
CLUSTER_KEYS = _aliases(ClusterConfig)
BROKER_KEYS = _aliases(BrokerConfig)
TOPIC_KEYS = LOG_KEYS | REPLICATION_KEYS


def _parse(model: type[BaseModel], values: Mapping[str, Any]) -> Any:
    try:
        return model.model_validate(dict(values))
    except ValidationError as error:
        raise ConfigError(describe_validation_error(error)) from error


def validate_topic_configs(values: Mapping[str, str]) -> None:
    """Raise INVALID_CONFIG naming each unknown key or bad value."""
    unknown = sorted(set(values) - TOPIC_KEYS)
    if unknown:
        raise ConfigError("; ".join(f"{key}: unknown topic configuration key" for key in unknown))
    LogConfig.parse({k: v for k, v in values.items() if k in LOG_KEYS})
    _parse(ReplicationConfig, {k: v for k, v in values.items() if k in REPLICATION_KEYS})


def validate_cluster_configs(values: Mapping[str, str]) -> None:
    """Cluster-wide overrides: the cluster keys plus defaults for every topic and broker key."""
    unknown = sorted(set(values) - TOPIC_KEYS - CLUSTER_KEYS - BROKER_KEYS)
    if unknown:
        raise ConfigError("; ".join(f"{key}: unknown configuration key" for key in unknown))
    validate_topic_configs({k: v for k, v in values.items() if k in TOPIC_KEYS})
    _parse(ClusterConfig, {k: v for k, v in values.items() if k in CLUSTER_KEYS})
    _parse(BrokerConfig, {k: v for k, v in values.items() if k in BROKER_KEYS})


def validate_broker_configs(values: Mapping[str, str]) -> None:
    """One broker's own overrides (resource BROKER, name = its id): the dynamic broker keys."""
    unknown = sorted(set(values) - BROKER_KEYS)
    if unknown:
        raise ConfigError(
            "; ".join(
                f"{key}: not a per-broker configuration key (per broker: "
                f"{', '.join(sorted(BROKER_KEYS))}; set the others cluster-wide, name '')"
                for key in unknown
            )
        )
    _parse(BrokerConfig, values)


def cluster_overrides(image: MetadataImage) -> Mapping[str, str]:
    return image.configs.get((ConfigResourceType.BROKER, ""), {})


def cluster_config(image: MetadataImage) -> ClusterConfig:
    values = {k: v for k, v in cluster_overrides(image).items() if k in CLUSTER_KEYS}
    config: ClusterConfig = _parse(ClusterConfig, values)
    return config


def broker_overrides(image: MetadataImage, broker_id: int) -> Mapping[str, str]:
    return image.configs.get((ConfigResourceType.BROKER, str(broker_id)), {})


def effective_broker_values(image: MetadataImage, broker_id: int) -> dict[str, str]:
    """Overrides that apply to broker ``broker_id``: the cluster-wide ones, then its own."""
    merged = {k: v for k, v in cluster_overrides(image).items() if k in BROKER_KEYS}
    merged.update(broker_overrides(image, broker_id))
    return merged


def broker_config(image: MetadataImage, broker_id: int) -> BrokerConfig:
    config: BrokerConfig = _parse(BrokerConfig, effective_broker_values(image, broker_id))
    return config


def effective_topic_values(image: MetadataImage, topic: str) -> dict[str, str]:
    """Overrides that apply to ``topic``: cluster-wide ones, then the topic's own."""
    merged = {k: v for k, v in cluster_overrides(image).items() if k in TOPIC_KEYS}
    merged.update(image.topic_configs(topic))
    return merged


def replication_config(image: MetadataImage, topic: str) -> ReplicationConfig:
    values = effective_topic_values(image, topic)
    config: ReplicationConfig = _parse(
        ReplicationConfig, {k: v for k, v in values.items() if k in REPLICATION_KEYS}
    )
    return config


def throttled_replicas(config: ReplicationConfig) -> tuple[ThrottledReplicas, ThrottledReplicas]:
    """A topic's (leader, follower) throttled replicas, from its ``replication_config``."""
    return (
        ThrottledReplicas.parse(config.leader_replication_throttled_replicas),
        ThrottledReplicas.parse(config.follower_replication_throttled_replicas),
    )


def log_config(image: MetadataImage, topic: str) -> LogConfig:
    values = effective_topic_values(image, topic)
    return LogConfig.parse({k: v for k, v in values.items() if k in LOG_KEYS})


def _as_properties(model: BaseModel) -> dict[str, str]:
    out = {}
    for key, value in model.model_dump(by_alias=True).items():
        out[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def describe_topic(image: MetadataImage, topic: str) -> list[tuple[str, str, bool]]:
    """Every topic key: (name, effective value, is_default)."""
    values = effective_topic_values(image, topic)
    defaults = LogConfig().to_properties() | _as_properties(ReplicationConfig())
    effective = log_config(image, topic).to_properties() | _as_properties(
        replication_config(image, topic)
    )
    return [(key, effective[key], key not in values) for key in sorted(defaults)]


def describe_cluster(image: MetadataImage) -> list[tuple[str, str, bool]]:
    overrides = cluster_overrides(image)
    defaults = (
        LogConfig().to_properties()
        | _as_properties(ReplicationConfig())
        | _as_properties(ClusterConfig())
        | _as_properties(BrokerConfig())
    )
    return [
        (key, overrides.get(key, value), key not in overrides)
        for key, value in sorted(defaults.items())
    ]


def describe_broker(image: MetadataImage, broker_id: int) -> list[tuple[str, str, bool]]:
    """Every dynamic broker key of ``broker_id``: (name, effective value, is_default)."""
    values = effective_broker_values(image, broker_id)
    effective = _as_properties(broker_config(image, broker_id))
    return [(key, effective[key], key not in values) for key in sorted(effective)]
