"""The producer: ``send`` appends to a :class:`RecordAccumulator`, one sender thread ships.

Kafka's architecture and settings (``acks``, ``batch.size``, ``linger.ms``,
``compression.type``, ``retries``, ``delivery.timeout.ms``, ``retry.backoff.ms``,
``request.timeout.ms``, ``max.in.flight.requests.per.connection``, ``buffer.memory``,
``max.block.ms``, ``max.request.size``, ``enable.idempotence``) with underscores. ``send``
returns a :class:`RecordFuture` (``result``, ``exception``, ``done``, ``add_done_callback``, as a
``concurrent.futures.Future``; one outcome per batch, see ``_record_future``); expected failures
(a missing topic, a record too large, a delivery timeout, a broker's non-retriable error)
arrive on the future as ``KafkaError``, never as an exception from ``send``. ``send`` raises
only for a caller's bug (wrong types: ``TypeError``/``ValueError``) or after ``close``
(``ProducerClosedError``).

Transactions (KIP-98, Kafka's Java client API): ``Producer(transactional_id=...)`` (idempotence
implied), ``init_transactions()`` once, then per transaction ``begin_transaction()``, ``send``,
optionally ``send_offsets_to_transaction(offsets, consumer.group_metadata())``, and
``commit_transaction()`` or ``abort_transaction()`` (or ``prepare_transaction()``, for another
process to complete: see ``_prepared``). Errors: see ``_transactions`` (fatal,
abortable, state errors). On a transactional producer ``send`` also raises: a
:class:`TransactionStateError` outside a transaction, and the transaction's error once it
failed (abort first), as Kafka's does.

Ordering: records of one partition are delivered in ``send`` order, also across retries:
without idempotence at most one batch per partition is in flight; with it (the default under
acks=all) up to five, ordered by the broker's sequence check (see ``_accumulator``).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal

from dataplane.client._accumulator import (
    ProducerClosedError,
    ProducerTimeoutError,
    RecordAccumulator,
    estimate_record_bytes,
)
from dataplane.client._closing import Closing
from dataplane.client._cluster import Cluster, SecuritySetting
from dataplane.client._config import DEFAULT_BATCH_SIZE, ProducerConfig
from dataplane.client._prepared import PreparedTransaction
from dataplane.client._record_future import RecordFuture
from dataplane.client._sender import Sender
from dataplane.client._transactions import TransactionManager, TransactionStateError
from dataplane.client._txn_requests import TransactionalRequests
from dataplane.client._types import (
    ConsumerGroupMetadata,
    OffsetAndMetadata,
    RecordMetadata,
    TopicPartition,
)
from dataplane.client.partitioner import StickyPartitioner, partition_for_key
from raftlog.batch import HEADER_SIZE
from raftlog.errors import ErrorCode, KafkaError
from raftlog.records import Headers

__all__ = [
    "PreparedTransaction",
    "Producer",
    "ProducerClosedError",
    "ProducerTimeoutError",
    "RecordFuture",
]

Callback = Callable[[RecordMetadata | None, BaseException | None], None]
CLOSE_FORCE_WAIT_S = 5.0  # after a forced close, how long to wait for the sender to stop


def _as_bytes(name: str, data: bytes | bytearray | memoryview | None) -> bytes | None:
    if data is None or isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"{name} must be bytes or None, not {type(data).__name__}")


def _as_headers(headers: Iterable[tuple[str, bytes | None]] | None) -> Headers:
    if headers is None:
        return ()
    result = tuple((key, _as_bytes("a header value", value)) for key, value in headers)
    for key, _ in result:
        if not isinstance(key, str):
            raise TypeError(f"a header key must be str, not {type(key).__name__}")
    return result


MAX_IN_FLIGHT_IDEMPOTENT = 5  # batches per partition the broker's sequence check can order


class Producer(Closing):
    """A thread-safe Kafka-style producer. Use as a context manager or call :meth:`close`."""

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        *,
        acks: Literal[0, 1, -1, "all"] = "all",
        batch_size: int = DEFAULT_BATCH_SIZE,
        linger_ms: int = 5,
        compression_type: Literal["none", "gzip", "snappy", "lz4", "zstd"] = "none",
        retries: int = 2**31 - 1,
        delivery_timeout_ms: int = 120_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1_000,
        request_timeout_ms: int = 30_000,
        max_in_flight_requests_per_connection: int = 5,
        buffer_memory: int = 32 * 1024 * 1024,
        max_block_ms: int = 60_000,
        max_request_size: int = 1024 * 1024,
        metadata_max_age_ms: int = 300_000,
        enable_idempotence: bool | None = None,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60_000,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        security: SecuritySetting = None,
    ) -> None:
        self.config = ProducerConfig(
            acks=acks,
            batch_size=batch_size,
            linger_ms=linger_ms,
            compression_type=compression_type,
            retries=retries,
            delivery_timeout_ms=delivery_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=retry_backoff_max_ms,
            request_timeout_ms=request_timeout_ms,
            max_in_flight_requests_per_connection=max_in_flight_requests_per_connection,
            buffer_memory=buffer_memory,
            max_block_ms=max_block_ms,
            max_request_size=max_request_size,
            metadata_max_age_ms=metadata_max_age_ms,
            enable_idempotence=enable_idempotence,
            transactional_id=transactional_id,
            transaction_timeout_ms=transaction_timeout_ms,
        )
        self._clock = clock
        self._max_block_s = max_block_ms / 1000
        self._max_record_bytes = min(max_request_size, buffer_memory)
        self._cluster = Cluster(
            bootstrap_servers,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=retry_backoff_max_ms,
            metadata_max_age_ms=metadata_max_age_ms,
            clock=clock,
            security=security,
        )
        self._accumulator = RecordAccumulator(
            batch_size=batch_size,
            linger_ms=linger_ms,
            buffer_memory=buffer_memory,
            clock=clock,
            max_in_flight_per_partition=(
                min(MAX_IN_FLIGHT_IDEMPOTENT, max_in_flight_requests_per_connection)
                if self.config.idempotent
                else 1
            ),
        )
        self._sticky = StickyPartitioner(rng or random.Random())
        # each topic's TopicPartitions, made once: send would otherwise build one per record
        self._topic_partitions: dict[str, tuple[TopicPartition, ...]] = {}
        self._closing = threading.Event()  # bounds the transactional calls' backoff waits
        self._transactions: TransactionManager | None = None
        self._txn_requests: TransactionalRequests | None = None
        if transactional_id is not None:
            self._transactions = TransactionManager(transactional_id, transaction_timeout_ms)
            self._txn_requests = TransactionalRequests(
                self._cluster, self._transactions, self._closing, clock
            )
        self._sender = Sender(
            self._cluster,
            self._accumulator,
            self.config,
            clock,
            None
            if self._transactions is None or self._txn_requests is None
            else (self._transactions, self._txn_requests),
        )
        self._closed = False
        self._sender.thread.start()

    # -- sending ---------------------------------------------------------------------------
    def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Iterable[tuple[str, bytes | None]] | None = None,
        callback: Callback | None = None,
    ) -> RecordFuture:
        """Queue one record; the future completes when the broker acknowledged it (per
        ``acks``) or delivery failed. ``callback(metadata, exception)`` runs on completion
        (on the sender thread: keep it short). Blocks at most ``max.block.ms`` for metadata
        and buffer space."""
        if self._closed:
            raise ProducerClosedError("send() after close()")
        if not isinstance(topic, str) or not topic:
            raise ValueError("topic must be a non-empty str")
        transactions = self._transactions
        if transactions is not None:
            transactions.check_can_send()
        # the checks inline for the common case (bytes or None, no headers): once per record
        if key is not None and key.__class__ is not bytes:
            key = _as_bytes("key", key)
        if value is not None and value.__class__ is not bytes:
            value = _as_bytes("value", value)
        record = (
            key,
            value,
            int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms),
            () if headers is None else _as_headers(headers),
        )
        try:
            future = self._append(topic, partition, record)
        except KafkaError as error:
            if transactions is not None:  # the transaction cannot commit without it
                transactions.fail(error, "abortable")
            future = RecordFuture.failed(
                TopicPartition(topic, -1 if partition is None else partition), error
            )
        else:
            if transactions is not None:
                transactions.maybe_add_partition(future.batch.tp)
        if callback is not None:
            future.add_done_callback(_adapt(callback))
        return future

    def _append(
        self,
        topic: str,
        partition: int | None,
        record: tuple[bytes | None, bytes | None, int, Headers],
    ) -> RecordFuture:
        key, value, _, headers = record
        size = estimate_record_bytes(key, value, headers)
        if size + HEADER_SIZE > self._max_record_bytes:
            raise KafkaError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"a record of ~{size + HEADER_SIZE} bytes exceeds "
                f"max.request.size={self.config.max_request_size} "
                f"or buffer.memory={self.config.buffer_memory}",
            )
        count = self._cluster.snapshot().partition_count(topic)
        max_block_s = self._max_block_s
        # a metadata wait (or a refresh for a partition past the cached count) takes from
        # max.block.ms; a partition the cache knows needs neither
        if count is None or (partition is not None and not 0 <= partition < count):
            started = self._clock()
            count = self._partition_count(topic, partition, started + max_block_s)
            max_block_s = max(0.0, started + max_block_s - self._clock())
        chosen = partition
        if chosen is None and key is not None:
            chosen = partition_for_key(key, count)
        sticky = chosen is None
        if chosen is None:
            chosen = self._sticky.current(topic, count)
        if chosen is None:
            available = self._cluster.snapshot().available_partitions(topic)
            chosen = self._sticky.partition(topic, available, count)
        known = self._topic_partitions.get(topic)
        if known is None or chosen >= len(known):  # new, or the topic grew
            known = self._topic_partitions[topic] = tuple(
                TopicPartition(topic, p) for p in range(max(count, chosen + 1))
            )
        result = self._accumulator.append(
            known[chosen], record, abort_on_new_batch=sticky, max_block_s=max_block_s, size=size
        )
        if result.aborted:  # KIP-480: a new batch moves the sticky partition on
            # (an aborted append returns before any wait: the whole budget is left)
            available = self._cluster.snapshot().available_partitions(topic)
            chosen = self._sticky.on_new_batch(topic, chosen, available, count)
            result = self._accumulator.append(
                known[chosen], record, max_block_s=max_block_s, size=size
            )
        if result.batch_full or result.new_batch:
            self._sender.wakeup()
        assert result.future is not None, "an append that was not aborted gives a future"
        return result.future

    def _partition_count(self, topic: str, partition: int | None, deadline: float) -> int:
        count = self._cluster.snapshot().partition_count(topic)
        if count is None:
            try:
                info = self._cluster.wait_for_topic(topic, max(0.0, deadline - self._clock()))
            except KafkaError as error:
                if error.error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    raise ProducerTimeoutError(
                        f"topic {topic!r} not in metadata after max.block.ms: {error}"
                    ) from error
                raise
            count = len(info.partitions)
        if partition is not None and not 0 <= partition < count:
            self._cluster.refresh([topic])  # it may have grown since the cache was filled
            count = self._cluster.snapshot().partition_count(topic) or count
            if not 0 <= partition < count:
                raise KafkaError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"partition {partition} is not in topic {topic!r} of {count} partitions",
                )
        return count

    def partitions_for(self, topic: str) -> list[int]:
        """The topic's partition ids (waits at most ``max.block.ms`` for metadata)."""
        info = self._cluster.wait_for_topic(topic, self.config.max_block_ms / 1000)
        return [p.partition for p in info.partitions]

    # -- transactions ------------------------------------------------------------------------
    def _transactional(self) -> tuple[TransactionManager, TransactionalRequests]:
        if self._closed:
            raise ProducerClosedError("a transactional call after close()")
        if self._transactions is None or self._txn_requests is None:
            raise TransactionStateError("transactional calls need a transactional_id")
        return self._transactions, self._txn_requests

    def _deadline(self, timeout_s: float | None) -> float:
        return self._clock() + (self._max_block_s if timeout_s is None else max(0.0, timeout_s))

    def init_transactions(self, timeout_s: float | None = None) -> None:
        """Get the transactional id's producer id and a new epoch from its coordinator: this
        fences older producers with the same id and completes (aborts) their open transaction.
        Call once, before the first transaction. Waits at most ``timeout_s`` (default
        ``max.block.ms``); after a timeout it may be called again."""
        manager, requests = self._transactional()
        deadline = self._deadline(timeout_s)
        manager.begin_init()
        producer_id, producer_epoch = requests.init_producer_id(deadline)
        manager.initialized(producer_id, producer_epoch)
        self._sender.wakeup()

    def begin_transaction(self) -> None:
        """Open a transaction (locally: the coordinator learns of it with its first
        partition or offsets)."""
        manager, _ = self._transactional()
        manager.begin_transaction()

    def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata]
        | Mapping[tuple[str, int], int | OffsetAndMetadata],
        group_metadata: ConsumerGroupMetadata | str,
        timeout_s: float | None = None,
    ) -> None:
        """Commit a consumer group's ``offsets`` (the next records to read) as part of the
        transaction: they take effect only if it commits. ``group_metadata`` is
        ``consumer.group_metadata()`` (with it the coordinator refuses a fenced member's
        commit); a group id alone is not checked."""
        manager, requests = self._transactional()
        manager.check_in_transaction("send_offsets_to_transaction()")
        group = (
            ConsumerGroupMetadata(group_metadata)
            if isinstance(group_metadata, str)
            else group_metadata
        )
        resolved = {TopicPartition(*tp): value for tp, value in offsets.items()}
        if not resolved:
            return
        deadline = self._deadline(timeout_s)
        requests.add_offsets(group.group_id, deadline)
        manager.offsets_added()
        requests.txn_offset_commit(resolved, group, deadline)

    def commit_transaction(self, timeout_s: float | None = None) -> None:
        """Send every record of the transaction, then commit it: its records become visible
        to read_committed consumers and its offsets take effect. Raises the transaction's
        error when a record failed (then ``abort_transaction``). After a timeout it may be
        called again."""
        manager, requests = self._transactional()
        deadline = self._deadline(timeout_s)
        manager.begin_commit()
        self.flush(max(0.0, deadline - self._clock()))
        error = manager.last_error()
        if error is not None:
            raise error
        if manager.transaction_started():
            requests.end_txn(True, deadline)
        manager.completed()

    def prepare_transaction(self, timeout_s: float | None = None) -> PreparedTransaction:
        """The first phase of a two-phase commit (KIP-939): send every record of the
        transaction and wait for their acknowledgements, then leave the transaction open on the
        coordinator and return what ends it (:func:`complete_prepared_transaction`, from any
        process). Raises the transaction's error when a record failed (then
        ``abort_transaction``). Afterwards this producer starts no other transaction and
        ``close()`` leaves the prepared one as it is (Kafka's close aborts nothing either); a
        later ``init_transactions`` of the same transactional id aborts it, unless it was
        committed first."""
        manager, _ = self._transactional()
        manager.check_in_transaction("prepare_transaction()")
        deadline = self._deadline(timeout_s)
        self.flush(max(0.0, deadline - self._clock()))
        error = manager.last_error()
        if error is not None:
            raise error
        manager.prepared()
        producer_id, producer_epoch = manager.producer_id_and_epoch()
        return PreparedTransaction(manager.transactional_id, producer_id, producer_epoch)

    def abort_transaction(self, timeout_s: float | None = None) -> None:
        """Abort the transaction: records not yet sent fail with ``TransactionAbortedError``,
        those sent are marked aborted (read_committed consumers skip them), its offsets are
        dropped. Clears an abortable error; a fatal one raises."""
        manager, requests = self._transactional()
        deadline = self._deadline(timeout_s)
        manager.begin_abort()
        self.flush(max(0.0, deadline - self._clock()))  # the sender drops the queued batches
        if manager.transaction_started():
            requests.end_txn(False, deadline)
        if not manager.epoch_bump_required:
            manager.completed()
            return
        manager.begin_epoch_bump()
        producer_id, producer_epoch = requests.init_producer_id(deadline, bump=True)
        manager.initialized(producer_id, producer_epoch)

    # -- flush and close ---------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued now and wait for it to complete (successfully or not).
        Raises ProducerTimeoutError when ``timeout`` (seconds) passes first."""
        batches = self._accumulator.begin_flush()
        try:
            self._sender.wakeup()
            deadline = None if timeout is None else time.monotonic() + timeout  # Event.wait's clock
            for batch in batches:
                left_s = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not batch.result.wait(left_s):
                    pending = sum(not b.result.done() for b in batches)
                    raise ProducerTimeoutError(f"flush: {pending} batches still in flight")
        finally:
            self._accumulator.end_flush()

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is queued (within ``timeout`` seconds, None = until every record is
        settled, itself bounded by ``delivery.timeout.ms``), then stop. Records still
        pending after ``timeout`` fail. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        self._accumulator.close()
        self._sender.initiate_close()
        self._sender.thread.join(timeout)
        if self._sender.thread.is_alive():
            self._sender.force_close()
            self._sender.thread.join(CLOSE_FORCE_WAIT_S)
        self._cluster.close()


def _adapt(callback: Callback) -> Callable[[RecordFuture], None]:
    def on_done(future: RecordFuture) -> None:
        error = future.exception()
        callback(None if error is not None else future.result(), error)

    return on_done
