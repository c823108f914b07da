"""Writing DataFrames to topics: columns ``value`` (required), ``key``, ``topic``,
``partition``, ``headers``, as Spark's Kafka connector does.

Each write task runs one idempotent producer (acks=all) with large batches: the broker drops a
batch the producer resends after a lost answer, so the producer's own retries never duplicate.
A task that Spark itself retries starts a new producer (a new producer id), so records a failed
task had already written are written again: at-least-once, as with Kafka without transactions.
Rows are sent without a callback each; the task keeps the futures of unacknowledged records
(bounded by the producer's ``buffer.memory``), settles them oldest first as they complete,
flushes once at the end, and fails with the first record that could not be delivered.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
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

from dataplane.client import Producer
from dataplane.client.producer import RecordFuture
from spark._options import WriteOptions
from spark.errors import MissingColumnError

FLUSH_TIMEOUT_S = 300.0
PRODUCER_BATCH_BYTES = 512 * 1024  # under the brokers' max.message.bytes (1 MiB)
PRODUCER_LINGER_MS = 20
PRODUCER_BUFFER_BYTES = 64 * 1024 * 1024
SETTLE_EVERY_ROWS = 1_000
KEY_VALUE_TYPES = (BinaryType, StringType)


@dataclass
class WriteResult(WriterCommitMessage):
    """What one write task wrote: records per (topic, partition)."""

    records: dict[tuple[str, int], int] = field(default_factory=dict)

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
    """Futures of sent records, oldest first, settled in order as they complete."""

    def __init__(self) -> None:
        self.futures: deque[RecordFuture] = deque()
        self.result = WriteResult()

    def settle(self) -> None:
        """Count the acknowledged records from the oldest on; raise the first failure."""
        futures, counts = self.futures, self.result.records
        while futures and futures[0].done():
            metadata = futures.popleft().result()  # raises the record's delivery error
            key = (metadata.topic, metadata.partition)
            counts[key] = counts.get(key, 0) + 1


def _column(batch: pa.RecordBatch, name: str) -> list[object] | None:
    index = batch.schema.get_field_index(name)
    return None if index < 0 else batch.column(index).to_pylist()


def _send_batch(
    producer: Producer, batch: pa.RecordBatch, topic: str | None, pending: _Pending
) -> None:
    values = _column(batch, "value")
    assert values is not None, "check_write_schema requires a value column"
    keys = _column(batch, "key") or [None] * batch.num_rows
    topics = [topic] * batch.num_rows if topic is not None else _column(batch, "topic")
    partitions = _column(batch, "partition") or [None] * batch.num_rows
    headers = _column(batch, "headers") or [None] * batch.num_rows
    assert topics is not None, "check_write_schema requires a topic option or column"
    send, append = producer.send, pending.futures.append
    for row in range(batch.num_rows):
        row_topic = topics[row]
        if not isinstance(row_topic, str):
            raise MissingColumnError(f"row {row} of a written batch has a null topic")
        row_headers = headers[row]
        append(
            send(
                row_topic,
                _as_bytes(values[row]),  # type: ignore[arg-type]
                key=_as_bytes(keys[row]),  # type: ignore[arg-type]
                partition=partitions[row],  # type: ignore[arg-type]
                headers=None
                if row_headers is None
                else [(h["key"], _as_bytes(h["value"])) for h in row_headers],  # type: ignore[attr-defined]
            )
        )
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
    with Producer(
        list(options.bootstrap_servers),
        acks="all",
        enable_idempotence=True,
        batch_size=PRODUCER_BATCH_BYTES,
        linger_ms=PRODUCER_LINGER_MS,
        buffer_memory=PRODUCER_BUFFER_BYTES,
    ) as producer:
        for batch in itertools.chain([first], rows):
            _send_batch(producer, batch, options.topic, pending)
        producer.flush(timeout=FLUSH_TIMEOUT_S)
        pending.settle()
    assert not pending.futures, "flush() returned with records unsettled"
    return pending.result


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        return write_batches(self.options, iterator)


class StreamWriter(DataSourceStreamArrowWriter):
    """Each micro-batch's rows are sent by the tasks; ``commit`` (on the driver) has nothing
    left to do, since records are visible once acknowledged."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        return write_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do (see the class docstring)."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Acknowledged records cannot be taken back; a retried batch writes them again."""
