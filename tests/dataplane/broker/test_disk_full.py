"""A broker whose disk fills halts, as Kafka's does; the cluster goes on; nothing acknowledged is
lost; freed and restarted, the broker catches up from a log without torn batches.

A real 3-node cluster on 127.0.0.164-166; node 2's data directory is a 64 MiB tmpfs that the test
fills (root only). Every process is stopped by its pid and the mount is removed in ``finally``s.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chaos.disk import DiskFaults
from chaos.runner import read_batches
from dataplane.client import AdminClient, Consumer, Producer, TopicPartition
from dataplane.tools.local_cluster import LocalCluster, wait_for
from raftlog.log import partition_dir_name
from tests.dataplane.cluster_support import consume_values, create_topic, running_cluster

pytestmark = [
    pytest.mark.timeout(300),
    # 127.0.0.164-166: tests/metadata_quorum/test_quorum_disk_full.py's too, in turn
    pytest.mark.xdist_group("disk_full"),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root"),
]
TOPIC = "events"
FULL = 2  # the node whose disk fills


def send(cluster: LocalCluster, start: int, count: int) -> None:
    with Producer(cluster.bootstrap_servers, enable_idempotence=True) as producer:
        futures = [producer.send(TOPIC, value=str(n).encode()) for n in range(start, start + count)]
        producer.flush()
        for future in futures:
            future.result(timeout=0)  # every write acknowledged (acks=all)


def isr(cluster: LocalCluster) -> tuple[int, ...]:
    admin = AdminClient(cluster.bootstrap_servers)
    try:
        return admin.describe_topics([TOPIC])[TOPIC].partitions[0].isr
    finally:
        admin.close()


def test_a_full_disk_halts_the_broker_and_loses_nothing(tmp_path: Path) -> None:
    with DiskFaults(f"{os.getpid()}-dataplane", 64 << 20) as disks:
        disks.mount(FULL, tmp_path / f"node-{FULL}" / "data", os.getuid(), os.getgid())
        with running_cluster(tmp_path, "disk_full") as cluster:
            create_topic(cluster, TOPIC, 1, configs={"min.insync.replicas": "2"})
            send(cluster, 0, 200)
            free = disks.fill(FULL)

            # The next writes reach node 2's log (it leads or follows): it halts, and the
            # others take the writes once the controller moved leadership / shrank the ISR.
            send(cluster, 200, 300)
            node = cluster._procs[FULL]
            wait_for("node 2 to halt", lambda: node.poll() is not None, 60)
            assert node.returncode == 1
            text = cluster.spec(FULL).log_path.read_text()
            assert "log directory" in text and "broker halts" in text

            free()
            cluster.start_node(FULL)
            wait_for("node 2 back in the ISR", lambda: FULL in isr(cluster), 90)
            send(cluster, 500, 100)

            with Consumer(cluster.bootstrap_servers) as consumer:
                consumer.assign([TopicPartition(TOPIC, 0)])
                consumer.seek_to_beginning(TopicPartition(TOPIC, 0))
                values = consume_values(consumer, 600)
            assert values == [str(n) for n in range(600)]  # none lost, none twice, in order

            wait_for("every replica in the ISR", lambda: len(isr(cluster)) == 3, 60)
            cluster.down()
            replicas = {
                spec.node_id: read_batches(spec.directory / "data" / partition_dir_name(TOPIC, 0))
                for spec in cluster.specs
            }
            assert replicas[FULL] == replicas[1] == replicas[3]  # same batches, same CRCs
