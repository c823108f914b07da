"""Divergence with real processes: records a leader appended with acks=1 but never replicated
are truncated from it when it returns after a SIGKILL, and every replica ends byte-identical
below the high watermark.

With KIP-966 (eligible.leader.replicas.version 1, the bootstrap level) the followers are not
eligible to lead: they left the ISR when they registered again while it still held the leader,
at min.insync.replicas 1, so the leader alone could have committed records they lack. The
partition stays offline (the leader, the only eligible replica, is down) until an unclean
election, which the test asks for as an operator would; Kafka 4.1 does the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from dataplane.tools.local_cluster import LocalCluster, wait_for
from protos import controller_pb2 as cpb
from raftlog.errors import KafkaError
from raftlog.log import Log
from tests.dataplane.cluster_support import (
    create_topic,
    fetch,
    metadata,
    produce,
    read_all,
    running_cluster,
    values_batch,
)

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("dataplane-divergence")]


def elect_uncleanly(cluster: LocalCluster) -> None:
    """ElectLeaders UNCLEAN for div-0; a refusal (no live replica yet) is tried again later."""
    client = cluster.client()
    try:
        request = cpb.ElectLeadersRequest(
            election_type=cpb.UNCLEAN, partitions=[cpb.TopicPartition(topic="div", partition=0)]
        )
        client.call("ElectLeaders", request, deadline_s=5.0)
    except KafkaError:  # no active controller yet: the next poll asks again
        return
    finally:
        client.close()


def test_unreplicated_acks_1_records_are_truncated_when_the_old_leader_returns(
    tmp_path: Path,
) -> None:
    overrides: dict[str, str | int] = {
        "broker.session.timeout.ms": 5000,
        "replica.lag.time.max.ms": 60_000,
    }
    with running_cluster(tmp_path, "divergence", overrides) as cluster:
        old = create_topic(cluster, "div", 1, 3)[0].leader_id
        followers = [s.node_id for s in cluster.specs if s.node_id != old]
        old_address = cluster.broker_address(old)
        for n in range(3):
            assert (
                produce(old_address, "div", 0, values_batch([b"committed-%d" % n])).error_code == 0
            )
        assert fetch(old_address, "div", 0, 0).high_watermark == 3, "acks=all: on every replica"
        # The followers die (SIGKILL: nothing in flight reaches their logs), the leader takes
        # acks=1 writes that nobody replicates, and dies too, all within one session timeout,
        # so the controller never shrinks the ISR.
        for f in followers:
            cluster.stop_node(f, kill=True)
        lost = produce(old_address, "div", 0, values_batch([b"lost-1", b"lost-2"]), acks=1)
        assert lost.error_code == 0 and lost.base_offset == 3
        cluster.stop_node(old, kill=True)
        for f in followers:
            cluster.start_node(f)

        def new_leader() -> int | None:
            described = metadata(cluster, followers[0], "div")
            if described is None or not described.partitions:
                return None
            leader = described.partitions[0].leader_id
            if leader < 0:
                elect_uncleanly(cluster)
            return leader if leader in followers else None

        leader = wait_for("a new leader", new_leader, timeout_s=60)
        address = cluster.broker_address(leader)
        answer = produce(address, "div", 0, values_batch([b"new-1", b"new-2"]))
        assert answer.error_code == 0 and answer.base_offset == 3, answer.error_message
        cluster.start_node(old)

        def all_in_sync() -> bool:
            described = metadata(cluster, leader, "div")
            return bool(described and sorted(described.partitions[0].isr) == [1, 2, 3])

        wait_for("the old leader to rejoin the ISR", all_in_sync, timeout_s=60)
        hw = fetch(address, "div", 0, 0).high_watermark
        values = [r.value for r in read_all(address, "div", 0, hw)]
        assert values == [b"committed-0", b"committed-1", b"committed-2", b"new-1", b"new-2"]
    replicas = []
    for spec in cluster.specs:
        log = Log(spec.directory / "data" / "div-0")
        replicas.append(log.read(0, 1 << 24, max_offset=hw))
        log.close()
    assert replicas[0] == replicas[1] == replicas[2], "replicas differ below the high watermark"
