"""Writing DataFrames to topics: columns ``value`` (required), ``key``, ``topic``,
``partition``, ``headers``, as Spark's Kafka connector does.

Each write task runs one idempotent producer (acks=all) with large batches: the broker drops a
batch the producer resends after a lost answer, so the producer's own retries never duplicate.
Rows are sent without a callback each; the task keeps the futures of unacknowledged records
(bounded by the producer's ``buffer.memory``), settles them oldest first as they complete,
flushes once at the end, and fails with the first record that could not be delivered.

**Exactly once** (``exactlyOnce``, the default): a two-phase commit over Kafka transactions,
KIP-939's shape, as Flink's exactly-once Kafka sink does it.

1. Each task with rows is a transactional producer with the id ``<prefix>-<partition id>``: one
   id per task partition, reused by every micro-batch and every attempt of the task, so there
   are never more ids than partitions. ``init_transactions`` fences any earlier attempt of the
   task and aborts its transaction if it was left open (a failed attempt, or a prepared one the
   driver never committed); a commit in progress is waited for.
2. The task then asks whether this micro-batch was already committed by a run that died in
   the middle of the driver's commit: every transaction also commits, through
   ``send_offsets_to_transaction``, an offset of the group named like the transactional id
   whose metadata is ``{"query": <query id>, "batch": <batch id>}`` (offset 0 of partition 0
   of the topic written). That offset commits with the records, atomically, so reading it
   back (``require_stable``: never while a commit is in progress) tells whether this batch's
   rows of this partition are in the log. If so the task writes nothing and says so.
3. Otherwise it sends its rows and the batch record, ``prepare_transaction()`` (every record
   acknowledged, the transaction still open), and hands the :class:`PreparedTransaction` to the
   driver in its commit message.
4. The driver's ``commit(messages, batchId)`` commits every prepared transaction
   (``complete_prepared_transaction``); ``abort`` aborts them.

So a task that fails after writing is retried without duplicates (the retry's init aborts the
failed attempt's records), and a driver killed between two of the commits re-runs the batch on
restart (Spark's checkpoint has no commit for it): the tasks whose transaction committed find
their batch record and skip, the others' init aborts the prepared transaction and writes again.
Readers must read ``read_committed``. Speculative execution would run two attempts of a task
at once: the later init fences the earlier, whose prepared transaction the driver then fails to
commit (``PreparedTransactionFencedError``): the query fails loudly and is re-run, never
duplicating. Batch writes (``write``) work the same, with a prefix made unique per job on the
driver (a failed batch job is re-run from scratch, as a new job) and batch id 0.

``exactlyOnce=false`` is the plain idempotent producer: a task that Spark retries starts a new
producer (a new producer id), so records a failed task had already written are written again:
at-least-once, as Spark's own Kafka sink.

Two options are test hooks, not for applications: ``raftlog.test.failTaskOnceMarker`` (a path:
the first attempt of each task partition fails once its transaction is prepared, leaving the
marker ``<path>.<partition id>``) and ``raftlog.test.killDriverAfterCommits``
(``<n>:<process group>``: the streaming commit SIGKILLs that process group, the driver's, after
committing ``n`` transactions of a micro-batch, then exits).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    StringType,
    StructType,
)

from dataplane.client import (
    AdminClient,
    BatchResult,
    OffsetAndMetadata,
    PreparedTransaction,
    PreparedTransactionFencedError,
    Producer,
    TopicPartition,
    complete_prepared_transaction,
)
from raftlog.errors import ErrorCode, KafkaError
from spark._key_hash import positive_murmur2
from spark._options import WriteOptions
from spark._worker import tune_worker
from spark.errors import MissingColumnError

FLUSH_TIMEOUT_S = 300.0
PRODUCER_BATCH_BYTES = 512 * 1024  # under the brokers' max.message.bytes (1 MiB)
PRODUCER_LINGER_MS = 20
PRODUCER_BUFFER_BYTES = 64 * 1024 * 1024
SETTLE_EVERY_ROWS = 1_000
KEY_VALUE_TYPES = (BinaryType, StringType)
TXN_CALL_TIMEOUT_S = 120.0  # init (which may wait for an abort's markers), complete
ADMIN_TIMEOUT_MS = 60_000
BATCH_ID_PROPERTY = "streaming.sql.batchId"  # Spark's local properties of a micro-batch's tasks
QUERY_ID_PROPERTY = "sql.streaming.queryId"  # the query's id, kept in its checkpoint
log = logging.getLogger("spark.raftlog")


@dataclass
class WriteResult(WriterCommitMessage):
    """What one write task wrote: records per (topic, partition); with exactly-once the
    transaction the driver is to commit, or ``committed_before`` when a previous run's
    transaction already holds this batch's rows of the task."""

    records: dict[tuple[str, int], int] = field(default_factory=dict)
    prepared: PreparedTransaction | None = None
    committed_before: bool = False

    @property
    def total(self) -> int:
        return sum(self.records.values())


def _headers_ok(data_type: DataType) -> bool:
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    fields = {f.name: f.dataType for f in data_type.elementType.fields}
    return isinstance(fields.get("key"), StringType) and isinstance(
        fields.get("value"), KEY_VALUE_TYPES
    )


def check_write_schema(schema: StructType, options: WriteOptions) -> None:
    """MissingColumnError naming the problem when ``schema`` cannot be written."""
    types = {f.name: f.dataType for f in schema.fields}
    names = ", ".join(types) or "none"
    if "value" not in types:
        raise MissingColumnError(
            f"a DataFrame written to raftlog needs a 'value' column; has {names}"
        )
    checks = {
        "value": isinstance(types["value"], KEY_VALUE_TYPES),
        "key": "key" not in types or isinstance(types["key"], KEY_VALUE_TYPES),
        "topic": "topic" not in types or isinstance(types["topic"], StringType),
        "partition": "partition" not in types or isinstance(types["partition"], IntegerType),
        "headers": "headers" not in types or _headers_ok(types["headers"]),
    }
    wrong = [name for name, ok in checks.items() if not ok]
    if wrong:
        raise MissingColumnError(
            f"column {wrong[0]!r} has type {types[wrong[0]].simpleString()}; value and key must "
            "be binary or string, topic string, partition int, headers "
            "array<struct<key:string,value:binary>>"
        )
    if options.topic is None and "topic" not in types:
        raise MissingColumnError("no 'topic' option and no 'topic' column: where should rows go?")


def _as_bytes(value: bytes | str | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


class _Pending:
    """The batches holding sent records, oldest first, each with how many of this task's
    records it holds, settled in order as they complete. A record's outcome is its batch's
    (a batch split as too large completes with its parts' first error), so settling costs
    per batch, not per record."""

    def __init__(self) -> None:
        self.batches: dict[BatchResult, int] = {}  # insertion order: oldest first
        self.result = WriteResult()

    def settle(self) -> None:
        """Count the acknowledged records from the oldest batch on; raise the first failure."""
        batches, counts = self.batches, self.result.records
        for batch in list(batches):
            if not batch.done():
                return
            records = batches.pop(batch)
            if batch.error is not None:
                raise batch.error
            key = (batch.tp.topic, batch.tp.partition)
            counts[key] = counts.get(key, 0) + records


def _column(batch: pa.RecordBatch, name: str) -> list[object] | None:
    index = batch.schema.get_field_index(name)
    return None if index < 0 else batch.column(index).to_pylist()


def _key_partitions(
    producer: Producer, batch: pa.RecordBatch, topics: Sequence[object]
) -> Sequence[object] | None:
    """Each row's partition, a column at a time: the ``partition`` column where set, else
    murmur2 of the key over its topic's partition count, else None (no key: the producer's
    sticky partitioner). None when no row has either."""
    index = batch.schema.get_field_index("partition")
    explicit = None if index < 0 else batch.column(index)
    index = batch.schema.get_field_index("key")
    keys = None if index < 0 else batch.column(index)
    if keys is None or keys.null_count == len(keys):
        return None if explicit is None else explicit.to_pylist()
    counts = {t: len(producer.partitions_for(t)) for t in set(topics) if isinstance(t, str)}
    if len(counts) == 1:
        per_row: object = next(iter(counts.values()))
    else:  # a topic column: each row's count (a null topic's row fails in the send loop)
        per_row = np.fromiter(
            (counts.get(t, 1) if isinstance(t, str) else 1 for t in topics), np.uint32, len(topics)
        )
    hashed = pa.array((positive_murmur2(keys) % per_row).astype(np.int32))
    chosen = pc.if_else(keys.is_valid(), hashed, pa.scalar(None, pa.int32()))
    if explicit is not None:
        chosen = pc.coalesce(explicit, chosen)
    return chosen.to_pylist()  # type: ignore[no-any-return]


def _send_batch(
    producer: Producer, batch: pa.RecordBatch, topic: str | None, pending: _Pending
) -> None:
    values = _column(batch, "value")
    assert values is not None, "check_write_schema requires a value column"
    keys = _column(batch, "key") or [None] * batch.num_rows
    topics = [topic] * batch.num_rows if topic is not None else _column(batch, "topic")
    assert topics is not None, "check_write_schema requires a topic option or column"
    partitions = _key_partitions(producer, batch, topics) or [None] * batch.num_rows
    headers = _column(batch, "headers") or [None] * batch.num_rows
    send, batches = producer.send, pending.batches
    for row in range(batch.num_rows):
        row_topic = topics[row]
        if not isinstance(row_topic, str):
            raise MissingColumnError(f"row {row} of a written batch has a null topic")
        row_headers = headers[row]
        sent = send(
            row_topic,
            _as_bytes(values[row]),  # type: ignore[arg-type]
            key=_as_bytes(keys[row]),  # type: ignore[arg-type]
            partition=partitions[row],  # type: ignore[arg-type]
            headers=None
            if row_headers is None
            else [(h["key"], _as_bytes(h["value"])) for h in row_headers],  # type: ignore[attr-defined]
        ).batch
        batches[sent] = batches.get(sent, 0) + 1
        if row % SETTLE_EVERY_ROWS == 0:
            pending.settle()


def write_batches(options: WriteOptions, batches: Iterator[pa.RecordBatch]) -> WriteResult:
    """Send every row, flush once; raise the first delivery failure. A task without rows
    (common in streaming: an aggregation's empty shuffle partitions) starts no producer."""
    rows = (batch for batch in batches if batch.num_rows)
    first = next(rows, None)
    pending = _Pending()
    if first is None:
        return pending.result
    tune_worker()
    with Producer(
        list(options.bootstrap_servers),
        acks="all",
        enable_idempotence=True,
        security=options.security,
        batch_size=PRODUCER_BATCH_BYTES,
        linger_ms=PRODUCER_LINGER_MS,
        buffer_memory=PRODUCER_BUFFER_BYTES,
    ) as producer:
        for batch in itertools.chain([first], rows):
            _send_batch(producer, batch, options.topic, pending)
        producer.flush(timeout=FLUSH_TIMEOUT_S)
        pending.settle()
    assert not pending.batches, "flush() returned with records unsettled"
    return pending.result


# -- exactly once ----------------------------------------------------------------------------
@dataclass(frozen=True)
class TaskBatch:
    """Who is writing: the transactional id of the task partition and the batch it writes."""

    transactional_id: str
    query_id: str
    batch_id: int
    partition_id: int


def batch_record(query_id: str, batch_id: int) -> str:
    """The metadata of the offset each transaction commits: which batch of which query."""
    return json.dumps({"query": query_id, "batch": batch_id}, sort_keys=True)


def names_batch(metadata: str, query_id: str, batch_id: int) -> bool:
    try:
        found = json.loads(metadata)
    except ValueError:
        return False
    return isinstance(found, dict) and found == {"query": query_id, "batch": batch_id}


def _first_topic(options: WriteOptions, batch: pa.RecordBatch) -> str:
    """The topic whose partition 0 holds the batch record: the ``topic`` option, else the
    first row's topic (any existing partition does: only the group's offsets are read)."""
    if options.topic is not None:
        return options.topic
    topics = _column(batch, "topic") or []
    topic = next((t for t in topics if isinstance(t, str)), None)
    if topic is None:
        raise MissingColumnError("a written batch has only null topics")
    return topic


def committed_before(options: WriteOptions, task: TaskBatch) -> bool:
    """Whether a transaction of ``task``'s id committed this very batch (its batch record)."""
    with AdminClient(
        list(options.bootstrap_servers),
        request_timeout_ms=ADMIN_TIMEOUT_MS,
        security=options.security,
    ) as admin:
        offsets = admin.list_group_offsets(task.transactional_id, require_stable=True)
    return any(
        names_batch(committed.metadata, task.query_id, task.batch_id)
        for committed in offsets.values()
    )


def _fail_once_for_test(options: WriteOptions, partition_id: int) -> None:
    marker = options.test_fail_task_once_marker
    if marker is None:
        return
    try:
        os.close(os.open(f"{marker}.{partition_id}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    raise RuntimeError(
        f"test hook {marker}: task partition {partition_id} fails once, its transaction prepared"
    )


def write_transactional(
    options: WriteOptions, batches: Iterator[pa.RecordBatch], task: TaskBatch
) -> WriteResult:
    """The task's side of the two-phase commit (see the module docstring)."""
    rows = (batch for batch in batches if batch.num_rows)
    first = next(rows, None)
    pending = _Pending()
    if first is None:
        return pending.result
    tune_worker()
    record_tp = TopicPartition(_first_topic(options, first), 0)
    with Producer(
        list(options.bootstrap_servers),
        acks="all",
        batch_size=PRODUCER_BATCH_BYTES,
        linger_ms=PRODUCER_LINGER_MS,
        buffer_memory=PRODUCER_BUFFER_BYTES,
        transactional_id=task.transactional_id,
        transaction_timeout_ms=options.transaction_timeout_ms,
        security=options.security,
    ) as producer:
        producer.init_transactions(TXN_CALL_TIMEOUT_S)
        if committed_before(options, task):
            log.info("%s: batch %d committed before, nothing to write", task, task.batch_id)
            return WriteResult(committed_before=True)
        producer.begin_transaction()
        try:
            for batch in itertools.chain([first], rows):
                _send_batch(producer, batch, options.topic, pending)
            producer.send_offsets_to_transaction(
                {record_tp: OffsetAndMetadata(0, batch_record(task.query_id, task.batch_id))},
                task.transactional_id,
                TXN_CALL_TIMEOUT_S,
            )
            prepared = producer.prepare_transaction(FLUSH_TIMEOUT_S)
            pending.settle()
        except BaseException:
            _abort_quietly(producer, task)  # else it holds read_committed readers until its timeout
            raise
    assert not pending.batches, "prepare_transaction() returned with records unsettled"
    _fail_once_for_test(options, task.partition_id)
    pending.result.prepared = prepared
    return pending.result


def _abort_quietly(producer: Producer, task: TaskBatch) -> None:
    try:
        producer.abort_transaction(TXN_CALL_TIMEOUT_S)
    except Exception as error:  # noqa: BLE001 - the task's own error is the one to raise
        log.warning("%s: abort after a failed write failed too: %s", task, error)


def _task_batch(prefix: str, query_id: str | None, batch_id: int | None) -> TaskBatch:
    """The task's id and batch, from Spark's task context: a micro-batch's tasks carry the
    query id and batch id as local properties; a batch job passes its own (``query_id``)."""
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("the raftlog writer runs in Spark tasks only")
    partition_id = context.partitionId()
    query = query_id if query_id is not None else context.getLocalProperty(QUERY_ID_PROPERTY)
    if batch_id is None:
        text = context.getLocalProperty(BATCH_ID_PROPERTY)
        if text is None or query is None:
            raise RuntimeError("a streaming write task without Spark's query and batch ids")
        batch_id = int(text)
    assert query is not None, "a batch job passes its own id"
    return TaskBatch(f"{prefix}-{partition_id}", query, batch_id, partition_id)


def _prepared(messages: Sequence[WriterCommitMessage | None]) -> list[PreparedTransaction]:
    return [m.prepared for m in messages if isinstance(m, WriteResult) and m.prepared is not None]


def commit_prepared(
    options: WriteOptions, messages: Sequence[WriterCommitMessage | None], batch_id: int
) -> None:
    """The driver's commit: every task's prepared transaction, each once (a repeat after a
    crash succeeds). All are attempted; the first failure is raised after."""
    failures: list[KafkaError] = []
    kill = options.test_kill_driver_after_commits
    for done, prepared in enumerate(_prepared(messages)):
        if kill is not None and done == kill[0]:
            _kill_driver_for_test(kill[1], done, batch_id)
        try:
            complete_prepared_transaction(
                list(options.bootstrap_servers), prepared, commit=True,
                timeout_s=TXN_CALL_TIMEOUT_S, security=options.security,
            )  # fmt: skip
        except KafkaError as error:
            log.error("batch %d: commit of %s failed: %s", batch_id, prepared, error)
            failures.append(error)
    if failures:
        raise failures[0]


def _kill_driver_for_test(process_group: int, done: int, batch_id: int) -> None:
    log.error("test hook: killing the driver after %d commits of batch %d", done, batch_id)
    os.killpg(process_group, signal.SIGKILL)
    os._exit(1)  # this process is Spark's Python worker, in a process group of its own


def abort_prepared(
    options: WriteOptions, messages: Sequence[WriterCommitMessage | None], batch_id: int
) -> None:
    """The driver's abort: every prepared transaction, best effort. One already taken over
    (fenced, timed out) or ended is left as it is: the next attempt's init aborts what stays
    open."""
    for prepared in _prepared(messages):
        try:
            complete_prepared_transaction(
                list(options.bootstrap_servers),
                prepared,
                commit=False,
                timeout_s=TXN_CALL_TIMEOUT_S,
                security=options.security,
            )
        except PreparedTransactionFencedError:
            continue
        except KafkaError as error:
            level = logging.INFO if error.error is ErrorCode.INVALID_TXN_STATE else logging.WARNING
            log.log(level, "batch %d: abort of %s: %s", batch_id, prepared, error)


class BatchWriter(DataSourceArrowWriter):
    """``write``: the job's prefix is made here, on the driver, unique per job."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        self.job_id = uuid.uuid4().hex[:16]

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        if not self.options.exactly_once:
            return write_batches(self.options, iterator)
        prefix = f"{self.options.transactional_id_prefix}-{self.job_id}"
        task = _task_batch(prefix, self.job_id, 0)
        return write_transactional(self.options, iterator, task)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_prepared(self.options, messages, 0)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_prepared(self.options, messages, 0)


class StreamWriter(DataSourceStreamArrowWriter):
    """Each micro-batch's rows are sent by the tasks; ``commit`` (on the driver) commits their
    transactions (at-least-once: nothing to do, records are visible once acknowledged)."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        if not self.options.exactly_once:
            return write_batches(self.options, iterator)
        task = _task_batch(self.options.transactional_id_prefix, None, None)
        return write_transactional(self.options, iterator, task)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        commit_prepared(self.options, messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Exactly once: abort the prepared transactions. At least once: acknowledged
        records cannot be taken back; a retried batch writes them again."""
        abort_prepared(self.options, messages, batchId)
