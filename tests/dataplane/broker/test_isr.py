"""ISR shrink and expand with real processes: a follower paused with SIGSTOP leaves the ISR
after replica.lag.time.max.ms, acks=all is then refused under min.insync.replicas (a batch
appended before the shrink times out: the high watermark waits for min ISR), and after SIGCONT
the follower catches up and rejoins."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from dataplane.tools.local_cluster import LocalCluster, wait_for
from raftlog.errors import ErrorCode
from tests.dataplane.cluster_support import (
    create_topic,
    fetch,
    metadata,
    produce,
    read_all,
    running_cluster,
    values_batch,
)

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("dataplane-isr")]
LAG_MS = 1500


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    overrides: dict[str, str | int] = {
        "replica.lag.time.max.ms": LAG_MS,
        # sessions outlive the pause: the *leader* must notice the lag, not the controller
        "broker.session.timeout.ms": 120_000,
    }
    with running_cluster(tmp_path_factory.mktemp("isr"), "isr", overrides) as running:
        yield running


def isr_of(cluster: LocalCluster, node_id: int, topic: str) -> list[int] | None:
    described = metadata(cluster, node_id, topic)
    if described is None or not described.partitions:
        return None
    return sorted(described.partitions[0].isr)


def test_paused_follower_leaves_the_isr_and_rejoins(cluster: LocalCluster) -> None:
    leaders = create_topic(cluster, "isr", 1, 3, {"min.insync.replicas": "3"})
    leader = leaders[0].leader_id
    address = cluster.broker_address(leader)
    paused = next(s.node_id for s in cluster.specs if s.node_id != leader)
    acked: list[bytes] = []

    def send(value: bytes, acks: int = -1, timeout_ms: int = 20_000) -> int:
        answer = produce(address, "isr", 0, values_batch([value]), acks=acks,
                         timeout_ms=timeout_ms)  # fmt: skip
        if answer.error_code == 0:
            acked.append(value)
        return answer.error_code

    assert send(b"before") == 0
    cluster.signal_node(paused, signal.SIGSTOP)
    try:
        # Appended, but the ISR shrinks below min.insync.replicas before it is replicated:
        # under min ISR the high watermark stays (KIP-966), so the wait ends in a timeout, as
        # Kafka 4's DelayedProduce does; the batch is committed once the follower is back.
        assert send(b"during", timeout_ms=LAG_MS * 4) == ErrorCode.REQUEST_TIMED_OUT.code
        wait_for("the ISR to shrink", lambda: isr_of(cluster, leader, "isr") == sorted(
            s.node_id for s in cluster.specs if s.node_id != paused))  # fmt: skip
        assert send(b"refused") == ErrorCode.NOT_ENOUGH_REPLICAS.code
        assert send(b"acks-1", acks=1) == 0
    finally:
        cluster.signal_node(paused, signal.SIGCONT)
    wait_for("the follower to rejoin", lambda: isr_of(cluster, leader, "isr") == [1, 2, 3])
    assert send(b"after") == 0
    end = fetch(address, "isr", 0, 0).high_watermark
    stored = [r.value for r in read_all(address, "isr", 0, end)]
    assert stored == [b"before", b"during", b"acks-1", b"after"], "refused writes are not stored"
    assert set(acked) <= set(stored)
