"""Exactly-once source tasks (Kafka Connect's KIP-618), on a worker with
``exactly.once.source.support=enabled`` (distributed mode).

Each source task produces with a **transactional producer**, transactional id
``<group.id>-<connector>-<task>`` (KIP-618's naming). A transaction holds a stretch of the
task's records *and* the source offsets that cover them, written to the worker's offsets topic
(``offset.storage.topic``) with the same producer, plus what the task adds with
``transaction_records`` (a mirror's offset syncs). It commits after every ``poll`` that gave
records (``transaction.boundary=poll``, the default) or every ``transaction.boundary.interval.ms``
(``transaction.boundary=interval``), and when the task stops cleanly. The offsets store reads the
offsets topic with read_committed, so after a crash a task resumes from offsets that match
exactly the records that became visible: the records of a transaction that did not commit are
aborted (read_committed consumers never see them) and sent again, those of one that did are not.

**Fencing.** ``init_transactions`` bumps the transactional id's epoch, which fences a zombie
(the same task still running in a worker that was declared dead, or a process that was killed
while its transaction was open): its open transaction is aborted, its later sends and commits
fail with ``PRODUCER_FENCED`` / ``INVALID_PRODUCER_EPOCH`` and it FAILS. Only then does the new
task read the committed offsets. Task 0 also fences the ids of task numbers from the current
task count up to ``tasks.max`` (a previous generation with more tasks), as Kafka's zombie fencing
round fences the previous generation's ids.

A commit that fails (an abortable error, a timeout) aborts the transaction and FAILS the task:
a restart resumes from the last committed offsets, as Kafka's ``ExactlyOnceWorkerSourceTask``
does; nothing is duplicated or skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence

from connect.api import (
    SourceConnector,
    SourceConnectorConfig,
    SourceRecord,
    SourceTask,
)
from connect.assignment import ConnectorTaskId
from connect.plugins import Validated
from connect.storage import TopicOffsetStore, encode_value
from connect.worker import (
    PAUSED,
    RUNNING,
    StatusListener,
    WorkerSourceTask,
    _Reader,
)
from connect.worker_config import WorkerConfig
from dataplane.client import Producer
from metadata_quorum.security.channels import ClientSecurity
from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)
ACK_WAIT_S = 0.05


def transactional_id(group_id: str, connector: str, task: int) -> str:
    """KIP-618's transactional id of a source task."""
    return f"{group_id}-{connector}-{task}"


def exactly_once_errors(validated: Validated, worker: WorkerConfig) -> list[str]:
    """Why this worker cannot run the connector as its ``exactly.once.support`` asks (empty:
    it can). ``required`` is refused on a worker without exactly-once (Kafka checks only on an
    enabled worker and would run the connector at-least-once: a silent downgrade) and for a
    connector that does not declare exactly-once support."""
    config = validated.config
    if not issubclass(validated.cls, SourceConnector) or not isinstance(
        config, SourceConnectorConfig
    ):
        return []
    if config.exactly_once_support != "required":
        return []
    if not worker.exactly_once:
        return [
            "exactly.once.support: required, but this worker's exactly.once.source.support is "
            "disabled (its source tasks deliver at-least-once)"
        ]
    if validated.cls.exactly_once_support(config) is not True:
        return [
            f"exactly.once.support: required, but {validated.cls.__name__} does not support "
            "exactly-once delivery as configured"
        ]
    return []


def fence_producers(
    servers: Sequence[str],
    ids: Iterable[str],
    timeout_s: float,
    security: ClientSecurity | None = None,
) -> None:
    """Fence every producer of ``ids`` (Kafka's ``Admin.fenceProducers``): a new epoch for each,
    which aborts its open transaction."""
    for tid in ids:
        with Producer(list(servers), transactional_id=tid, security=security) as producer:
            producer.init_transactions(timeout_s)
        log.info("fenced transactional id %s", tid)


class ExactlyOnceWorkerSourceTask(WorkerSourceTask):
    """A source task whose records and offsets commit in one transaction on the worker's
    cluster (see the module's docstring)."""

    def __init__(
        self,
        task_id: ConnectorTaskId,
        config: WorkerConfig,
        status: StatusListener,
        task: SourceTask,
        task_config: dict[str, object],
        offsets: TopicOffsetStore,
        connector_config: SourceConnectorConfig,
        task_count: int | None,
    ) -> None:
        super().__init__(task_id, config, status, task, task_config, offsets)
        assert config.group_id is not None, "exactly-once source tasks run in distributed mode"
        self.store = offsets
        self.transactional_id = transactional_id(config.group_id, task_id.connector, task_id.task)
        self.boundary = connector_config.transaction_boundary
        interval_ms = (
            connector_config.transaction_boundary_interval_ms or config.offset_flush_interval_ms
        )
        self.flush_interval_s = interval_ms / 1000
        self.tasks_max = connector_config.tasks_max
        self.task_count = task_count
        self.timeout_s = config.request_timeout_ms / 1000
        self._producer: Producer | None = None
        self._in_transaction = False

    def execute(self) -> None:
        config = self.worker_config
        producer = self._producer = Producer(
            config.bootstrap_servers, acks="all", transactional_id=self.transactional_id,
            transaction_timeout_ms=config.transaction_timeout_ms,
            request_timeout_ms=config.request_timeout_ms,
            security=config.client_security("producer"),
        )  # fmt: skip
        try:
            producer.init_transactions(self.timeout_s)  # fences this task's zombie first
            if self.id.task == 0 and self.task_count is not None:
                assert config.group_id is not None
                fence_producers(config.bootstrap_servers, [
                    transactional_id(config.group_id, self.id.connector, n)
                    for n in range(self.task_count, self.tasks_max)], self.timeout_s,
                    config.client_security("producer"))  # fmt: skip
            self.store.refresh(self.timeout_s)  # read_committed: what became visible
            self.task.exactly_once = True
            self.task.start(self.task_config, _Reader(self.store, self.id.connector))
            log.info("task %s: exactly-once, transactional id %s, transaction.boundary=%s",
                     self.id, self.transactional_id, self.boundary)  # fmt: skip
            self.report(PAUSED if self.paused.is_set() else RUNNING)
            self._loop(producer)
            self._commit_transaction()  # a clean stop commits what was sent
        except BaseException:
            self._abort_quietly()
            raise
        finally:
            producer.close(config.offset_flush_timeout_ms / 1000)

    def _send(self, producer: Producer, records: list[SourceRecord]) -> None:
        if not self._in_transaction:
            producer.begin_transaction()
            self._in_transaction = True
        super()._send(producer, records)

    def _after_poll(self) -> None:
        if self.boundary == "poll":
            self._commit_transaction()

    def _commit_offsets(self) -> None:
        """The loop's timer: ``transaction.boundary=interval`` commits here."""
        if self.boundary == "interval":
            self._commit_transaction()

    def _commit_transaction(self) -> None:
        """Every record sent since ``begin_transaction`` acknowledged, then the task's extra
        records and the offsets of those records written, then the commit."""
        producer = self._producer
        if not self._in_transaction or producer is None:
            return
        deadline = time.monotonic() + self.timeout_s
        producer.flush(self.timeout_s)
        self._wait_acknowledged(deadline)
        for extra in self.task.transaction_records():
            producer.send(extra.topic, extra.value, extra.key, partition=extra.partition)
        with self._lock:
            committable = self._submitted.committable()
        for key, offset in committable.items():
            producer.send(self.store.topic, encode_value(offset), key.encode())
        producer.commit_transaction(max(0.0, deadline - time.monotonic()))
        self._in_transaction = False
        self.store.committed_in_transaction(committable)
        self.task.commit()

    def _wait_acknowledged(self, deadline: float) -> None:
        """Until every record's callback ran (``commit_record`` included): the offsets written
        next must cover exactly the transaction's records."""
        while True:
            self._raise_send_error()
            with self._lock:
                if self._submitted.outstanding == 0:
                    return
            if time.monotonic() > deadline:
                raise KafkaError(ErrorCode.REQUEST_TIMED_OUT,
                                 f"{self.id}: records not acknowledged in time")  # fmt: skip
            self._acked.wait(ACK_WAIT_S)
            self._acked.clear()

    def _abort_quietly(self) -> None:
        producer = self._producer
        if not self._in_transaction or producer is None:
            return
        self._in_transaction = False
        try:
            producer.abort_transaction(self.timeout_s)
        except (KafkaError, RuntimeError) as error:  # fenced, unreachable, closed: the
            # coordinator aborts it (a new epoch, or transaction.timeout.ms)
            log.warning("task %s: transaction not aborted: %s", self.id, error)
