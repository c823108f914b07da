"""The transaction coordinator on a real 3-node cluster, spoken raw (gRPC): a transaction's
markers land on every partition it wrote, commit and abort alike, with the coordinator's epoch;
a second InitProducerId fences the first producer; a transaction left open past its timeout is
aborted by the coordinator; bad input gets Kafka's codes and changes nothing."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from dataplane.tools.local_cluster import LocalCluster, wait_for
from protos import broker_pb2 as pb
from protos import transaction_pb2 as tpb
from raftlog.errors import ErrorCode
from tests.dataplane.cluster_support import create_topic, running_cluster, stub
from tests.dataplane.coordinator.txn_support import (
    LogEntry,
    Producer,
    find_coordinator,
    leader_address,
    live_addresses,
    read_log,
    txn_stub,
)

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("dataplane-transactions")]

E = ErrorCode
TOPIC, PARTITIONS = "payments", 3
MAX_TIMEOUT_MS = 60_000
OVERRIDES: dict[str, str | int] = {
    "transaction.state.log.num.partitions": 5,
    "transaction.max.timeout.ms": MAX_TIMEOUT_MS,
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": 300,
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("txn"), "transactions", OVERRIDES) as running:
        create_topic(running, TOPIC, PARTITIONS)
        yield running


def codes(response: tpb.AddPartitionsToTxnResponse) -> dict[tuple[str, int], str]:
    return {(r.topic, r.partition): E.from_code(r.error_code).name for r in response.results}


def transaction_of(entries: list[LogEntry], producer_id: int) -> list[LogEntry]:
    return [e for e in entries if e.producer_id == producer_id]


def run_transaction(cluster: LocalCluster, tid: str, commit: bool) -> Producer:
    producer = Producer(cluster, tid)
    assert producer.init().error_code == 0
    added = producer.add(TOPIC, *range(PARTITIONS))
    assert set(codes(added).values()) == {"NONE"}, codes(added)
    for partition in range(PARTITIONS):
        values = [f"{tid}-{partition}-{n}".encode() for n in range(3)]
        result = producer.send(TOPIC, partition, values, sequence=0)
        assert result.error_code == 0, result.error_message
    assert producer.describe().state == "Ongoing"
    ended = producer.end(commit)
    assert ended.error_code == 0, ended.error_message
    return producer


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_the_markers_land_on_every_partition(cluster: LocalCluster, commit: bool) -> None:
    tid = f"payments-{'commit' if commit else 'abort'}"
    producer = run_transaction(cluster, tid, commit)
    done = producer.wait_state("CompleteCommit" if commit else "CompleteAbort")
    assert (done.producer_id, done.producer_epoch, list(done.topics)) == (
        producer.producer_id, 0, [])  # fmt: skip
    for partition in range(PARTITIONS):
        batches = transaction_of(read_log(cluster, TOPIC, partition), producer.producer_id)
        data, marker = batches[0], batches[-1].marker
        assert data.values == tuple(f"{tid}-{partition}-{n}".encode() for n in range(3))
        assert marker is not None and len(batches) == 2, batches
        assert (marker.commit, marker.producer_epoch) == (commit, 0)
        assert marker.coordinator_epoch >= 0  # the __transaction_state partition's leader epoch


def test_a_second_producer_fences_the_first(cluster: LocalCluster) -> None:
    zombie = Producer(cluster, "fenced")
    assert zombie.init().error_code == 0
    assert set(codes(zombie.add(TOPIC, 0)).values()) == {"NONE"}
    assert zombie.send(TOPIC, 0, [b"zombie"], sequence=0).error_code == 0
    successor = Producer(cluster, "fenced")
    answer = successor.init()  # retried through CONCURRENT_TRANSACTIONS while the abort runs
    assert (answer.error_code, answer.producer_id, answer.producer_epoch) == (
        0, zombie.producer_id, zombie.epoch + 2)  # fmt: skip
    entries = transaction_of(read_log(cluster, TOPIC, 0), zombie.producer_id)
    abort = entries[-1].marker
    assert abort is not None and (abort.commit, abort.producer_epoch) == (False, zombie.epoch + 1)
    assert E.from_code(zombie.add(TOPIC, 1).error_code) is E.PRODUCER_FENCED
    assert E.from_code(zombie.end(commit=True).error_code) is E.PRODUCER_FENCED
    late = zombie.send(TOPIC, 0, [b"late"], sequence=1)
    assert E.from_code(late.error_code) in (E.INVALID_PRODUCER_EPOCH, E.PRODUCER_FENCED)
    assert successor.describe().state == "Empty"


def test_a_forgotten_transaction_is_aborted_after_its_timeout(cluster: LocalCluster) -> None:
    producer = Producer(cluster, "forgotten")
    assert producer.init(timeout_ms=2_000).error_code == 0
    assert set(codes(producer.add(TOPIC, 2)).values()) == {"NONE"}
    assert producer.send(TOPIC, 2, [b"never"], sequence=0).error_code == 0
    aborted = producer.wait_state("CompleteAbort", timeout_s=60)
    assert aborted.producer_epoch == producer.epoch + 1
    marker = transaction_of(read_log(cluster, TOPIC, 2), producer.producer_id)[-1].marker
    assert marker is not None and not marker.commit
    assert E.from_code(producer.end(commit=True).error_code) is E.PRODUCER_FENCED


def test_a_producer_must_add_a_partition_before_writing_it(cluster: LocalCluster) -> None:
    """KIP-890: the partition's leader asks the coordinator (over gRPC, or in process when it
    coordinates the id itself) before it takes the first transactional batch."""
    producer = Producer(cluster, "unverified")
    assert producer.init().error_code == 0
    coordinator = find_coordinator(cluster, producer.tid)
    by_leader = {leader_address(cluster, TOPIC, p): p for p in range(PARTITIONS)}
    for address, partition in sorted(by_leader.items()):
        refused = producer.send(TOPIC, partition, [b"not added"], sequence=0)
        assert E.from_code(refused.error_code) is E.INVALID_TXN_STATE, (
            address == coordinator,
            refused.error_message,
        )
        assert set(codes(producer.add(TOPIC, partition)).values()) == {"NONE"}
        accepted = producer.send(TOPIC, partition, [b"added"], sequence=0)
        assert accepted.error_code == 0, (address == coordinator, accepted.error_message)
    assert producer.end(commit=False).error_code == 0
    producer.wait_state("CompleteAbort")


def test_bad_input_gets_kafkas_codes(cluster: LocalCluster) -> None:
    unknown = Producer(cluster, "nobody", producer_id=4242, epoch=0)
    assert E.from_code(unknown.end(commit=True).error_code) is E.INVALID_PRODUCER_ID_MAPPING
    too_long = Producer(cluster, "too-long").init(timeout_ms=MAX_TIMEOUT_MS + 1)
    assert E.from_code(too_long.error_code) is E.INVALID_TRANSACTION_TIMEOUT
    producer = Producer(cluster, "misdirected")
    assert producer.init().error_code == 0
    assert codes(producer.add("no-such-topic", 0)) == {
        ("no-such-topic", 0): "UNKNOWN_TOPIC_OR_PARTITION"
    }
    mixed = producer.add(TOPIC, 0, 7)
    assert codes(mixed) == {
        (TOPIC, 0): "OPERATION_NOT_ATTEMPTED",
        (TOPIC, 7): "UNKNOWN_TOPIC_OR_PARTITION",
    }
    assert producer.describe().state == "Empty"  # nothing was added
    # a broker that does not coordinate the id says so
    coordinator = find_coordinator(cluster, "misdirected")
    other = next(a for a in live_addresses(cluster) if a != coordinator)
    request = tpb.EndTxnRequest(transactional_id="misdirected", producer_id=producer.producer_id,
                                producer_epoch=producer.epoch, committed=True)  # fmt: skip
    assert E.from_code(txn_stub(other).EndTxn(request, timeout=10).error_code) is E.NOT_COORDINATOR
    init_elsewhere = stub(other).InitProducerId(
        pb.InitProducerIdRequest(transactional_id="misdirected", transaction_timeout_ms=1000),
        timeout=10,
    )
    assert E.from_code(init_elsewhere.error_code) is E.NOT_COORDINATOR


def test_transactions_are_listed_by_their_coordinators(cluster: LocalCluster) -> None:
    run_transaction(cluster, "listed", commit=True)

    def listed() -> dict[str, str] | None:
        found: dict[str, str] = {}
        for address in live_addresses(cluster):
            try:
                answer = txn_stub(address).ListTransactions(
                    tpb.ListTransactionsRequest(), timeout=10
                )
            except grpc.RpcError:
                return None
            if answer.error_code:
                return None
            found.update({t.transactional_id: t.state for t in answer.transactions})
        return found if found.get("listed") == "CompleteCommit" else None

    wait_for("the transaction listed", listed, 60)
