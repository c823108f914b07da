"""The transactional producer: the state machine alone, then the producer against fake brokers
and a fake transaction coordinator (``fake_transactions``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dataplane.client import (
    AbortableTransactionError,
    AdminClient,
    ConsumerGroupMetadata,
    OffsetAndMetadata,
    Producer,
    ProducerFencedError,
    TopicPartition,
    TransactionAbortedError,
    TransactionStateError,
)
from dataplane.client._transactions import (
    TRANSITIONS,
    TransactionManager,
    TransactionState,
    classify,
)
from protos import broker_pb2 as pb
from protos import group_pb2 as gpb
from raftlog.batch import iter_batches
from raftlog.errors import ErrorCode, KafkaError
from tests.dataplane.client.fake_transactions import FakeCoordinator, fake_txn_brokers
from tests.dataplane.fake_broker import FakeCluster, bootstrap

S = TransactionState
TP = TopicPartition("t", 0)
FAST: dict[str, Any] = {
    "retry_backoff_ms": 10,
    "request_timeout_ms": 5_000,
    "delivery_timeout_ms": 20_000,
    "max_block_ms": 10_000,
}


# -- the state machine ---------------------------------------------------------------------------
def manager_in(state: TransactionState) -> TransactionManager:
    """A manager driven into ``state`` through legal transitions."""
    m = TransactionManager("tid", 60_000)
    if state is S.UNINITIALIZED:
        return m
    m.begin_init()
    if state is S.INITIALIZING:
        return m
    m.initialized(7, 0)
    if state is S.READY:
        return m
    m.begin_transaction()
    if state is S.IN_TRANSACTION:
        return m
    if state is S.COMMITTING_TRANSACTION:
        m.begin_commit()
    elif state is S.ABORTING_TRANSACTION:
        m.begin_abort()
    elif state is S.ABORTABLE_ERROR:
        m.fail(KafkaError(ErrorCode.MESSAGE_TOO_LARGE, "big"), "abortable")
    elif state is S.FATAL_ERROR:
        m.fail(KafkaError(ErrorCode.PRODUCER_FENCED, "fenced"), "fatal")
    assert m.state is state
    return m


def state_of(m: TransactionManager) -> TransactionState:
    """The state, read afresh (not narrowed by an earlier assert)."""
    return m.state


CALLS = {
    "begin_transaction": lambda m: m.begin_transaction(),
    "begin_commit": lambda m: m.begin_commit(),
    "begin_abort": lambda m: m.begin_abort(),
    "check_can_send": lambda m: m.check_can_send(),
    "begin_init": lambda m: m.begin_init(),
}
# (state, call) -> the state after it, or the exception it raises
EXPECTED: dict[tuple[TransactionState, str], TransactionState | type[BaseException]] = {
    (S.UNINITIALIZED, "begin_transaction"): TransactionStateError,
    (S.UNINITIALIZED, "begin_commit"): TransactionStateError,
    (S.UNINITIALIZED, "begin_abort"): TransactionStateError,
    (S.UNINITIALIZED, "check_can_send"): TransactionStateError,
    (S.UNINITIALIZED, "begin_init"): S.INITIALIZING,
    (S.INITIALIZING, "begin_init"): S.INITIALIZING,  # a retried init carries on
    (S.INITIALIZING, "begin_transaction"): TransactionStateError,
    (S.READY, "begin_transaction"): S.IN_TRANSACTION,
    (S.READY, "begin_commit"): TransactionStateError,  # commit without begin
    (S.READY, "begin_abort"): TransactionStateError,
    (S.READY, "check_can_send"): TransactionStateError,  # send outside a transaction
    (S.READY, "begin_init"): TransactionStateError,
    (S.IN_TRANSACTION, "begin_transaction"): TransactionStateError,
    (S.IN_TRANSACTION, "begin_commit"): S.COMMITTING_TRANSACTION,
    (S.IN_TRANSACTION, "begin_abort"): S.ABORTING_TRANSACTION,
    (S.IN_TRANSACTION, "check_can_send"): S.IN_TRANSACTION,
    (S.COMMITTING_TRANSACTION, "begin_commit"): S.COMMITTING_TRANSACTION,  # retried commit
    (S.COMMITTING_TRANSACTION, "begin_abort"): TransactionStateError,
    (S.COMMITTING_TRANSACTION, "check_can_send"): TransactionStateError,
    (S.ABORTING_TRANSACTION, "begin_abort"): S.ABORTING_TRANSACTION,
    (S.ABORTING_TRANSACTION, "begin_commit"): TransactionStateError,
    (S.ABORTABLE_ERROR, "begin_commit"): AbortableTransactionError,
    (S.ABORTABLE_ERROR, "check_can_send"): AbortableTransactionError,
    (S.ABORTABLE_ERROR, "begin_transaction"): AbortableTransactionError,
    (S.ABORTABLE_ERROR, "begin_abort"): S.ABORTING_TRANSACTION,
    (S.FATAL_ERROR, "begin_abort"): ProducerFencedError,
    (S.FATAL_ERROR, "begin_commit"): ProducerFencedError,
    (S.FATAL_ERROR, "begin_transaction"): ProducerFencedError,
    (S.FATAL_ERROR, "check_can_send"): ProducerFencedError,
    (S.FATAL_ERROR, "begin_init"): ProducerFencedError,
}


@pytest.mark.parametrize(("state", "call"), sorted(EXPECTED, key=str))
def test_calls_in_each_state(state: TransactionState, call: str) -> None:
    manager = manager_in(state)
    expected = EXPECTED[(state, call)]
    if isinstance(expected, TransactionState):
        CALLS[call](manager)
        assert manager.state is expected
    else:
        with pytest.raises(expected):
            CALLS[call](manager)
        assert manager.state is state  # a refused call changes nothing


def test_the_transition_table_is_kafkas() -> None:
    assert TRANSITIONS[S.IN_TRANSACTION] == {S.READY}
    assert TRANSITIONS[S.ABORTING_TRANSACTION] == {S.IN_TRANSACTION, S.ABORTABLE_ERROR}
    assert TRANSITIONS[S.FATAL_ERROR] == set(S)
    assert S.FATAL_ERROR not in {s for targets in TRANSITIONS.values() for s in targets} - set(
        TRANSITIONS[S.FATAL_ERROR]
    )


@pytest.mark.parametrize(
    ("code", "produce", "severity"),
    [
        (ErrorCode.PRODUCER_FENCED, False, "fatal"),
        (ErrorCode.PRODUCER_FENCED, True, "fatal"),
        (ErrorCode.INVALID_PRODUCER_EPOCH, False, "fatal"),  # the coordinator's answer
        (ErrorCode.INVALID_PRODUCER_EPOCH, True, "abortable"),  # a Produce's (KIP-588)
        (ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, True, "fatal"),
        (ErrorCode.UNSUPPORTED_VERSION, False, "fatal"),
        (ErrorCode.INVALID_TXN_STATE, False, "fatal"),
        (ErrorCode.CONCURRENT_TRANSACTIONS, False, "retriable"),
        (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, False, "retriable"),
        (ErrorCode.NOT_COORDINATOR, False, "retriable"),
        (ErrorCode.MESSAGE_TOO_LARGE, True, "abortable"),
        (ErrorCode.ILLEGAL_GENERATION, False, "abortable"),
        (ErrorCode.UNKNOWN_MEMBER_ID, False, "abortable"),
    ],
)
def test_error_classification(code: ErrorCode, produce: bool, severity: str) -> None:
    assert classify(code, produce=produce) == severity


def test_partitions_are_added_once_and_sendable_after() -> None:
    m = manager_in(S.IN_TRANSACTION)
    m.maybe_add_partition(TP)
    m.maybe_add_partition(TP)
    assert not m.is_sendable(TP)
    assert m.take_pending() == [TP]
    m.maybe_add_partition(TP)  # being added: not again
    assert m.take_pending() == []
    m.add_partitions_retry([TP])
    assert m.take_pending() == [TP]
    m.partitions_added([TP])
    assert m.is_sendable(TP) and m.transaction_started()
    m.begin_commit()
    assert m.is_sendable(TP)  # the commit's flush sends them
    m.completed()
    assert m.state is S.READY and not m.is_sendable(TP) and not m.transaction_started()


def test_a_failed_batch_makes_the_transaction_abortable_and_asks_for_an_epoch_bump() -> None:
    m = manager_in(S.IN_TRANSACTION)
    m.batch_failed(KafkaError(ErrorCode.INVALID_PRODUCER_EPOCH, "old"), sequences_spent=True)
    assert m.state is S.ABORTABLE_ERROR and m.epoch_bump_required
    error = m.last_error()
    assert isinstance(error, AbortableTransactionError)
    assert error.error is ErrorCode.INVALID_PRODUCER_EPOCH
    m.batch_failed(KafkaError(ErrorCode.MESSAGE_TOO_LARGE, "later"), sequences_spent=False)
    assert m.last_error() is error  # the first error is kept
    assert isinstance(m.queued_batch_error(), AbortableTransactionError)
    m.begin_abort()
    assert isinstance(m.queued_batch_error(), TransactionAbortedError)
    m.begin_epoch_bump()
    m.initialized(7, 1)
    assert state_of(m) is S.READY and not m.epoch_bump_required
    assert m.producer_id_and_epoch() == (7, 1)


def test_a_fenced_batch_is_fatal_and_stays_fatal() -> None:
    m = manager_in(S.IN_TRANSACTION)
    m.batch_failed(KafkaError(ErrorCode.PRODUCER_FENCED, "newer"), sequences_spent=True)
    assert m.state is S.FATAL_ERROR
    assert isinstance(m.last_error(), ProducerFencedError)
    assert m.fail(KafkaError(ErrorCode.MESSAGE_TOO_LARGE, "x"), "abortable") is m.last_error()
    assert m.state is S.FATAL_ERROR


def test_any_init_failure_is_fatal() -> None:
    m = manager_in(S.INITIALIZING)
    raised = m.fail(KafkaError(ErrorCode.INVALID_REQUEST, "no"), "abortable")
    assert m.state is S.FATAL_ERROR and raised is m.last_error()


# -- the producer against fakes --------------------------------------------------------------------
@pytest.fixture
def fakes() -> Iterator[tuple[FakeCluster, FakeCoordinator]]:
    with fake_txn_brokers(2) as (cluster, coordinator):
        cluster.create_topic("t", 2, leaders=[1, 2])
        yield cluster, coordinator


def transactional(cluster: FakeCluster, tid: str = "tid", **settings: Any) -> Producer:
    return Producer(bootstrap(cluster), transactional_id=tid, **{**FAST, **settings})


def test_config_rules() -> None:
    with pytest.raises(ValueError, match=r"requires enable\.idempotence"):
        Producer("127.0.0.1:1", transactional_id="x", enable_idempotence=False)
    with pytest.raises(ValueError, match="requires acks=all"):
        Producer("127.0.0.1:1", transactional_id="x", acks=1)
    with (
        Producer("127.0.0.1:1", linger_ms=0) as plain,
        pytest.raises(TransactionStateError, match="transactional_id"),
    ):
        plain.begin_transaction()


def test_commit_adds_partitions_before_the_batches_and_marks_them_transactional(
    fakes: tuple[FakeCluster, FakeCoordinator],
) -> None:
    cluster, coordinator = fakes
    with transactional(cluster) as producer:
        producer.init_transactions(10)
        producer.begin_transaction()
        futures = [producer.send("t", b"v%d" % i, partition=i % 2) for i in range(10)]
        producer.commit_transaction(10)
        assert [f.result(0).offset for f in futures] == [i // 2 for i in range(10)]
    methods = coordinator.methods()
    assert methods[0] == "FindCoordinator"
    assert methods.index("InitProducerId") < methods.index("AddPartitionsToTxn")
    assert methods.count("AddPartitionsToTxn") == 1  # both partitions in one request
    [(_, added)] = [c for c in coordinator.calls if c[0] == "AddPartitionsToTxn"]
    assert {(t.topic, p) for t in added.topics for p in t.partitions} == {("t", 0), ("t", 1)}  # type: ignore[attr-defined]
    assert methods[-1] == "EndTxn"
    [ended] = coordinator.ended
    assert ended.committed and ended.partitions == {("t", 0), ("t", 1)}
    requests: list[pb.ProduceRequest] = cluster.produce_requests
    assert requests and all(r.transactional_id == "tid" for r in requests)
    for partition in (0, 1):
        for state in [cluster.topics["t"][partition]]:
            for batch in state.batches:
                _, header = next(iter_batches(batch))
                assert header.is_transactional and header.producer_id == 5000


def test_an_empty_transaction_commits_without_the_coordinator(
    fakes: tuple[FakeCluster, FakeCoordinator],
) -> None:
    cluster, coordinator = fakes
    with transactional(cluster) as producer:
        producer.init_transactions(10)
        producer.begin_transaction()
        producer.commit_transaction(10)
        producer.begin_transaction()
        producer.abort_transaction(10)
    assert "EndTxn" not in coordinator.methods()


def test_abort_fails_the_unsent_records_and_sends_nothing(
    fakes: tuple[FakeCluster, FakeCoordinator],
) -> None:
    cluster, coordinator = fakes
    with transactional(cluster, linger_ms=60_000, delivery_timeout_ms=120_000) as producer:
        producer.init_transactions(10)
        producer.begin_transaction()
        future = producer.send("t", b"never", partition=0)
        producer.abort_transaction(10)
        assert isinstance(future.exception(0), TransactionAbortedError)
        producer.begin_transaction()  # READY again
        producer.send("t", b"kept", partition=0)
        producer.commit_transaction(10)
    assert cluster.values("t", 0) == [b"kept"]
    # the aborted one ended at the coordinator only if the sender had added its partition
    assert [e.committed for e in coordinator.ended] in ([False, True], [True])


def test_state_errors_raise_at_once(fakes: tuple[FakeCluster, FakeCoordinator]) -> None:
    cluster, _ = fakes
    with transactional(cluster) as producer:
        with pytest.raises(TransactionStateError):
            producer.begin_transaction()  # before init_transactions
        producer.init_transactions(10)
        with pytest.raises(TransactionStateError):
            producer.commit_transaction(1)  # without begin
        with pytest.raises(TransactionStateError):
            producer.send("t", b"x")  # outside a transaction
        with pytest.raises(TransactionStateError):
            producer.init_transactions(1)  # twice


def test_a_record_too_large_is_abortable(fakes: tuple[FakeCluster, FakeCoordinator]) -> None:
    cluster, coordinator = fakes
    with transactional(cluster, max_request_size=1000) as producer:
        producer.init_transactions(10)
        producer.begin_transaction()
        producer.send("t", b"small", partition=0)
        too_big = producer.send("t", b"x" * 2000, partition=0)
        assert isinstance(too_big.exception(0), KafkaError)
        with pytest.raises(AbortableTransactionError) as raised:
            producer.send("t", b"after", partition=0)
        assert raised.value.error is ErrorCode.MESSAGE_TOO_LARGE
        with pytest.raises(AbortableTransactionError):
            producer.commit_transaction(10)
        producer.abort_transaction(10)
        producer.begin_transaction()
        producer.send("t", b"next", partition=1)
        producer.commit_transaction(10)
    assert cluster.values("t", 1) == [b"next"]
    assert [e.committed for e in coordinator.ended] in ([False, True], [True])


def test_a_broker_refusal_inside_the_transaction_aborts_with_an_epoch_bump(
    fakes: tuple[FakeCluster, FakeCoordinator],
) -> None:
    cluster, coordinator = fakes
    with transactional(cluster) as producer:
        producer.init_transactions(10)
        producer.begin_transaction()
        cluster.inject("t", 0, ErrorCode.INVALID_RECORD)
        failed = producer.send("t", b"refused", partition=0)
        with pytest.raises(AbortableTransactionError) as raised:
            producer.commit_transaction(10)
        assert raised.value.error is ErrorCode.INVALID_RECORD
        assert isinstance(failed.exception(0), KafkaError)
        producer.abort_transaction(10)
        # the sequences of the refused batch are spent: a new epoch starts them again
        [_, bump] = [r for m, r in coordinator.calls if m == "InitProducerId"]
        assert bump.producer_epoch == 0  # type: ignore[attr-defined]
        producer.begin_transaction()
        future = producer.send("t", b"again", partition=0)
        producer.commit_transaction(10)
        assert future.result(0).offset == 0
    assert coordinator.txns["tid"].producer_epoch == 1


def test_retriable_coordinator_answers_are_retried(
    fakes: tuple[FakeCluster, FakeCoordinator],
) -> None:
    cluster, coordinator = fakes
    coordinator.inject("InitProducerId", ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
    coordinator.inject("AddPartitionsToTxn", ErrorCode.CONCURRENT_TRANSACTIONS)
    coordinator.inject("EndTxn", ErrorCode.NOT_COORDINATOR, ErrorCode.CONCURRENT_TRANSACTIONS)
    with transactional(cluster) as producer:
        producer.init_transactions(10)
        producer.begin_transaction()
        future = producer.send("t", b"v", partition=0)
        producer.commit_transaction(10)
        assert future.result(0).offset == 0
    methods = coordinator.methods()
    assert methods.count("InitProducerId") == 2
    assert methods.count("AddPartitionsToTxn") == 2
    assert methods.count("EndTxn") == 3
    assert [e.committed for e in coordinator.ended] == [True]


def test_a_newer_producer_fences_the_older_one(
    fakes: tuple[FakeCluster, FakeCoordinator],
) -> None:
    cluster, _ = fakes
    with transactional(cluster) as zombie, transactional(cluster) as newer:
        zombie.init_transactions(10)
        zombie.begin_transaction()
        newer.init_transactions(10)  # epoch 1: the zombie (epoch 0) is fenced
        future = zombie.send("t", b"zombie", partition=0)
        with pytest.raises(ProducerFencedError):
            zombie.commit_transaction(10)
        assert isinstance(future.exception(0), ProducerFencedError)
        with pytest.raises(ProducerFencedError):
            zombie.abort_transaction(10)
        with pytest.raises(ProducerFencedError):
            zombie.send("t", b"more", partition=0)
        newer.begin_transaction()
        newer.send("t", b"newer", partition=0)
        newer.commit_transaction(10)
    assert cluster.values("t", 0) == [b"newer"]


def test_send_offsets_to_transaction(fakes: tuple[FakeCluster, FakeCoordinator]) -> None:
    cluster, coordinator = fakes
    with transactional(cluster) as producer:
        producer.init_transactions(10)
        with pytest.raises(TransactionStateError):
            producer.send_offsets_to_transaction({TP: 1}, "g", 1)  # outside a transaction
        producer.begin_transaction()
        group = ConsumerGroupMetadata("g", generation_id=3, member_id="m-1")
        offsets: dict[tuple[str, int], int | OffsetAndMetadata] = {
            TopicPartition("in", 0): 17,
            ("in", 1): OffsetAndMetadata(5, "meta"),
        }
        producer.send_offsets_to_transaction(offsets, group, 10)
        producer.commit_transaction(10)
    [commit] = coordinator.offset_commits
    assert isinstance(commit, gpb.TxnOffsetCommitRequest)
    assert (commit.group_id, commit.generation_id, commit.member_id) == ("g", 3, "m-1")
    assert (commit.producer_id, commit.producer_epoch, commit.transactional_id) == (5000, 0, "tid")
    sent = {(t.name, p.partition): (p.committed_offset, p.metadata) for t in commit.topics
            for p in t.partitions}  # fmt: skip
    assert sent == {("in", 0): (17, ""), ("in", 1): (5, "meta")}
    [ended] = coordinator.ended
    assert ended.committed and ended.groups == {"g"} and not ended.partitions


def test_offsets_refused_for_a_fenced_member_are_abortable(
    fakes: tuple[FakeCluster, FakeCoordinator],
) -> None:
    cluster, coordinator = fakes
    coordinator.inject("TxnOffsetCommit", ErrorCode.ILLEGAL_GENERATION)
    with transactional(cluster) as producer:
        producer.init_transactions(10)
        producer.begin_transaction()
        with pytest.raises(AbortableTransactionError) as raised:
            producer.send_offsets_to_transaction({TP: 1}, ConsumerGroupMetadata("g", 1, "m"), 10)
        assert raised.value.error is ErrorCode.ILLEGAL_GENERATION
        producer.abort_transaction(10)
    assert [e.committed for e in coordinator.ended] == [False]


def test_admin_describes_and_lists_transactions(
    fakes: tuple[FakeCluster, FakeCoordinator],
) -> None:
    cluster, _ = fakes
    cluster.controller_addresses = ("127.0.0.1:9",)  # never called: the calls go to brokers
    with transactional(cluster) as producer, AdminClient(bootstrap(cluster)) as admin:
        producer.init_transactions(10)
        producer.begin_transaction()
        producer.send("t", b"v", partition=1).result(10)
        described = admin.describe_transactions(["tid"])["tid"]
        assert (described.state, described.producer_id, described.coordinator_id) == (
            "Ongoing", 5000, 1)  # fmt: skip
        assert described.topic_partitions == {TopicPartition("t", 1)}
        assert described.transaction_start_ms == 1000
        # every broker answers (each fake lists every id): merged by transactional id
        [listed] = admin.list_transactions(states=["Ongoing"])
        assert (listed.transactional_id, listed.producer_id, listed.state) == (
            "tid", 5000, "Ongoing")  # fmt: skip
        assert admin.list_transactions(states=["CompleteCommit"]) == []
        with pytest.raises(KafkaError) as missing:
            admin.describe_transactions(["nope"])
        assert missing.value.error is ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
        producer.abort_transaction(10)


def test_a_missing_topic_is_abortable(fakes: tuple[FakeCluster, FakeCoordinator]) -> None:
    cluster, _ = fakes
    with transactional(cluster, max_block_ms=300) as producer:
        producer.init_transactions(10)
        producer.begin_transaction()
        future = producer.send("missing", b"v")
        assert isinstance(future.exception(0), KafkaError)
        with pytest.raises(AbortableTransactionError):
            producer.commit_transaction(10)
        producer.abort_transaction(10)
        producer.begin_transaction()  # usable again


def test_invalid_producer_epoch_from_the_coordinator_is_fencing(
    fakes: tuple[FakeCluster, FakeCoordinator],
) -> None:
    cluster, coordinator = fakes
    coordinator.inject("EndTxn", ErrorCode.INVALID_PRODUCER_EPOCH)
    with transactional(cluster) as producer:
        producer.init_transactions(10)
        producer.begin_transaction()
        producer.send("t", b"v", partition=0)
        with pytest.raises(ProducerFencedError) as raised:
            producer.commit_transaction(10)
        assert raised.value.error is ErrorCode.INVALID_PRODUCER_EPOCH
        with pytest.raises(ProducerFencedError):
            producer.begin_transaction()
