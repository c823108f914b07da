"""The transaction coordinator's pure state: every transition Kafka allows (and none other),
fencing, KIP-360 recovery, timeouts, id expiry, the markers a prepared transaction waits for,
and, as a property, that replaying what any sequence of requests emitted rebuilds the same state.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dataplane.coordinator.transaction_state import (
    EPOCH_MAX,
    LEGAL,
    TransactionShard,
    TxnLimits,
    TxnMetadata,
    TxnState,
    encode,
)
from raftlog.coordinator_key import partition_for
from raftlog.errors import ErrorCode, KafkaError

T0 = 1_000_000
TIMEOUT_MS = 60_000


def shard() -> TransactionShard:
    ids = itertools.count(1000)
    return TransactionShard(lambda: next(ids), TxnLimits(max_timeout_ms=900_000))


def error_of(call: Callable[[], object]) -> ErrorCode:
    with pytest.raises(KafkaError) as raised:
        call()
    return raised.value.error


def replayed(
    source: TransactionShard, records: list[tuple[bytes, bytes | None]]
) -> dict[str, TxnMetadata]:
    fresh = shard()
    for key, value in records:
        fresh.replay(key, value)
    return fresh.transactions


def test_a_transaction_commits_through_its_markers() -> None:
    s = shard()
    pid, epoch = s.init_producer_id("t", TIMEOUT_MS, T0)
    assert (pid, epoch) == (1000, 0)
    s.add_partitions("t", pid, epoch, [("out", 0), ("out", 1)], T0 + 1)
    offsets_tp = s.add_offsets("t", pid, epoch, "g", T0 + 2)
    assert offsets_tp == ("__consumer_offsets", partition_for("g", 50))
    meta = s.describe("t")
    assert (meta.state, meta.start_ms) == (TxnState.ONGOING, T0 + 1)
    assert meta.partitions == {("out", 0), ("out", 1), offsets_tp}
    s.end_transaction("t", pid, epoch, commit=True, now_ms=T0 + 3)
    [job] = s.pending_markers()
    assert job.commit and job.partitions == meta.partitions and job.producer_epoch == 0
    assert error_of(lambda: s.add_partitions("t", pid, epoch, [("x", 0)], T0 + 4)) is (
        ErrorCode.CONCURRENT_TRANSACTIONS
    )
    assert s.complete(job, T0 + 5)
    done = s.describe("t")
    assert (done.state, done.partitions, done.start_ms) == (
        TxnState.COMPLETE_COMMIT,
        frozenset(),
        -1,
    )
    assert s.pending_markers() == []
    s.end_transaction("t", pid, epoch, commit=True, now_ms=T0 + 6)  # a retry: answered the same
    assert error_of(lambda: s.end_transaction("t", pid, epoch, False, T0 + 7)) is (
        ErrorCode.INVALID_TXN_STATE
    )
    assert replayed(s, s.take_emitted()) == s.transactions


def test_each_preparation_is_its_own_job_though_producer_and_partitions_repeat() -> None:
    """Found by the chaos harness: without an epoch bump per transaction, the next transaction
    of a producer over the same partitions made the same MarkerJob as the last one, so a
    coordinator still holding the finished job never wrote the new one's markers."""
    s = shard()
    pid, epoch = s.init_producer_id("t", TIMEOUT_MS, T0)
    jobs = []
    for n in range(2):
        s.add_partitions("t", pid, epoch, [("out", 0)], T0 + 10 * n)
        s.end_transaction("t", pid, epoch, commit=True, now_ms=T0 + 10 * n + 1)
        [job] = s.pending_markers()
        jobs.append(job)
        if n == 0:
            assert s.complete(job, T0 + 2)
    first, second = jobs
    assert first != second and first.partitions == second.partitions
    assert not s.complete(first, T0 + 20)  # a stale job never completes the next transaction
    assert s.describe("t").state is TxnState.PREPARE_COMMIT
    again = shard()  # a new coordinator's load names the pending one afresh, and completes it
    for key, value in s.take_emitted():
        again.replay(key, value)
    [loaded] = again.pending_markers()
    assert again.complete(loaded, T0 + 21)


def test_a_new_producer_fences_the_old_and_aborts_its_transaction() -> None:
    s = shard()
    pid, old = s.init_producer_id("t", TIMEOUT_MS, T0)
    s.add_partitions("t", pid, old, [("out", 0)], T0)
    assert error_of(lambda: s.init_producer_id("t", TIMEOUT_MS, T0 + 1)) is (
        ErrorCode.CONCURRENT_TRANSACTIONS
    )
    fenced = s.describe("t")
    assert (fenced.state, fenced.producer_epoch) == (TxnState.PREPARE_ABORT, old + 1)
    [job] = s.pending_markers()
    assert not job.commit and job.producer_epoch == old + 1  # markers carry the new epoch
    # the zombie can neither write nor end
    assert error_of(lambda: s.add_partitions("t", pid, old, [("out", 1)], T0 + 2)) is (
        ErrorCode.PRODUCER_FENCED
    )
    assert error_of(lambda: s.end_transaction("t", pid, old, True, T0 + 2)) is (
        ErrorCode.PRODUCER_FENCED
    )
    assert s.complete(job, T0 + 3)
    assert s.init_producer_id("t", TIMEOUT_MS, T0 + 4) == (pid, old + 2)
    assert s.verify("t", pid, old, ("out", 0)) is ErrorCode.PRODUCER_FENCED


def test_kip_360_a_producer_recovers_with_its_own_id_and_epoch() -> None:
    s = shard()
    pid, epoch = s.init_producer_id("t", TIMEOUT_MS, T0)
    assert s.init_producer_id("t", TIMEOUT_MS, T0 + 1, expected=(pid, epoch)) == (pid, epoch + 1)
    # the answer was lost and the producer retries with what it had: the same bump, not another
    assert s.init_producer_id("t", TIMEOUT_MS, T0 + 2, expected=(pid, epoch)) == (pid, epoch + 1)
    assert error_of(lambda: s.init_producer_id("t", TIMEOUT_MS, T0, expected=(pid, 7))) is (
        ErrorCode.PRODUCER_FENCED
    )
    assert error_of(lambda: s.init_producer_id("new", TIMEOUT_MS, T0, expected=(5, 0))) is (
        ErrorCode.INVALID_PRODUCER_ID_MAPPING
    )


def test_an_exhausted_epoch_rotates_the_producer_id() -> None:
    s = shard()
    pid, _ = s.init_producer_id("t", TIMEOUT_MS, T0)
    key, _value = s.take_emitted()[0]
    worn = TxnMetadata("t", pid, EPOCH_MAX - 1, TIMEOUT_MS, last_update_ms=T0)
    s.replay(key, encode(worn))
    new_pid, epoch = s.init_producer_id("t", TIMEOUT_MS, T0 + 1)
    assert new_pid != pid and epoch == 0
    assert s.describe("t").previous_producer_id == pid


def test_timeouts_abort_and_idle_ids_expire() -> None:
    s = TransactionShard(lambda: 7, TxnLimits(id_expiration_ms=10_000))
    pid, epoch = s.init_producer_id("t", 5_000, T0)
    s.add_partitions("t", pid, epoch, [("out", 0)], T0)
    assert s.abort_timed_out(T0 + 5_000) == []
    assert s.abort_timed_out(T0 + 5_001) == ["t"]
    [job] = s.pending_markers()
    assert not job.commit and s.describe("t").producer_epoch == epoch + 1
    s.complete(job, T0 + 5_002)
    assert s.expire_ids(T0 + 15_002) == []
    assert s.expire_ids(T0 + 15_003) == ["t"]
    assert error_of(lambda: s.describe("t")) is ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
    records = s.take_emitted()
    assert records[-1][1] is None, "an expired id leaves a tombstone"
    assert replayed(s, records) == {}


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda s: s.init_producer_id("t", 900_001, T0), ErrorCode.INVALID_TRANSACTION_TIMEOUT),
        (lambda s: s.init_producer_id("t", 0, T0), ErrorCode.INVALID_TRANSACTION_TIMEOUT),
        (lambda s: s.init_producer_id("", TIMEOUT_MS, T0), ErrorCode.INVALID_REQUEST),
        (lambda s: s.end_transaction("nope", 1, 0, True, T0),
         ErrorCode.INVALID_PRODUCER_ID_MAPPING),
        (lambda s: s.add_partitions("nope", 1, 0, [("a", 0)], T0),
         ErrorCode.INVALID_PRODUCER_ID_MAPPING),
        (lambda s: s.describe("nope"), ErrorCode.TRANSACTIONAL_ID_NOT_FOUND),
    ],
)  # fmt: skip
def test_bad_requests_change_nothing(
    call: Callable[[TransactionShard], object], error: ErrorCode
) -> None:
    s = shard()
    assert error_of(lambda: call(s)) is error
    assert s.take_emitted() == [] and s.transactions == {}


def test_ending_a_transaction_that_never_began_is_invalid() -> None:
    s = shard()
    pid, epoch = s.init_producer_id("t", TIMEOUT_MS, T0)
    assert error_of(lambda: s.end_transaction("t", pid, epoch, True, T0)) is (
        ErrorCode.INVALID_TXN_STATE
    )


def test_the_transition_table_is_kafkas() -> None:
    assert LEGAL[TxnState.PREPARE_COMMIT] == {TxnState.COMPLETE_COMMIT}
    assert LEGAL[TxnState.PREPARE_EPOCH_FENCE] == {TxnState.PREPARE_ABORT}
    assert LEGAL[TxnState.DEAD] == frozenset()
    assert TxnState.PREPARE_EPOCH_FENCE.kafka_name == "PrepareEpochFence"
    with pytest.raises(AssertionError, match="illegal move"):
        TransactionShard._transition(
            TxnMetadata("t", 1, 0, 1000, state=TxnState.EMPTY), TxnState.COMPLETE_COMMIT
        )


class Transactions(RuleBasedStateMachine):
    """Any sequence of requests: every emitted record replays to the same state, states move
    only along the table, epochs never go back, and a prepared transaction has markers due."""

    def __init__(self) -> None:
        super().__init__()
        self.shard = shard()
        self.log: list[tuple[bytes, bytes | None]] = []
        self.now = T0
        self.seen: dict[str, tuple[int, int, TxnState]] = {}
        self.held: dict[str, tuple[int, int]] = {}

    def _call(self, call: Callable[[], object]) -> None:
        with contextlib.suppress(KafkaError):  # a refusal emits nothing: the invariants check
            call()
        self.log += self.shard.take_emitted()

    @rule(tid=st.sampled_from(["a", "b"]), advance=st.integers(0, 30_000))
    def init(self, tid: str, advance: int) -> None:
        self.now += advance

        def call() -> None:
            self.held[tid] = self.shard.init_producer_id(tid, 20_000, self.now)

        self._call(call)

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data(), partition=st.integers(0, 2))
    def add(self, data: st.DataObject, partition: int) -> None:
        tid = data.draw(st.sampled_from(sorted(self.held)))
        pid, epoch = self.held[tid]
        self._call(lambda: self.shard.add_partitions(tid, pid, epoch, [("o", partition)], self.now))

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data(), commit=st.booleans())
    def end(self, data: st.DataObject, commit: bool) -> None:
        tid = data.draw(st.sampled_from(sorted(self.held)))
        pid, epoch = self.held[tid]
        self._call(lambda: self.shard.end_transaction(tid, pid, epoch, commit, self.now))

    @rule()
    def markers(self) -> None:
        for job in self.shard.pending_markers():
            assert job.partitions, "a prepared transaction names its partitions"
            self.shard.complete(job, self.now)
        self.log += self.shard.take_emitted()

    @rule(advance=st.integers(0, 40_000))
    def timers(self, advance: int) -> None:
        self.now += advance
        self.shard.abort_timed_out(self.now)
        self.log += self.shard.take_emitted()

    @invariant()
    def replay_rebuilds_the_state(self) -> None:
        assert replayed(self.shard, self.log) == self.shard.transactions

    @invariant()
    def states_move_along_the_table_and_epochs_never_go_back(self) -> None:
        for tid, meta in self.shard.transactions.items():
            before = self.seen.get(tid)
            if before is not None and before[0] == meta.producer_id:
                assert meta.producer_epoch >= before[1]
                if meta.state is not before[2] and before[2] is not TxnState.ONGOING:
                    assert meta.state in LEGAL[before[2]]
            self.seen[tid] = (meta.producer_id, meta.producer_epoch, meta.state)


TestTransactions = Transactions.TestCase
TestTransactions.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
