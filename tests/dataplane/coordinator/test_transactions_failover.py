"""Transaction coordinator failover on a real 3-node cluster: SIGKILL the broker that coordinates a
transactional id (the leader of its ``__transaction_state`` partition) in the middle of a
transaction, and between EndTxn and its markers; the new coordinator has the transaction from the
replicated log, and finishes it: the markers land, the state is CompleteCommit."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from dataplane.tools.local_cluster import LocalCluster
from protos import transaction_pb2 as tpb
from tests.dataplane.cluster_support import create_topic, running_cluster
from tests.dataplane.coordinator.txn_support import (
    Producer,
    find_coordinator,
    read_log,
    txn_stub,
)

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("dataplane-transactions-failover")]

OVERRIDES: dict[str, str | int] = {"transaction.state.log.num.partitions": 5}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("txnf"), "transactions_failover", OVERRIDES) as c:
        yield c


def node_at(cluster: LocalCluster, address: str) -> int:
    return next(s.node_id for s in cluster.specs if cluster.broker_address(s.node_id) == address)


def restart(cluster: LocalCluster, node_id: int) -> None:
    cluster.start_node(node_id)
    cluster.wait_for_brokers(timeout_s=60)


def commit_markers(
    cluster: LocalCluster, topic: str, partition: int, producer_id: int
) -> list[bool]:
    """The commit flag of each of the producer's markers on the partition."""
    entries = read_log(cluster, topic, partition)
    return [
        e.marker.commit for e in entries if e.producer_id == producer_id and e.marker is not None
    ]


def test_the_new_coordinator_takes_over_an_open_transaction(cluster: LocalCluster) -> None:
    create_topic(cluster, "orders", 2)
    producer = Producer(cluster, "mid-transaction")
    assert producer.init().error_code == 0
    assert all(r.error_code == 0 for r in producer.add("orders", 0, 1).results)
    for partition in (0, 1):
        assert producer.send("orders", partition, [b"before"], sequence=0).error_code == 0
    victim = node_at(cluster, find_coordinator(cluster, producer.tid))
    cluster.stop_node(victim, kill=True)
    try:
        assert producer.describe().state == "Ongoing"  # from the new coordinator
        assert producer.end(commit=True).error_code == 0
        producer.wait_state("CompleteCommit")
        for partition in (0, 1):
            assert commit_markers(cluster, "orders", partition, producer.producer_id) == [True]
    finally:
        restart(cluster, victim)


def test_the_new_coordinator_writes_the_markers_the_old_one_could_not(
    cluster: LocalCluster,
) -> None:
    """The markers are held back by pausing the only replica of the partition they go to; the
    coordinator is killed while its transaction waits in PrepareCommit."""
    leaders = create_topic(cluster, "ledger", 1, rf=1)
    holder = leaders[0].leader_id
    producer = next(
        p for p in (Producer(cluster, f"ledger-{n}") for n in range(50))
        if node_at(cluster, find_coordinator(cluster, p.tid)) != holder
    )  # fmt: skip
    coordinator_address = find_coordinator(cluster, producer.tid)
    victim = node_at(cluster, coordinator_address)
    assert producer.init().error_code == 0
    assert all(r.error_code == 0 for r in producer.add("ledger", 0).results)
    assert producer.send("ledger", 0, [b"held"], sequence=0).error_code == 0
    cluster.signal_node(holder, signal.SIGSTOP)
    try:
        assert producer.end(commit=True).error_code == 0
        described = txn_stub(coordinator_address).DescribeTransactions(
            tpb.DescribeTransactionsRequest(transactional_ids=[producer.tid]), timeout=10
        )
        assert described.transactions[0].state == "PrepareCommit"  # no marker can be written
        cluster.stop_node(victim, kill=True)
    finally:
        cluster.signal_node(holder, signal.SIGCONT)
    try:
        producer.wait_state("CompleteCommit", timeout_s=120)
        markers = commit_markers(cluster, "ledger", 0, producer.producer_id)
        assert markers and all(markers), markers  # written (twice is harmless), never an abort
    finally:
        restart(cluster, victim)
