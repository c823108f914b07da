"""Topic and cluster configuration the controller validates and stores (Kafka's dotted names).

A topic's effective config = Kafka's default ← cluster-wide override (resource BROKER, name "")
← the topic's own override. Values are stored as strings, exactly as the user gave them, after
validation; ``describe`` shows every key with its effective value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from metadata_quorum.image import MetadataImage
from metadata_quorum.records import ConfigResourceType
from raftlog.config import ConfigError, LogConfig, describe_validation_error


class ReplicationConfig(BaseModel):
    """Topic configs that belong to replication rather than to the log on disk."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    min_insync_replicas: int = Field(1, alias="min.insync.replicas", ge=1, le=2**31 - 1)
    unclean_leader_election_enable: bool = Field(False, alias="unclean.leader.election.enable")


class ClusterConfig(BaseModel):
    """Cluster-wide settings of the controller (resource BROKER, name "")."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    num_partitions: int = Field(1, alias="num.partitions", ge=1, le=100_000)
    default_replication_factor: int = Field(1, alias="default.replication.factor", ge=1, le=32)
    auto_leader_rebalance_enable: bool = Field(True, alias="auto.leader.rebalance.enable")


def _aliases(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(f.alias or name for name, f in model.model_fields.items())


LOG_KEYS = _aliases(LogConfig)
REPLICATION_KEYS = _aliases(ReplicationConfig)
CLUSTER_KEYS = _aliases(ClusterConfig)
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
    """Cluster-wide overrides: the cluster keys plus defaults for every topic key."""
    unknown = sorted(set(values) - TOPIC_KEYS - CLUSTER_KEYS)
    if unknown:
        raise ConfigError("; ".join(f"{key}: unknown configuration key" for key in unknown))
    validate_topic_configs({k: v for k, v in values.items() if k in TOPIC_KEYS})
    _parse(ClusterConfig, {k: v for k, v in values.items() if k in CLUSTER_KEYS})


def cluster_overrides(image: MetadataImage) -> Mapping[str, str]:
    return image.configs.get((ConfigResourceType.BROKER, ""), {})


def cluster_config(image: MetadataImage) -> ClusterConfig:
    values = {k: v for k, v in cluster_overrides(image).items() if k in CLUSTER_KEYS}
    config: ClusterConfig = _parse(ClusterConfig, values)
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
    )
    return [
        (key, overrides.get(key, value), key not in overrides)
        for key, value in sorted(defaults.items())
    ]
