"""The connector API, in Kafka Connect's shape.

A **connector** is configured once (a pydantic model per connector class, ``extra="forbid"``,
bounded numbers) and splits its work into **task** configs (``task_configs(max_tasks)``); the
runtime runs each task on some worker. A :class:`SourceTask` returns :class:`SourceRecord`\\ s
from ``poll``, each with a *source partition* and *source offset* (plain JSON dicts, e.g.
``{"filename": ...}`` / ``{"position": ...}``); the runtime produces them and stores, per source
partition, the offset of the last record all of whose predecessors were acknowledged. A restarted
task reads that offset back through its :class:`OffsetReader`. A :class:`SinkTask` gets records
in ``put``; ``flush(offsets)`` must make everything up to ``offsets`` durable, after which the
runtime commits those offsets for the consumer group ``connect-<connector>``.

Delivery is at-least-once: records after the last committed offset are sent (source) or put
(sink) again after a crash; on a worker with ``exactly.once.source.support=enabled`` a source
task's records and offsets commit in one transaction (``connect.exactly_once``), exactly once.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from dataplane.client import RecordFuture, RecordMetadata

JsonDict = dict[str, Any]
TASKS_MAX_MAX = 1_000


class ConnectorConfig(BaseModel):
    """The settings every connector has (Kafka Connect's names). Subclass per connector and
    add its own fields with dotted aliases."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(min_length=1, max_length=249, pattern=r"^[A-Za-z0-9._-]+$")
    connector_class: str = Field(alias="connector.class", min_length=1, max_length=255)
    tasks_max: int = Field(1, alias="tasks.max", ge=1, le=TASKS_MAX_MAX)


class SourceConnectorConfig(ConnectorConfig):
    """A source connector's settings, with KIP-618's exactly-once ones. They matter only on a
    worker with ``exactly.once.source.support=enabled`` (see ``connect.exactly_once``):
    ``exactly.once.support=required`` refuses a connector that cannot say it supports
    exactly-once delivery (instead of running it without), and ``transaction.boundary`` says
    when a task's transaction commits: after every ``poll`` that gave records, or every
    ``transaction.boundary.interval.ms`` (default ``offset.flush.interval.ms``). Kafka's third
    boundary, ``connector`` (the task defines them), is refused: no task here defines any."""

    exactly_once_support: Literal["requested", "required"] = Field(
        "requested", alias="exactly.once.support"
    )
    transaction_boundary: Literal["poll", "interval"] = Field("poll", alias="transaction.boundary")
    transaction_boundary_interval_ms: int | None = Field(
        None, alias="transaction.boundary.interval.ms", ge=10, le=3_600_000
    )


class SinkConnectorConfig(ConnectorConfig):
    topics: str = Field(min_length=1, max_length=10_000)  # comma-separated, as in Kafka

    def topic_list(self) -> list[str]:
        return [t.strip() for t in self.topics.split(",") if t.strip()]


@dataclass(slots=True)
class SourceRecord:
    """One record a source task's ``poll`` gives. A plain slotted dataclass, not a frozen one:
    a source makes one per record, and a frozen dataclass's ``__init__`` (``object.__setattr__``
    per field) cost 1.5 µs of it against 0.4. Treat it as immutable once returned."""

    source_partition: JsonDict
    source_offset: JsonDict
    topic: str
    value: bytes | None
    key: bytes | None = None
    partition: int | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp_ms: int | None = None  # None: the time of sending


@dataclass(frozen=True)
class SinkRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: tuple[tuple[str, bytes | None], ...] = field(default=())


class OffsetReader(abc.ABC):
    """The committed offsets of a connector's source partitions."""

    @abc.abstractmethod
    def offset(self, partition: Mapping[str, Any]) -> JsonDict | None:
        """The last committed offset of ``partition``; None if none was committed."""


class ConnectorContext(abc.ABC):
    """What a running connector may ask of the runtime (Kafka's ``ConnectorContext``)."""

    @abc.abstractmethod
    def request_task_reconfiguration(self) -> None:
        """The connector's work changed (e.g. new topics): ask ``task_configs`` again and
        restart the tasks if they differ. Does not block; safe from any thread."""


class Connector(abc.ABC):
    """Configured from a validated model; ``task_configs`` splits the work."""

    config_model: ClassVar[type[ConnectorConfig]]
    version: ClassVar[str] = "1.0"
    context: ConnectorContext | None = None

    def initialize(self, context: ConnectorContext) -> None:
        """Called before ``start``."""
        self.context = context

    def start(self, config: ConnectorConfig) -> None:  # noqa: B027 - optional to override
        """Called once on the worker that runs the connector."""

    @abc.abstractmethod
    def task_configs(self, max_tasks: int) -> list[JsonDict]:
        """At most ``max_tasks`` task configs (JSON objects), one task each."""

    def stop(self) -> None:  # noqa: B027 - optional to override
        """Release what ``start`` took."""


class SourceConnector(Connector):
    kind: ClassVar[str] = "source"
    config_model: ClassVar[type[ConnectorConfig]] = SourceConnectorConfig

    @classmethod
    def exactly_once_support(cls, config: ConnectorConfig) -> bool | None:
        """Whether tasks of this connector configured so deliver exactly once when the runtime
        commits their records and offsets in one transaction (Kafka's ``exactlyOnceSupport``):
        True (supported), False (not), None (unknown, the default). A connector that
        ``exactly.once.support=required`` needs must answer True."""
        return None

    @staticmethod
    @abc.abstractmethod
    def task_class() -> type[SourceTask]: ...


class SinkConnector(Connector):
    kind: ClassVar[str] = "sink"
    config_model: ClassVar[type[ConnectorConfig]] = SinkConnectorConfig

    @staticmethod
    @abc.abstractmethod
    def task_class() -> type[SinkTask]: ...


@dataclass(frozen=True)
class TransactionRecord:
    """A record a source task adds to its transaction (:meth:`SourceTask.transaction_records`)."""

    topic: str
    value: bytes | None
    key: bytes | None = None
    partition: int | None = None


class SourceTask(abc.ABC):
    exactly_once: bool = False  # set by the runtime before start: records commit in transactions

    @abc.abstractmethod
    def start(self, config: JsonDict, offsets: OffsetReader) -> None:
        """Begin where the committed offsets say."""

    @abc.abstractmethod
    def poll(self) -> list[SourceRecord]:
        """The next records; may block briefly (bounded) and return [] when there are none."""

    def commit(self) -> None:  # noqa: B027 - optional to override
        """The offsets of the records polled so far, up to some point, are committed."""

    def commit_record(self, record: SourceRecord, metadata: RecordMetadata) -> None:  # noqa: B027
        """``record`` was acknowledged at ``metadata`` (Kafka's ``commitRecord``). Called on
        the producer's thread: keep it short. Under exactly-once the acknowledgement is of a
        record in an open transaction: it becomes visible only if that transaction commits."""

    def commit_records(
        self, records: Sequence[SourceRecord], futures: Sequence[RecordFuture]
    ) -> None:
        """``records``, sent one after another from one source partition into one producer
        batch, were acknowledged; ``futures[i]`` is ``records[i]``'s (done). By default
        ``commit_record`` for each. A task that sees many records may override this instead,
        to do per run what it would do per record and skip building a ``RecordMetadata`` each
        (``RecordFuture.offset`` is the record's offset alone); the mirror does. Called on the
        producer's thread, like ``commit_record``."""
        for record, future in zip(records, futures, strict=True):
            self.commit_record(record, future.result(0))

    def transaction_records(self) -> list[TransactionRecord]:
        """Exactly-once only: records to write in the transaction about to commit, with no
        source offset of their own (a mirror's offset syncs). Called on the task's thread after
        every record of the transaction was acknowledged (``commit_record`` ran for each), just
        before the source offsets are written."""
        return []

    def metrics(self) -> JsonDict:
        """Figures for the task's status (e.g. replication lag); called on the task's thread
        every ``status.metrics.interval.ms``. Empty: nothing to report."""
        return {}

    @abc.abstractmethod
    def stop(self) -> None:
        """Called from another thread: make a blocked ``poll`` return soon."""


class SinkTask(abc.ABC):
    @abc.abstractmethod
    def start(self, config: JsonDict) -> None: ...

    @abc.abstractmethod
    def put(self, records: list[SinkRecord]) -> None:
        """Take the records (buffering is fine: ``flush`` makes them durable)."""

    @abc.abstractmethod
    def flush(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Make every record put so far durable; ``offsets`` are about to be committed
        (topic, partition -> next offset)."""

    @abc.abstractmethod
    def stop(self) -> None: ...
