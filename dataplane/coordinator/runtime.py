"""What every coordinator of an internal compacted topic shares (Kafka's ``coordinator-common``).

A coordinator keeps its state as the **replay of an internal topic** (``__consumer_offsets`` for
groups; ``__transaction_state`` is the next): each partition of the topic is a *shard*, coordinated
by that partition's leader. :class:`CoordinatorRuntime` owns the shards of one broker:

**Leadership.** After every metadata image it loads the partitions this broker now leads and drops
the ones it no longer leads. A load replays the whole log into a fresh state (requests meanwhile
get COORDINATOR_LOAD_IN_PROGRESS); a dropped shard answers NOT_COORDINATOR, so clients look the
coordinator up again.

**Writes.** Every request runs under its shard's lock: the pure state emits records (already
applied to itself), they are appended to the partition as leader, and the response waits, outside
the lock, until the high watermark covers everything the shard has written, so nothing a client is
told can be lost by a failover. A failed append leaves the state ahead of the log: the shard is
dropped and reloaded from the log. Responses that wrote nothing wait the same way, so a client
never sees state that is not yet replicated. Requests the state holds back (a classic JoinGroup
waiting for its phase to end) are *answers*: futures completed once the records that decided them
are replicated, or failed with the error that stopped them.

**The topic** is created on the first lookup of a coordinator, with the coordinator's partition
count, replication factor and configs (``offsets.topic.*`` for groups).

The state is a :class:`ShardState`: pure, records in, records out; its timers stay with the
coordinator that owns them.

**Transactions.** A state that also implements :class:`TransactionalState` (the groups: a
TxnOffsetCommit's offsets) has records that belong to a producer's transaction
(:meth:`CoordinatorRuntime.run_transactional`): they go to the log as a *transactional batch*
carrying the producer's id and epoch, as Kafka's coordinators write them, and a commit or abort
marker (:meth:`CoordinatorRuntime.write_marker`, from WriteTxnMarkers) decides them. Both are
appended first and applied after, so a refusal of the partition (a fenced producer, a
transaction that ended meanwhile) leaves the state as it was. A load replays both in log order.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from dataplane.broker.partition import NotLeader, Partition, Role
from dataplane.broker.producer_state import VerificationGuard
from dataplane.broker.replica_manager import ReplicaManager
from dataplane.broker.service import wait_until
from metadata_quorum.replication import INTERNAL_TOPICS
from raftlog.batch import NO_PRODUCER_ID, BatchHeader, iter_batches, next_sequence
from raftlog.errors import ErrorCode, KafkaError
from raftlog.records import Record, decode_batch, encode_batch
from raftlog.txn import read_marker

log = logging.getLogger(__name__)
LOAD_READ_BYTES = 4 * 1024 * 1024
RECORDS_PER_BATCH = 500
CREATE_TOPIC_RETRY_MS = 1000
T = TypeVar("T")
CoordinatorRecord = tuple[bytes, bytes | None]  # (key, value); a None value is a tombstone
Answers = list[tuple["Future[Any]", Any]]  # held-back requests and the answer each is to get


class ShardState(Protocol):
    """The pure state of one shard: changed only by replaying records."""

    def replay(self, key: bytes, value: bytes | None) -> None:
        """Apply one record of the topic (a load replays the log through this)."""

    def take_emitted(self) -> list[CoordinatorRecord]:
        """The records the handlers emitted (already replayed) since the last call."""

    def take_answers(self) -> Answers:
        """The held-back answers that the emitted records decided."""

    def fail_answers(self, answers: Answers, error: KafkaError) -> None:
        """Each of ``answers`` gets ``error`` instead of what it was to get."""

    def on_loaded(self, now_ms: int) -> None:
        """The whole log is replayed; timers restart from ``now_ms``."""

    def abandon(self, error: ErrorCode, message: str) -> None:
        """The shard is dropped (or its writes failed): every held-back request gets ``error``."""


@runtime_checkable
class TransactionalState(Protocol):
    """What a :class:`ShardState` adds when its records can belong to transactions."""

    def replay_transactional(self, key: bytes, value: bytes | None, producer_id: int) -> None:
        """Apply one record of a transactional batch of ``producer_id`` (pending until its
        marker)."""

    def replay_marker(self, producer_id: int, commit: bool) -> None:
        """Apply the producer's commit or abort marker."""


S = TypeVar("S", bound=ShardState)


@dataclass(frozen=True)
class InternalTopic:
    """The internal topic a coordinator's state lives in, and how it is created."""

    name: str
    num_partitions: int
    replication_factor: int
    configs: Mapping[str, str] = field(default_factory=dict)
    config_prefix: str = ""  # named in errors: "offsets.topic" for __consumer_offsets

    def __post_init__(self) -> None:
        assert self.name in INTERNAL_TOPICS, f"producers must not write {self.name}"


class Shard(Generic[S]):
    """A partition of the internal topic that this broker leads, and the state replayed from it."""

    def __init__(self, partition: Partition, leader_epoch: int, state: S) -> None:
        self.partition = partition
        self.leader_epoch = leader_epoch
        self.state = state
        self.lock = threading.Lock()
        self.loaded = threading.Event()
        self.active = True
        self.written_end = 0  # the log end after this shard's last append


class CoordinatorRuntime(Generic[S]):
    """The shards of one internal topic that this broker leads (see the module docstring)."""

    def __init__(
        self,
        broker_id: int,
        topic: InternalTopic,
        replicas: ReplicaManager,
        new_state: Callable[[], S],
        create_topic: Callable[[str, int, int, Mapping[str, str]], None],
        clock_ms: Callable[[], int],
        commit_timeout_ms: int,
    ) -> None:
        self.broker_id = broker_id
        self.topic = topic
        self.replicas = replicas
        self.new_state = new_state
        self.create_topic = create_topic
        self.clock_ms = clock_ms
        self.commit_timeout_ms = commit_timeout_ms
        self._lock = threading.Lock()
        self._shards: dict[int, Shard[S]] = {}
        self._loads: queue.Queue[Shard[S] | None] = queue.Queue()
        self._stop = threading.Event()
        self._create_attempt_ms = 0
        short = topic.name.strip("_").split("_")[-1]
        self._loader = threading.Thread(target=self._load_loop, name=f"{short}-loader", daemon=True)

    def start(self) -> None:
        self._loader.start()

    def close(self) -> None:
        self._stop.set()
        self._loads.put(None)
        if self._loader.is_alive():
            self._loader.join(timeout=5)
        with self._lock:
            shards = list(self._shards.values())
            for shard in shards:
                shard.active = False
            self._shards.clear()
        for shard in shards:
            with shard.lock:
                shard.state.abandon(ErrorCode.NOT_COORDINATOR, "the broker is stopping")

    # -- leadership --------------------------------------------------------------------------------
    def on_image(self) -> None:
        """After the replica manager applied an image: load the partitions of the topic this
        broker now leads, drop the ones it no longer leads."""
        name = self.topic.name
        led = {p.partition: p for p in self.replicas.partitions_of(name) if p.role is Role.LEADER}
        dropped: list[Shard[S]] = []
        with self._lock:
            for pid, shard in list(self._shards.items()):
                partition = led.get(pid)
                if (
                    partition is None
                    or partition is not shard.partition
                    or (partition.leader_epoch != shard.leader_epoch)
                ):
                    shard.active = False
                    del self._shards[pid]
                    dropped.append(shard)
                    log.info("%s-%d unloaded", name, pid)
            for pid, partition in led.items():
                if pid not in self._shards:
                    self._add_shard(partition)
        for shard in dropped:  # (the shard lock is never taken under self._lock)
            with shard.lock:
                shard.state.abandon(ErrorCode.NOT_COORDINATOR, "the coordinator moved")

    def _add_shard(self, partition: Partition) -> None:
        shard = Shard(partition, partition.leader_epoch, self.new_state())
        self._shards[partition.partition] = shard
        self._loads.put(shard)

    def _load_loop(self) -> None:
        while not self._stop.is_set():
            shard = self._loads.get()
            if shard is None:
                return
            try:
                self._load(shard)
            except Exception:
                log.exception("loading %s failed", shard.partition.name)
                self._reload(shard)

    def _load(self, shard: Shard[S]) -> None:
        started = time.monotonic()
        partition = shard.partition
        plog = partition.log
        offset, end = plog.log_start_offset, plog.log_end_offset
        count = 0
        while offset < end and shard.active:
            data = plog.read(offset, LOAD_READ_BYTES, min_one_batch=True)
            if not data:
                break
            for position, header in iter_batches(data):
                count += _replay_batch(shard.state, data, position, header, offset)
                offset = header.next_offset
        with shard.lock:
            shard.written_end = end
            shard.state.on_loaded(self.clock_ms())
            shard.loaded.set()
        log.info(
            "%s loaded: %d records in %.0f ms",
            partition.name, count, (time.monotonic() - started) * 1000,
        )  # fmt: skip

    def _reload(self, shard: Shard[S]) -> None:
        """The shard's state may be ahead of its log: start again from the log."""
        with self._lock:
            shard.active = False
            if self._shards.get(shard.partition.partition) is shard:
                del self._shards[shard.partition.partition]
                if shard.partition.role is Role.LEADER and not self._stop.is_set():
                    self._add_shard(shard.partition)

    # -- finding the coordinator -------------------------------------------------------------------
    def coordinator(self, partition_of: Callable[[int], int]) -> tuple[int, str, int]:
        """(node id, host, port) of the coordinator of a key, whose partition ``partition_of``
        computes from the topic's partition count. Creates the topic if it does not exist yet
        (COORDINATOR_NOT_AVAILABLE until it has leaders)."""
        name = self.topic.name
        image = self.replicas.image
        topic = image.topic(name)
        if topic is None or not topic.partitions:
            self._ensure_topic()
            raise KafkaError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{name} is being created")
        pid = partition_of(len(topic.partitions))
        leader = topic.partitions[pid].leader
        broker = image.brokers.get(leader)
        endpoint = None if broker is None or broker.fenced else broker.endpoint("BROKER")
        if endpoint is None:
            raise KafkaError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{name}-{pid} has no leader")
        return leader, endpoint.host, endpoint.port

    def _ensure_topic(self) -> None:
        now_ms = self.clock_ms()
        with self._lock:
            if now_ms - self._create_attempt_ms < CREATE_TOPIC_RETRY_MS:
                return
            self._create_attempt_ms = now_ms
        topic = self.topic
        try:
            self.create_topic(
                topic.name, topic.num_partitions, topic.replication_factor, topic.configs
            )
            log.info("created %s", topic.name)
        except KafkaError as error:
            if error.error is not ErrorCode.TOPIC_ALREADY_EXISTS:
                log.warning("cannot create %s: %s", topic.name, error)
                raise KafkaError(
                    ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    f"cannot create {topic.name}: {error.message} "
                    f"({topic.config_prefix}.replication.factor)",
                ) from error

    # -- running requests --------------------------------------------------------------------------
    def shard(self, partition_of: Callable[[int], int], what: str) -> Shard[S]:
        """The loaded shard of a key (see :meth:`coordinator`); ``what`` names the key in errors."""
        topic = self.replicas.image.topic(self.topic.name)
        if topic is None or not topic.partitions:
            raise KafkaError(ErrorCode.NOT_COORDINATOR, f"{self.topic.name} does not exist yet")
        pid = partition_of(len(topic.partitions))
        with self._lock:
            shard = self._shards.get(pid)
        if shard is None:
            raise KafkaError(
                ErrorCode.NOT_COORDINATOR, f"broker {self.broker_id} does not coordinate {what}"
            )
        if not shard.loaded.is_set():
            raise KafkaError(
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, f"{shard.partition.name} is loading"
            )
        return shard

    def loaded_shards(self) -> Iterator[Shard[S]]:
        with self._lock:
            shards = [s for s in self._shards.values() if s.loaded.is_set()]
        return iter(shards)

    def loading(self) -> bool:
        """Whether a shard this broker leads is still loading (a listing would be partial)."""
        with self._lock:
            return any(not s.loaded.is_set() for s in self._shards.values())

    def run(self, shard: Shard[S], action: Callable[[S], T]) -> T:
        """``action`` on the shard's state; append what it emitted; answer once replicated.
        Answers the action queued for held-back requests go out at the same moment, or fail
        with the error that stopped the records."""
        with shard.lock:
            if not shard.active:
                raise KafkaError(ErrorCode.NOT_COORDINATOR, f"{shard.partition.name} moved")
            failure: KafkaError | None = None
            try:
                result = action(shard.state)
            except KafkaError as error:
                failure = error
            answers, required = self.append_locked(shard)
        if failure is not None and not answers:
            raise failure
        self.answer_once_replicated(shard, required, answers)
        if failure is not None:
            raise failure
        return result

    def append_locked(self, shard: Shard[S]) -> tuple[Answers, int]:
        """Under the shard lock: append what was emitted; the queued answers and the offset
        they wait for. If the append fails, every held-back request learns it."""
        answers = shard.state.take_answers()
        try:
            self._append(shard, shard.state.take_emitted())
        except KafkaError as error:
            shard.state.fail_answers(answers, error)
            shard.state.abandon(error.error, error.message)
            raise
        return answers, shard.written_end

    def answer_once_replicated(self, shard: Shard[S], required: int, answers: Answers) -> None:
        try:
            self._await_replicated(shard, required)
        except KafkaError as error:
            shard.state.fail_answers(answers, error)
            raise
        for future, answer in answers:
            if not future.done():
                future.set_result(answer)

    def _append(self, shard: Shard[S], records: list[CoordinatorRecord]) -> None:
        if not records:
            return
        partition = shard.partition
        now_ms = self.clock_ms()
        try:
            min_isr = self.replicas.settings(self.topic.name).min_insync_replicas
            for start in range(0, len(records), RECORDS_PER_BATCH):
                chunk = records[start : start + RECORDS_PER_BATCH]
                batch = encode_batch([Record(-1, now_ms, k, v) for k, v in chunk])
                self._append_batch(shard, batch, min_isr)
        except KafkaError as error:
            log.warning("%s: records not appended (%s): reloading", partition.name, error)
            self._reload(shard)
            code = (
                ErrorCode.NOT_COORDINATOR
                if isinstance(error, NotLeader)
                else ErrorCode.COORDINATOR_NOT_AVAILABLE
            )
            raise KafkaError(code, f"{partition.name}: {error.message}") from error

    def _append_batch(
        self,
        shard: Shard[S],
        batch: bytes,
        min_isr: int,
        verification: VerificationGuard | None = None,
    ) -> None:
        info, epoch = shard.partition.append_as_leader(
            batch, -1, min_isr, verification=verification
        )
        if epoch != shard.leader_epoch:
            raise NotLeader(ErrorCode.NOT_LEADER_OR_FOLLOWER, "new leader epoch", -1, epoch)
        shard.written_end = info.last_offset + 1

    def run_transactional(
        self,
        shard: Shard[S],
        producer_id: int,
        producer_epoch: int,
        verification: VerificationGuard | None,
        action: Callable[[S], tuple[list[CoordinatorRecord], T]],
    ) -> T:
        """``action`` generates records of the producer's open transaction (without applying
        them); they are appended as transactional batches and, once the partition took them,
        applied with ``replay_transactional``; answers once replicated. ``verification`` is the
        partition's KIP-890 guard for the producer (None: not verified). A refusal of the
        first batch (INVALID_PRODUCER_EPOCH for a fenced producer, INVALID_TXN_STATE for a
        transaction that ended meanwhile) is raised as it is, with nothing stored or applied."""
        with shard.lock:
            if not shard.active:
                raise KafkaError(ErrorCode.NOT_COORDINATOR, f"{shard.partition.name} moved")
            state = shard.state
            assert isinstance(state, TransactionalState), f"{self.topic.name} has no transactions"
            records, result = action(state)
            self._append_transactional(shard, producer_id, producer_epoch, verification, records)
            for key, value in records:
                state.replay_transactional(key, value, producer_id)
            required = shard.written_end
        self._await_replicated(shard, required)
        return result

    def _append_transactional(
        self,
        shard: Shard[S],
        producer_id: int,
        producer_epoch: int,
        verification: VerificationGuard | None,
        records: list[CoordinatorRecord],
    ) -> None:
        partition = shard.partition
        now_ms = self.clock_ms()
        min_isr = self.replicas.settings(self.topic.name).min_insync_replicas
        start = 0
        try:
            sequence = _next_sequence(partition, producer_id, producer_epoch)
            for start in range(0, len(records), RECORDS_PER_BATCH):
                chunk = records[start : start + RECORDS_PER_BATCH]
                batch = encode_batch(
                    [Record(-1, now_ms, k, v) for k, v in chunk],
                    producer_id=producer_id, producer_epoch=producer_epoch,
                    base_sequence=sequence, is_transactional=True,
                )  # fmt: skip
                self._append_batch(shard, batch, min_isr, verification)
                sequence = next_sequence(sequence, len(chunk))
        except KafkaError as error:
            if start > 0 or isinstance(error, NotLeader):  # the log is ahead of the state
                self._reload(shard)
            raise _transactional_append_error(partition.name, error) from error

    def write_marker(
        self,
        shard: Shard[S],
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
    ) -> None:
        """A commit or abort marker for the producer's transaction on the shard's partition:
        appended under the shard lock (so it lands after every record the state emitted
        before it), applied to the state, and returned once replicated. A refusal of the
        partition (NOT_LEADER_OR_FOLLOWER, INVALID_PRODUCER_EPOCH, ...) leaves the state as it
        was; a shard that moved answers NOT_COORDINATOR, as every request does."""
        state = shard.state
        assert isinstance(state, TransactionalState), f"{self.topic.name} has no transactions"
        partition = shard.partition
        with shard.lock:
            if not shard.active:
                raise KafkaError(ErrorCode.NOT_COORDINATOR, f"{partition.name} moved")
            min_isr = self.replicas.settings(self.topic.name).min_insync_replicas
            info, epoch = partition.append_marker(
                producer_id, producer_epoch, commit=commit, coordinator_epoch=coordinator_epoch,
                min_insync_replicas=min_isr,
            )  # fmt: skip
            if epoch != shard.leader_epoch:  # appended under a newer leadership: stale shard
                self._reload(shard)
                raise KafkaError(ErrorCode.NOT_COORDINATOR, f"{partition.name} moved")
            shard.written_end = info.last_offset + 1
            state.replay_marker(producer_id, commit)
            required = shard.written_end
        self._await_replicated(shard, required)

    def _await_replicated(self, shard: Shard[S], required: int) -> None:
        """Until the high watermark passes ``required`` (within the commit timeout)."""
        partition = shard.partition
        min_isr = self.replicas.settings(self.topic.name).min_insync_replicas

        def replicated() -> bool:
            try:
                outcome = partition.acks_all_outcome(required, shard.leader_epoch, min_isr)
            except KafkaError as error:
                raise KafkaError(ErrorCode.NOT_COORDINATOR, error.message) from error
            if outcome not in (None, ErrorCode.NONE):
                raise KafkaError(
                    ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    f"{partition.name}: {outcome.name} while replicating coordinator records",
                )
            return outcome is ErrorCode.NONE

        deadline = time.monotonic() + self.commit_timeout_ms / 1000
        wait_until([partition], deadline, replicated)
        if not replicated():
            raise KafkaError(
                ErrorCode.REQUEST_TIMED_OUT,
                f"{partition.name}: records not replicated within {self.commit_timeout_ms} ms",
            )


def _next_sequence(partition: Partition, producer_id: int, producer_epoch: int) -> int:
    """The sequence the partition expects next of the producer at this epoch. The coordinator
    is the only writer of its partition and appends under the shard lock, so its transactional
    batches pass the partition's producer checks like a client's, numbered from the producer
    state the partition keeps (0 for a new producer or epoch)."""
    for pid, entry in partition.active_producers():
        if pid == producer_id:
            if entry.producer_epoch != producer_epoch or not entry.batches:
                return 0
            return next_sequence(entry.last_sequence)
    return 0


# A transactional append refused by the partition, answered as Kafka's group coordinator
# answers a TxnOffsetCommit (``normalizeException``); the producer's own refusals (fenced epoch,
# ended transaction) go back as they are.
_APPEND_ERRORS = {
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER: ErrorCode.COORDINATOR_NOT_AVAILABLE,
}


def _transactional_append_error(name: str, error: KafkaError) -> KafkaError:
    code = _APPEND_ERRORS.get(error.error, error.error)
    if isinstance(error, NotLeader):
        code = ErrorCode.NOT_COORDINATOR
    return KafkaError(code, f"{name}: {error.message}")


def _replay_batch(
    state: ShardState, data: bytes, position: int, header: BatchHeader, start: int
) -> int:
    """Replay the batch at ``position`` (its records from offset ``start`` on) into ``state``;
    the number of records replayed. Markers and transactional batches go to a
    :class:`TransactionalState`; a state without transactions has neither in its log."""
    if header.next_offset <= start:
        return 0
    if header.is_control:
        if header.is_transactional:
            assert isinstance(state, TransactionalState), "a marker in a log without transactions"
            marker = read_marker(data, position)
            state.replay_marker(marker.producer_id, marker.commit)
        return 0  # other control batches (none are written here) carry no state
    count = 0
    transactional = header.is_transactional and header.producer_id != NO_PRODUCER_ID
    for record in decode_batch(data, position)[1]:
        if record.offset < start or record.key is None:
            continue
        if transactional:
            assert isinstance(state, TransactionalState), "a transaction in a log without them"
            state.replay_transactional(record.key, record.value, header.producer_id)
        else:
            state.replay(record.key, record.value)
        count += 1
    return count
