"""The producer's one sender thread (Kafka's ``Sender``): drains ready batches from the
accumulator, groups them by leader broker into one ProduceRequest per broker, keeps up to
``max.in.flight.requests.per.connection`` requests in flight per broker (asynchronous unary
calls, so requests pipeline), and settles each partition's batch from the response.

Per partition, the response decides:

* NONE: every record's future gets ``base_offset + index``.
* a retriable error (``ErrorCode.retriable``; a failed RPC that is UNAVAILABLE, CANCELLED,
  ABORTED or DEADLINE_EXCEEDED counts as NETWORK_EXCEPTION / REQUEST_TIMED_OUT): metadata is
  invalidated when the error says the leader moved, and the batch goes back to the front of its
  partition's deque after ``retry.backoff.ms``, while ``retries`` and ``delivery.timeout.ms``
  allow. The partition stays muted while its batch is in flight, so order is kept.
* MESSAGE_TOO_LARGE or RECORD_LIST_TOO_LARGE for a batch of more than one record (KIP-126):
  the batch is split in two (:meth:`RecordAccumulator.split`) and the halves take its place at
  the front of its deque, sent one at a time like retries (a half refused again is split again).
  With idempotence the halves keep the batch's producer id and epoch and share out its sequence
  range in order (Kafka's ``ProducerBatch.split``): the broker stored none of it, so later
  batches' sequences stay right. One record too large fails.
* anything else (INVALID_RECORD, CORRUPT_MESSAGE, ...): the futures fail
  with ``KafkaError``. CORRUPT_MESSAGE is retriable in Kafka (bits flipped on the way); here the
  batch bytes are built once and gRPC checks its transport, so resending the same bytes cannot
  help and it fails at once.
* UNKNOWN_TOPIC_OR_PARTITION is retried after a metadata refresh, unless the refreshed
  metadata says the topic does not exist: then its queued batches fail.

Idempotence: a batch's payload (its producer id, epoch and sequences) is built once and every
retry resends those bytes. The broker recognises a retry only among a producer's last five
batches of the partition, so a partition never has more than five batches outstanding counted
from its oldest unsettled one (:meth:`Sender._window_full`): with answers that arrive in any
order, a request whose answer was lost would otherwise time out while later batches are
acknowledged and new ones sent, and its retry would fall out of the broker's window
(OUT_OF_ORDER_SEQUENCE_NUMBER for a batch that is stored). Kafka gets this from its
connection, which answers in order, so one lost answer holds every later one.

Transactions: with a :class:`TransactionManager` the producer id and epoch come from it
(``init_transactions``), batches carry the transactional attribute and the request its
``transactional_id``, and a partition's batches go only once the coordinator has the
partition: each round first sends one AddPartitionsToTxn for every partition new to the
transaction (Kafka's batching). While the transaction is in an error state its queued batches
fail with the transaction's error; while it aborts, with :class:`TransactionAbortedError`.
A failed batch makes the transaction abortable (or fatal: PRODUCER_FENCED).

Concurrent requests may also reach the broker reordered. The broker holds a batch that overtook
an earlier one of its producer until that one is appended (``dataplane.broker.partition``); only
when it does not come within a second is the batch refused, and then it is resent alone.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from dataplane.client._accumulator import (
    ProducerBatch,
    ProducerTimeoutError,
    RecordAccumulator,
)
from dataplane.client._cluster import BrokerInfo, Cluster, rpc_error
from dataplane.client._config import ProducerConfig
from dataplane.client._transactions import TransactionManager
from dataplane.client._txn_requests import TransactionalRequests
from dataplane.client._types import TopicPartition
from protos import broker_pb2 as pb
from protos import wire
from raftlog.batch import BATCHES_KEPT, next_sequence, read_header
from raftlog.errors import ErrorCode, KafkaError
from raftlog.records import encode_batch

log = logging.getLogger(__name__)
LEADER_ERRORS = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.REPLICA_NOT_AVAILABLE,
    }
)
NEVER_RETRIED = frozenset({ErrorCode.CORRUPT_MESSAGE})
SPLIT_ERRORS = frozenset({ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE})
MAX_IDLE_S = 0.5  # the longest the loop sleeps without a reason to wake: expiry checks


@dataclass(eq=False)
class InFlightRequest:
    node_id: int
    batches: dict[TopicPartition, ProducerBatch]
    call: grpc.Future | None = None
    settled: bool = False


@dataclass
class _Wakeup:
    condition: threading.Condition = field(default_factory=threading.Condition)
    woken: bool = False
    completions: deque[InFlightRequest] = field(default_factory=deque)


class Sender:
    def __init__(
        self,
        cluster: Cluster,
        accumulator: RecordAccumulator,
        config: ProducerConfig,
        clock: Callable[[], float],
        transactions: tuple[TransactionManager, TransactionalRequests] | None = None,
    ) -> None:
        self._cluster = cluster
        self._txn: TransactionManager | None = None
        self._txn_requests: TransactionalRequests | None = None
        if transactions is not None:
            self._txn, self._txn_requests = transactions
        self._txn_retry_at = 0.0  # when a retriable AddPartitionsToTxn may go again
        self._accumulator = accumulator
        self._config = config
        self._clock = clock
        self._acks = config.acks_code
        self._rpc_timeout_s = config.request_timeout_ms / 1000
        self._retry_backoff_s = config.retry_backoff_ms / 1000
        self._delivery_timeout_s = config.delivery_timeout_ms / 1000
        self._wake = _Wakeup()
        self._in_flight: dict[int, set[InFlightRequest]] = {}
        self._check_topics: set[str] = set()
        self._running = True
        self._forced = False
        # Idempotence: the producer id and epoch from InitProducerId, and per partition the
        # sequence of the next batch. A batch's sequence is fixed when it is first sent (its
        # payload is kept) and every retry resends it.
        self._producer_id = -1
        self._producer_epoch = -1
        self._producer_id_refused = False  # the last InitProducerId failed for good
        self._sequences: dict[TopicPartition, int] = {}
        # per partition, the batches with sequences from the oldest one not yet settled, in
        # sequence order (settled ones behind it stay until it settles): at most BATCHES_KEPT
        self._windows: dict[TopicPartition, deque[ProducerBatch]] = {}
        self._settled: set[ProducerBatch] = set()  # settled batches still inside a window
        self._window_batches = min(BATCHES_KEPT, accumulator.max_in_flight_per_partition)
        self.thread = threading.Thread(target=self.run, name="raftlog-producer-sender", daemon=True)

    # -- control (application threads) -----------------------------------------------------
    def wakeup(self) -> None:
        if self._wake.woken:
            # Already woken: the sender has not yet taken this wakeup (its _wait clears the
            # flag without sleeping, then it drains again). Skips the lock on the send path:
            # while batches queue behind the in-flight ones, every append asks for a wakeup.
            return
        with self._wake.condition:
            self._wake.woken = True
            self._wake.condition.notify()

    def initiate_close(self) -> None:
        """Stop after every accepted record is settled."""
        self._running = False
        self.wakeup()

    def force_close(self) -> None:
        """Stop now: fail what is queued and in flight."""
        self._running = False
        self._forced = True
        self.wakeup()

    # -- the loop --------------------------------------------------------------------------
    def run(self) -> None:
        while self._running:
            self.run_once()
        while not self._forced and (self._accumulator.has_incomplete() or self._requests()):
            self.run_once()
        if self._forced:
            self._abort_all()

    def _requests(self) -> int:
        return sum(len(requests) for requests in self._in_flight.values())

    def run_once(self) -> None:
        self._settle_completions()
        for batch in self._accumulator.expire(self._delivery_timeout_s):
            self._fail(
                batch, ProducerTimeoutError("expired before it was sent: delivery.timeout.ms")
            )
        if self._cluster.maybe_refresh() is None and self._check_topics:
            self._fail_missing_topics()
        if self._txn is not None:
            self._transaction_round()
        elif self._needs_producer_id() and not self._init_producer_id():
            self._wait(self._clock() + self._cluster.backoff_s())
            return
        ready = self._accumulator.ready()
        snapshot = self._cluster.snapshot()
        by_leader: dict[int, list[TopicPartition]] = {}
        leaders: dict[int, BrokerInfo] = {}
        for tp in ready.partitions:
            if self._window_full(tp) or (self._txn is not None and not self._txn.is_sendable(tp)):
                continue
            leader = snapshot.leader(tp.topic, tp.partition)
            if leader is None:
                self._cluster.invalidate()
                continue
            leaders[leader.node_id] = leader
            by_leader.setdefault(leader.node_id, []).append(tp)
        sent = False
        for node_id, partitions in by_leader.items():
            if (
                len(self._in_flight.get(node_id, ()))
                < self._config.max_in_flight_requests_per_connection
            ):
                batches = self._accumulator.drain(partitions, self._config.max_request_size)
                if batches:
                    self._send(leaders[node_id], batches)
                    sent = True
        if not sent:
            # Nothing more may go now (in-flight limits, windows) or nothing is ready: sleep
            # until a completion, an append or the next linger expiry. After a send, go round
            # at once: the next batches of the same partitions may already be ready, and
            # waiting for the answer would allow one request in flight at a time.
            next_ready_s = ready.next_ready_s
            if self._txn is not None and self._txn_retry_at > self._clock():
                # partitions wait for an AddPartitionsToTxn retry
                next_ready_s = min(next_ready_s or self._txn_retry_at, self._txn_retry_at)
            self._wait(next_ready_s)

    def _wait(self, next_ready_s: float | None) -> None:
        if not self._running and not self._requests() and not self._accumulator.has_incomplete():
            return  # closing and nothing is left: the loop ends now
        timeout = MAX_IDLE_S
        if next_ready_s is not None:
            timeout = min(timeout, max(0.0, next_ready_s - self._clock()))
        if self._cluster.needs_refresh():
            timeout = min(timeout, self._cluster.backoff_s())
        with self._wake.condition:
            if not self._wake.woken and not self._wake.completions:
                self._wake.condition.wait(timeout)
            self._wake.woken = False

    # -- idempotence -----------------------------------------------------------------------
    def _needs_producer_id(self) -> bool:
        """Idempotent without a producer id; after a refusal only once records wait again
        (not every backoff while idle: each refusal is a denied request in the audit log)."""
        if not self._config.idempotent or self._producer_id >= 0:
            return False
        return not self._producer_id_refused or bool(self._accumulator.queued_topics())

    def _init_producer_id(self) -> bool:
        """Ask any broker for a producer id; False (retry later) when none answered.

        A refusal that retrying cannot cure (CLUSTER_AUTHORIZATION_FAILED: neither
        IDEMPOTENT_WRITE on the cluster nor WRITE on any topic; SASL_AUTHENTICATION_FAILED)
        fails the queued batches with it rather than holding them until delivery.timeout.ms.
        As Kafka's producer takes it (an abortable error, not a fatal one), the next batches
        ask again: an ACL granted meanwhile lets them through."""
        try:
            address = self._cluster.any_broker()
            response = self._cluster.stub(address).InitProducerId(
                pb.InitProducerIdRequest(), timeout=min(self._rpc_timeout_s, 10.0)
            )
        except grpc.RpcError as error:
            self._cluster.invalidate()
            log.debug("InitProducerId failed: %s", rpc_error(error, "InitProducerId"))
            return False
        except KafkaError as error:
            log.debug("InitProducerId: %s", error)
            self._fail_queued_unless_retriable(error)
            return False
        if response.error_code:
            refused = KafkaError(ErrorCode.from_code(response.error_code), response.error_message)
            log.debug("InitProducerId: %s", refused)
            self._fail_queued_unless_retriable(refused)
            return False
        self._producer_id, self._producer_epoch = response.producer_id, response.producer_epoch
        self._producer_id_refused = False
        self._sequences.clear()
        self._windows.clear()
        self._settled.clear()
        return True

    def _fail_queued_unless_retriable(self, error: KafkaError) -> None:
        if error.retriable:
            return
        self._producer_id_refused = True
        for batch in self._accumulator.remove_queued(lambda _: True):
            self._fail(batch, error)

    # -- transactions ------------------------------------------------------------------------
    def _transaction_round(self) -> None:
        """Before a round's sends: take the transaction's producer id and epoch, fail queued
        batches the transaction no longer allows, add new partitions to it."""
        txn, requests = self._txn, self._txn_requests
        assert txn is not None and requests is not None, "only a transactional producer"
        producer_id, producer_epoch = txn.producer_id_and_epoch()
        if (producer_id, producer_epoch) != (self._producer_id, self._producer_epoch):
            # a new epoch (init_transactions, a bump after an abort) starts every sequence at 0
            self._producer_id, self._producer_epoch = producer_id, producer_epoch
            self._sequences.clear()
            self._windows.clear()
            self._settled.clear()
        error = txn.queued_batch_error()
        if error is not None:
            for batch in self._accumulator.remove_queued(lambda _: True):
                self._fail(batch, error)
            return
        if self._clock() < self._txn_retry_at:
            return
        partitions = txn.take_pending()
        if not partitions:
            return
        try:
            requests.add_partitions(partitions, self._clock() + self._rpc_timeout_s)
        except ProducerTimeoutError as error:
            log.debug("AddPartitionsToTxn %s: %s", partitions, error)
            txn.add_partitions_retry(partitions)
            self._txn_retry_at = self._clock() + self._retry_backoff_s
            return
        except KafkaError as error:  # the manager is in its error state: queued batches fail
            log.debug("AddPartitionsToTxn %s: %s", partitions, error)
            return
        txn.partitions_added(partitions)

    def _window_full(self, tp: TopicPartition) -> bool:
        """True while ``tp`` must not send a new batch: five batches are outstanding from its
        oldest unsettled one and that one is in flight. (Not in flight, it waits at the front of
        its deque for a retry, which may go: it is inside the window.)"""
        window = self._windows.get(tp)
        return window is not None and len(window) >= self._window_batches and window[0].in_flight

    def _settle_in_window(self, batch: ProducerBatch) -> None:
        """A batch succeeded or failed: the window moves past the settled batches at its start."""
        window = self._windows.get(batch.tp)
        if window is None or batch.producer_id != self._producer_id:
            return
        self._settled.add(batch)
        while window and window[0] in self._settled:
            self._settled.discard(window.popleft())

    def _encode(self, batch: ProducerBatch) -> bytes:
        if not self._config.idempotent:
            return encode_batch(batch.records, compression=self._config.compression)
        sequence = self._sequences.get(batch.tp, 0)
        payload = encode_batch(
            batch.records,
            compression=self._config.compression,
            producer_id=self._producer_id,
            producer_epoch=self._producer_epoch,
            base_sequence=sequence,
            is_transactional=self._txn is not None,
        )
        self._sequences[batch.tp] = next_sequence(sequence, len(batch.records))
        batch.producer_id = self._producer_id
        self._windows.setdefault(batch.tp, deque()).append(batch)
        return payload

    # -- sending ---------------------------------------------------------------------------
    def _send(self, leader: BrokerInfo, batches: list[ProducerBatch]) -> None:
        by_topic: dict[str, list[tuple[int, bytes]]] = {}  # partition, records
        request_batches: dict[TopicPartition, ProducerBatch] = {}
        for batch in batches:
            if batch.payload is None:
                try:
                    batch.payload = self._encode(batch)
                except KafkaError as error:  # a record the codec refuses: fail this batch only
                    self._fail(batch, error)
                    continue
            request_batches[batch.tp] = batch
            by_topic.setdefault(batch.tp.topic, []).append((batch.tp.partition, batch.payload))
        if not request_batches:
            return
        # the records go beside the request (protos.wire): one copy of them, not four
        request = pb.ProduceRequest(
            acks=self._acks,
            timeout_ms=self._config.request_timeout_ms,
            transactional_id=self._config.transactional_id or "",
            topics=[
                pb.ProduceTopic(
                    name=topic,
                    partitions=[pb.ProducePartition(partition=p) for p, _ in partitions],
                )
                for topic, partitions in by_topic.items()
            ],
        )
        records = [data for partitions in by_topic.values() for _, data in partitions]
        entry = InFlightRequest(leader.node_id, request_batches)
        try:
            entry.call = self._cluster.produce_method(leader).future(
                wire.encode(request, records), timeout=self._rpc_timeout_s
            )
        except KafkaError as error:  # the client is closed under us
            for batch in request_batches.values():
                self._fail(batch, error)
            return
        self._in_flight.setdefault(leader.node_id, set()).add(entry)
        if self._acks == 0:  # no answer is awaited: the records are done once sent
            for batch in request_batches.values():
                self._succeed(batch, base_offset=-1, log_append_time_ms=-1, with_offsets=False)
        entry.call.add_done_callback(lambda _: self._on_done(entry))

    def _on_done(self, entry: InFlightRequest) -> None:
        """gRPC's callback thread: hand the finished call to the sender thread."""
        with self._wake.condition:
            self._wake.completions.append(entry)
            self._wake.condition.notify()

    # -- settling --------------------------------------------------------------------------
    def _settle_completions(self) -> None:
        with self._wake.condition:
            done = list(self._wake.completions)
            self._wake.completions.clear()
        for entry in done:
            if entry.settled:
                continue
            entry.settled = True
            self._in_flight.get(entry.node_id, set()).discard(entry)
            if self._acks != 0:
                self._settle(entry)

    def _settle(self, entry: InFlightRequest) -> None:
        assert entry.call is not None, "a completed request was sent"
        try:
            response: pb.ProduceResponse = entry.call.result()
        except grpc.RpcError as error:
            failure = rpc_error(error, f"Produce to broker {entry.node_id}")
            for batch in entry.batches.values():
                self._retry_or_fail(batch, failure)
            return
        except grpc.FutureCancelledError:
            failure = KafkaError(ErrorCode.NETWORK_EXCEPTION, "the request was cancelled")
            for batch in entry.batches.values():
                self._retry_or_fail(batch, failure)
            return
        answers = {
            TopicPartition(topic.name, p.partition): p
            for topic in response.topics
            for p in topic.partitions
        }
        for tp, batch in entry.batches.items():
            answer = answers.get(tp)
            if answer is None:
                self._fail(batch, KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, f"no answer for {tp}"))
            elif answer.error_code == ErrorCode.NONE.code:
                self._succeed(batch, answer.base_offset, answer.log_append_time_ms)
            else:
                code = ErrorCode.from_code(answer.error_code)
                self._retry_or_fail(batch, KafkaError(code, answer.error_message or str(tp)))

    def _retry_or_fail(self, batch: ProducerBatch, error: KafkaError) -> None:
        if error.error in SPLIT_ERRORS and len(batch.records) > 1 and not self._forced:
            self._split(batch, error)
            return
        expired = (
            batch.created_s + self._delivery_timeout_s <= self._clock() + self._retry_backoff_s
        )
        retriable = error.retriable and error.error not in NEVER_RETRIED
        if error.error is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER:
            # Sent while an earlier batch was in flight, it may have overtaken one that was
            # lost (the broker waits a while for it): send it again, alone, after the earlier
            # ones. Sent alone, the gap is real.
            retriable = batch.sent_behind
        if not retriable or batch.attempts > self._config.retries or expired or self._forced:
            if retriable and expired:
                error = ProducerTimeoutError(f"delivery.timeout.ms passed; last error {error}")
            self._fail(batch, error)
            return
        if error.error in LEADER_ERRORS:
            self._cluster.invalidate()
        if error.error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            self._check_topics.add(batch.tp.topic)
        self._accumulator.reenqueue(batch, self._retry_backoff_s)

    def _split(self, batch: ProducerBatch, error: KafkaError) -> None:
        """KIP-126: resend the records of a batch refused as too large in smaller parts."""
        parts = self._accumulator.split(batch)
        log.warning(
            "%s: a batch of %d records was refused (%s): resending it in %d parts",
            batch.tp, len(batch.records), error, len(parts),
        )  # fmt: skip
        if batch.producer_id >= 0 and batch.payload is not None:
            # The parts go with the batch's producer id, epoch and sequences, in order: the
            # broker stored none of its range, and later batches' sequences follow it.
            header = read_header(batch.payload)
            sequence = header.base_sequence
            for part in parts:
                part.payload = encode_batch(
                    part.records,
                    compression=self._config.compression,
                    producer_id=header.producer_id,
                    producer_epoch=header.producer_epoch,
                    base_sequence=sequence,
                    is_transactional=header.is_transactional,
                )
                part.producer_id = batch.producer_id
                sequence = next_sequence(sequence, len(part.records))
            window = self._windows.get(batch.tp)
            if window is not None and batch in window:
                replaced = [p for b in window for p in (parts if b is batch else (b,))]
                window.clear()
                window.extend(replaced)
        self._accumulator.reenqueue_split(batch, parts)

    def _fail_missing_topics(self) -> None:
        """After a refresh: batches of topics the metadata says do not exist fail."""
        snapshot = self._cluster.snapshot()
        missing = {
            topic
            for topic in self._check_topics
            if (info := snapshot.topics.get(topic)) is not None
            and info.error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        }
        self._check_topics.clear()
        error = KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "the topic does not exist")
        for batch in self._accumulator.remove_queued(lambda tp: tp.topic in missing):
            self._fail(batch, error)

    def _succeed(
        self,
        batch: ProducerBatch,
        base_offset: int,
        log_append_time_ms: int,
        with_offsets: bool = True,
    ) -> None:
        self._accumulator.complete(batch)
        self._settle_in_window(batch)
        batch.result.succeed(base_offset if with_offsets else -1, log_append_time_ms)

    def _fail(self, batch: ProducerBatch, error: KafkaError) -> None:
        self._accumulator.complete(batch)
        self._settle_in_window(batch)
        if self._txn is not None:
            # the transaction cannot commit now; a batch with sequences needs a new epoch,
            # bumped when the transaction is aborted (not a new producer id, which would
            # lose the transactional id's)
            self._txn.batch_failed(error, sequences_spent=batch.producer_id >= 0)
        elif batch.producer_id >= 0 and batch.producer_id == self._producer_id:
            # The batch's sequences are spent, stored or not: later batches would leave a gap.
            # A new producer id starts every partition's sequence afresh (KIP-360's remedy).
            self._producer_id = -1
            self._accumulator.forget_unsent_payloads()
        batch.result.fail(error)

    def _abort_all(self) -> None:
        error = KafkaError(ErrorCode.NETWORK_EXCEPTION, "the producer was closed before delivery")
        for requests in self._in_flight.values():
            for entry in requests:
                entry.settled = True
                if entry.call is not None:
                    entry.call.cancel()
                if self._acks != 0:
                    for batch in entry.batches.values():
                        self._fail(batch, error)
        self._in_flight.clear()
        for batch in self._accumulator.remove_queued(lambda _: True):
            self._fail(batch, error)
