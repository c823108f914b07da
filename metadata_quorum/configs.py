"""Topic and cluster configuration the controller validates and stores (Kafka's dotted names).

A topic's effective config = Kafka's default ← cluster-wide override (resource BROKER, name "")
← the topic's own override. A broker's dynamic configs (the replication throttles) = Kafka's
default ← the broker's node config file (STATIC_BROKER_CONFIG; the broker registers these
values, so the controller can describe them) ← the cluster-wide default (resource BROKER,
name "") ← the broker's own (resource BROKER, name = its id): Kafka's precedence. Values are
stored as strings, exactly as the user gave them, after validation; ``describe`` shows every
key with its effective value and where that value comes from (Kafka's ``ConfigSource``).

``alter_dynamic_configs`` is the AlterConfigs / IncrementalAlterConfigs arithmetic: a
resource's dynamic set and a list of operations (SET, DELETE, APPEND, SUBTRACT) give its new
set, validated whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from metadata_quorum.image import MetadataImage
from metadata_quorum.records import ConfigResourceType
from raftlog.config import INT64_MAX, ConfigError, LogConfig, describe_validation_error
from raftlog.errors import ErrorCode, KafkaError

THROTTLED_REPLICAS_MAX_CHARS = 1_000_000
LEADER_THROTTLED_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_THROTTLED_REPLICAS = "follower.replication.throttled.replicas"
# Kafka's configs of type LIST among raftlog's: the ones APPEND and SUBTRACT apply to
LIST_KEYS = frozenset({"cleanup.policy", LEADER_THROTTLED_REPLICAS, FOLLOWER_THROTTLED_REPLICAS})


class ConfigSource(IntEnum):
    """Kafka's DescribeConfigs ``config_source`` values (those that apply here)."""

    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


class DescribedConfig(NamedTuple):
    name: str
    value: str
    is_default: bool  # Kafka's DescribeConfigs v0 flag: the value is Kafka's default
    source: ConfigSource


class AlterOp(IntEnum):
    """Kafka's AlterConfigOp.OpType ids (IncrementalAlterConfigs ``config_operation``)."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


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


def known_keys(kind: ConfigResourceType, name: str) -> frozenset[str]:
    """The keys a resource may override: a topic's, one broker's dynamic ones, or (the
    cluster-wide default, broker "") all of them."""
    if kind is ConfigResourceType.TOPIC:
        return TOPIC_KEYS
    return BROKER_KEYS if name else TOPIC_KEYS | CLUSTER_KEYS | BROKER_KEYS


def validate_dynamic_configs(
    kind: ConfigResourceType, name: str, values: Mapping[str, str]
) -> None:
    if kind is ConfigResourceType.TOPIC:
        validate_topic_configs(values)
    elif name:
        validate_broker_configs(values)
    else:
        validate_cluster_configs(values)


def _parts(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def _listed(op: AlterOp, key: str, value: str, current: str) -> str:
    """APPEND (the entries not listed yet, in order) or SUBTRACT on a list config's value."""
    if key not in LIST_KEYS:
        raise ConfigError(
            f"{key}: Config value {op.name.lower()} is not allowed for config key: {key} "
            f"(only list configs: {', '.join(sorted(LIST_KEYS))})"
        )
    parts, given = _parts(current), _parts(value)
    if op is AlterOp.APPEND:
        parts += [part for part in dict.fromkeys(given) if part not in parts]
    else:
        parts = [part for part in parts if part not in given]
    return ",".join(parts)


def alter_dynamic_configs(
    kind: ConfigResourceType,
    name: str,
    current: Mapping[str, str],
    ops: Sequence[tuple[AlterOp, str, str | None]],
    *,
    replace: bool = False,
) -> dict[str, str]:
    """The resource's new dynamic set after ``ops`` (op, key, value), validated whole.

    IncrementalAlterConfigs: SET a value, DELETE the override (back to the next source),
    APPEND entries to / SUBTRACT entries from a list config, starting from its override or
    else Kafka's default. AlterConfigs (``replace``): the SET values become the whole set.
    A key named twice is INVALID_REQUEST (as Kafka's ConfigAdminManager); an unknown key, a
    null value to set, APPEND/SUBTRACT on a key that is no list, or a bad resulting value is
    INVALID_CONFIG naming the key."""
    keys = [key for _, key, _ in ops]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise KafkaError(ErrorCode.INVALID_REQUEST, f"duplicate config keys: {', '.join(twice)}")
    unknown = sorted(set(keys) - known_keys(kind, name))
    if unknown:
        what = "topic" if kind is ConfigResourceType.TOPIC else "broker" if name else "cluster"
        raise ConfigError("; ".join(f"{key}: unknown {what} configuration key" for key in unknown))
    new = {} if replace else dict(current)
    defaults = default_values()
    for op, key, value in ops:
        if op is AlterOp.DELETE:
            new.pop(key, None)
        elif value is None:
            raise ConfigError(f"{key}: a null value cannot be set (delete the key instead)")
        elif op is AlterOp.SET:
            new[key] = value
        else:
            new[key] = _listed(op, key, value, new.get(key, defaults[key]))
    validate_dynamic_configs(kind, name, new)
    return new


def cluster_overrides(image: MetadataImage) -> Mapping[str, str]:
    return image.configs.get((ConfigResourceType.BROKER, ""), {})


def cluster_config(image: MetadataImage) -> ClusterConfig:
    values = {k: v for k, v in cluster_overrides(image).items() if k in CLUSTER_KEYS}
    config: ClusterConfig = _parse(ClusterConfig, values)
    return config


def broker_overrides(image: MetadataImage, broker_id: int) -> Mapping[str, str]:
    return image.configs.get((ConfigResourceType.BROKER, str(broker_id)), {})


def static_broker_values(image: MetadataImage, broker_id: int) -> Mapping[str, str]:
    """The dynamic broker configs broker ``broker_id``'s config file sets, as it registered them."""
    registration = image.brokers.get(broker_id)
    return dict(registration.static_configs) if registration is not None else {}


def broker_value_sources(
    image: MetadataImage, broker_id: int, static: Mapping[str, str] | None = None
) -> dict[str, tuple[str, ConfigSource]]:
    """Each broker key set somewhere for ``broker_id``, with its winning value and source:
    its own dynamic value > the cluster-wide dynamic default > its config file (``static``,
    or as registered when None) > Kafka's default (not listed)."""
    statics = static_broker_values(image, broker_id) if static is None else static
    layers = (
        (statics, ConfigSource.STATIC_BROKER_CONFIG),
        (cluster_overrides(image), ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG),
        (broker_overrides(image, broker_id), ConfigSource.DYNAMIC_BROKER_CONFIG),
    )
    merged: dict[str, tuple[str, ConfigSource]] = {}
    for values, source in layers:
        merged.update((k, (v, source)) for k, v in values.items() if k in BROKER_KEYS)
    return merged


def effective_broker_values(
    image: MetadataImage, broker_id: int, static: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Values that apply to broker ``broker_id`` (see ``broker_value_sources``)."""
    return {k: v for k, (v, _) in broker_value_sources(image, broker_id, static).items()}


def broker_config(
    image: MetadataImage, broker_id: int, static: Mapping[str, str] | None = None
) -> BrokerConfig:
    """A broker passes its own config file's values as ``static`` (it knows them before it
    has registered them); the controller uses the registered ones."""
    values = effective_broker_values(image, broker_id, static)
    config: BrokerConfig = _parse(BrokerConfig, values)
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


def default_values() -> dict[str, str]:
    """Kafka's default of every key raftlog knows, as DescribeConfigs shows it."""
    return (
        LogConfig().to_properties()
        | _as_properties(ReplicationConfig())
        | _as_properties(ClusterConfig())
        | _as_properties(BrokerConfig())
    )


def _described(key: str, value: str, source: ConfigSource) -> DescribedConfig:
    return DescribedConfig(key, value, source is ConfigSource.DEFAULT_CONFIG, source)


def describe_topic(image: MetadataImage, topic: str) -> list[DescribedConfig]:
    """Every topic key with its effective value: the topic's own override, the cluster-wide
    one (DYNAMIC_DEFAULT_BROKER_CONFIG), or Kafka's default."""
    own, cluster = image.topic_configs(topic), cluster_overrides(image)
    defaults = LogConfig().to_properties() | _as_properties(ReplicationConfig())
    effective = log_config(image, topic).to_properties() | _as_properties(
        replication_config(image, topic)
    )
    rows = []
    for key in sorted(defaults):
        if key in own:
            source = ConfigSource.DYNAMIC_TOPIC_CONFIG
        elif key in cluster:
            source = ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG
        else:
            source = ConfigSource.DEFAULT_CONFIG
        rows.append(_described(key, effective[key], source))
    return rows


def describe_cluster(image: MetadataImage) -> list[DescribedConfig]:
    """Every key with its cluster-wide override (DYNAMIC_DEFAULT_BROKER_CONFIG) or default."""
    overrides = cluster_overrides(image)
    return [
        _described(key, overrides[key], ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)
        if key in overrides
        else _described(key, value, ConfigSource.DEFAULT_CONFIG)
        for key, value in sorted(default_values().items())
    ]


def describe_broker(
    image: MetadataImage, broker_id: int, static: Mapping[str, str] | None = None
) -> list[DescribedConfig]:
    """Every dynamic broker key of ``broker_id`` with its effective value and its source."""
    sources = broker_value_sources(image, broker_id, static)
    effective = _as_properties(broker_config(image, broker_id, static))
    return [
        _described(key, effective[key], sources.get(key, ("", ConfigSource.DEFAULT_CONFIG))[1])
        for key in sorted(effective)
    ]
