"""The transactions of one ``__transaction_state`` partition: pure state, records in, records out.

A :class:`TransactionShard` holds the transactional ids that hash to one partition of
``__transaction_state`` (Kafka's ``abs(id.hashCode()) % N``). It changes only by replaying
records (:meth:`TransactionShard.replay`): a load replays the partition, and every handler
(InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, the marker writer's completion,
the timers) *emits* records, each replayed at once and collected for the coordinator to append,
exactly as the group coordinator's shard (the shared machinery is
:mod:`dataplane.coordinator.runtime`).

The states and their legal moves are Kafka's ``TransactionState``: a table, and one
``_transition`` that refuses anything else. As in Kafka, ``PrepareEpochFence`` is never written:
fencing an ongoing transaction (a new InitProducerId for its id, or its timeout) bumps the epoch
in memory and goes on at once to ``PrepareAbort``, which is written with the bumped epoch, so the
zombie's writes and its EndTxn are refused. A transaction in ``PrepareCommit`` / ``PrepareAbort``
waits for its markers: :meth:`TransactionShard.pending_markers` names them (also after a load,
so a new coordinator finishes what the old one started), and
:meth:`TransactionShard.complete` moves it to ``CompleteCommit`` / ``CompleteAbort`` once every
partition has its marker.

Producer ids come from the caller (``new_producer_id``): the shell hands out ids from the blocks
the controller allocates, as Kafka's ProducerIdManager does.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from protos import transaction_pb2 as tpb
from raftlog.batch import NO_PRODUCER_EPOCH, NO_PRODUCER_ID

# A transactional id's partition: Kafka hashes it as it hashes a group id.
from raftlog.coordinator_key import partition_for
from raftlog.errors import ErrorCode, KafkaError

TopicPartition = tuple[str, int]
TransactionRecord = tuple[bytes, bytes | None]  # (key, value); a None value is a tombstone
EPOCH_MAX = 2**15 - 1  # Short.MAX_VALUE: an epoch at MAX - 1 rotates to a new producer id
NO_TIMESTAMP = -1
OFFSETS_TOPIC = "__consumer_offsets"


class TxnState(enum.Enum):
    """Kafka's transaction states; the value is the status stored in the log."""

    EMPTY = tpb.EMPTY
    ONGOING = tpb.ONGOING
    PREPARE_COMMIT = tpb.PREPARE_COMMIT
    PREPARE_ABORT = tpb.PREPARE_ABORT
    COMPLETE_COMMIT = tpb.COMPLETE_COMMIT
    COMPLETE_ABORT = tpb.COMPLETE_ABORT
    DEAD = tpb.DEAD
    PREPARE_EPOCH_FENCE = tpb.PREPARE_EPOCH_FENCE

    @property
    def kafka_name(self) -> str:
        """The name Kafka's DescribeTransactions and ListTransactions use."""
        return "".join(part.capitalize() for part in self.name.split("_"))


S = TxnState
# Kafka's TransactionState.validPreviousStates, turned around: state -> the states it may become.
LEGAL: dict[TxnState, frozenset[TxnState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.ONGOING, S.DEAD}),
    S.ONGOING: frozenset({S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT, S.PREPARE_EPOCH_FENCE}),
    S.PREPARE_COMMIT: frozenset({S.COMPLETE_COMMIT}),
    S.PREPARE_ABORT: frozenset({S.COMPLETE_ABORT}),
    S.COMPLETE_COMMIT: frozenset({S.EMPTY, S.ONGOING, S.DEAD}),
    S.COMPLETE_ABORT: frozenset({S.EMPTY, S.ONGOING, S.DEAD}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset(),
}
ENDED = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})
PREPARED = frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT})


@dataclass(frozen=True)
class TxnMetadata:
    """One transactional id, as its last record left it."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    previous_producer_id: int = NO_PRODUCER_ID
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    partitions: frozenset[TopicPartition] = frozenset()
    start_ms: int = NO_TIMESTAMP
    last_update_ms: int = NO_TIMESTAMP


@dataclass(frozen=True)
class MarkerJob:
    """Markers the coordinator must write for a prepared transaction, on each partition."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    partitions: frozenset[TopicPartition]
    # Which preparation of the id this is (the shard counts the records it replays): without
    # epoch bumps per transaction (KIP-890 part 2), consecutive transactions of one producer
    # over the same partitions would otherwise be the same job, and a finished one could be
    # mistaken for the next.
    prepared_at: int = 0


@dataclass(frozen=True)
class TxnLimits:
    """The coordinator's settings (Kafka's names)."""

    max_timeout_ms: int = 900_000  # transaction.max.timeout.ms
    id_expiration_ms: int = 7 * 24 * 3600 * 1000  # transactional.id.expiration.ms


def key_bytes(transactional_id: str) -> bytes:
    return tpb.TransactionLogKey(transactional_id=transactional_id).SerializeToString()


def encode(meta: TxnMetadata) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(meta.partitions):
        by_topic.setdefault(topic, []).append(partition)
    return tpb.TransactionLogValue(
        producer_id=meta.producer_id,
        previous_producer_id=meta.previous_producer_id,
        producer_epoch=meta.producer_epoch,
        last_producer_epoch=meta.last_producer_epoch,
        transaction_timeout_ms=meta.timeout_ms,
        status=meta.state.value,
        partitions=[
            tpb.TransactionPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()
        ],
        transaction_start_ms=meta.start_ms,
        last_update_ms=meta.last_update_ms,
    ).SerializeToString()


def decode(transactional_id: str, value: bytes) -> TxnMetadata:
    m = tpb.TransactionLogValue.FromString(value)
    return TxnMetadata(
        transactional_id=transactional_id,
        producer_id=m.producer_id,
        producer_epoch=m.producer_epoch,
        timeout_ms=m.transaction_timeout_ms,
        state=TxnState(m.status),
        previous_producer_id=m.previous_producer_id,
        last_producer_epoch=m.last_producer_epoch,
        partitions=frozenset((p.topic, n) for p in m.partitions for n in p.partitions),
        start_ms=m.transaction_start_ms,
        last_update_ms=m.last_update_ms,
    )


class TransactionShard:
    """The transactional ids of one ``__transaction_state`` partition (see the module doc)."""

    def __init__(
        self,
        new_producer_id: Callable[[], int],
        limits: TxnLimits | None = None,
        offsets_partitions: int = 50,
    ) -> None:
        self.new_producer_id = new_producer_id
        self.limits = limits or TxnLimits()
        self.offsets_partitions = offsets_partitions  # offsets.topic.num.partitions
        self.transactions: dict[str, TxnMetadata] = {}
        self._emitted: list[TransactionRecord] = []
        self._replayed = 0  # records replayed so far: names each preparation (MarkerJob)
        self._prepared_at: dict[str, int] = {}

    # -- records (dataplane.coordinator.runtime.ShardState) -------------------------------------
    def replay(self, key: bytes, value: bytes | None) -> None:
        """Apply one record of ``__transaction_state`` (a load replays the log through this)."""
        transactional_id = tpb.TransactionLogKey.FromString(key).transactional_id
        self._replayed += 1
        if value is None:
            self.transactions.pop(transactional_id, None)
            self._prepared_at.pop(transactional_id, None)
            return
        meta = self.transactions[transactional_id] = decode(transactional_id, value)
        if meta.state in PREPARED:
            self._prepared_at[transactional_id] = self._replayed
        else:
            self._prepared_at.pop(transactional_id, None)

    def take_emitted(self) -> list[TransactionRecord]:
        emitted, self._emitted = self._emitted, []
        return emitted

    def take_answers(self) -> list[tuple[Future[Any], Any]]:
        return []  # every answer goes out once its records are replicated; none is held back

    def fail_answers(self, answers: list[tuple[Future[Any], Any]], error: KafkaError) -> None:
        for future, _ in answers:
            future.set_exception(error)

    def on_loaded(self, now_ms: int) -> None:
        """Nothing restarts from the load time: timeouts run from each transaction's start,
        and prepared transactions are in :meth:`pending_markers` for the new coordinator."""

    def abandon(self, error: ErrorCode, message: str) -> None:
        """Nothing is held back (see :meth:`take_answers`)."""

    def _write(self, meta: TxnMetadata) -> TxnMetadata:
        """Emit ``meta`` as the id's record (a tombstone when it is dead) and replay it."""
        key = key_bytes(meta.transactional_id)
        value = None if meta.state is TxnState.DEAD else encode(meta)
        self.replay(key, value)
        self._emitted.append((key, value))
        return meta

    @staticmethod
    def _transition(meta: TxnMetadata, state: TxnState, **changes: Any) -> TxnMetadata:
        if state not in LEGAL[meta.state]:
            raise AssertionError(
                f"transaction {meta.transactional_id}: illegal move {meta.state.kafka_name} -> "
                f"{state.kafka_name}"
            )
        return replace(meta, state=state, **changes)

    # -- InitProducerId ------------------------------------------------------------------------
    def init_producer_id(
        self,
        transactional_id: str,
        timeout_ms: int,
        now_ms: int,
        expected: tuple[int, int] | None = None,
    ) -> tuple[int, int]:
        """(producer id, epoch) for ``transactional_id``: a new id starts at epoch 0, a known
        one gets its epoch bumped (fencing any producer with the old one); an ongoing
        transaction is aborted first (CONCURRENT_TRANSACTIONS: retry). ``expected`` is the
        (producer id, epoch) a producer presents to recover (KIP-360)."""
        if not transactional_id:
            raise KafkaError(ErrorCode.INVALID_REQUEST, "the transactional id must not be empty")
        if not 0 < timeout_ms <= self.limits.max_timeout_ms:
            raise KafkaError(
                ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                f"transaction.timeout.ms {timeout_ms} is not in 1..{self.limits.max_timeout_ms} "
                "(transaction.max.timeout.ms)",
            )
        meta = self.transactions.get(transactional_id)
        if meta is None:
            if expected is not None and expected[0] != NO_PRODUCER_ID:
                raise KafkaError(
                    ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                    f"no producer id is mapped to {transactional_id!r}",
                )
            fresh = TxnMetadata(transactional_id, self.new_producer_id(), 0, timeout_ms,
                                last_update_ms=now_ms)  # fmt: skip
            self._write(fresh)
            return fresh.producer_id, fresh.producer_epoch
        self._check_expected(meta, expected)
        if meta.state in PREPARED:
            raise KafkaError(
                ErrorCode.CONCURRENT_TRANSACTIONS,
                f"{transactional_id}: the last transaction is still being completed",
            )
        if meta.state is TxnState.ONGOING:
            self._fence_and_abort(meta, now_ms)
            raise KafkaError(
                ErrorCode.CONCURRENT_TRANSACTIONS,
                f"{transactional_id}: the open transaction of epoch {meta.producer_epoch} is "
                "being aborted",
            )
        if expected is not None and (meta.producer_id, meta.last_producer_epoch) == expected:
            return meta.producer_id, meta.producer_epoch  # a retry of a bump that happened
        bumped = self._bumped(meta)
        self._write(self._transition(bumped, TxnState.EMPTY, timeout_ms=timeout_ms,
                                     partitions=frozenset(), start_ms=NO_TIMESTAMP,
                                     last_update_ms=now_ms))  # fmt: skip
        return bumped.producer_id, bumped.producer_epoch

    def _check_expected(self, meta: TxnMetadata, expected: tuple[int, int] | None) -> None:
        """KIP-360: a producer that presents (id, epoch) must hold the current or the last one."""
        if expected is None or expected[0] == NO_PRODUCER_ID:
            return
        ids = {meta.producer_id, meta.previous_producer_id}
        epochs = {meta.producer_epoch, meta.last_producer_epoch}
        if expected[0] not in ids or expected[1] not in epochs:
            raise KafkaError(
                ErrorCode.PRODUCER_FENCED,
                f"{meta.transactional_id}: producer {expected[0]} epoch {expected[1]} is not the "
                f"current one ({meta.producer_id}, epoch {meta.producer_epoch})",
            )

    def _bumped(self, meta: TxnMetadata) -> TxnMetadata:
        """The next epoch, or a new producer id at epoch 0 once the epoch is exhausted."""
        if meta.producer_epoch >= EPOCH_MAX - 1:
            return replace(meta, previous_producer_id=meta.producer_id,
                           producer_id=self.new_producer_id(), producer_epoch=0,
                           last_producer_epoch=NO_PRODUCER_EPOCH)  # fmt: skip
        return replace(meta, producer_epoch=meta.producer_epoch + 1,
                       last_producer_epoch=meta.producer_epoch)  # fmt: skip

    def _fence_and_abort(self, meta: TxnMetadata, now_ms: int) -> TxnMetadata:
        """Fence the producer of an ongoing transaction (epoch + 1, kept in memory as Kafka's
        PrepareEpochFence) and write PrepareAbort with the new epoch."""
        fenced = self._transition(
            self._bumped(meta), TxnState.PREPARE_EPOCH_FENCE, last_update_ms=now_ms
        )
        return self._write(self._transition(fenced, TxnState.PREPARE_ABORT, last_update_ms=now_ms))

    # -- AddPartitionsToTxn / AddOffsetsToTxn ---------------------------------------------------
    def _current(self, transactional_id: str, producer_id: int, epoch: int) -> TxnMetadata:
        meta = self.transactions.get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            raise KafkaError(
                ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                f"producer {producer_id} is not mapped to {transactional_id!r}",
            )
        if epoch != meta.producer_epoch:
            raise KafkaError(
                ErrorCode.PRODUCER_FENCED,
                f"{transactional_id}: epoch {epoch} is fenced by epoch {meta.producer_epoch}",
            )
        return meta

    def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        partitions: Iterable[TopicPartition],
        now_ms: int,
    ) -> None:
        """The transaction will write ``partitions``: it is Ongoing from the first of them."""
        meta = self._current(transactional_id, producer_id, epoch)
        if meta.state in PREPARED or meta.state is TxnState.PREPARE_EPOCH_FENCE:
            raise KafkaError(
                ErrorCode.CONCURRENT_TRANSACTIONS,
                f"{transactional_id}: the last transaction is still being completed",
            )
        wanted = frozenset(partitions)
        if meta.state is TxnState.ONGOING and wanted <= meta.partitions:
            return
        start_ms = meta.start_ms if meta.state is TxnState.ONGOING else now_ms
        self._write(self._transition(meta, TxnState.ONGOING, partitions=meta.partitions | wanted,
                                     start_ms=start_ms, last_update_ms=now_ms))  # fmt: skip

    def add_offsets(
        self, transactional_id: str, producer_id: int, epoch: int, group_id: str, now_ms: int
    ) -> TopicPartition:
        """AddOffsetsToTxn: the group's ``__consumer_offsets`` partition joins the transaction
        (its offsets commit with the transaction's marker); that partition."""
        if not group_id:
            raise KafkaError(ErrorCode.INVALID_GROUP_ID, "the group id must not be empty")
        tp = (OFFSETS_TOPIC, partition_for(group_id, self.offsets_partitions))
        self.add_partitions(transactional_id, producer_id, epoch, [tp], now_ms)
        return tp

    def verify(
        self, transactional_id: str, producer_id: int, epoch: int, partition: TopicPartition
    ) -> ErrorCode:
        """KIP-890's check for a partition leader before it takes a transaction's first batch:
        NONE only if the transaction is ongoing with that producer and epoch and holds it."""
        meta = self.transactions.get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if epoch != meta.producer_epoch:
            return ErrorCode.PRODUCER_FENCED
        if meta.state is not TxnState.ONGOING or partition not in meta.partitions:
            return ErrorCode.INVALID_TXN_STATE
        return ErrorCode.NONE

    # -- EndTxn and its markers -----------------------------------------------------------------
    def end_transaction(
        self, transactional_id: str, producer_id: int, epoch: int, commit: bool, now_ms: int
    ) -> None:
        """EndTxn: Ongoing -> PrepareCommit / PrepareAbort (the markers follow); a retry of an
        end that completed answers as it did; anything else is Kafka's error."""
        meta = self._current(transactional_id, producer_id, epoch)
        done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        preparing = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        if meta.state is TxnState.ONGOING:
            self._write(self._transition(meta, preparing, last_update_ms=now_ms))
            return
        if meta.state is done:
            return  # the client retried an end that completed
        if meta.state is preparing:
            raise KafkaError(
                ErrorCode.CONCURRENT_TRANSACTIONS,
                f"{transactional_id}: the transaction is still being completed",
            )
        verb = "commit" if commit else "abort"
        raise KafkaError(
            ErrorCode.INVALID_TXN_STATE,
            f"{transactional_id}: cannot {verb} in state {meta.state.kafka_name}",
        )

    def pending_markers(self) -> list[MarkerJob]:
        """The prepared transactions and the markers each still needs (all their partitions:
        writing a marker twice is harmless, the partition leader ignores a repeat)."""
        return [
            MarkerJob(
                m.transactional_id,
                m.producer_id,
                m.producer_epoch,
                m.state is TxnState.PREPARE_COMMIT,
                m.partitions,
                self._prepared_at.get(m.transactional_id, 0),
            )
            for m in sorted(self.transactions.values(), key=lambda m: m.transactional_id)
            if m.state in PREPARED
        ]

    def complete(self, job: MarkerJob, now_ms: int) -> bool:
        """Every marker of ``job`` is written: PrepareX -> CompleteX. False if the transaction
        moved on meanwhile (another coordinator completed it, or its id was re-initialised)."""
        meta = self.transactions.get(job.transactional_id)
        if meta is None or meta.state not in PREPARED:
            return False
        if (meta.producer_id, meta.producer_epoch) != (job.producer_id, job.producer_epoch):
            return False
        if self._prepared_at.get(job.transactional_id, 0) != job.prepared_at:
            return False  # a later transaction of the same producer, prepared since
        done = TxnState.COMPLETE_COMMIT if job.commit else TxnState.COMPLETE_ABORT
        self._write(self._transition(meta, done, partitions=frozenset(), start_ms=NO_TIMESTAMP,
                                     last_update_ms=now_ms))  # fmt: skip
        return True

    # -- timers ----------------------------------------------------------------------------------
    def abort_timed_out(self, now_ms: int) -> list[str]:
        """Ongoing transactions older than their transaction.timeout.ms are fenced and aborted
        (their producer must re-initialise); the ids."""
        expired = [
            m for m in self.transactions.values()
            if m.state is TxnState.ONGOING and now_ms - m.start_ms > m.timeout_ms
        ]  # fmt: skip
        for meta in expired:
            self._fence_and_abort(meta, now_ms)
        return sorted(m.transactional_id for m in expired)

    def expire_ids(self, now_ms: int) -> list[str]:
        """transactional.id.expiration.ms: ids idle (no transaction) that long are removed."""
        idle = [
            m for m in self.transactions.values()
            if m.state in ENDED and now_ms - m.last_update_ms > self.limits.id_expiration_ms
        ]  # fmt: skip
        for meta in idle:
            self._write(self._transition(meta, TxnState.DEAD, last_update_ms=now_ms))
        return sorted(m.transactional_id for m in idle)

    # -- DescribeTransactions / ListTransactions ------------------------------------------------
    def describe(self, transactional_id: str) -> TxnMetadata:
        meta = self.transactions.get(transactional_id)
        if meta is None:
            raise KafkaError(
                ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, f"no transactional id {transactional_id!r}"
            )
        return meta

    def listing(
        self, states: Iterable[str] = (), producer_ids: Iterable[int] = ()
    ) -> Iterator[TxnMetadata]:
        """ListTransactions: ids in one of ``states`` (Kafka's names; none = all) held by one of
        ``producer_ids`` (none = any)."""
        wanted_states, wanted_ids = set(states), set(producer_ids)
        for meta in sorted(self.transactions.values(), key=lambda m: m.transactional_id):
            if wanted_states and meta.state.kafka_name not in wanted_states:
                continue
            if wanted_ids and meta.producer_id not in wanted_ids:
                continue
            yield meta
