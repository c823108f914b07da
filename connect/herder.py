"""A herder: the REST API's operations and the reconciliation of what this worker runs.

Every change of configuration is a record of ``connect-configs`` (see ``connect.config_state``);
:meth:`Herder.write` is where the two modes differ: standalone applies the records to its own
:class:`ConfigState` at once, distributed writes them to the topic (every worker applies them in
the topic's order). After a change, :meth:`Herder.reconcile` makes the runtime run what this
worker owns (everything in standalone mode, its assignment in distributed mode) with the current
configs: it starts what is missing, stops what is gone, restarts what changed or what a restart
request names, and writes the task configs a (re)started connector generates when they differ
from the stored ones.

Errors are :class:`ConnectError` with Kafka Connect's HTTP status (404 unknown connector, 400
invalid config, 409 existing name or rebalance in progress).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from connect.api import JsonDict
from connect.assignment import ConnectorTaskId
from connect.config_state import (
    PAUSED,
    STARTED,
    ConfigState,
    connector_key,
    restart_key,
    target_state_key,
    task_records,
)
from connect.exactly_once import exactly_once_errors
from connect.plugins import ConfigInvalid, connector_class, plugins, validate
from connect.runtime import Runtime, Status
from connect.worker_config import WorkerConfig

log = logging.getLogger(__name__)
Records = dict[str, JsonDict | None]
RECONCILE_PASSES_MAX = 3
RECONFIGURE_JOIN_S = 30.0


class ConnectError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def not_found(name: str) -> ConnectError:
    return ConnectError(404, f"Connector {name} not found")


@dataclass
class Owned:
    """What this worker is to run."""

    connectors: set[str] = field(default_factory=set)
    tasks: set[ConnectorTaskId] = field(default_factory=set)


class Herder:
    def __init__(self) -> None:
        self.state = ConfigState()
        self.statuses: dict[tuple[str, str], Status] = {}
        self._lock = threading.RLock()  # state and statuses
        self._reconcile_lock = threading.Lock()
        self._started: dict[str, tuple[Any, ...]] = {}  # what each running item started with
        self._task_started: dict[ConnectorTaskId, tuple[Any, ...]] = {}
        self._wrote_tasks = False
        self.runtime: Runtime
        self.config: WorkerConfig
        self._reconfigure_requests: set[str] = set()
        self._reconfigure_wanted = threading.Event()
        self._reconfigure_stopping = threading.Event()
        self._reconfigure_thread: threading.Thread | None = None

    # -- what the modes provide ------------------------------------------------------------------
    def write(self, records: Records) -> None:
        raise NotImplementedError

    def refresh(self) -> None:
        """Catch up with configuration written elsewhere (distributed mode)."""

    def owned(self) -> Owned:
        raise NotImplementedError

    def check_writable(self) -> None:
        """Raise 409 while a write cannot be served (distributed: during a rebalance)."""

    def after_write(self) -> None:
        """React to a write of the REST API (standalone: reconcile at once)."""

    # -- task reconfiguration (a connector's work changed) ----------------------------------------
    def request_task_reconfiguration(self, name: str) -> None:
        """A running connector asks for new task configs (from its own thread: only noted
        here; the reconfiguration thread regenerates them)."""
        with self._lock:
            self._reconfigure_requests.add(name)
            if self._reconfigure_thread is None and not self._reconfigure_stopping.is_set():
                self._reconfigure_thread = threading.Thread(
                    target=self._reconfigure_loop, name="reconfigure", daemon=True
                )
                self._reconfigure_thread.start()
        self._reconfigure_wanted.set()

    def _reconfigure_loop(self) -> None:
        while not self._reconfigure_stopping.is_set():
            self._reconfigure_wanted.wait()
            self._reconfigure_wanted.clear()
            with self._lock:
                names, self._reconfigure_requests = self._reconfigure_requests, set()
            for name in sorted(names):
                if self._reconfigure_stopping.is_set():
                    return
                try:
                    self._regenerate_tasks(name)
                except ConnectError as error:  # the config topic: the connector asks again
                    log.warning("connector %s: task configs not written: %s", name, error.message)

    def _regenerate_tasks(self, name: str) -> None:
        with self._reconcile_lock:
            configs = self.runtime.task_configs(name)
            with self._lock:
                current = self.state.tasks.get(name)
            if configs is None or configs == current:
                return
            log.info("connector %s asked for new task configs: %d tasks", name, len(configs))
            self.write(task_records(name, configs))
        self.after_write()

    def stop_reconfiguring(self) -> None:
        self._reconfigure_stopping.set()
        self._reconfigure_wanted.set()
        with self._lock:
            thread = self._reconfigure_thread
        if thread is not None:
            thread.join(RECONFIGURE_JOIN_S)

    # -- status ----------------------------------------------------------------------------------
    def on_status(self, connector: str, task: str, status: Status | None) -> None:
        with self._lock:
            if status is None:
                self.statuses.pop((connector, task), None)
            else:
                self.statuses[(connector, task)] = status

    def task_metrics(self) -> list[tuple[str, str, JsonDict]]:
        """(connector, task, metrics) of every status that carries figures."""
        with self._lock:
            return [(c, t, s.metrics) for (c, t), s in self.statuses.items() if s.metrics]

    # -- the REST API's operations ---------------------------------------------------------------
    def connectors(self) -> list[str]:
        self.refresh()
        with self._lock:
            return sorted(self.state.connectors)

    def connector_info(self, name: str) -> JsonDict:
        self.refresh()
        with self._lock:
            config = self.state.connectors.get(name)
            if config is None:
                raise not_found(name)
            return {
                "name": name,
                "config": dict(config),
                "tasks": [
                    {"connector": t.connector, "task": t.task} for t in self.state.task_ids(name)
                ],
                "type": _kind(config),
            }

    def connector_config(self, name: str) -> JsonDict:
        return dict(self.connector_info(name)["config"])

    def task_infos(self, name: str) -> list[JsonDict]:
        self.connector_info(name)
        with self._lock:
            return [
                {"id": {"connector": name, "task": i}, "config": dict(c)}
                for i, c in enumerate(self.state.tasks.get(name, []))
            ]

    def status(self, name: str) -> JsonDict:
        info = self.connector_info(name)
        with self._lock:
            connector = self.statuses.get((name, ""), Status("UNASSIGNED", ""))
            tasks = [
                {"id": t["task"], **_status_json(self.statuses.get((name, str(t["task"]))))}
                for t in info["tasks"]
            ]
        return {
            "name": name,
            "connector": _status_json(connector),
            "tasks": tasks,
            "type": info["type"],
        }

    def create(self, name: str, config: Mapping[str, Any]) -> JsonDict:
        self.refresh()
        self.check_writable()
        checked = _validated(name, config, self.config)
        with self._lock:
            if name in self.state.connectors:
                raise ConnectError(409, f"Connector {name} already exists")
        self.write({connector_key(name): {"properties": checked},
                    target_state_key(name): {"state": STARTED}})  # fmt: skip
        self.after_write()
        return self.connector_info(name)

    def put_config(self, name: str, config: Mapping[str, Any]) -> tuple[bool, JsonDict]:
        self.refresh()
        self.check_writable()
        checked = _validated(name, config, self.config)
        with self._lock:
            created = name not in self.state.connectors
        records: Records = {connector_key(name): {"properties": checked}}
        if created:
            records[target_state_key(name)] = {"state": STARTED}
        self.write(records)
        self.after_write()
        return created, self.connector_info(name)

    def delete(self, name: str) -> None:
        self.connector_info(name)
        self.check_writable()
        self.write({connector_key(name): None, target_state_key(name): None})
        self.after_write()

    def set_target_state(self, name: str, state: str) -> None:
        self.connector_info(name)
        self.check_writable()
        self.write({target_state_key(name): {"state": state}})
        self.after_write()

    def restart(self, name: str) -> None:
        self.connector_info(name)
        self.check_writable()
        self.write({restart_key(name): {"request": str(uuid.uuid4())}})
        self.after_write()

    @staticmethod
    def plugins() -> list[JsonDict]:
        return [
            {"class": path, "type": "source" if cls.kind == "source" else "sink",
             "version": cls.version}
            for path, cls in sorted(plugins().items())
            if hasattr(cls, "kind")
        ]  # fmt: skip

    # -- reconciliation --------------------------------------------------------------------------
    def reconcile(self) -> None:
        """Make the runtime run what this worker owns, with the current configs; again while
        a pass wrote new task configs (bounded)."""
        with self._reconcile_lock:
            for _pass in range(RECONCILE_PASSES_MAX):
                self._wrote_tasks = False
                self._reconcile_once()
                if not self._wrote_tasks:
                    return

    def _reconcile_once(self) -> None:
        owned = self.owned()
        with self._lock:
            connectors = dict(self.state.connectors)
            tasks = {n: list(c) for n, c in self.state.tasks.items()}
            targets = {n: self.state.target_state(n) for n in connectors}
            restarts = dict(self.state.restarts)
        regenerated: set[str] = set()
        self._reconcile_connectors(owned, connectors, tasks, targets, restarts, regenerated)
        self._reconcile_tasks(owned, connectors, tasks, targets, restarts, regenerated)

    def _reconcile_connectors(
        self,
        owned: Owned,
        connectors: dict[str, JsonDict],
        tasks: dict[str, list[JsonDict]],
        targets: dict[str, str],
        restarts: dict[str, str],
        regenerated: set[str],
    ) -> None:
        for name in list(self._started):
            if name not in connectors or name not in owned.connectors:
                self.runtime.stop_connector(name)
                del self._started[name]
                if name not in connectors:
                    self.write_status(name, "", None)
        for name in sorted(owned.connectors & set(connectors)):
            started = (connectors[name], restarts.get(name))
            if self._started.get(name, (None, None))[:2] != started:
                self._started[name] = (*started, targets[name])
                configs = self.runtime.start_connector(name, connectors[name], targets[name])
                if configs is not None and configs != tasks.get(name):
                    log.info("connector %s: %d task configs", name, len(configs))
                    self.write(task_records(name, configs))
                    self._wrote_tasks = True
                    regenerated.add(name)
            elif self._started[name][2] != targets[name]:
                self._started[name] = (*started, targets[name])
                self.runtime.set_target_state(name, targets[name])

    def _reconcile_tasks(
        self,
        owned: Owned,
        connectors: dict[str, JsonDict],
        tasks: dict[str, list[JsonDict]],
        targets: dict[str, str],
        restarts: dict[str, str],
        regenerated: set[str],
    ) -> None:
        """Tasks of the connectors in ``regenerated`` (new task configs just written) are left
        as they are: the next pass starts them with their new configs."""

        def config_of(t: ConnectorTaskId) -> JsonDict | None:
            configs = tasks.get(t.connector, [])
            return configs[t.task] if t.connector in connectors and t.task < len(configs) else None

        wanted = {t for t in owned.tasks if config_of(t) is not None}
        gone = [t for t in self._task_started if t not in wanted]
        self.runtime.stop_tasks(gone)
        for t in gone:
            del self._task_started[t]
            if t.connector not in connectors or t.task >= len(tasks.get(t.connector, [])):
                self.write_status(t.connector, str(t.task), None)
        for t in sorted(wanted):
            if t.connector in regenerated:
                continue
            task_config = config_of(t)
            assert task_config is not None
            started = (connectors[t.connector], task_config, restarts.get(t.connector))
            target = targets[t.connector]
            before = self._task_started.get(t)
            if before is None or before[:3] != started:
                self._task_started[t] = (*started, target)
                self.runtime.start_task(t, connectors[t.connector], task_config, target,
                                        len(tasks.get(t.connector, [])))  # fmt: skip
            elif before[3] != target:
                self._task_started[t] = (*started, target)
                self.runtime.set_target_state(t.connector, target)

    def write_status(self, connector: str, task: str, status: Status | None) -> None:
        self.on_status(connector, task, status)

    def forget_started(self) -> None:
        """Everything was stopped (a revocation): start from nothing on the next reconcile."""
        self._started.clear()
        self._task_started.clear()


def _validated(name: str, config: Mapping[str, Any], worker: WorkerConfig) -> JsonDict:
    try:
        errors = exactly_once_errors(validate(name, config), worker)
        if errors:
            raise ConfigInvalid(errors)
    except ConfigInvalid as error:
        raise ConnectError(400, str(error)) from error
    return {**dict(config), "name": name}


def _kind(config: Mapping[str, Any]) -> str:
    cls = connector_class(str(config.get("connector.class", "")))
    return "unknown" if cls is None else str(getattr(cls, "kind", "unknown"))


def _status_json(status: Status | None) -> JsonDict:
    if status is None:
        return {"state": "UNASSIGNED", "worker_id": ""}
    out: JsonDict = {"state": status.state, "worker_id": status.worker_id}
    if status.trace:
        out["trace"] = status.trace
    if status.metrics:
        out["metrics"] = status.metrics
    return out


__all__ = ["PAUSED", "STARTED", "ConnectError", "Herder", "Owned"]
