"""The connectors' configuration as the records of ``connect-configs`` build it. Pure.

Records (key → JSON value), Kafka Connect's:

- ``connector-<name>`` → ``{"properties": {...}}``; null deletes the connector;
- ``task-<name>-<n>`` → ``{"properties": {...}}``: task n's config, pending until
- ``commit-<name>`` → ``{"tasks": count}``: the task configs written before it are the
  connector's tasks now (so a half-written set is never used);
- ``target-state-<name>`` → ``{"state": "STARTED" | "PAUSED"}``;
- ``restart-<name>`` → ``{"request": id}``: restart the connector and its tasks.

:meth:`ConfigState.apply` is the only mutator and says what changed, so a worker knows whether
the group must rebalance (connectors or task sets changed) or only local work must react
(target state, restart). Standalone mode applies the same records without a topic.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from connect.assignment import ConnectorTaskId, WorkToAssign

JsonDict = dict[str, Any]
STARTED = "STARTED"
PAUSED = "PAUSED"


class Change(enum.Enum):
    NONE = "none"
    ASSIGNMENT = "assignment"  # connectors or task sets changed: rebalance
    TARGET_STATE = "target_state"
    RESTART = "restart"
    CONFIG = "config"  # a connector's config changed: its connector regenerates task configs


def connector_key(name: str) -> str:
    return f"connector-{name}"


def task_key(task: ConnectorTaskId) -> str:
    return f"task-{task.connector}-{task.task}"


def commit_key(name: str) -> str:
    return f"commit-{name}"


def target_state_key(name: str) -> str:
    return f"target-state-{name}"


def restart_key(name: str) -> str:
    return f"restart-{name}"


@dataclass
class ConfigState:
    connectors: dict[str, JsonDict] = field(default_factory=dict)
    tasks: dict[str, list[JsonDict]] = field(default_factory=dict)
    target_states: dict[str, str] = field(default_factory=dict)
    restarts: dict[str, str] = field(default_factory=dict)
    offset: int = 0  # the next record of connect-configs to apply
    _pending: dict[ConnectorTaskId, JsonDict] = field(default_factory=dict)

    def apply(self, key: str, value: JsonDict | None, offset: int) -> tuple[Change, str]:
        """Apply the record at ``offset``; what changed and for which connector."""
        self.offset = max(self.offset, offset + 1)
        kind, _, rest = _split_key(key)
        if kind == "connector":
            return self._apply_connector(rest, value), rest
        if kind == "task":
            name, _, index = rest.rpartition("-")
            if value is not None and name and index.isdigit():
                self._pending[ConnectorTaskId(name, int(index))] = dict(value["properties"])
            return Change.NONE, name
        if kind == "commit":
            return self._apply_commit(rest, value), rest
        if kind == "target-state":
            state = PAUSED if value is not None and value.get("state") == PAUSED else STARTED
            before = self.target_states.get(rest, STARTED)
            self.target_states[rest] = state
            return (Change.TARGET_STATE if state != before else Change.NONE), rest
        if kind == "restart" and value is not None:
            self.restarts[rest] = str(value.get("request", ""))
            return Change.RESTART, rest
        return Change.NONE, rest

    def _apply_connector(self, name: str, value: JsonDict | None) -> Change:
        if value is None:
            existed = self.connectors.pop(name, None) is not None
            self.tasks.pop(name, None)
            self.target_states.pop(name, None)
            self._pending = {t: c for t, c in self._pending.items() if t.connector != name}
            return Change.ASSIGNMENT if existed else Change.NONE
        created = name not in self.connectors
        self.connectors[name] = dict(value["properties"])
        return Change.ASSIGNMENT if created else Change.CONFIG

    def _apply_commit(self, name: str, value: JsonDict | None) -> Change:
        if value is None or name not in self.connectors:
            return Change.NONE
        count = int(value["tasks"])
        configs = [self._pending.get(ConnectorTaskId(name, i)) for i in range(count)]
        if any(c is None for c in configs):
            return Change.NONE  # an incomplete set: keep the previous one
        before = self.tasks.get(name)
        self.tasks[name] = [c for c in configs if c is not None]
        self._pending = {t: c for t, c in self._pending.items() if t.connector != name}
        return Change.ASSIGNMENT if before != self.tasks[name] else Change.NONE

    def task_ids(self, name: str) -> list[ConnectorTaskId]:
        return [ConnectorTaskId(name, i) for i in range(len(self.tasks.get(name, ())))]

    def task_config(self, task: ConnectorTaskId) -> JsonDict | None:
        configs = self.tasks.get(task.connector, [])
        return configs[task.task] if task.task < len(configs) else None

    def target_state(self, name: str) -> str:
        return self.target_states.get(name, STARTED)

    def work(self) -> WorkToAssign:
        names = tuple(sorted(self.connectors))
        return WorkToAssign(names, tuple(t for n in names for t in self.task_ids(n)))


def task_records(name: str, configs: list[JsonDict]) -> dict[str, JsonDict | None]:
    """The records that replace ``name``'s task configs: each task's, then the commit."""
    records: dict[str, JsonDict | None] = {
        task_key(ConnectorTaskId(name, i)): {"properties": c} for i, c in enumerate(configs)
    }
    records[commit_key(name)] = {"tasks": len(configs)}
    return records


def _split_key(key: str) -> tuple[str, str, str]:
    for kind in ("target-state", "connector", "task", "commit", "restart"):
        if key.startswith(kind + "-"):
            return kind, "-", key[len(kind) + 1 :]
    return "", "", key
