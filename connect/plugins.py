"""Connector classes by name, and connector config validation.

``connector.class`` names a built-in connector by its short name (``FileStreamSource``), its
Python path (``connect.file.FileStreamSource``) or Kafka's class name
(``org.apache.kafka.connect.file.FileStreamSourceConnector``); other packages add connectors
through the ``raftlog.connectors`` entry-point group.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from pydantic import ValidationError

from connect.api import Connector, ConnectorConfig, SinkConnector, SourceConnector
from connect.file import FileStreamSink, FileStreamSource
from connect.mirror import MirrorSourceConnector
from connect.mirror_checkpoint import MirrorCheckpointConnector

PLUGIN_GROUP = "raftlog.connectors"
BUILT_IN: dict[str, type[Connector]] = {
    "FileStreamSource": FileStreamSource,
    "FileStreamSink": FileStreamSink,
    "MirrorSourceConnector": MirrorSourceConnector,
    "MirrorCheckpointConnector": MirrorCheckpointConnector,
}
KAFKA_NAMES = {
    "org.apache.kafka.connect.file.FileStreamSourceConnector": "FileStreamSource",
    "org.apache.kafka.connect.file.FileStreamSinkConnector": "FileStreamSink",
    "org.apache.kafka.connect.mirror.MirrorSourceConnector": "MirrorSourceConnector",
    "org.apache.kafka.connect.mirror.MirrorCheckpointConnector": "MirrorCheckpointConnector",
}


class ConfigInvalid(ValueError):
    """A connector config with errors, one per invalid field (Kafka answers 400 with them)."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__(
            f"Connector configuration is invalid and contains the following {len(errors)} "
            "error(s):\n" + "\n".join(errors)
        )


def plugins() -> dict[str, type[Connector]]:
    """Every known connector class by its Python path."""
    found = {f"{c.__module__}.{c.__name__}": c for c in BUILT_IN.values()}
    for entry in entry_points(group=PLUGIN_GROUP):
        loaded = entry.load()
        if isinstance(loaded, type) and issubclass(loaded, SourceConnector | SinkConnector):
            found[f"{loaded.__module__}.{loaded.__name__}"] = loaded
    return found


def connector_class(name: str) -> type[Connector] | None:
    short = KAFKA_NAMES.get(name, name)
    if short in BUILT_IN:
        return BUILT_IN[short]
    known = plugins()
    if short in known:
        return known[short]
    matches = [c for path, c in known.items() if path.rsplit(".", 1)[-1] == short]
    return matches[0] if len(matches) == 1 else None


@dataclass(frozen=True)
class Validated:
    cls: type[Connector]
    config: ConnectorConfig

    @property
    def kind(self) -> str:
        return "source" if issubclass(self.cls, SourceConnector) else "sink"


def validate(name: str, config: Mapping[str, Any]) -> Validated:
    """The connector class and its parsed config; ConfigInvalid naming every bad field."""
    values = dict(config)
    if values.setdefault("name", name) != name:
        raise ConfigInvalid(
            [f"name: {values['name']!r} differs from the connector's name {name!r}"]
        )
    class_name = values.get("connector.class")
    if not isinstance(class_name, str) or not class_name:
        raise ConfigInvalid(['connector.class: Missing required configuration "connector.class"'])
    cls = connector_class(class_name)
    if cls is None:
        raise ConfigInvalid([f"connector.class: no connector plugin named {class_name!r}"])
    try:
        parsed = cls.config_model.model_validate(values)
    except ValidationError as error:
        raise ConfigInvalid([_describe(e) for e in error.errors()]) from error
    return Validated(cls, parsed)


def _describe(error: Mapping[str, Any]) -> str:
    where = ".".join(str(part) for part in error.get("loc", ())) or "config"
    if error.get("type") == "missing":
        return f'{where}: Missing required configuration "{where}" which has no default value'
    return f"{where}: {error.get('msg', 'invalid')}"
