"""A controller whose disk fills stops serving (it steps down, votes and acknowledges nothing) and
stays alive; the other two voters elect a leader and commit; space freed, it serves again and
catches up; SIGKILLed and restarted, its journal needs no repair.

Three controller processes (process.roles=controller) on 127.0.0.164-166, the range of
tests/dataplane/broker/test_disk_full.py (the same xdist group: they run in turn). Each node's
data directory (its metadata log under ``__cluster_metadata``) is a 16 MiB tmpfs (root only);
the one of the active controller is filled. Every process is stopped by its pid and every mount
removed in ``finally``s.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import pytest

from chaos.disk import DiskFaults
from dataplane.tools.local_cluster import LocalCluster
from metadata_quorum.client import ControllerClient
from metadata_quorum.raft import JOURNAL_FILE
from metadata_quorum.raft_journal import RaftJournal
from tests.dataplane.cluster_support import RANGES
from tests.metadata_quorum.quorum_support import (
    create_topics,
    describe_node,
    make_cluster,
    register_brokers,
    wait_for,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("disk_full"),
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root"),
]
DISK_BYTES = 16 << 20
FULL_LINE = "is full ("


def topics_on(cluster: LocalCluster, node_id: int) -> set[str] | None:
    described = describe_node(cluster, node_id)
    return None if described is None else {topic.name for topic in described.topics}


def has_topic(cluster: LocalCluster, node_id: int, name: str) -> bool:
    return name in (topics_on(cluster, node_id) or set())


def node_log(cluster: LocalCluster, node_id: int) -> str:
    return cluster.spec(node_id).log_path.read_text(errors="replace")


def fill_and_step_down(cluster: LocalCluster, disks: DiskFaults, client: ControllerClient) -> int:
    """Fill the active controller's disk and commit once more: its next meta or journal write
    fails, it steps down and says so once; the others elect a leader. The full node's id."""
    full = cluster.wait_for_leader()
    disks.fill(full)
    create_topics(client, ["while-filling"])  # may still fit in its reserved journal chunk
    wait_for(lambda: FULL_LINE in node_log(cluster, full), 30, "the full controller's log line")
    wait_for(lambda: cluster.wait_for_leader() != full, 30, "another active controller")
    return full


def test_a_full_controller_stops_serving_and_catches_up(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path / "cluster", first_host=RANGES["disk_full"])
    with DiskFaults(f"{os.getpid()}-quorum", DISK_BYTES) as disks:
        for spec in cluster.specs:
            disks.mount(spec.node_id, spec.directory / "data", os.getuid(), os.getgid())
        client = cluster.client()
        try:
            cluster.up(timeout_s=60)
            register_brokers(client, [1, 2, 3])
            create_topics(client, ["before"])
            full = fill_and_step_down(cluster, disks, client)

            # The two others commit; the full one is alive, not leading, its image frozen.
            during = [f"during-{n}" for n in range(10)]
            create_topics(client, during)
            assert cluster.pid(full) is not None, node_log(cluster, full)[-3000:]
            stale = topics_on(cluster, full)
            assert stale is not None and not stale & set(during)
            assert node_log(cluster, full).count(FULL_LINE) == 1  # one clear line, no flood

            disks.free(full)
            everything = {"before", "while-filling", *during}
            wait_for(lambda: everything <= (topics_on(cluster, full) or set()), 60, "catch-up")
            assert "space returned" in node_log(cluster, full)
            create_topics(client, ["after"])
            for node_id in (1, 2, 3):
                wait_for(partial(has_topic, cluster, node_id, "after"), 30,
                         f"node {node_id} to commit after the disk came back")  # fmt: skip

            # SIGKILLed and restarted: its journal is whole (nothing to cut) and it rejoins.
            cluster.stop_node(full, kill=True)
            data_dir = cluster.spec(full).directory / "data" / "__cluster_metadata"
            journal = RaftJournal(data_dir / JOURNAL_FILE, b"0.3.17")
            assert journal[-1][1] >= len(everything)  # one entry per topic at least
            journal._destroy()
            cluster.start_node(full)
            wait_for(partial(has_topic, cluster, full, "after"), 60, "the restart")
            restarted = node_log(cluster, full)
            assert "cutting the journal" not in restarted
            assert "interrupted compaction" not in restarted
        finally:
            client.close()
            for spec in cluster.specs:
                cluster.stop_node(spec.node_id, kill=True)
