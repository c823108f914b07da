"""A node's config file as its broker's DescribeConfigs lists it
(metadata_quorum/broker_describe.py): every NodeConfig key under its Kafka name, the values the
file (or a ``RAFTLOG_*`` variable) sets (STATIC_BROKER_CONFIG) and raftlog's default of the
others (DEFAULT_CONFIG), as Kafka's property strings."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

from dataplane.server.config import NodeConfig
from metadata_quorum.broker_describe import NodeConfigView
from metadata_quorum.topic_config_defs import ConfigType

GATHERED = "topic.config.defaults"  # not a key of its own: the log.* keys a file sets


def property_string(value: Any) -> str | None:
    """A NodeConfig value as Kafka's property string (None: null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, frozenset | set):
        return ",".join(sorted(str(v) for v in value))
    return str(value)


def _type(annotation: Any) -> ConfigType:
    """The DescribeConfigs type of a raftlog-only key, from its field's annotation."""
    kinds = {a for a in typing.get_args(annotation) if a is not type(None)} or {annotation}
    kind = next(iter(kinds))
    origin = typing.get_origin(kind) or kind
    if origin is bool:
        return ConfigType.BOOLEAN
    if origin is int:
        return ConfigType.INT
    if origin in (frozenset, set, list):
        return ConfigType.LIST
    if origin in (str, Path, typing.Literal):
        return ConfigType.STRING
    return ConfigType.UNKNOWN


def node_config_view(config: NodeConfig) -> NodeConfigView:
    fields = {name: f for name, f in NodeConfig.model_fields.items() if f.alias != GATHERED}
    values = config.model_dump(by_alias=True)
    static = {
        fields[name].alias or name: property_string(values[fields[name].alias or name])
        for name in config.model_fields_set
        if name in fields
    }
    defaults = {
        f.alias or name: None if f.is_required() else property_string(f.get_default())
        for name, f in fields.items()
    }
    types = {f.alias or name: _type(f.annotation) for name, f in fields.items()}
    return NodeConfigView(
        static={k: v for k, v in static.items() if v is not None} | config.topic_config_defaults,
        defaults=defaults,
        types=types,
    )
