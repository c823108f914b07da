"""What one worker runs now: its connectors and tasks, started and stopped as a herder says.

Both herders drive it the same way; it knows nothing of groups or topics. Stopping tasks asks
all of them first, then waits for each within ``task.shutdown.graceful.timeout.ms`` (a task that
does not finish in time is abandoned, as Kafka Connect does, and said so in the log).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from connect.api import JsonDict, SourceConnector, SourceConnectorConfig
from connect.assignment import ConnectorTaskId
from connect.config_state import PAUSED
from connect.exactly_once import ExactlyOnceWorkerSourceTask, exactly_once_errors
from connect.plugins import ConfigInvalid, Validated, validate
from connect.storage import TopicOffsetStore
from connect.worker import (
    FAILED,
    RUNNING,
    UNASSIGNED,
    OffsetStore,
    RunningConnector,
    WorkerTask,
    generate_task_configs,
    new_task,
    start_connector,
)
from connect.worker_config import WorkerConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Status:
    state: str
    worker_id: str
    trace: str = ""
    metrics: JsonDict | None = None  # a task's figures (e.g. a mirror's replication lag)


StatusSink = Callable[[str, str, Status | None], None]  # connector, task ("" = connector), status


class Runtime:
    """The connectors and tasks running in this process. Thread-safe."""

    def __init__(
        self,
        config: WorkerConfig,
        worker_id: str,
        offsets: OffsetStore,
        status: StatusSink,
        reconfigure: Callable[[str], None],
    ) -> None:
        self.config = config
        self._reconfigure = reconfigure
        self.worker_id = worker_id
        self.offsets = offsets
        self._status = status
        self._lock = threading.RLock()
        self.connectors: dict[str, RunningConnector] = {}
        self.tasks: dict[ConnectorTaskId, WorkerTask] = {}

    def _report(
        self, connector: str, task: str, state: str, trace: str, metrics: JsonDict | None = None
    ) -> None:
        self._status(connector, task, Status(state, self.worker_id, trace, metrics))

    def _validate(self, name: str, config: JsonDict) -> Validated:
        """The connector's config, and whether this worker can run it as it asks."""
        validated = validate(name, config)
        errors = exactly_once_errors(validated, self.config)
        if errors:
            raise ConfigInvalid(errors)
        return validated

    # -- connectors ------------------------------------------------------------------------------
    def start_connector(
        self, name: str, config: JsonDict, target_state: str
    ) -> list[JsonDict] | None:
        """Start ``name``; its task configs (None if it failed)."""
        with self._lock:
            self.stop_connector(name)
            try:
                running = start_connector(name, self._validate(name, config), self._reconfigure)
                configs = generate_task_configs(running)
            except Exception as error:  # a bad config or connector code: it FAILS
                log.exception("connector %s failed to start", name)
                self._report(name, "", FAILED, "".join(traceback.format_exception(error)))
                return None
            self.connectors[name] = running
            self._report(name, "", PAUSED if target_state == PAUSED else RUNNING, "")
            return configs

    def task_configs(self, name: str) -> list[JsonDict] | None:
        """The running connector's task configs now (None if it does not run here or its
        code failed)."""
        with self._lock:
            running = self.connectors.get(name)
        if running is None:
            return None
        try:
            return generate_task_configs(running)
        except Exception:  # connector code: logged; its tasks keep their configs
            log.exception("connector %s failed to generate task configs", name)
            return None

    def stop_connector(self, name: str) -> None:
        with self._lock:
            running = self.connectors.pop(name, None)
        if running is not None:
            try:
                running.instance.stop()
            except Exception:  # connector code: logged, the connector is gone either way
                log.exception("connector %s failed to stop", name)

    # -- tasks -----------------------------------------------------------------------------------
    def start_task(
        self,
        task_id: ConnectorTaskId,
        config: JsonDict,
        task_config: JsonDict,
        target: str,
        task_count: int | None = None,
    ) -> None:
        """``task_count``: how many tasks the connector has now (an exactly-once task 0
        fences the transactional ids of task numbers from there up to ``tasks.max``)."""
        with self._lock:
            self.stop_tasks([task_id])
            try:
                validated = self._validate(task_id.connector, config)
            except ConfigInvalid as error:
                self._report(task_id.connector, str(task_id.task), FAILED, str(error))
                return
            task: WorkerTask
            if self.config.exactly_once and issubclass(validated.cls, SourceConnector):
                assert isinstance(validated.config, SourceConnectorConfig)
                assert isinstance(self.offsets, TopicOffsetStore), "distributed mode only"
                source = validated.cls.task_class()()
                task = ExactlyOnceWorkerSourceTask(
                    task_id, self.config, self._report, source, task_config, self.offsets,
                    validated.config, task_count,
                )  # fmt: skip
            else:
                task = new_task(
                    task_id, validated, task_config, self.config, self._report, self.offsets
                )
            if target == PAUSED:
                task.paused.set()
            self.tasks[task_id] = task
            task.start()

    def stop_tasks(self, ids: Iterable[ConnectorTaskId], *, unassigned: bool = False) -> None:
        with self._lock:
            stopping = [self.tasks.pop(t) for t in list(ids) if t in self.tasks]
        for task in stopping:
            task.stop()
        deadline = time.monotonic() + self.config.task_shutdown_graceful_timeout_ms / 1000
        for task in stopping:
            if not task.join(max(0.0, deadline - time.monotonic())):
                log.error("task %s did not stop within task.shutdown.graceful.timeout.ms", task.id)
                task.cancel()
            if unassigned:  # the runtime's report: a cancelled task reports nothing
                self._report(task.id.connector, str(task.id.task), UNASSIGNED, "")

    def set_target_state(self, name: str, state: str) -> None:
        with self._lock:
            tasks = [t for t in self.tasks.values() if t.id.connector == name]
            connector_running = name in self.connectors
        for task in tasks:
            task.set_paused(state == PAUSED)
        if connector_running:
            self._report(name, "", PAUSED if state == PAUSED else RUNNING, "")

    def task_ids(self, name: str | None = None) -> list[ConnectorTaskId]:
        with self._lock:
            return sorted(t for t in self.tasks if name is None or t.connector == name)

    def stop_all(self, *, unassigned: bool = False) -> None:
        """Stop every task, then every connector; with ``unassigned`` (the worker is leaving)
        report them UNASSIGNED."""
        self.stop_tasks(self.task_ids(), unassigned=unassigned)
        with self._lock:
            names = list(self.connectors)
        for name in names:
            self.stop_connector(name)
            if unassigned:
                self._report(name, "", UNASSIGNED, "")
