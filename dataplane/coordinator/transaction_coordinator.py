"""The transaction coordinator of a broker: the transactional ids of the ``__transaction_state``
partitions it leads, served over TransactionCoordinatorService and InitProducerId.

Transactional id ``t`` lives in partition ``partition_for(t, N)`` of the compacted internal topic
``__transaction_state`` (N = ``transaction.state.log.num.partitions``, created on the first
FindCoordinator with key type 1, replication ``transaction.state.log.replication.factor``,
``min.insync.replicas`` = ``transaction.state.log.min.isr``); its coordinator is that
partition's leader. Loading, writing and answering once replicated are the shared machinery of
:mod:`dataplane.coordinator.runtime`, exactly as for groups: each partition this broker leads is
replayed into a :class:`~dataplane.coordinator.transaction_state.TransactionShard`.

**Markers.** EndTxn answers once its PrepareCommit / PrepareAbort is replicated, as Kafka does;
the client's next InitProducerId or AddPartitionsToTxn gets CONCURRENT_TRANSACTIONS until the
markers are written. A marker thread makes a task of every prepared transaction of the loaded
shards (looking after an EndTxn, a fencing abort or a timer, and every
``MARKER_SCAN_INTERVAL_S`` to catch loads) and hands each task's rounds to a bounded pool: a
round writes the markers still missing
(:class:`~dataplane.coordinator.transaction_markers.MarkerWriter`); the next one is due after a
growing backoff, so a partition without a leader holds no worker; once none is missing the
transaction is recorded complete (PrepareX -> CompleteX) through the runtime. A new coordinator
finds the prepared transactions of the partition it loaded and finishes them: writing a marker
twice is harmless.

**Timers.** Every ``transaction.abort.timed.out.transaction.cleanup.interval.ms`` ongoing
transactions older than their ``transaction.timeout.ms`` are fenced (epoch + 1) and aborted;
every ``transaction.remove.expired.transaction.cleanup.interval.ms`` ids idle longer than
``transactional.id.expiration.ms`` are removed (a tombstone).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from dataplane.broker import authorization as authz
from dataplane.broker.replica_manager import ReplicaManager
from dataplane.coordinator.runtime import CoordinatorRuntime, InternalTopic, Shard
from dataplane.coordinator.transaction_markers import (
    MARKER_BACKOFF_MAX_S,
    MARKER_BACKOFF_MIN_S,
    TRANSACTION_STATE_TOPIC,
    Channels,
    LocalMarkers,
    MarkerWriter,
    SendMarkers,
)
from dataplane.coordinator.transaction_state import (
    OFFSETS_TOPIC,
    MarkerJob,
    TopicPartition,
    TransactionShard,
    TxnLimits,
    TxnMetadata,
    TxnState,
)
from metadata_quorum.security.acl import AclOperation
from metadata_quorum.security.authorization import ALLOW_ALL, AccessControl
from protos import broker_pb2 as pb
from protos import transaction_pb2 as tpb
from protos import transaction_pb2_grpc as tpb_grpc
from raftlog.coordinator_key import partition_for
from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)
T = TypeVar("T")
TIMER_TICK_S = 0.1
MARKER_SCAN_INTERVAL_S = 1.0
MARKER_WORKERS = 8
MARKER_TASKS_MAX = 10_000  # beyond this, prepared transactions wait for a later scan
STATE_NAMES = frozenset(s.kafka_name for s in TxnState)


@dataclass(frozen=True)
class TransactionConfig:
    """The coordinator's settings (Kafka's names in the comments)."""

    state_log_num_partitions: int = 50  # transaction.state.log.num.partitions
    state_log_replication_factor: int = 3  # transaction.state.log.replication.factor
    state_log_min_isr: int = 2  # transaction.state.log.min.isr
    state_log_segment_bytes: int = 100 * 1024 * 1024  # transaction.state.log.segment.bytes
    max_timeout_ms: int = 900_000  # transaction.max.timeout.ms
    id_expiration_ms: int = 7 * 24 * 3600 * 1000  # transactional.id.expiration.ms
    # transaction.abort.timed.out.transaction.cleanup.interval.ms
    abort_timed_out_interval_ms: int = 10_000
    # transaction.remove.expired.transaction.cleanup.interval.ms
    remove_expired_interval_ms: int = 3_600_000
    # Kafka's TransactionConfig.requestTimeoutMs: how long a write waits for its replication
    request_timeout_ms: int = 30_000


@dataclass
class _MarkerTask:
    """A prepared transaction whose markers this broker is writing, round by round."""

    shard: Shard[TransactionShard]
    job: MarkerJob
    pending: set[TopicPartition]  # the partitions still without their marker
    due_s: float = 0.0  # time.monotonic() of its next round
    backoff_s: float = MARKER_BACKOFF_MIN_S
    running: bool = False  # a worker has it (only that worker touches pending)
    finished: bool = False  # no more rounds: completed, refused, or no longer this broker's


@dataclass(frozen=True)
class ListedTransactions:
    transactions: list[TxnMetadata]
    unknown_state_filters: list[str]


class TransactionCoordinator:
    def __init__(
        self,
        broker_id: int,
        config: TransactionConfig,
        replicas: ReplicaManager,
        create_topic: Callable[[str, int, int, Mapping[str, str]], None],
        allocate_producer_id: Callable[[], int],
        clock_ms: Callable[[], int],
        local_markers: LocalMarkers,
        offsets_partitions: int = 50,
        send_markers: SendMarkers | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.config = config
        self.replicas = replicas
        self.allocate_producer_id = allocate_producer_id
        self.clock_ms = clock_ms
        self.offsets_partitions = offsets_partitions  # offsets.topic.num.partitions
        state_topic = InternalTopic(
            TRANSACTION_STATE_TOPIC,
            config.state_log_num_partitions,
            config.state_log_replication_factor,
            {
                "cleanup.policy": "compact",
                "segment.bytes": str(config.state_log_segment_bytes),
                "min.insync.replicas": str(config.state_log_min_isr),
            },
            config_prefix="transaction.state.log",
        )
        self.runtime: CoordinatorRuntime[TransactionShard] = CoordinatorRuntime(
            broker_id, state_topic, replicas, self._new_state, create_topic, clock_ms,
            config.request_timeout_ms,
        )  # fmt: skip
        self._stop = threading.Event()
        self.channels = Channels()
        self.markers = MarkerWriter(
            broker_id, lambda: self.replicas.image, local_markers, self.channels, send_markers
        )
        self._scan_due = threading.Event()  # a transaction may have been prepared
        self._wake = threading.Event()  # the marker loop: scan, or a round may be due
        self._tasks_lock = threading.Lock()
        self._tasks: dict[tuple[Shard[TransactionShard], MarkerJob], _MarkerTask] = {}
        self._pool = ThreadPoolExecutor(MARKER_WORKERS, thread_name_prefix="txn-markers")
        self._threads = [
            threading.Thread(target=self._marker_loop, name="txn-marker-scan", daemon=True),
            threading.Thread(target=self._timer_loop, name="txn-timers", daemon=True),
        ]

    def start(self) -> None:
        self.runtime.start()
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=5)
        self.channels.close()  # first: a round waiting on another broker ends at once
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.runtime.close()

    def _new_state(self) -> TransactionShard:
        limits = TxnLimits(self.config.max_timeout_ms, self.config.id_expiration_ms)
        return TransactionShard(self.allocate_producer_id, limits, self.offsets_partitions)

    # -- leadership --------------------------------------------------------------------------------
    def on_image(self) -> None:
        """After the replica manager applied an image: load the ``__transaction_state``
        partitions this broker now leads, drop the ones it no longer leads."""
        self.runtime.on_image()
        self._markers_due()

    # -- finding the coordinator -------------------------------------------------------------------
    def find_coordinator(self, transactional_id: str) -> tuple[int, str, int]:
        _check_id(transactional_id)
        return self.runtime.coordinator(lambda count: partition_for(transactional_id, count))

    def _shard(self, transactional_id: str) -> Shard[TransactionShard]:
        _check_id(transactional_id)
        return self.runtime.shard(
            lambda count: partition_for(transactional_id, count),
            f"transactional id {transactional_id!r}",
        )

    def _run(self, shard: Shard[TransactionShard], action: Callable[[TransactionShard], T]) -> T:
        """Through the runtime; the marker thread looks for new prepared transactions after."""
        try:
            return self.runtime.run(shard, action)
        finally:
            self._markers_due()

    def _markers_due(self) -> None:
        """A transaction may have been prepared (or a shard loaded): the marker loop looks."""
        self._scan_due.set()
        self._wake.set()

    # -- requests ----------------------------------------------------------------------------------
    def init_producer_id(
        self, transactional_id: str, timeout_ms: int, expected: tuple[int, int] | None = None
    ) -> tuple[int, int]:
        """InitProducerId with a transactional id: (producer id, epoch)."""
        shard = self._shard(transactional_id)
        return self._run(
            shard,
            lambda s: s.init_producer_id(transactional_id, timeout_ms, self.clock_ms(), expected),
        )

    def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        """AddPartitionsToTxn: NONE for each partition added; if any does not exist, it gets
        UNKNOWN_TOPIC_OR_PARTITION and the others OPERATION_NOT_ATTEMPTED (nothing is added).
        A transaction-level error is raised."""
        wanted = sorted(set(partitions))
        image = self.replicas.image
        unknown = {
            tp for tp in wanted
            if (topic := image.topic(tp[0])) is None or tp[1] not in topic.partitions
        }  # fmt: skip
        if unknown:
            return {
                tp: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                if tp in unknown
                else ErrorCode.OPERATION_NOT_ATTEMPTED
                for tp in wanted
            }
        shard = self._shard(transactional_id)
        self._run(
            shard,
            lambda s: s.add_partitions(
                transactional_id, producer_id, epoch, wanted, self.clock_ms()
            ),
        )
        return {tp: ErrorCode.NONE for tp in wanted}

    def verify(
        self, transactional_id: str, producer_id: int, epoch: int, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, ErrorCode]:
        """KIP-890: whether the transaction is ongoing and holds each partition (read only)."""
        shard = self._shard(transactional_id)
        with shard.lock:
            if not shard.active:
                raise KafkaError(ErrorCode.NOT_COORDINATOR, f"{shard.partition.name} moved")
            state = shard.state
            return {tp: state.verify(transactional_id, producer_id, epoch, tp) for tp in partitions}

    def add_offsets(
        self, transactional_id: str, producer_id: int, epoch: int, group_id: str
    ) -> TopicPartition:
        """AddOffsetsToTxn: the group's ``__consumer_offsets`` partition joins the transaction."""
        shard = self._shard(transactional_id)
        offsets_topic = self.replicas.image.topic(OFFSETS_TOPIC)

        def add(state: TransactionShard) -> TopicPartition:
            if offsets_topic is not None and offsets_topic.partitions:  # the group's partition
                state.offsets_partitions = len(offsets_topic.partitions)
            return state.add_offsets(
                transactional_id, producer_id, epoch, group_id, self.clock_ms()
            )

        return self._run(shard, add)

    def end_transaction(
        self, transactional_id: str, producer_id: int, epoch: int, commit: bool
    ) -> None:
        """EndTxn: returns once PrepareCommit / PrepareAbort is replicated (markers follow)."""
        shard = self._shard(transactional_id)
        self._run(
            shard,
            lambda s: s.end_transaction(
                transactional_id, producer_id, epoch, commit, self.clock_ms()
            ),
        )

    def describe(self, transactional_id: str) -> TxnMetadata:
        shard = self._shard(transactional_id)
        return self._run(shard, lambda s: s.describe(transactional_id))

    def list_transactions(
        self, states: Iterable[str] = (), producer_ids: Iterable[int] = (), duration_ms: int = 0
    ) -> ListedTransactions:
        """ListTransactions over the shards this broker coordinates (a client asks every
        broker). COORDINATOR_LOAD_IN_PROGRESS while one of them loads, as Kafka."""
        if self.runtime.loading():
            raise KafkaError(
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, f"broker {self.broker_id} is loading"
            )
        wanted = list(states)
        known = [s for s in wanted if s in STATE_NAMES]
        unknown = sorted(set(wanted) - STATE_NAMES)
        found: list[TxnMetadata] = []
        if wanted and not known:
            return ListedTransactions(found, unknown)
        now_ms = self.clock_ms()
        pids = list(producer_ids)
        for shard in self.runtime.loaded_shards():
            with shard.lock:
                listed = list(shard.state.listing(known, pids))
            found += [
                m for m in listed
                if duration_ms <= 0 or (m.start_ms >= 0 and now_ms - m.start_ms > duration_ms)
            ]  # fmt: skip
        return ListedTransactions(sorted(found, key=lambda m: m.transactional_id), unknown)

    # -- markers -----------------------------------------------------------------------------------
    def _marker_loop(self) -> None:
        """Take up the prepared transactions (when told, and every ``MARKER_SCAN_INTERVAL_S``),
        and hand each task whose round is due to the pool."""
        next_scan_s = 0.0
        while not self._stop.is_set():
            now_s = time.monotonic()
            if now_s >= next_scan_s or self._scan_due.is_set():
                self._scan_due.clear()
                self._take_up_prepared()
                next_scan_s = now_s + MARKER_SCAN_INTERVAL_S
            next_round_s = self._start_due_rounds(now_s)
            self._wake.wait(max(0.0, min(next_scan_s, next_round_s) - time.monotonic()))
            self._wake.clear()

    def _take_up_prepared(self) -> None:
        """A task for every prepared transaction of the loaded shards; tasks whose transaction
        is no longer this broker's to finish are dropped."""
        current: set[tuple[Shard[TransactionShard], MarkerJob]] = set()
        for shard in self.runtime.loaded_shards():
            with shard.lock:
                if shard.active:
                    current.update((shard, job) for job in shard.state.pending_markers())
        with self._tasks_lock:
            for key, task in list(self._tasks.items()):
                if key not in current and not task.running:
                    del self._tasks[key]
            for key in sorted(current - self._tasks.keys(), key=lambda k: k[1].transactional_id):
                if len(self._tasks) >= MARKER_TASKS_MAX:
                    break
                self._tasks[key] = _MarkerTask(key[0], key[1], set(key[1].partitions))

    def _start_due_rounds(self, now_s: float) -> float:
        """Hand the due tasks to the pool; when the next one is due (monotonic seconds)."""
        with self._tasks_lock:
            waiting = [t for t in self._tasks.values() if not t.running and not t.finished]
            due = [t for t in waiting if t.due_s <= now_s]
            for task in due:
                task.running = True
            later = [t.due_s for t in waiting if t.due_s > now_s]
        for task in due:
            self._pool.submit(self._round, task)
        return min(later, default=now_s + MARKER_SCAN_INTERVAL_S)

    def _round(self, task: _MarkerTask) -> None:
        """One round of ``task``'s markers; once all are written, the transaction completes."""
        job = task.job
        try:
            if not self._wanted(task.shard, job):
                task.finished = True  # dropped at the next scan
            elif not self.markers.write_round(job, task.shard.leader_epoch, task.pending):
                task.finished = True  # kept, so it is not taken up again
            elif not task.pending:
                completed = self.runtime.run(task.shard, lambda s: s.complete(job, self.clock_ms()))
                task.finished = True
                if not completed:  # completed meanwhile, or re-initialised: not ours to finish
                    return
                log.info("transaction %s (producer %d, epoch %d) %s on %d partitions",
                         job.transactional_id, job.producer_id, job.producer_epoch,
                         "committed" if job.commit else "aborted",
                         len(job.partitions))  # fmt: skip
        except KafkaError as error:  # the completion was not written: the next round again
            log.info("transaction %s: completion not written: %s", job.transactional_id, error)
        except AssertionError:  # Kafka's IllegalStateException: stop this transaction's markers
            log.critical("transaction %s: markers stopped", job.transactional_id, exc_info=True)
            task.finished = True
        except Exception:  # a bug below: said loudly, and the round is tried again later
            log.exception("transaction %s: a round of markers failed", job.transactional_id)
        finally:
            with self._tasks_lock:
                task.due_s = time.monotonic() + task.backoff_s
                task.backoff_s = min(task.backoff_s * 2, MARKER_BACKOFF_MAX_S)
                task.running = False
            self._wake.set()

    @staticmethod
    def _wanted(shard: Shard[TransactionShard], job: MarkerJob) -> bool:
        """Whether ``job`` is still this shard's to finish (it leads, the job is pending)."""
        with shard.lock:
            if not shard.active:
                return False
            return job in shard.state.pending_markers()

    # -- timers ------------------------------------------------------------------------------------
    def _timer_loop(self) -> None:
        now_ms = self.clock_ms()
        next_abort = now_ms + self.config.abort_timed_out_interval_ms
        next_expire = now_ms + self.config.remove_expired_interval_ms
        while not self._stop.wait(TIMER_TICK_S):
            now_ms = self.clock_ms()
            if now_ms >= next_abort:
                next_abort = now_ms + self.config.abort_timed_out_interval_ms
                self._each_shard("aborted (timed out)", TransactionShard.abort_timed_out, now_ms)
            if now_ms >= next_expire:
                next_expire = now_ms + self.config.remove_expired_interval_ms
                self._each_shard("expired", TransactionShard.expire_ids, now_ms)

    def _each_shard(
        self, what: str, action: Callable[[TransactionShard, int], list[str]], now_ms: int
    ) -> None:
        for shard in self.runtime.loaded_shards():
            try:
                ids = self._run(shard, lambda state: action(state, now_ms))
            except KafkaError as error:
                log.info("%s: timer records not written: %s", shard.partition.name, error)
                continue
            if ids:
                log.info("%s: transactional ids %s: %s", shard.partition.name, what, ", ".join(ids))


def _check_id(transactional_id: str) -> None:
    if not transactional_id:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "the transactional id must not be empty")


# -- the gRPC service ------------------------------------------------------------------------------
def _set_error(message: Any, error: KafkaError) -> None:
    message.error_code = error.error.code
    message.error_message = error.message


def _partitions(topics: Iterable[tpb.TopicPartitions]) -> list[TopicPartition]:
    return [(t.topic, p) for t in topics for p in t.partitions]


class TransactionServicer(tpb_grpc.TransactionCoordinatorServiceServicer):
    """TransactionCoordinatorService, and InitProducerId with a transactional id (served for
    ``BrokerServicer.InitProducerId`` through :meth:`init_producer_id`)."""

    def __init__(
        self, coordinator: TransactionCoordinator, access: AccessControl = ALLOW_ALL
    ) -> None:
        self.coordinator = coordinator
        # WRITE on the transactional id for a producer's requests (and WRITE on each topic it
        # adds, READ on the group whose offsets it adds), DESCRIBE to describe or list it; a
        # broker's verification (verify_only) needs CLUSTER_ACTION
        self.access = access

    def _refused(self, transactional_id: str, verify_only: bool = False) -> KafkaError | None:
        if verify_only:
            return authz.cluster_action_denied(self.access, "AddPartitionsToTxn verify_only")
        return authz.transactional_id_denied(self.access, transactional_id)

    def find_coordinator(self, transactional_id: str) -> tuple[int, str, int]:
        """FindCoordinator with key type 1 (GroupServicer.FindCoordinator delegates here)."""
        return self.coordinator.find_coordinator(transactional_id)

    def init_producer_id(self, request: pb.InitProducerIdRequest) -> pb.InitProducerIdResponse:
        response = pb.InitProducerIdResponse(producer_id=-1, producer_epoch=-1)
        expected = None
        if request.HasField("producer_id") and request.producer_id >= 0:
            epoch = request.producer_epoch if request.HasField("producer_epoch") else -1
            expected = (request.producer_id, epoch)
        try:
            response.producer_id, response.producer_epoch = self.coordinator.init_producer_id(
                request.transactional_id, request.transaction_timeout_ms, expected
            )
        except KafkaError as error:
            _set_error(response, error)
        return response

    def AddPartitionsToTxn(
        self, request: tpb.AddPartitionsToTxnRequest, context: Any
    ) -> tpb.AddPartitionsToTxnResponse:
        wanted = _partitions(request.topics)
        response = tpb.AddPartitionsToTxnResponse()
        coordinator = self.coordinator
        args = (request.transactional_id, request.producer_id, request.producer_epoch, wanted)
        try:
            refused = self._refused(request.transactional_id, request.verify_only)
            if refused is not None:
                raise refused
            names = () if request.verify_only else (t for t, _ in wanted)
            denied = authz.denied_topics(self.access, AclOperation.WRITE, names)
            if denied:  # Kafka adds none: the others are OPERATION_NOT_ATTEMPTED
                results = {
                    tp: ErrorCode.TOPIC_AUTHORIZATION_FAILED
                    if tp[0] in denied
                    else ErrorCode.OPERATION_NOT_ATTEMPTED
                    for tp in wanted
                }
            elif request.verify_only:
                results = coordinator.verify(*args)
            else:
                results = coordinator.add_partitions(*args)
        except KafkaError as error:
            _set_error(response, error)
            results = {tp: error.error for tp in wanted}
        for (topic, partition), code in sorted(results.items()):
            response.results.add(topic=topic, partition=partition, error_code=code.code)
        return response

    def AddOffsetsToTxn(
        self, request: tpb.AddOffsetsToTxnRequest, context: Any
    ) -> tpb.AddOffsetsToTxnResponse:
        response = tpb.AddOffsetsToTxnResponse()
        try:
            refused = self._refused(request.transactional_id) or authz.group_denied(
                self.access, request.group_id
            )
            if refused is not None:
                raise refused
            self.coordinator.add_offsets(
                request.transactional_id, request.producer_id, request.producer_epoch,
                request.group_id,
            )  # fmt: skip
        except KafkaError as error:
            _set_error(response, error)
        return response

    def EndTxn(self, request: tpb.EndTxnRequest, context: Any) -> tpb.EndTxnResponse:
        response = tpb.EndTxnResponse()
        try:
            refused = self._refused(request.transactional_id)
            if refused is not None:
                raise refused
            self.coordinator.end_transaction(
                request.transactional_id, request.producer_id, request.producer_epoch,
                request.committed,
            )  # fmt: skip
        except KafkaError as error:
            _set_error(response, error)
        return response

    def DescribeTransactions(
        self, request: tpb.DescribeTransactionsRequest, context: Any
    ) -> tpb.DescribeTransactionsResponse:
        response = tpb.DescribeTransactionsResponse()
        for transactional_id in request.transactional_ids:
            out = response.transactions.add(
                transactional_id=transactional_id, transaction_start_ms=-1, producer_id=-1,
                producer_epoch=-1,
            )  # fmt: skip
            try:
                refused = authz.transactional_id_denied(
                    self.access, transactional_id, AclOperation.DESCRIBE
                )
                if refused is not None:
                    raise refused
                meta = self.coordinator.describe(transactional_id)
            except KafkaError as error:
                _set_error(out, error)
                continue
            out.state = meta.state.kafka_name
            out.transaction_timeout_ms = meta.timeout_ms
            out.transaction_start_ms = meta.start_ms
            out.producer_id = meta.producer_id
            out.producer_epoch = meta.producer_epoch
            by_topic: dict[str, list[int]] = {}
            topics = sorted({t for t, _ in meta.partitions})
            shown = set(self.access.filter(AclOperation.DESCRIBE, authz.TOPIC, topics))
            for topic, partition in sorted(meta.partitions):
                if topic in shown:  # Kafka lists only the topics the principal may describe
                    by_topic.setdefault(topic, []).append(partition)
            for topic, partitions in by_topic.items():
                out.topics.add(topic=topic, partitions=partitions)
        return response

    def ListTransactions(
        self, request: tpb.ListTransactionsRequest, context: Any
    ) -> tpb.ListTransactionsResponse:
        response = tpb.ListTransactionsResponse()
        try:
            listed = self.coordinator.list_transactions(
                request.state_filters, request.producer_id_filters, request.duration_filter_ms
            )
        except KafkaError as error:
            response.error_code = error.error.code
            return response
        response.unknown_state_filters.extend(listed.unknown_state_filters)
        ids = [meta.transactional_id for meta in listed.transactions]
        shown = set(self.access.filter(AclOperation.DESCRIBE, authz.TRANSACTIONAL_ID, ids))
        for meta in listed.transactions:
            if meta.transactional_id not in shown:
                continue
            response.transactions.add(
                transactional_id=meta.transactional_id, producer_id=meta.producer_id,
                state=meta.state.kafka_name,
            )  # fmt: skip
        return response
