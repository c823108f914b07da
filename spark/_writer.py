"""Writing DataFrames to topics: columns ``value`` (required), ``key``, ``topic``,
``partition``, ``headers``, as Spark's Kafka connector does.

Each write task runs one idempotent producer (acks=all): the broker drops a batch the
producer resends after a lost answer, so the producer's own retries never duplicate. A task
that Spark itself retries starts a new producer (a new producer id), so records a failed task
had already written are written again: at-least-once, as with Kafka without transactions.
The task fails with the first record that could not be delivered.
"""

from __future__ import annotations

import threading
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

from dataplane.client import Producer, RecordMetadata
from spark._options import WriteOptions
from spark.errors import MissingColumnError

FLUSH_TIMEOUT_S = 300.0
PRODUCER_BATCH_BYTES = 256 * 1024
PRODUCER_LINGER_MS = 10
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


class _Delivery:
    """Counts acknowledged records and keeps the first failure (producer callbacks run on
    the producer's sender thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.result = WriteResult()
        self.error: BaseException | None = None

    def __call__(self, metadata: RecordMetadata | None, error: BaseException | None) -> None:
        with self.lock:
            if error is not None:
                self.error = self.error or error
            elif metadata is not None:
                key = (metadata.topic, metadata.partition)
                self.result.records[key] = self.result.records.get(key, 0) + 1


def _column(batch: pa.RecordBatch, name: str) -> list[object] | None:
    index = batch.schema.get_field_index(name)
    return None if index < 0 else batch.column(index).to_pylist()


def _send_batch(
    producer: Producer, batch: pa.RecordBatch, topic: str | None, done: _Delivery
) -> None:
    values = _column(batch, "value")
    assert values is not None, "check_write_schema requires a value column"
    keys = _column(batch, "key") or [None] * batch.num_rows
    topics = [topic] * batch.num_rows if topic is not None else _column(batch, "topic")
    partitions = _column(batch, "partition") or [None] * batch.num_rows
    headers = _column(batch, "headers") or [None] * batch.num_rows
    assert topics is not None, "check_write_schema requires a topic option or column"
    for row in range(batch.num_rows):
        row_topic = topics[row]
        if not isinstance(row_topic, str):
            raise MissingColumnError(f"row {row} of a written batch has a null topic")
        row_headers = headers[row]
        producer.send(
            row_topic,
            _as_bytes(values[row]),  # type: ignore[arg-type]
            key=_as_bytes(keys[row]),  # type: ignore[arg-type]
            partition=partitions[row],  # type: ignore[arg-type]
            headers=None
            if row_headers is None
            else [(h["key"], _as_bytes(h["value"])) for h in row_headers],  # type: ignore[attr-defined]
            callback=done,
        )


def write_batches(options: WriteOptions, batches: Iterator[pa.RecordBatch]) -> WriteResult:
    """Send every row; raise the first delivery failure after flushing."""
    done = _Delivery()
    with Producer(
        list(options.bootstrap_servers),
        acks="all",
        enable_idempotence=True,
        batch_size=PRODUCER_BATCH_BYTES,
        linger_ms=PRODUCER_LINGER_MS,
    ) as producer:
        for batch in batches:
            _send_batch(producer, batch, options.topic, done)
            if done.error is not None:
                break
        producer.flush(timeout=FLUSH_TIMEOUT_S)
    if done.error is not None:
        raise done.error
    return done.result


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
