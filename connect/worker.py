"""A worker runs connectors and tasks; the herders (standalone, distributed) tell it which.

Each task runs on its own thread:

- **source**: ``poll`` → each record produced with the task's own idempotent ``Producer``
  (acks=all) and remembered in :class:`~connect.offsets.SubmittedRecords`; every
  ``offset.flush.interval.ms`` (and when the task stops) the offsets whose predecessors were all
  acknowledged are written to the offset store, then ``task.commit()`` runs. At most
  ``max.outstanding.records`` records wait for their acknowledgement. On a worker with
  ``exactly.once.source.support=enabled`` the runtime runs ``connect.exactly_once``'s
  subclass instead: records and offsets commit in one transaction.
- **sink**: a ``Consumer`` in group ``connect-<connector>`` subscribed to ``topics``; ``put``
  the polled records; every ``offset.flush.interval.ms``, before partitions are revoked and when
  the task stops, ``flush(offsets)`` and only then commit those offsets for the group.

A task whose connector code raises is FAILED (the error in its status) until restarted; not
one that raises after it was asked to stop (a ``stop`` that closed what ``start`` or ``poll``
was using), which is logged. A task that does not stop within
``task.shutdown.graceful.timeout.ms`` is cancelled and left to finish on its own, reporting
nothing more: a newer instance of it may be running (Kafka's orphaned task).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from connect.api import (
    ConnectorContext,
    JsonDict,
    OffsetReader,
    SinkConnector,
    SinkConnectorConfig,
    SinkRecord,
    SinkTask,
    SourceConnector,
    SourceRecord,
    SourceTask,
)
from connect.assignment import ConnectorTaskId
from connect.offsets import OffsetKeys, SubmittedRecord, SubmittedRecords
from connect.plugins import Validated
from connect.worker_config import WorkerConfig
from dataplane.client import (
    BatchResult,
    Consumer,
    ConsumerRebalanceListener,
    Producer,
    RecordFuture,
    TopicPartition,
)
from raftlog.errors import KafkaError

log = logging.getLogger(__name__)
RUNNING, PAUSED, FAILED, UNASSIGNED = "RUNNING", "PAUSED", "FAILED", "UNASSIGNED"
SINK_POLL_MS = 200
PAUSED_WAIT_S = 0.1
ACK_WAIT_S = 0.05


class OffsetStore(Protocol):
    def get(self, connector: str, partition: Mapping[str, Any]) -> JsonDict | None: ...
    def commit(self, offsets: Mapping[str, JsonDict]) -> None: ...
    def refresh(self, timeout_s: float) -> None: ...


# (connector, task or "", state, trace, metrics)
StatusListener = Callable[[str, str, str, str, JsonDict | None], None]


class _Reader(OffsetReader):
    def __init__(self, store: OffsetStore, connector: str) -> None:
        self.store = store
        self.connector = connector

    def offset(self, partition: Mapping[str, Any]) -> JsonDict | None:
        return self.store.get(self.connector, partition)


class WorkerTask:
    """The thread of one task; ``stop`` asks it to finish, ``join`` waits for it."""

    def __init__(
        self, task_id: ConnectorTaskId, config: WorkerConfig, status: StatusListener
    ) -> None:
        self.id = task_id
        self.worker_config = config
        self._status = status
        self.stopping = threading.Event()
        self.paused = threading.Event()
        # set by the runtime when the task did not stop within
        # task.shutdown.graceful.timeout.ms: a newer instance of the task may run from then
        # on, so this one reports nothing more (Kafka's cancelled, orphaned task)
        self.cancelled = False
        self._reporting = threading.Lock()
        self.thread = threading.Thread(target=self._main, name=f"task-{task_id}", daemon=True)
        self.flush_interval_s = config.offset_flush_interval_ms / 1000
        self.state = UNASSIGNED

    def start(self) -> None:
        self.thread.start()

    def set_paused(self, paused: bool) -> None:
        if paused != self.paused.is_set():
            (self.paused.set if paused else self.paused.clear)()
            self.report(PAUSED if paused else RUNNING)

    def stop(self) -> None:
        self.stopping.set()

    def join(self, timeout_s: float) -> bool:
        self.thread.join(timeout_s)
        return not self.thread.is_alive()

    def cancel(self) -> None:
        """The task did not stop in time and is left to finish on its own: from now on it
        reports no state, so it cannot overwrite a newer instance's."""
        with self._reporting:
            self.cancelled = True

    def report(self, state: str, trace: str = "", metrics: JsonDict | None = None) -> None:
        with self._reporting:
            if self.cancelled:
                return
            self.state = state
            self._status(self.id.connector, str(self.id.task), state, trace, metrics)

    def _main(self) -> None:
        try:
            self.execute()
        except Exception as error:  # connector code may raise anything: FAILED, unless stopping
            if self.cancelled:
                log.warning("task %s, stopped too late and left behind, failed (a newer instance "
                            "of it may run): %r", self.id, error)  # fmt: skip
            elif self.stopping.is_set():  # e.g. a stop() that closed what start() was using
                log.warning("task %s failed while stopping: %r", self.id, error)
            else:
                log.exception("task %s failed", self.id)
                self.report(FAILED, "".join(traceback.format_exception(error)))

    def execute(self) -> None:
        raise NotImplementedError


class _Run:
    """Records sent one after another from one source partition into one producer batch:
    acknowledged together, so submitted as one entry (its last offset, its count) and watched
    with the batch's one callback."""

    __slots__ = ("batch", "futures", "key", "records", "submitted")

    def __init__(self, key: str, batch: BatchResult) -> None:
        self.key = key
        self.batch = batch
        self.records: list[SourceRecord] = []
        self.futures: list[RecordFuture] = []
        self.submitted: SubmittedRecord | None = None

    def error(self) -> BaseException | None:
        """The first failure among the run's records: the batch's own, or after the batch was
        split (KIP-126) the first of the parts its records went to."""
        if self.batch.parts is None:
            return self.batch.error
        return next((e for e in (f.exception(0) for f in self.futures) if e is not None), None)


class WorkerSourceTask(WorkerTask):
    def __init__(
        self,
        task_id: ConnectorTaskId,
        config: WorkerConfig,
        status: StatusListener,
        task: SourceTask,
        task_config: JsonDict,
        offsets: OffsetStore,
    ) -> None:
        super().__init__(task_id, config, status)
        self.task = task
        self.task_config = task_config
        self.offsets = offsets
        self._lock = threading.Lock()
        self._submitted = SubmittedRecords()
        # the runs of records sent, per producer batch they went to, until it completes
        self._batches: dict[BatchResult, list[_Run]] = {}
        # SourceTask's commit_record(s) are no-ops unless the connector overrides one
        self._commit_each = (
            type(task).commit_record is not SourceTask.commit_record
            or type(task).commit_records is not SourceTask.commit_records
        )
        self._offset_keys = OffsetKeys(self.id.connector)
        self._acked = threading.Event()
        self._send_error: BaseException | None = None
        self._metrics: JsonDict = {}

    def stop(self) -> None:
        super().stop()
        self.task.stop()

    def execute(self) -> None:
        config = self.worker_config
        self.offsets.refresh(config.request_timeout_ms / 1000)
        producer = Producer(
            config.bootstrap_servers, acks="all", enable_idempotence=True,
            request_timeout_ms=config.request_timeout_ms,
            security=config.client_security("producer"),
        )  # fmt: skip
        try:
            self.task.start(self.task_config, _Reader(self.offsets, self.id.connector))
            self.report(PAUSED if self.paused.is_set() else RUNNING)
            self._loop(producer)
        finally:
            try:
                producer.flush(config.offset_flush_timeout_ms / 1000)
                self._commit_offsets()
            finally:
                producer.close(config.offset_flush_timeout_ms / 1000)

    def _loop(self, producer: Producer) -> None:
        next_commit = time.monotonic() + self.flush_interval_s
        metrics_interval_s = self.worker_config.status_metrics_interval_ms / 1000
        next_metrics = time.monotonic()
        while not self.stopping.is_set():
            self._raise_send_error()
            if time.monotonic() >= next_commit:
                self._commit_offsets()
                next_commit = time.monotonic() + self.flush_interval_s
            if time.monotonic() >= next_metrics:
                self._report_metrics()
                next_metrics = time.monotonic() + metrics_interval_s
            if self.paused.is_set():
                self.stopping.wait(PAUSED_WAIT_S)
                continue
            with self._lock:
                full = self._submitted.outstanding >= self.worker_config.max_outstanding_records
            if full:
                self._acked.wait(ACK_WAIT_S)
                self._acked.clear()
                continue
            records = self.task.poll()
            if records:
                self._send(producer, records)
                self._after_poll()

    def _after_poll(self) -> None:
        """A poll's records were handed to the producer (exactly-once commits here)."""

    def _send(self, producer: Producer, records: list[SourceRecord]) -> None:
        """Send a poll's records, then submit them (their offsets, in order) under one lock
        and watch each producer batch they went to with one callback (``_on_batch``), not one
        per record: the per-record callback, its lock and wake-up were the worker's largest
        cost after the producer's ``send``. A record is submitted before its batch's callback
        can see it, so none is acknowledged before it is submitted.

        Records sent one after another from one source partition into one batch form a
        :class:`_Run`, submitted as one entry: one offset copy and one queue entry per run
        instead of per record (a file source's poll of 2,000 lines is two or three runs).

        Records that share one source partition object (a mirror's poll gives each topic
        partition's records one) share its offset key: the object's contents are what they are
        now, whoever filled it, so one encoding serves all of them."""
        runs: list[_Run] = []
        run: _Run | None = None
        partition: object = None
        key = ""
        send = producer.send
        for record in records:
            if record.source_partition is not partition:
                partition = record.source_partition
                key = self._offset_keys(record.source_partition)
                run = None
            future = send(
                record.topic, record.value, record.key, partition=record.partition,
                timestamp_ms=record.timestamp_ms, headers=record.headers or None,
            )  # fmt: skip
            batch = future.batch
            if run is None or run.batch is not batch:
                run = _Run(key, batch)
                runs.append(run)
            run.records.append(record)
            run.futures.append(future)
        watch: list[BatchResult] = []
        batches = self._batches
        with self._lock:
            submit = self._submitted.submit
            for run in runs:
                last = run.records[-1]
                run.submitted = submit(run.key, dict(last.source_offset), len(run.records))
                group = batches.get(run.batch)
                if group is None:  # a new batch, or one whose callback already took its runs
                    batches[run.batch] = [run]
                    watch.append(run.batch)
                else:
                    group.append(run)
        for batch in watch:  # outside the lock: a completed batch's callback runs at once
            batch.add_batch_callback(self._on_batch)

    def _on_batch(self, batch: BatchResult) -> None:
        """The producer's thread: a batch completed; acknowledge its runs in order, up to the
        first failure (and with a connector's own ``commit_records``/``commit_record``, call it
        for them, as Kafka's per-record callback does)."""
        with self._lock:
            runs = self._batches.pop(batch, [])
        acked: list[SubmittedRecord] = []
        for run in runs:
            error = run.error()
            if error is None and self._commit_each:
                error = self._commit_records(run)
            if error is not None:
                self._send_error = error
                break
            assert run.submitted is not None, "a run is submitted before it is watched"
            acked.append(run.submitted)
        with self._lock:
            for submitted in acked:
                self._submitted.ack(submitted)
        self._acked.set()

    def _commit_records(self, run: _Run) -> Exception | None:
        try:
            self.task.commit_records(run.records, run.futures)
        except Exception as raised:  # connector code: the task fails on its thread
            log.exception("task %s: commit_record failed", self.id)
            return raised
        return None

    def _report_metrics(self) -> None:
        metrics = self.task.metrics()
        if metrics and metrics != self._metrics:
            self._metrics = metrics
            self.report(self.state, metrics=metrics)

    def _raise_send_error(self) -> None:
        if self._send_error is not None:
            raise RuntimeError(f"a record of {self.id} was not delivered") from self._send_error

    def _commit_offsets(self) -> None:
        with self._lock:
            committable = self._submitted.committable()
        if committable:
            self.offsets.commit(committable)
            self.task.commit()


class _SinkListener(ConsumerRebalanceListener):
    def __init__(self, owner: WorkerSinkTask) -> None:
        self.owner = owner

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.owner.commit(revoked)

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        self.owner.forget(lost)


class WorkerSinkTask(WorkerTask):
    def __init__(
        self,
        task_id: ConnectorTaskId,
        config: WorkerConfig,
        status: StatusListener,
        task: SinkTask,
        task_config: JsonDict,
        topics: list[str],
    ) -> None:
        super().__init__(task_id, config, status)
        self.task = task
        self.task_config = task_config
        self.topics = topics
        self._consumed: dict[TopicPartition, int] = {}  # next offset, not yet committed
        self._consumer: Consumer | None = None

    def execute(self) -> None:
        config = self.worker_config
        consumer = self._consumer = Consumer(
            config.bootstrap_servers,
            group_id=f"connect-{self.id.connector}",
            client_id=f"connector-consumer-{self.id}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=SINK_POLL_MS,
            request_timeout_ms=config.request_timeout_ms,
            security=config.client_security("consumer"),
        )
        try:
            self.task.start(self.task_config)
            self.report(PAUSED if self.paused.is_set() else RUNNING)
            consumer.subscribe(self.topics, listener=_SinkListener(self))
            next_commit = time.monotonic() + self.flush_interval_s
            while not self.stopping.is_set():
                self._poll(consumer)
                if time.monotonic() >= next_commit:
                    self.commit(None)
                    next_commit = time.monotonic() + self.flush_interval_s
            self.commit(None)
        finally:
            try:
                consumer.close()
            finally:
                self.task.stop()

    def _poll(self, consumer: Consumer) -> None:
        owned = consumer.assignment()
        if self.paused.is_set():
            consumer.pause(*owned)
        else:
            consumer.resume(*consumer.paused())
        batch = consumer.poll(SINK_POLL_MS)
        records = [
            SinkRecord(r.topic, r.partition, r.offset, r.key, r.value, r.timestamp, r.headers)
            for rs in batch.values()
            for r in rs
        ]
        if records:
            self.task.put(records)
        for tp, rs in batch.items():
            if rs:
                self._consumed[tp] = rs[-1].offset + 1

    def commit(self, partitions: set[TopicPartition] | None) -> None:
        """Flush the task, then commit what it was given of ``partitions`` (None: all)."""
        wanted = {
            tp: offset
            for tp, offset in self._consumed.items()
            if partitions is None or tp in partitions
        }
        if not wanted or self._consumer is None:
            return
        self.task.flush({(tp.topic, tp.partition): o for tp, o in wanted.items()})
        try:
            self._consumer.commit(wanted)
        except KafkaError as error:
            log.warning("%s: offsets %s not committed: %s", self.id, wanted, error)
            return
        for tp, offset in wanted.items():
            if self._consumed.get(tp) == offset:
                del self._consumed[tp]

    def forget(self, partitions: set[TopicPartition]) -> None:
        for tp in partitions:
            self._consumed.pop(tp, None)


@dataclass
class RunningConnector:
    name: str
    validated: Validated
    instance: SourceConnector | SinkConnector


def new_task(
    task_id: ConnectorTaskId,
    validated: Validated,
    task_config: JsonDict,
    config: WorkerConfig,
    status: StatusListener,
    offsets: OffsetStore,
) -> WorkerTask:
    cls = validated.cls
    if issubclass(cls, SourceConnector):
        source = cls.task_class()()
        return WorkerSourceTask(task_id, config, status, source, task_config, offsets)
    assert issubclass(cls, SinkConnector), f"{cls} is neither a source nor a sink"
    assert isinstance(validated.config, SinkConnectorConfig), "a sink's config names its topics"
    sink = cls.task_class()()
    topics = validated.config.topic_list()
    return WorkerSinkTask(task_id, config, status, sink, task_config, topics)


class _Context(ConnectorContext):
    def __init__(self, name: str, reconfigure: Callable[[str], None]) -> None:
        self.name = name
        self.reconfigure = reconfigure

    def request_task_reconfiguration(self) -> None:
        self.reconfigure(self.name)


def start_connector(
    name: str, validated: Validated, reconfigure: Callable[[str], None]
) -> RunningConnector:
    instance = validated.cls()
    assert isinstance(instance, SourceConnector | SinkConnector)
    instance.initialize(_Context(name, reconfigure))
    instance.start(validated.config)
    return RunningConnector(name, validated, instance)


def generate_task_configs(running: RunningConnector) -> list[JsonDict]:
    tasks_max = running.validated.config.tasks_max
    configs = running.instance.task_configs(tasks_max)
    if len(configs) > tasks_max:
        raise ValueError(f"{running.name}: {len(configs)} task configs for tasks.max={tasks_max}")
    return configs
