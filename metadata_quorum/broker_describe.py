"""A broker's DescribeConfigs of itself, as Kafka's broker answers it (its ConfigHelper).

Resource BROKER named by the broker's own id lists every broker config the broker has: each key
of its node config under Kafka's name, every topic config's broker synonyms (``log.retention.ms``,
``log.retention.hours``, ...) and the dynamic broker and cluster keys. A value's source is the
first layer that sets it, in Kafka's order: the broker's own dynamic value
(DYNAMIC_BROKER_CONFIG), the cluster-wide dynamic default (resource BROKER "",
DYNAMIC_DEFAULT_BROKER_CONFIG), the node's config file (STATIC_BROKER_CONFIG), the default
(DEFAULT_CONFIG). Synonyms are Kafka's: for each of those layers in turn, every name of the
config's synonym group that the layer sets (``log.roll.ms`` before ``log.roll.hours``), then the
leading ones that name another config of the group dropped (Kafka's ``dropWhile``): describing
``log.roll.hours`` does not show ``log.roll.ms``'s value. ``read_only`` is true for a config
AlterConfigs cannot change here, a PASSWORD config is sensitive (value and synonyms' values
null), and the type is Kafka's (``metadata_quorum.kafka_broker_configs``; raftlog's own keys
carry their own).

The default resource (name "") lists only the cluster-wide dynamic values, each with that one
synonym, as Kafka's does. A broker describes no other broker: Kafka's clients send a BROKER
resource to the broker it names, and anything else is INVALID_REQUEST (``check_own_broker``).

Pure: the broker passes its metadata image and a ``NodeConfigView`` of its config file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from metadata_quorum.configs import (
    BROKER_KEYS,
    CLUSTER_KEYS,
    ConfigSource,
    broker_overrides,
    cluster_overrides,
    default_values,
)
from metadata_quorum.image import MetadataImage
from metadata_quorum.kafka_broker_configs import BY_NAME as KAFKA_BROKER_CONFIGS
from metadata_quorum.topic_config_defs import (
    BROKER_SYNONYMS,
    DYNAMIC_BROKER_SYNONYMS,
    TOPIC_CONFIG_DEFS,
    ConfigType,
    config_type,
    documentation,
)
from raftlog.errors import ErrorCode, KafkaError

KAFKA_NULL_DEFAULT = "(none)"  # kafka_broker_configs' way of writing a null default


@dataclass(frozen=True)
class NodeConfigView:
    """What a broker's node config says, for DescribeConfigs: the values its file sets (each
    key under Kafka's name, as Kafka's property string; the ``log.*`` topic defaults too),
    raftlog's default of every key it knows (None: null), and the type of each (Kafka's type
    wins for Kafka's keys)."""

    static: Mapping[str, str] = field(default_factory=dict)
    defaults: Mapping[str, str | None] = field(default_factory=dict)
    types: Mapping[str, ConfigType] = field(default_factory=dict)


class Synonym(NamedTuple):
    name: str
    value: str | None  # None: sensitive (or a null value)
    source: ConfigSource


class BrokerConfigRow(NamedTuple):
    """One config of a broker's DescribeConfigs, in Kafka's DescribeConfigsResourceResult terms."""

    name: str
    value: str | None
    source: ConfigSource
    synonyms: tuple[Synonym, ...]
    read_only: bool
    sensitive: bool
    type: ConfigType
    documentation: str | None


# AlterConfigs may change these on a broker or the cluster (the rest: the node's file only)
DYNAMIC_KEYS = BROKER_KEYS | DYNAMIC_BROKER_SYNONYMS | CLUSTER_KEYS


def check_own_broker(name: str, broker_id: int) -> None:
    """Kafka's ConfigHelper: a BROKER resource names this broker or is "" (the default)."""
    if not name:
        return
    try:
        asked = int(name)
    except ValueError as error:
        raise KafkaError(
            ErrorCode.INVALID_REQUEST, f"Broker id must be an integer, but it is: {name}"
        ) from error
    if asked != broker_id:
        raise KafkaError(
            ErrorCode.INVALID_REQUEST,
            f"Unexpected broker id, expected {broker_id} or empty string, but received {name}",
        )


def synonym_group(name: str) -> list[str]:
    """Kafka's DynamicBrokerConfig.brokerConfigSynonyms: a topic config default's every broker
    name, finest unit first (``log.roll.ms``, ``log.roll.hours``); else the name alone."""
    if name not in BROKER_SYNONYMS:
        return [name]
    return [s.name for s in TOPIC_CONFIG_DEFS[BROKER_SYNONYMS[name][0]].synonyms]


def _synonym_defaults() -> dict[str, str]:
    """The default of each topic config's broker synonym: raftlog's topic default, in the
    synonym's unit, under the names Kafka gives a default (``log.retention.hours`` = 168;
    ``log.retention.ms`` and ``log.retention.minutes`` are null in Kafka)."""
    topic_defaults = default_values()
    out: dict[str, str] = {}
    for synonym, (topic, ms_per_unit) in BROKER_SYNONYMS.items():
        kafka = KAFKA_BROKER_CONFIGS.get(synonym)
        if kafka is not None and kafka.default == KAFKA_NULL_DEFAULT:
            continue
        value = topic_defaults[topic]
        if ms_per_unit == 1:
            out[synonym] = value
        elif int(value) % ms_per_unit == 0:
            out[synonym] = str(int(value) // ms_per_unit)
    return out


def default_layer(view: NodeConfigView) -> dict[str, str]:
    """Every non-null default: the node's keys', the ``log.*`` synonyms', the dynamic keys'."""
    dynamic = {k: v for k, v in default_values().items() if k in BROKER_KEYS | CLUSTER_KEYS}
    node = {k: v for k, v in view.defaults.items() if v is not None}
    return dynamic | _synonym_defaults() | node


def _type(name: str, view: NodeConfigView) -> ConfigType:
    kafka = KAFKA_BROKER_CONFIGS.get(name)
    if kafka is not None:
        return ConfigType[kafka.type]
    return view.types.get(name) or config_type(name)


def _row(
    name: str, layers: list[tuple[Mapping[str, str], ConfigSource]], view: NodeConfigView
) -> BrokerConfigRow:
    kind = _type(name, view)
    sensitive = kind is ConfigType.PASSWORD
    group = synonym_group(name)
    found = [
        Synonym(n, None if sensitive else values[n], source)
        for values, source in layers
        for n in group
        if n in values
    ]
    while found and found[0].name != name:  # Kafka's dropWhile
        found.pop(0)
    value = found[0].value if found else None
    source = found[0].source if found else ConfigSource.DEFAULT_CONFIG
    return BrokerConfigRow(
        name, value, source, tuple(found), name not in DYNAMIC_KEYS, sensitive, kind,
        documentation(name),
    )  # fmt: skip


def describe_own_broker(
    image: MetadataImage, broker_id: int, view: NodeConfigView
) -> list[BrokerConfigRow]:
    """Every config of broker ``broker_id`` (this broker), sorted by name."""
    layers = [
        (broker_overrides(image, broker_id), ConfigSource.DYNAMIC_BROKER_CONFIG),
        (cluster_overrides(image), ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG),
        (view.static, ConfigSource.STATIC_BROKER_CONFIG),
        (default_layer(view), ConfigSource.DEFAULT_CONFIG),
    ]
    names = (
        view.defaults.keys() | view.static.keys() | BROKER_SYNONYMS.keys() | BROKER_KEYS
        | CLUSTER_KEYS
    )  # fmt: skip
    return [_row(name, layers, view) for name in sorted(names)]


def describe_cluster_default(image: MetadataImage, view: NodeConfigView) -> list[BrokerConfigRow]:
    """The cluster-wide dynamic values (resource BROKER ""), each its one synonym."""
    layers = [(cluster_overrides(image), ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)]
    return [_row(name, layers, view) for name in sorted(cluster_overrides(image))]
