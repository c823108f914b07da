"""``raftlog configs``: describe and alter the dynamic configs of topics, brokers and groups
(Kafka's kafka-configs.sh for those entity types; docs/cli.md).

``describe`` shows a resource's overrides (``--all``: every config with its value, its source
and its synonyms), in kafka-configs.sh's lines. ``alter`` takes kafka-configs.sh's
``--add-config k=v,k2=[a,b]`` (a LIST value in square brackets, its commas kept) and
``--delete-config k,k2``, sends them as IncrementalAlterConfigs SET and DELETE operations and
prints what changed. For brokers ``--entity-default`` is the cluster-wide default (resource
BROKER ""). The controller validates: a broker config only a node's config file sets
(``log.dirs``) is INVALID_REQUEST "Cannot update these configs dynamically", as in Kafka.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from typing import Annotated, Any

import typer

from dataplane.client import AdminClient
from dataplane.client.admin import ConfigEntry, ConfigResource, ResourceType
from dataplane.tools.client_commands import (
    DEFAULT_BOOTSTRAP,
    BootstrapOption,
    JsonOption,
    admin_client,
    fail,
    kafka_errors,
    print_json,
)
from raftlog.errors import ErrorCode, KafkaError

__all__ = ["configs_app", "parse_add_config", "parse_delete_config"]

configs_app = typer.Typer(
    help="Describe and alter topic, broker and group configs (kafka-configs.sh).",
    no_args_is_help=True,
)


class EntityType(enum.StrEnum):
    TOPICS = "topics"
    BROKERS = "brokers"
    GROUPS = "groups"


RESOURCE_TYPES = {
    EntityType.TOPICS: ResourceType.TOPIC,
    EntityType.BROKERS: ResourceType.BROKER,
    EntityType.GROUPS: ResourceType.GROUP,
}
# the source of a resource's own overrides: what describe shows without --all (as Kafka's)
OVERRIDE_SOURCES = {
    EntityType.TOPICS: "DYNAMIC_TOPIC_CONFIG",
    EntityType.BROKERS: "DYNAMIC_BROKER_CONFIG",
    EntityType.GROUPS: "DYNAMIC_GROUP_CONFIG",
}
DEFAULT_BROKER_SOURCE = "DYNAMIC_DEFAULT_BROKER_CONFIG"

EntityTypeOption = Annotated[EntityType, typer.Option("--entity-type", case_sensitive=False)]
EntityNameOption = Annotated[
    str | None, typer.Option("--entity-name", help="topic name, broker id or group id")
]
EntityDefaultOption = Annotated[
    bool, typer.Option("--entity-default", help="brokers: the cluster-wide default")
]

# kafka-configs.sh's: a comma (or an '=') not inside square brackets
_OUTSIDE_BRACKETS = r"(?=[^\]]*(?:\[|$))"
_PAIR_SEPARATOR = re.compile("," + _OUTSIDE_BRACKETS)
_KEY_VALUE_SEPARATOR = re.compile(r"\s*=\s*" + _OUTSIDE_BRACKETS)
_KEY = re.compile(r"[a-zA-Z0-9._-]*")


def parse_add_config(text: str) -> dict[str, str]:
    """kafka-configs.sh's ``--add-config``: ``k=v`` pairs separated by commas, a value in
    square brackets keeping its commas (``cleanup.policy=[compact,delete]`` is
    ``compact,delete``); an empty value is allowed. INVALID_CONFIG for a pair without one '='
    or a key with characters Kafka's tool refuses."""
    added: dict[str, str] = {}
    for pair in _PAIR_SEPARATOR.split(text):
        parts = _KEY_VALUE_SEPARATOR.split(pair)
        if len(parts) != 2:
            raise KafkaError(
                ErrorCode.INVALID_CONFIG,
                'Invalid entity config: all configs to be added must be in the format "key=val".',
            )
        key = parts[0].strip()
        if not _KEY.fullmatch(key):
            raise KafkaError(
                ErrorCode.INVALID_CONFIG, f"Invalid character found for config key: {key}"
            )
        added[key] = re.sub(r"[\[\]]", "", parts[1]).strip()
    return added


def parse_delete_config(items: list[str] | None) -> list[str]:
    """``--delete-config k,k2`` (repeatable, as kafka-configs.sh's): the keys, in order, once."""
    keys = [key.strip() for item in items or () for key in item.split(",")]
    return list(dict.fromkeys(key for key in keys if key))


def _resource(entity_type: EntityType, name: str | None, default: bool) -> ConfigResource:
    if default == (name is not None):
        raise typer.BadParameter("give exactly one of --entity-name or --entity-default")
    if default and entity_type is not EntityType.BROKERS:
        raise typer.BadParameter(f"--entity-default is for brokers, not {entity_type}")
    if entity_type is EntityType.BROKERS and name is not None and not name.isdigit():
        raise typer.BadParameter(
            f"The entity name for brokers must be a valid integer broker id, found: {name}",
            param_hint="--entity-name",
        )
    return ConfigResource(RESOURCE_TYPES[entity_type], name or "")


def _override_source(entity_type: EntityType, resource: ConfigResource) -> str:
    if entity_type is EntityType.BROKERS and not resource.name:
        return DEFAULT_BROKER_SOURCE
    return OVERRIDE_SOURCES[entity_type]


def _entries(
    admin: AdminClient, entity_type: EntityType, resource: ConfigResource, every: bool
) -> list[ConfigEntry]:
    """The resource's described configs, sorted by name: its overrides only unless ``every``."""
    described = admin.describe_configs([resource])[resource]
    source = _override_source(entity_type, resource)
    return sorted(
        (e for e in described.values() if every or e.source == source), key=lambda e: e.name
    )


def _every_resource(admin: AdminClient, entity_type: EntityType) -> list[ConfigResource]:
    """kafka-configs.sh --describe without a name: every topic, every broker and then the
    cluster default, or every group."""
    kind = RESOURCE_TYPES[entity_type]
    if entity_type is EntityType.TOPICS:
        names = admin.list_topics()
    elif entity_type is EntityType.GROUPS:
        names = sorted(g.group_id for g in admin.list_groups())
    else:
        ids = sorted(b.broker_id for b in admin.describe_cluster().brokers)
        names = [*(str(i) for i in ids), ""]
    return [ConfigResource(kind, name) for name in names]


def _title(entity_type: EntityType, resource: ConfigResource, every: bool) -> str:
    if entity_type is EntityType.BROKERS and not resource.name:
        return "Default configs for brokers in the cluster are:"
    which = "All" if every else "Dynamic"
    return f"{which} configs for {entity_type[:-1]} {resource.name} are:"


def _line(entry: ConfigEntry) -> str:
    synonyms = ", ".join(f"{s.source}:{s.name}={s.value}" for s in entry.synonyms)
    return f"  {entry.name}={entry.value} sensitive=false synonyms={{{synonyms}}}"


def _entry_json(entry: ConfigEntry) -> dict[str, Any]:
    return {
        "name": entry.name,
        "value": entry.value,
        "source": entry.source,
        "is_default": entry.is_default,
        "sensitive": False,
        "read_only": False,
        "synonyms": [
            {"name": s.name, "value": s.value, "source": s.source} for s in entry.synonyms
        ],
    }


@configs_app.command("describe")
def configs_describe(
    entity_type: EntityTypeOption,
    entity_name: EntityNameOption = None,
    entity_default: EntityDefaultOption = False,
    every: Annotated[
        bool, typer.Option("--all", help="every config with its source, not only overrides")
    ] = False,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """A resource's overrides (every config with --all); without a name, every resource's."""
    whole_type = entity_name is None and not entity_default
    with kafka_errors(), admin_client(bootstrap) as admin:
        resources = (
            _every_resource(admin, entity_type)
            if whole_type
            else [_resource(entity_type, entity_name, entity_default)]
        )
        described = [(r, _entries(admin, entity_type, r, every)) for r in resources]
    if as_json:
        print_json(
            [
                {"entity_type": str(entity_type), "entity_name": r.name,
                 "configs": [_entry_json(e) for e in entries]}
                for r, entries in described
            ]
        )  # fmt: skip
        return
    for resource, entries in described:
        print(_title(entity_type, resource, every))
        for entry in entries:
            print(_line(entry))


def _changes(
    before: Mapping[str, str], added: Mapping[str, str], deleted: list[str]
) -> dict[str, tuple[str | None, str | None]]:
    """key -> (old override, new override) for each key the alteration changes."""
    after = {k: v for k, v in before.items() if k not in deleted} | dict(added)
    return {
        key: (before.get(key), after.get(key))
        for key in sorted(before.keys() | after.keys())
        if before.get(key) != after.get(key)
    }


def _completed(entity_type: EntityType, resource: ConfigResource) -> str:
    if entity_type is EntityType.BROKERS and not resource.name:
        return "Completed updating default config for brokers in the cluster."
    return f"Completed updating config for {entity_type[:-1]} {resource.name}."


@configs_app.command("alter")
def configs_alter(
    entity_type: EntityTypeOption,
    entity_name: EntityNameOption = None,
    entity_default: EntityDefaultOption = False,
    add_config: Annotated[
        str | None,
        typer.Option("--add-config", help=r"k1=v1,k2=\[a,b],k3=v3 (a LIST value in brackets)"),
    ] = None,
    delete_config: Annotated[
        list[str] | None, typer.Option("--delete-config", help="k1,k2 (repeatable)")
    ] = None,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """Set (--add-config) and remove (--delete-config) a resource's overrides."""
    resource = _resource(entity_type, entity_name, entity_default)
    deleted = parse_delete_config(delete_config)
    if add_config is None and not deleted:
        raise typer.BadParameter("give --add-config and/or --delete-config")
    with kafka_errors(), admin_client(bootstrap) as admin:
        added = parse_add_config(add_config) if add_config is not None else {}
        both = sorted(set(added) & set(deleted))
        if both:
            fail(KafkaError(ErrorCode.INVALID_REQUEST, f"duplicate config keys: {', '.join(both)}"))
        before = {e.name: e.value for e in _entries(admin, entity_type, resource, every=False)}
        missing = [key for key in deleted if key not in before]
        if missing:  # kafka-configs.sh's check: only an override can be deleted
            fail(KafkaError(ErrorCode.INVALID_CONFIG, f"Invalid config(s): {','.join(missing)}"))
        admin.alter_configs(resource, {**added, **dict.fromkeys(deleted)})
    changes = _changes(before, added, deleted)
    if as_json:
        print_json(
            {"entity_type": str(entity_type), "entity_name": resource.name,
             "changes": {k: {"old": old, "new": new} for k, (old, new) in changes.items()}}
        )  # fmt: skip
        return
    print(_completed(entity_type, resource))
    for key, (old, new) in changes.items():
        print(
            f"  {key}: {'(unset)' if old is None else old} -> {'(unset)' if new is None else new}"
        )
