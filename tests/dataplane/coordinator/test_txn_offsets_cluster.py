"""Transactional offset commits on a real cluster (KIP-98, KIP-447), spoken raw: AddOffsetsToTxn,
TxnOffsetCommit to the group's coordinator, OffsetFetch (``require_stable``), EndTxn (whose
markers reach ``__consumer_offsets`` through WriteTxnMarkers and the group coordinator's marker
writer), a SIGKILL of the group coordinator with a transaction open, and bad input."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc
import pytest

from dataplane.tools.local_cluster import LocalCluster, wait_for
from protos import broker_pb2 as pb
from protos import group_pb2 as gpb
from protos import group_pb2_grpc as gpb_grpc
from protos import transaction_pb2 as tpb
from raftlog.errors import ErrorCode
from tests.dataplane.cluster_support import (
    create_topic,
    metadata,
    produce,
    running_cluster,
    stub,
    values_batch,
)
from tests.dataplane.coordinator.txn_support import (
    RPC_TIMEOUT_S,
    Producer,
    leader_address,
    live_addresses,
    txn_stub,
    until_answered,
)

pytestmark = [pytest.mark.timeout(400), pytest.mark.xdist_group("dataplane-txn-offsets")]

E = ErrorCode
R = TypeVar("R")
TOPIC, PARTITIONS, RECORDS = "input", 2, 100
OFFSETS_TOPIC = "__consumer_offsets"
# what a client retries against the group coordinator (after looking it up again)
RETRIABLE = frozenset({
    E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE, E.COORDINATOR_LOAD_IN_PROGRESS,
    E.CONCURRENT_TRANSACTIONS, E.REQUEST_TIMED_OUT,
})  # fmt: skip
Offsets = dict[tuple[str, int], int]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    overrides: dict[str, str | int] = {  # quicker to create on 2 cores
        "offsets.topic.num.partitions": 3,
        "transaction.state.log.num.partitions": 3,
    }
    with running_cluster(tmp_path_factory.mktemp("txnoff"), "txn_offsets", overrides) as c:
        create_topic(c, TOPIC, PARTITIONS)
        for partition in range(PARTITIONS):
            values = [str(n).encode() for n in range(RECORDS)]
            answer = produce(leader_address(c, TOPIC, partition), TOPIC, partition,
                             values_batch(values))  # fmt: skip
            assert answer.error_code == 0, answer.error_message
        yield c


_CHANNELS: dict[str, grpc.Channel] = {}


def group_stub(address: str) -> gpb_grpc.GroupCoordinatorServiceStub:
    channel = _CHANNELS.get(address)
    if channel is None:
        channel = _CHANNELS[address] = grpc.insecure_channel(address)
    return gpb_grpc.GroupCoordinatorServiceStub(channel)


def group_coordinator(cluster: LocalCluster, group: str, timeout_s: float = 90) -> str:
    def probe() -> str | None:
        for address in live_addresses(cluster):
            try:
                answer = group_stub(address).FindCoordinator(
                    gpb.FindCoordinatorRequest(group_ids=[group]), timeout=5
                )
            except grpc.RpcError:
                continue
            (found,) = answer.coordinators
            if found.error_code == 0 and cluster.pid(found.node_id) is not None:
                return f"{found.host}:{found.port}"
        return None

    result: str = wait_for(f"the coordinator of group {group}", probe, timeout_s)
    return result


def on_group_coordinator(
    cluster: LocalCluster, group: str, call: Callable[[str], R], error_of: Callable[[R], int]
) -> R:
    """``call(address)`` until the group coordinator answers something a client would not
    retry (it is looked up again each time)."""
    deadline = time.monotonic() + 90
    while True:
        try:
            answer = call(group_coordinator(cluster, group))
            last: object = E.from_code(error_of(answer))
            if last not in RETRIABLE:
                return answer
        except grpc.RpcError as error:
            last = error
        if time.monotonic() > deadline:
            raise AssertionError(f"group {group}: no answer: {last}")
        time.sleep(0.1)


def add_offsets(producer: Producer, group: str) -> tpb.AddOffsetsToTxnResponse:
    request = tpb.AddOffsetsToTxnRequest(
        transactional_id=producer.tid, producer_id=producer.producer_id,
        producer_epoch=producer.epoch, group_id=group,
    )  # fmt: skip
    answer: tpb.AddOffsetsToTxnResponse = until_answered(
        producer.cluster, producer.tid,
        lambda a: txn_stub(a).AddOffsetsToTxn(request, timeout=RPC_TIMEOUT_S),
        lambda r: r.error_code,
    )  # fmt: skip
    return answer


def txn_commit(
    producer: Producer, group: str, offsets: Offsets, *, epoch: int | None = None,
    generation_id: int = -1, member_id: str = "",
) -> dict[tuple[str, int], int]:  # fmt: skip
    """TxnOffsetCommit; each partition's error code."""
    by_topic: dict[str, list[gpb.OffsetCommitPartition]] = {}
    for (topic, partition), offset in offsets.items():
        by_topic.setdefault(topic, []).append(
            gpb.OffsetCommitPartition(
                partition=partition, committed_offset=offset, committed_leader_epoch=-1
            )
        )
    request = gpb.TxnOffsetCommitRequest(
        transactional_id=producer.tid, group_id=group, producer_id=producer.producer_id,
        producer_epoch=producer.epoch if epoch is None else epoch, generation_id=generation_id,
        member_id=member_id,
        topics=[gpb.OffsetCommitTopic(name=t, partitions=ps) for t, ps in by_topic.items()],
    )  # fmt: skip
    answer: gpb.OffsetCommitResponse = on_group_coordinator(
        producer.cluster, group,
        lambda a: group_stub(a).TxnOffsetCommit(request, timeout=RPC_TIMEOUT_S),
        lambda r: r.error_code,
    )  # fmt: skip
    return {(t.name, p.partition): p.error_code for t in answer.topics for p in t.partitions}


def fetch_offsets(
    cluster: LocalCluster, group: str, require_stable: bool
) -> dict[tuple[str, int], tuple[int, int]]:
    """(committed offset, error code) of each input partition."""
    request = gpb.OffsetFetchRequest(
        group_id=group, require_stable=require_stable,
        topics=[gpb.TopicPartitions(topic=TOPIC, partitions=list(range(PARTITIONS)))],
    )  # fmt: skip
    answer: gpb.OffsetFetchResponse = on_group_coordinator(
        cluster, group,
        lambda a: group_stub(a).OffsetFetch(request, timeout=RPC_TIMEOUT_S),
        lambda r: r.error_code,
    )  # fmt: skip
    return {
        (t.name, p.partition): (p.committed_offset, p.error_code)
        for t in answer.topics
        for p in t.partitions
    }


def stable(offsets: Offsets) -> dict[tuple[str, int], tuple[int, int]]:
    return {(TOPIC, p): (offsets.get((TOPIC, p), -1), 0) for p in range(PARTITIONS)}


def unstable(offsets: Offsets, pending: set[int]) -> dict[tuple[str, int], tuple[int, int]]:
    code = E.UNSTABLE_OFFSET_COMMIT.code
    return {
        (TOPIC, p): (-1, code) if p in pending else (offsets.get((TOPIC, p), -1), 0)
        for p in range(PARTITIONS)
    }


def wait_stable(cluster: LocalCluster, group: str, expected: Offsets) -> None:
    """Markers are written after EndTxn answers: wait until the offsets are stable."""
    wanted = stable(expected)
    wait_for(
        f"{group}'s offsets {expected} stable",
        lambda: fetch_offsets(cluster, group, require_stable=True) == wanted,
        90,
    )


def begin(producer: Producer, group: str) -> None:
    answer = add_offsets(producer, group)
    assert answer.error_code == 0, answer.error_message


def test_offsets_are_pending_until_the_marker(cluster: LocalCluster) -> None:
    group, producer = "etl", Producer(cluster, "etl-tx")
    assert producer.init().error_code == 0
    t0, t1 = (TOPIC, 0), (TOPIC, 1)
    begin(producer, group)
    assert txn_commit(producer, group, {t0: 10, t1: 20}) == {t0: 0, t1: 0}
    assert fetch_offsets(cluster, group, require_stable=False) == stable({})  # not yet
    assert fetch_offsets(cluster, group, require_stable=True) == unstable({}, {0, 1})
    assert producer.end(commit=True).error_code == 0
    wait_stable(cluster, group, {t0: 10, t1: 20})

    begin(producer, group)  # the next transaction: aborted
    assert txn_commit(producer, group, {t0: 50}) == {t0: 0}
    assert fetch_offsets(cluster, group, require_stable=True) == unstable({t1: 20}, {0})
    assert producer.end(commit=False).error_code == 0
    wait_stable(cluster, group, {t0: 10, t1: 20})
    assert fetch_offsets(cluster, group, require_stable=False) == stable({t0: 10, t1: 20})


def test_pending_offsets_survive_a_coordinator_sigkill(cluster: LocalCluster) -> None:
    group, producer = "failover", Producer(cluster, "failover-tx")
    assert producer.init(timeout_ms=300_000).error_code == 0
    t0 = (TOPIC, 0)
    begin(producer, group)
    assert txn_commit(producer, group, {t0: 30}) == {t0: 0}
    address = group_coordinator(cluster, group)
    victim = next(s.node_id for s in cluster.specs if cluster.broker_address(s.node_id) == address)
    cluster.stop_node(victim, kill=True)
    try:
        wait_for(
            "a new group coordinator",
            lambda: group_coordinator(cluster, group) != address,
            90,
        )
        # The new coordinator replayed the transactional batch: still pending, not lost.
        assert fetch_offsets(cluster, group, require_stable=True) == unstable({}, {0})
        assert fetch_offsets(cluster, group, require_stable=False) == stable({})
        assert producer.end(commit=True).error_code == 0
        wait_stable(cluster, group, {t0: 30})
    finally:
        cluster.start_node(victim)
    wait_for(f"node {victim} serving", lambda: metadata(cluster, victim, TOPIC) is not None, 90)


def test_bad_input_stores_nothing(cluster: LocalCluster) -> None:
    group, producer = "bad", Producer(cluster, "bad-tx")
    assert producer.init().error_code == 0
    t0 = (TOPIC, 0)
    # The transaction does not hold the group's partition (no AddOffsetsToTxn): KIP-890.
    assert txn_commit(producer, group, {t0: 5}) == {t0: E.INVALID_TXN_STATE.code}
    begin(producer, group)
    unknown = ("no-such-topic", 0)
    assert txn_commit(producer, group, {t0: 5, unknown: 1}) == {
        t0: 0, unknown: E.UNKNOWN_TOPIC_OR_PARTITION.code,
    }  # fmt: skip
    # past the log end: accepted, as Kafka's coordinator stores any offset
    assert txn_commit(producer, group, {(TOPIC, 1): RECORDS + 1}) == {(TOPIC, 1): 0}
    # Group metadata of a group that does not exist (KIP-447): ILLEGAL_GENERATION.
    assert txn_commit(producer, "nobody", {t0: 5}, generation_id=4, member_id="m") == {
        t0: E.ILLEGAL_GENERATION.code
    }
    # A zombie: the producer's epoch was bumped by a new instance, which aborted the open
    # transaction (its offset never shows).
    zombie_epoch = producer.epoch
    assert producer.init().error_code == 0
    wait_stable(cluster, group, {})
    refused = txn_commit(producer, group, {t0: 7}, epoch=zombie_epoch)
    assert refused == {t0: E.INVALID_PRODUCER_EPOCH.code}  # Kafka's answer to a fenced one
    assert fetch_offsets(cluster, group, require_stable=True) == stable({})


def test_a_marker_to_a_broker_not_coordinating_the_partition(cluster: LocalCluster) -> None:
    request = pb.WriteTxnMarkersRequest(
        markers=[
            pb.TxnMarker(
                producer_id=999_999, producer_epoch=0, committed=True, coordinator_epoch=0,
                topics=[pb.TxnMarkerTopic(name=OFFSETS_TOPIC, partitions=[0])],
            )
        ]
    )  # fmt: skip
    group_coordinator(cluster, "any")  # creates the offsets topic if no test did
    leader = leader_address(cluster, OFFSETS_TOPIC, 0)
    other = next(a for a in live_addresses(cluster) if a != leader)

    def answered() -> list[int] | None:
        try:
            answer = stub(other).WriteTxnMarkers(request, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError:
            return None  # a node still starting (the failover test restarts one)
        return [p.error_code for m in answer.markers for t in m.topics for p in t.partitions]

    assert wait_for(f"WriteTxnMarkers answered by {other}", answered, 60) == [
        E.NOT_LEADER_OR_FOLLOWER.code
    ]
