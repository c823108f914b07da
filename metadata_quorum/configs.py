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

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from metadata_quorum import client_metrics_configs as client_metrics
from metadata_quorum import connection_configs as cc
from metadata_quorum.group_configs import GROUP_KEYS, KAFKA_GROUP_RULES, GroupRules
from metadata_quorum.image import MetadataImage
from metadata_quorum.records import ConfigResourceType
from metadata_quorum.topic_config_defs import (
    BROKER_SYNONYMS,
    DYNAMIC_BROKER_SYNONYMS,
    TOPIC_CONFIG_DEFS,
    topic_values_from_broker,
)
from raftlog.config import INT64_MAX, ConfigError, LogConfig, describe_validation_error
from raftlog.errors import ErrorCode, KafkaError

THROTTLED_REPLICAS_MAX_CHARS = 1_000_000
LEADER_THROTTLED_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_THROTTLED_REPLICAS = "follower.replication.throttled.replicas"
# Kafka's configs of type LIST among raftlog's: the ones APPEND and SUBTRACT apply to
LIST_KEYS = frozenset(
    {"cleanup.policy", LEADER_THROTTLED_REPLICAS, FOLLOWER_THROTTLED_REPLICAS}
    | client_metrics.LIST_KEYS
)


class ConfigSource(IntEnum):
    """Kafka's DescribeConfigs ``config_source`` values (those that apply here)."""

    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


class DescribedSynonym(NamedTuple):
    name: str
    value: str
    source: ConfigSource


class DescribedConfig(NamedTuple):
    name: str
    value: str
    is_default: bool  # Kafka's DescribeConfigs v0 flag: the value is Kafka's default
    source: ConfigSource
    # Kafka's synonyms: every source that sets the value, the winning one first
    synonyms: tuple[DescribedSynonym, ...] = ()


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
    # Kafka's connection limits (SocketServerConfigs), applied by the KAFKA listener
    # (dataplane/kafka/connection_limits.py): connections in all, from one address, and the
    # per-address exceptions ("host:count,...")
    max_connections: int = Field(
        cc.MAX_CONNECTIONS_DEFAULT, alias="max.connections", ge=0, le=cc.INT32_MAX
    )
    max_connections_per_ip: int = Field(
        cc.MAX_CONNECTIONS_PER_IP_DEFAULT, alias="max.connections.per.ip", ge=0, le=cc.INT32_MAX
    )
    max_connections_per_ip_overrides: str = Field(
        "", alias="max.connections.per.ip.overrides", max_length=cc.PER_IP_OVERRIDES_MAX_CHARS
    )

    @field_validator("max_connections_per_ip_overrides")
    @classmethod
    def _per_ip_overrides(cls, value: str) -> str:
        cc.parse_per_ip_overrides(value)
        return value

    @model_validator(mode="after")
    def _per_ip_zero_needs_overrides(self) -> BrokerConfig:
        cc.check_per_ip_limits(self.max_connections_per_ip, self.max_connections_per_ip_overrides)
        return self


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


# Kafka 4.1 broker configs whose update mode is read-only (not in Kafka's
# DynamicBrokerConfig.AllDynamicConfigs): only a node's config file sets them, and
# AlterConfigs on a broker refuses them by name. Every broker synonym of a topic config but
# the first is among them (Kafka's DynamicLogConfig takes only ``log.retention.ms``, not
# ``log.retention.hours``). A key in neither this set nor raftlog's dynamic keys is unknown.
KAFKA_READ_ONLY_BROKER_CONFIGS = frozenset(
    {
        "node.id", "broker.id", "process.roles", "log.dirs", "log.dir", "metadata.log.dir",
        "controller.listener.names", "controller.quorum.voters",
        "controller.quorum.bootstrap.servers", "controller.quorum.election.timeout.ms",
        "controller.quorum.fetch.timeout.ms", "inter.broker.listener.name",
        "security.inter.broker.protocol", "broker.rack", "broker.heartbeat.interval.ms",
        "broker.session.timeout.ms", "initial.broker.registration.timeout.ms",
        "auto.create.topics.enable", "authorizer.class.name", "delete.topic.enable",
        "num.partitions", "default.replication.factor", "auto.leader.rebalance.enable",
        "leader.imbalance.check.interval.seconds", "advertised.listeners",
        "log.retention.check.interval.ms", "group.initial.rebalance.delay.ms",
        "group.min.session.timeout.ms", "group.max.session.timeout.ms", "group.max.size",
        "offsets.topic.num.partitions", "offsets.topic.replication.factor",
        "offsets.topic.segment.bytes", "offsets.retention.minutes",
        "offsets.retention.check.interval.ms", "offsets.commit.timeout.ms",
        "offset.metadata.max.bytes", "transaction.state.log.num.partitions",
        "transaction.state.log.replication.factor", "transaction.state.log.segment.bytes",
        "transaction.state.log.min.isr", "transaction.max.timeout.ms",
        "transactional.id.expiration.ms", "replica.fetch.max.bytes",
        "replica.fetch.response.max.bytes", "replica.fetch.wait.max.ms",
        "replica.lag.time.max.ms", "replica.selector.class", "replica.socket.timeout.ms",
        "max.incremental.fetch.session.cache.slots", "queued.max.requests",
        "socket.send.buffer.bytes", "socket.receive.buffer.bytes", "socket.request.max.bytes",
        "num.replica.alter.log.dirs.threads", "fetch.max.bytes", "metadata.log.segment.bytes",
        "metadata.max.retention.bytes",
    }
    | (BROKER_SYNONYMS.keys() - DYNAMIC_BROKER_SYNONYMS)
)  # fmt: skip


def refuse_read_only_broker_configs(name: str, keys: Sequence[str]) -> None:
    """Kafka's DynamicBrokerConfig.validateConfigs: a broker config only a node's config file
    sets is INVALID_REQUEST (as Kafka's ConfigAdminManager answers it, KAFKA-13609), named in
    Kafka's words. raftlog's own cluster-wide keys (``num.partitions``, ...) stay settable on
    the cluster default (broker "")."""
    allowed = known_keys(ConfigResourceType.BROKER, name)
    read_only = sorted((set(keys) & KAFKA_READ_ONLY_BROKER_CONFIGS) - allowed)
    if read_only:
        raise KafkaError(
            ErrorCode.INVALID_REQUEST,
            f"Cannot update these configs dynamically: Set({', '.join(read_only)})",
        )


def _parse(model: type[BaseModel], values: Mapping[str, Any]) -> Any:
    try:
        return model.model_validate(dict(values))
    except ValidationError as error:
        raise ConfigError(describe_validation_error(error)) from error


REMOTE_STORAGE_DISABLED = (
    "remote.storage.enable: Tiered Storage functionality is disabled in the broker. Topic "
    "cannot be configured with remote log storage."
)


def validate_topic_configs(values: Mapping[str, str]) -> None:
    """Raise INVALID_CONFIG naming each unknown key or bad value. remote.storage.enable=true
    is refused as by a Kafka cluster with remote.log.storage.system.enable=false."""
    unknown = sorted(set(values) - TOPIC_KEYS)
    if unknown:
        raise ConfigError("; ".join(f"{key}: unknown topic configuration key" for key in unknown))
    config = LogConfig.parse({k: v for k, v in values.items() if k in LOG_KEYS})
    _parse(ReplicationConfig, {k: v for k, v in values.items() if k in REPLICATION_KEYS})
    if config.remote_storage_enable:
        raise ConfigError(REMOTE_STORAGE_DISABLED)


def validate_broker_log_configs(values: Mapping[str, str]) -> None:
    """Broker configs that set topic configs' defaults (``log.retention.hours``, ...): each
    validated as the topic config it sets, INVALID_CONFIG naming the broker config."""
    for key, value in values.items():
        topic_key, _ = BROKER_SYNONYMS[key]
        converted = topic_values_from_broker({key: value})[topic_key][0]
        try:
            validate_topic_configs({topic_key: converted})
        except ConfigError as error:
            raise ConfigError(f"{key}: {error.message.partition(': ')[2]}") from error


def validate_cluster_configs(values: Mapping[str, str]) -> None:
    """Cluster-wide overrides: the cluster keys plus defaults for every topic and broker key."""
    unknown = sorted(
        set(values) - TOPIC_KEYS - CLUSTER_KEYS - BROKER_KEYS - DYNAMIC_BROKER_SYNONYMS
    )
    if unknown:
        raise ConfigError("; ".join(f"{key}: unknown configuration key" for key in unknown))
    validate_topic_configs({k: v for k, v in values.items() if k in TOPIC_KEYS})
    validate_broker_log_configs({k: v for k, v in values.items() if k in DYNAMIC_BROKER_SYNONYMS})
    _parse(ClusterConfig, {k: v for k, v in values.items() if k in CLUSTER_KEYS})
    _parse(BrokerConfig, {k: v for k, v in values.items() if k in BROKER_KEYS})


def validate_broker_configs(values: Mapping[str, str]) -> None:
    """One broker's own overrides (resource BROKER, name = its id): the dynamic broker keys
    and the dynamic topic defaults (``log.retention.ms``, ...)."""
    unknown = sorted(set(values) - BROKER_KEYS - DYNAMIC_BROKER_SYNONYMS)
    if unknown:
        raise ConfigError(
            "; ".join(
                f"{key}: not a per-broker configuration key (per broker: "
                f"{', '.join(sorted(BROKER_KEYS))} and the log.* topic defaults; set the "
                "others cluster-wide, name '')"
                for key in unknown
            )
        )
    _parse(BrokerConfig, {k: v for k, v in values.items() if k in BROKER_KEYS})
    validate_broker_log_configs({k: v for k, v in values.items() if k in DYNAMIC_BROKER_SYNONYMS})


def validate_static_broker_configs(values: Mapping[str, str]) -> None:
    """What a broker's config file sets and registers: its dynamic broker keys and any topic
    config default (every broker synonym, ``log.retention.hours`` too)."""
    unknown = sorted(set(values) - BROKER_KEYS - BROKER_SYNONYMS.keys())
    if unknown:
        raise ConfigError(
            "; ".join(f"{key}: not a broker configuration key a file registers" for key in unknown)
        )
    _parse(BrokerConfig, {k: v for k, v in values.items() if k in BROKER_KEYS})
    validate_broker_log_configs({k: v for k, v in values.items() if k in BROKER_SYNONYMS})


def known_keys(kind: ConfigResourceType, name: str) -> frozenset[str]:
    """The keys a resource may override: a topic's, one broker's dynamic ones, or (the
    cluster-wide default, broker "") all of them; a group's (metadata_quorum.group_configs)."""
    if kind is ConfigResourceType.TOPIC:
        return TOPIC_KEYS
    if kind is ConfigResourceType.GROUP:
        return GROUP_KEYS
    if kind is ConfigResourceType.CLIENT_METRICS:
        return client_metrics.CLIENT_METRICS_KEYS
    if name:
        return BROKER_KEYS | DYNAMIC_BROKER_SYNONYMS
    return TOPIC_KEYS | CLUSTER_KEYS | BROKER_KEYS | DYNAMIC_BROKER_SYNONYMS


def validate_dynamic_configs(
    kind: ConfigResourceType,
    name: str,
    values: Mapping[str, str],
    group_rules: GroupRules = KAFKA_GROUP_RULES,
) -> None:
    if kind is ConfigResourceType.TOPIC:
        validate_topic_configs(values)
    elif kind is ConfigResourceType.GROUP:
        group_rules.validate(values)
    elif kind is ConfigResourceType.CLIENT_METRICS:
        client_metrics.validate_client_metrics_configs(name, values)
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
    group_rules: GroupRules = KAFKA_GROUP_RULES,
) -> dict[str, str]:
    """The resource's new dynamic set after ``ops`` (op, key, value), validated whole (a
    group's with ``group_rules``: the controller node's group defaults and bounds).

    IncrementalAlterConfigs: SET a value, DELETE the override (back to the next source),
    APPEND entries to / SUBTRACT entries from a list config, starting from its override or
    else Kafka's default. AlterConfigs (``replace``): the SET values become the whole set.
    A key named twice, or a broker config Kafka only reads from a node's file
    (``log.dirs``: ``refuse_read_only_broker_configs``), is INVALID_REQUEST (as Kafka's
    ConfigAdminManager); an unknown key, a
    null value to set, APPEND/SUBTRACT on a key that is no list, or a bad resulting value is
    INVALID_CONFIG naming the key."""
    keys = [key for _, key, _ in ops]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise KafkaError(ErrorCode.INVALID_REQUEST, f"duplicate config keys: {', '.join(twice)}")
    if kind is ConfigResourceType.BROKER:
        refuse_read_only_broker_configs(
            name, [key for op, key, _ in ops if op is not AlterOp.DELETE]
        )
    unknown = sorted(set(keys) - known_keys(kind, name))
    if unknown and kind is ConfigResourceType.CLIENT_METRICS:  # Kafka's INVALID_REQUEST
        client_metrics.validate_client_metrics_configs(name, dict.fromkeys(unknown, ""))
    if unknown:
        what = {ConfigResourceType.TOPIC: "topic", ConfigResourceType.GROUP: "group"}.get(
            kind, "broker" if name else "cluster"
        )
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
            new[key] = _listed(op, key, value, new.get(key, defaults.get(key, "")))
    validate_dynamic_configs(kind, name, new, group_rules)
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


TopicLayer = dict[str, tuple[str, str, str]]  # topic key -> (value, name set under, its value)


def topic_value_layers(
    image: MetadataImage,
    topic: str,
    broker_id: int | None = None,
    static: Mapping[str, str] | None = None,
) -> list[tuple[ConfigSource, TopicLayer]]:
    """Where ``topic``'s values come from, most specific first (Kafka's precedence): its own
    overrides, broker ``broker_id``'s dynamic ``log.*`` defaults, the cluster-wide ones
    (``log.*`` names, or the topic names themselves: raftlog's older form, which wins), the
    broker's node config file (``static``, or as it registered it). Without ``broker_id`` (the
    controller's own decisions) only the topic's and the cluster-wide layers."""
    own = {k: (v, k, v) for k, v in image.topic_configs(topic).items()}
    layers: list[tuple[ConfigSource, TopicLayer]] = [(ConfigSource.DYNAMIC_TOPIC_CONFIG, own)]
    if broker_id is not None:
        broker = topic_values_from_broker(broker_overrides(image, broker_id))
        layers.append((ConfigSource.DYNAMIC_BROKER_CONFIG, broker))
    cluster = cluster_overrides(image)
    cluster_layer = topic_values_from_broker(cluster)
    cluster_layer.update((k, (v, k, v)) for k, v in cluster.items() if k in TOPIC_KEYS)
    layers.append((ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG, cluster_layer))
    if broker_id is not None:
        statics = static_broker_values(image, broker_id) if static is None else static
        layers.append((ConfigSource.STATIC_BROKER_CONFIG, topic_values_from_broker(statics)))
    return layers


def effective_topic_values(
    image: MetadataImage,
    topic: str,
    broker_id: int | None = None,
    static: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The values set for ``topic`` somewhere (see ``topic_value_layers``); Kafka's default
    for the others."""
    merged: dict[str, str] = {}
    for _, layer in reversed(topic_value_layers(image, topic, broker_id, static)):
        merged.update((k, value) for k, (value, _, _) in layer.items())
    return merged


def replication_config(
    image: MetadataImage,
    topic: str,
    broker_id: int | None = None,
    static: Mapping[str, str] | None = None,
) -> ReplicationConfig:
    values = effective_topic_values(image, topic, broker_id, static)
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


def log_config(
    image: MetadataImage,
    topic: str,
    broker_id: int | None = None,
    static: Mapping[str, str] | None = None,
) -> LogConfig:
    """``topic``'s log config; as broker ``broker_id`` applies it when given (with its
    ``log.*`` defaults, ``static`` its node config file's)."""
    values = effective_topic_values(image, topic, broker_id, static)
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


def describe_topic(
    image: MetadataImage,
    topic: str,
    broker_id: int | None = None,
    static: Mapping[str, str] | None = None,
) -> list[DescribedConfig]:
    """Every topic key with its effective value (as broker ``broker_id`` applies it, when
    given), the source of that value and its synonyms: each layer that sets it, under the name
    it is set with there (``log.roll.hours``: its own value), then Kafka's default under the
    topic config's first broker synonym."""
    layers = topic_value_layers(image, topic, broker_id, static)
    defaults = LogConfig().to_properties() | _as_properties(ReplicationConfig())
    effective = log_config(image, topic, broker_id, static).to_properties() | _as_properties(
        replication_config(image, topic, broker_id, static)
    )
    rows = []
    for key in sorted(defaults):
        synonyms = [
            DescribedSynonym(layer[key][1], layer[key][2], source)
            for source, layer in layers
            if key in layer
        ]
        names = TOPIC_CONFIG_DEFS[key].synonyms
        default_name = names[0].name if names else key
        synonyms.append(DescribedSynonym(default_name, defaults[key], ConfigSource.DEFAULT_CONFIG))
        source = synonyms[0].source
        rows.append(
            DescribedConfig(
                key, effective[key], source is ConfigSource.DEFAULT_CONFIG, source, tuple(synonyms)
            )
        )
    return rows


def _log_synonym_defaults() -> dict[str, str]:
    """Kafka's default of each dynamic ``log.*`` topic default (its topic config's)."""
    topic_defaults = LogConfig().to_properties() | _as_properties(ReplicationConfig())
    return {name: topic_defaults[BROKER_SYNONYMS[name][0]] for name in DYNAMIC_BROKER_SYNONYMS}


def describe_cluster(image: MetadataImage) -> list[DescribedConfig]:
    """Every key with its cluster-wide override (DYNAMIC_DEFAULT_BROKER_CONFIG) or default."""
    overrides = cluster_overrides(image)
    return [
        _described(key, overrides[key], ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)
        if key in overrides
        else _described(key, value, ConfigSource.DEFAULT_CONFIG)
        for key, value in sorted((_log_synonym_defaults() | default_values()).items())
    ]


def describe_broker(
    image: MetadataImage, broker_id: int, static: Mapping[str, str] | None = None
) -> list[DescribedConfig]:
    """Every dynamic broker key of ``broker_id`` with its effective value and its source."""
    sources = broker_value_sources(image, broker_id, static)
    effective = _as_properties(broker_config(image, broker_id, static))
    rows = [
        _described(key, effective[key], sources.get(key, ("", ConfigSource.DEFAULT_CONFIG))[1])
        for key in effective
    ]
    statics = static_broker_values(image, broker_id) if static is None else static
    layers = (
        (broker_overrides(image, broker_id), ConfigSource.DYNAMIC_BROKER_CONFIG),
        (cluster_overrides(image), ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG),
        (statics, ConfigSource.STATIC_BROKER_CONFIG),
    )
    for key, default in _log_synonym_defaults().items():
        if key in effective:
            continue
        found = next(((v[key], s) for v, s in layers if key in v), None)
        rows.append(_described(key, *(found or (default, ConfigSource.DEFAULT_CONFIG))))
    return sorted(rows)
