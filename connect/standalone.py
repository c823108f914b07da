"""Standalone mode: one worker runs every connector and task; connector configs come from the
command line's files (and the REST API, for this process's lifetime), source offsets are kept in
``offset.storage.file.filename`` (rewritten atomically on every commit)."""

from __future__ import annotations

from pathlib import Path

from connect.herder import Herder, Owned, Records
from connect.runtime import Runtime
from connect.storage import FileOffsetStore
from connect.worker_config import WorkerConfig


class StandaloneHerder(Herder):
    def __init__(self, config: WorkerConfig, worker_id: str) -> None:
        super().__init__()
        self.config = config
        if config.offset_storage_file_filename is None:
            raise ValueError("standalone mode needs offset.storage.file.filename")
        if config.exactly_once:  # a file cannot join a transaction (Kafka: distributed only)
            raise ValueError("exactly.once.source.support=enabled needs distributed mode")
        self.offsets = FileOffsetStore(Path(config.offset_storage_file_filename))
        self.runtime = Runtime(
            config, worker_id, self.offsets, self.on_status, self.request_task_reconfiguration
        )
        self._next_offset = 0

    def write(self, records: Records) -> None:
        with self._lock:
            for key, value in records.items():
                self.state.apply(key, value, self._next_offset)
                self._next_offset += 1

    def owned(self) -> Owned:
        with self._lock:
            names = set(self.state.connectors)
            return Owned(names, {t for n in names for t in self.state.task_ids(n)})

    def after_write(self) -> None:
        self.reconcile()

    def start(self) -> None:
        """Nothing to join: everything is this worker's."""

    def stop(self) -> None:
        self.stop_reconfiguring()
        self.runtime.stop_all()
