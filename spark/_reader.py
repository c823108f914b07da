"""Reading one offset range from its partition's leader into Arrow record batches.

Runs in Spark's Python workers. A Consumer is assigned the one topic-partition, seeks to the
range's start and polls until its position reaches the range's end (or no record arrived
for ``kafkaConsumer.pollTimeoutMs``). Records deleted by retention before they were read show
up as OFFSET_OUT_OF_RANGE below the log start offset: with ``failOnDataLoss`` that raises
:class:`DataLossError`, without it the reader logs a warning and skips to the log start offset.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence

import pyarrow as pa

from dataplane.client import Consumer, ConsumerRecord
from raftlog.errors import ErrorCode, KafkaError
from spark._offsets import OffsetRange
from spark.errors import DataLossError

log = logging.getLogger("spark.raftlog")

MAX_POLL_RECORDS = 20_000  # also the most rows of one Arrow batch
MAX_PARTITION_FETCH_BYTES = 8 * 1024 * 1024
FETCH_MAX_WAIT_MS = 200
MAX_DATA_LOSS_SKIPS = 10_000  # bounds the retry loop when retention keeps deleting ahead


def _timestamp_type() -> pa.DataType:
    return pa.timestamp("us", tz="UTC")


def to_arrow(
    records: Sequence[ConsumerRecord], schema: pa.Schema, include_headers: bool
) -> pa.RecordBatch:
    """One Arrow batch of ``records`` in the Kafka connector's row layout."""
    count = len(records)
    first = records[0]
    columns = [
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.value for r in records], pa.binary()),
        pa.array([first.topic] * count, pa.string()),
        pa.array([first.partition] * count, pa.int32()),
        pa.array([r.offset for r in records], pa.int64()),
        pa.array([r.timestamp for r in records], pa.timestamp("ms", tz="UTC")).cast(
            _timestamp_type()
        ),
        pa.array([r.timestamp_type for r in records], pa.int32()),
    ]
    if include_headers:
        columns.append(
            pa.array(
                [[{"key": k, "value": v} for k, v in r.headers] for r in records],
                schema.field("headers").type,
            )
        )
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _skip_lost(consumer: Consumer, rng: OffsetRange, position: int, fail: bool) -> int:
    """The position to continue from after OFFSET_OUT_OF_RANGE at ``position``."""
    log_start = consumer.beginning_offsets([rng.tp])[rng.tp]
    if log_start <= position:
        raise KafkaError(
            ErrorCode.OFFSET_OUT_OF_RANGE,
            f"{rng.topic}-{rng.partition}: offset {position} is out of range but not below "
            f"the log start offset {log_start} (was the topic deleted and recreated?)",
        )
    lost_until = min(log_start, rng.until_offset)
    message = (
        f"{rng.topic}-{rng.partition}: offsets [{position}, {lost_until}) were deleted "
        f"(retention) before they were read; the log now starts at {log_start}"
    )
    if fail:
        raise DataLossError(
            message + ". Some data may have been lost. Set failOnDataLoss=false to skip "
            "deleted records with a warning instead."
        )
    log.warning("%s; skipping them (failOnDataLoss=false)", message)
    return lost_until


def _poll_once(
    consumer: Consumer, rng: OffsetRange, position: int, fail: bool
) -> tuple[list[ConsumerRecord], int]:
    """Records polled at ``position`` below the range's end, and the next position."""
    try:
        polled = consumer.poll(timeout_ms=FETCH_MAX_WAIT_MS * 5)
    except KafkaError as error:
        if error.error is not ErrorCode.OFFSET_OUT_OF_RANGE:
            raise
        skipped_to = _skip_lost(consumer, rng, position, fail)
        if skipped_to < rng.until_offset:
            consumer.seek(rng.tp, skipped_to)
        return [], skipped_to
    records = polled.get(rng.tp, [])
    if records and records[-1].offset >= rng.until_offset:
        records = [r for r in records if r.offset < rng.until_offset]
    return records, consumer.position(rng.tp)


def iter_range(
    bootstrap_servers: Sequence[str],
    rng: OffsetRange,
    *,
    fail_on_data_loss: bool,
    poll_timeout_ms: int,
) -> Iterator[list[ConsumerRecord]]:
    """Every record of ``rng`` in offset order, a polled chunk at a time."""
    if rng.size == 0:
        return
    with Consumer(
        list(bootstrap_servers),
        auto_offset_reset="none",
        max_poll_records=MAX_POLL_RECORDS,
        max_partition_fetch_bytes=MAX_PARTITION_FETCH_BYTES,
        fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
    ) as consumer:
        consumer.assign([rng.tp])
        consumer.seek(rng.tp, rng.from_offset)
        position = rng.from_offset
        progress_at = time.monotonic()
        for _ in range(rng.size + MAX_DATA_LOSS_SKIPS):  # each round reads a record or skips
            if position >= rng.until_offset:
                return
            records, next_position = _poll_once(consumer, rng, position, fail_on_data_loss)
            if next_position > position:
                progress_at = time.monotonic()
            elif time.monotonic() - progress_at > poll_timeout_ms / 1000:
                raise TimeoutError(
                    f"{rng.topic}-{rng.partition}: no record at offset {position} within "
                    f"{poll_timeout_ms} ms (kafkaConsumer.pollTimeoutMs); the range ends at "
                    f"{rng.until_offset}"
                )
            position = next_position
            if records:
                yield records
        raise AssertionError(f"{rng}: read loop exceeded its bound")


def read_range(
    bootstrap_servers: Sequence[str],
    rng: OffsetRange,
    schema: pa.Schema,
    *,
    fail_on_data_loss: bool,
    include_headers: bool,
    poll_timeout_ms: int,
) -> Iterator[pa.RecordBatch]:
    """Every record of ``rng`` as Arrow batches, in offset order."""
    for records in iter_range(
        bootstrap_servers, rng, fail_on_data_loss=fail_on_data_loss, poll_timeout_ms=poll_timeout_ms
    ):
        yield to_arrow(records, schema, include_headers)
