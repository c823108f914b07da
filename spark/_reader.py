"""Reading one offset range from its partition's leader into Arrow record batches.

Runs in Spark's Python workers. A Consumer is assigned the one topic-partition, seeks to the
range's start and fetches whole record batches (``poll_batches``, up to
``MAX_PARTITION_FETCH_BYTES`` a fetch) until its position reaches the range's end (or nothing
arrived for ``kafkaConsumer.pollTimeoutMs``); each fetch becomes one Arrow batch, decoded a
column at a time (see ``_columns``), never a Python object per record. Records deleted by
retention before they were read show up as OFFSET_OUT_OF_RANGE below the log start offset:
with ``failOnDataLoss`` that raises :class:`DataLossError`, without it the reader logs a warning
and skips to the log start offset.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TypeVar

import pyarrow as pa

from dataplane.client import Consumer
from dataplane.client.consumer import FetchedBatches
from metadata_quorum.security.channels import ClientSecurity
from raftlog.errors import ErrorCode, KafkaError
from spark._columns import to_record_batch
from spark._offsets import OffsetRange
from spark._options import IsolationLevel
from spark.errors import DataLossError

log = logging.getLogger("spark.raftlog")

MAX_PARTITION_FETCH_BYTES = 16 * 1024 * 1024  # also bounds the bytes of one Arrow batch
FETCH_MAX_WAIT_MS = 200
MAX_DATA_LOSS_SKIPS = 10_000  # bounds the retry loop when retention keeps deleting ahead
PREFETCH_FETCHES = 2  # fetched, not yet decoded: at most this many x MAX_PARTITION_FETCH_BYTES
HANDOFF_WAIT_S = 0.5  # how often a blocked hand-off rechecks that the other side still runs

T = TypeVar("T")


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
) -> tuple[list[FetchedBatches], int]:
    """Batches fetched at ``position``, and the next position."""
    try:
        fetched = consumer.poll_batches(timeout_ms=FETCH_MAX_WAIT_MS * 5)
    except KafkaError as error:
        if error.error is not ErrorCode.OFFSET_OUT_OF_RANGE:
            raise
        skipped_to = _skip_lost(consumer, rng, position, fail)
        if skipped_to < rng.until_offset:
            consumer.seek(rng.tp, skipped_to)
        return [], skipped_to
    return fetched, consumer.position(rng.tp)


def iter_range(
    bootstrap_servers: Sequence[str],
    rng: OffsetRange,
    *,
    fail_on_data_loss: bool,
    poll_timeout_ms: int,
    isolation_level: IsolationLevel = "read_uncommitted",
    security: ClientSecurity | None = None,
) -> Iterator[FetchedBatches]:
    """The fetched batches holding the records of ``rng``, in offset order (the first may
    start before the range, the last end after it)."""
    if rng.size == 0:
        return
    with Consumer(
        list(bootstrap_servers),
        auto_offset_reset="none",
        max_partition_fetch_bytes=MAX_PARTITION_FETCH_BYTES,
        fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
        isolation_level=isolation_level,
        security=security,
    ) as consumer:
        consumer.assign([rng.tp])
        consumer.seek(rng.tp, rng.from_offset)
        position = rng.from_offset
        progress_at = time.monotonic()
        for _ in range(rng.size + MAX_DATA_LOSS_SKIPS):  # each round reads a record or skips
            if position >= rng.until_offset:
                return
            fetched, next_position = _poll_once(consumer, rng, position, fail_on_data_loss)
            if next_position > position:
                progress_at = time.monotonic()
            elif time.monotonic() - progress_at > poll_timeout_ms / 1000:
                raise TimeoutError(
                    f"{rng.topic}-{rng.partition}: no record at offset {position} within "
                    f"{poll_timeout_ms} ms (kafkaConsumer.pollTimeoutMs); the range ends at "
                    f"{rng.until_offset}"
                )
            position = next_position
            yield from fetched
        raise AssertionError(f"{rng}: read loop exceeded its bound")


def prefetched(source: Iterator[T], depth: int) -> Iterator[T]:
    """The items of ``source``, iterated on a thread of their own up to ``depth`` ahead of the
    caller: the next fetch travels while this one is decoded. An error of ``source`` is raised
    here; closing this generator early stops the thread, which closes ``source``."""
    handoff: queue.Queue[tuple[bool, T | BaseException | None]] = queue.Queue(depth)
    stopped = threading.Event()

    def put(item: tuple[bool, T | BaseException | None]) -> bool:
        while not stopped.is_set():
            try:
                handoff.put(item, timeout=HANDOFF_WAIT_S)
            except queue.Full:
                continue
            return True
        return False

    def run() -> None:
        try:
            for item in source:
                if not put((True, item)):
                    return
            put((False, None))
        except BaseException as error:  # noqa: BLE001 - not swallowed: raised in the caller
            put((False, error))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=run, name="raftlog-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            try:
                more, value = handoff.get(timeout=HANDOFF_WAIT_S)
            except queue.Empty:
                if not thread.is_alive() and handoff.empty():
                    raise RuntimeError("the prefetch thread ended without a word") from None
                continue
            if isinstance(value, BaseException):
                raise value
            if not more:
                return
            yield value  # type: ignore[misc]
    finally:
        stopped.set()
        thread.join()


def read_range(
    bootstrap_servers: Sequence[str],
    rng: OffsetRange,
    schema: pa.Schema,
    *,
    fail_on_data_loss: bool,
    include_headers: bool,
    poll_timeout_ms: int,
    isolation_level: IsolationLevel = "read_uncommitted",
    security: ClientSecurity | None = None,
) -> Iterator[pa.RecordBatch]:
    """Every record of ``rng`` as Arrow batches (one a fetch), in offset order; the next
    fetch is in flight while one is decoded."""
    fetches = iter_range(
        bootstrap_servers,
        rng,
        fail_on_data_loss=fail_on_data_loss,
        poll_timeout_ms=poll_timeout_ms,
        isolation_level=isolation_level,
        security=security,
    )
    for fetched in prefetched(fetches, PREFETCH_FETCHES):
        batch = to_record_batch(fetched, rng.until_offset, schema, include_headers)
        if batch.num_rows:
            yield batch
