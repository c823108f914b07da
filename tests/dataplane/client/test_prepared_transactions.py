"""Two-phase commit (KIP-939's shape): ``Producer.prepare_transaction`` and
``complete_prepared_transaction``, against the fake brokers and coordinator
(``fake_transactions``)."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pytest

from dataplane.client import (
    PreparedTransaction,
    PreparedTransactionFencedError,
    Producer,
    ProducerFencedError,
    TransactionStateError,
    complete_prepared_transaction,
)
from dataplane.client._accumulator import ProducerTimeoutError
from dataplane.client._transactions import TRANSITIONS, TransactionState
from raftlog.errors import ErrorCode, KafkaError
from tests.dataplane.client.fake_transactions import FakeCoordinator, fake_txn_brokers
from tests.dataplane.fake_broker import FakeCluster, bootstrap

S = TransactionState
FAST: dict[str, Any] = {
    "retry_backoff_ms": 10,
    "request_timeout_ms": 5_000,
    "delivery_timeout_ms": 20_000,
    "max_block_ms": 10_000,
}


@pytest.fixture
def fakes() -> Iterator[tuple[FakeCluster, FakeCoordinator]]:
    with fake_txn_brokers(2) as (cluster, coordinator):
        cluster.create_topic("t", 2, leaders=[1, 2])
        yield cluster, coordinator


def prepare(cluster: FakeCluster, tid: str = "tid", records: int = 4) -> PreparedTransaction:
    """A transaction of ``records`` records prepared by a producer that is then closed."""
    with Producer(bootstrap(cluster), transactional_id=tid, **FAST) as producer:
        producer.init_transactions(10)
        producer.begin_transaction()
        futures = [producer.send("t", b"v%d" % i, partition=i % 2) for i in range(records)]
        prepared = producer.prepare_transaction(10)
        assert all(f.done() and f.exception(0) is None for f in futures)  # all acknowledged
        for call in (
            producer.begin_transaction,
            lambda: producer.send("t", b"late", partition=0),
            producer.commit_transaction,
            producer.abort_transaction,
        ):
            with pytest.raises(TransactionStateError):  # only close() is left
                call()
    return prepared


def test_prepared_is_a_state_reached_only_from_an_open_transaction() -> None:
    assert TRANSITIONS[S.PREPARED_TRANSACTION] == {S.IN_TRANSACTION}
    assert S.PREPARED_TRANSACTION not in {
        s for k, v in TRANSITIONS.items() if k is not S.FATAL_ERROR for s in v
    }


def test_prepare_leaves_the_transaction_open_and_close_does_not_abort_it(
    fakes: tuple[FakeCluster, FakeCoordinator],
) -> None:
    cluster, coordinator = fakes
    prepared = prepare(cluster)
    assert prepared == PreparedTransaction("tid", 5000, 0)
    assert pickle.loads(pickle.dumps(prepared)) == prepared  # travels to the driver
    assert coordinator.txns["tid"].state == "Ongoing" and not coordinator.ended
    assert "EndTxn" not in coordinator.methods()


def test_another_process_commits_it_and_a_repeat_succeeds(
    fakes: tuple[FakeCluster, FakeCoordinator],
) -> None:
    cluster, coordinator = fakes
    prepared = prepare(cluster)
    complete_prepared_transaction(bootstrap(cluster), prepared, commit=True, timeout_s=10)
    [ended] = coordinator.ended
    assert ended.committed and ended.partitions == {("t", 0), ("t", 1)}
    # a driver that died after the commit and commits again on restart: success, no second end
    complete_prepared_transaction(bootstrap(cluster), prepared, commit=True, timeout_s=10)
    assert len(coordinator.ended) == 1
    with pytest.raises(KafkaError) as refused:  # aborting what committed is Kafka's error
        complete_prepared_transaction(bootstrap(cluster), prepared, commit=False, timeout_s=10)
    assert refused.value.error is ErrorCode.INVALID_TXN_STATE


def test_abort_of_a_prepared_transaction(fakes: tuple[FakeCluster, FakeCoordinator]) -> None:
    cluster, coordinator = fakes
    prepared = prepare(cluster)
    complete_prepared_transaction(bootstrap(cluster), prepared, commit=False, timeout_s=10)
    assert [e.committed for e in coordinator.ended] == [False]


def test_retriable_answers_are_retried(fakes: tuple[FakeCluster, FakeCoordinator]) -> None:
    cluster, coordinator = fakes
    prepared = prepare(cluster)
    coordinator.inject(
        "EndTxn",
        ErrorCode.CONCURRENT_TRANSACTIONS,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    )
    complete_prepared_transaction(bootstrap(cluster), prepared, commit=True, timeout_s=10)
    assert coordinator.methods().count("EndTxn") == 4
    assert [e.committed for e in coordinator.ended] == [True]


def test_out_of_time_while_retrying(fakes: tuple[FakeCluster, FakeCoordinator]) -> None:
    cluster, coordinator = fakes
    prepared = prepare(cluster)
    coordinator.inject("EndTxn", *[ErrorCode.CONCURRENT_TRANSACTIONS] * 1000)
    with pytest.raises(ProducerTimeoutError, match="did not succeed in time"):
        complete_prepared_transaction(bootstrap(cluster), prepared, commit=True, timeout_s=0.3)
    assert coordinator.txns["tid"].state == "Ongoing"  # may be completed later


def test_a_newer_producer_takes_the_transaction_over(
    fakes: tuple[FakeCluster, FakeCoordinator],
) -> None:
    cluster, coordinator = fakes
    prepared = prepare(cluster)
    with Producer(bootstrap(cluster), transactional_id="tid", **FAST) as newer:
        newer.init_transactions(10)  # aborts the prepared transaction, bumps the epoch
    assert [e.committed for e in coordinator.ended] == [False]
    with pytest.raises(PreparedTransactionFencedError, match="taken over") as fenced:
        complete_prepared_transaction(bootstrap(cluster), prepared, commit=True, timeout_s=10)
    assert fenced.value.error is ErrorCode.PRODUCER_FENCED
    assert isinstance(fenced.value, ProducerFencedError)
    coordinator.inject("EndTxn", ErrorCode.INVALID_PRODUCER_EPOCH)
    with pytest.raises(PreparedTransactionFencedError):
        complete_prepared_transaction(bootstrap(cluster), prepared, commit=False, timeout_s=10)


def test_an_empty_transaction_cannot_be_prepared(
    fakes: tuple[FakeCluster, FakeCoordinator],
) -> None:
    cluster, _ = fakes
    with Producer(bootstrap(cluster), transactional_id="tid", **FAST) as producer:
        producer.init_transactions(10)
        producer.begin_transaction()
        with pytest.raises(TransactionStateError, match="empty"):
            producer.prepare_transaction(10)
        producer.send("t", b"v", partition=0)
        producer.prepare_transaction(10)  # still open, so it can go on


def test_prepare_outside_a_transaction_or_without_an_id(
    fakes: tuple[FakeCluster, FakeCoordinator],
) -> None:
    cluster, _ = fakes
    with Producer(bootstrap(cluster), transactional_id="tid", **FAST) as producer:
        producer.init_transactions(10)
        with pytest.raises(TransactionStateError, match="prepare_transaction"):
            producer.prepare_transaction(10)
    with Producer(bootstrap(cluster), **FAST) as plain, pytest.raises(TransactionStateError):
        plain.prepare_transaction(10)
