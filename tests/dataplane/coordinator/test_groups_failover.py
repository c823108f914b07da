"""Group coordinator failover: SIGKILL the broker leading the group's ``__consumer_offsets``
partition; the committed offsets are intact on the new coordinator and the group resumes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from dataplane.client import Consumer, TopicPartition
from dataplane.client._cluster import Cluster
from dataplane.client._group import GroupClient
from dataplane.tools.local_cluster import LocalCluster, wait_for
from raftlog.errors import KafkaError
from tests.dataplane.cluster_support import (
    consume_values,
    create_topic,
    produce_numbers,
    running_cluster,
)

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("dataplane-groups-failover")]

TOPIC, PARTITIONS, GROUP = "orders", 3, "billing"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    overrides: dict[str, str | int] = {
        "group.consumer.session.timeout.ms": 6000,
        "group.consumer.heartbeat.interval.ms": 300,
    }
    with running_cluster(tmp_path_factory.mktemp("gfail"), "groups_failover", overrides) as c:
        yield c


def produce(cluster: LocalCluster, start: int, count: int) -> None:
    produce_numbers(cluster, TOPIC, start, count)


def consume(consumer: Consumer, count: int) -> list[int]:
    return [int(v) for v in consume_values(consumer, count, timeout_s=90)]


def test_committed_offsets_survive_a_coordinator_sigkill(cluster: LocalCluster) -> None:
    create_topic(cluster, TOPIC, PARTITIONS)
    produce(cluster, 0, 300)
    tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    with Consumer(cluster.bootstrap_servers, group_id=GROUP, auto_offset_reset="earliest",
                  enable_auto_commit=False) as consumer:  # fmt: skip
        consumer.subscribe([TOPIC])
        assert sorted(consume(consumer, 300)) == list(range(300))
        consumer.commit()
        before = consumer.committed(tps)
        assert sum(o.offset for o in before.values() if o) == 300

        address = GroupClient(
            consumer._cluster, GROUP, threading.Event(), time.monotonic
        ).coordinator(10)
        # A client whose first bootstrap address is the broker about to die: FindCoordinator
        # must move on to the others.
        others = [a for a in cluster.bootstrap_servers if a != address]
        finder = GroupClient(Cluster([address, *others]), GROUP, threading.Event(), time.monotonic)
        victim = next(
            s.node_id for s in cluster.specs if cluster.broker_address(s.node_id) == address
        )
        cluster.stop_node(victim, kill=True)

        def moved() -> bool:
            finder.forget()
            try:
                return finder.coordinator(2) != address
            except (KafkaError, grpc.RpcError):
                return False  # no coordinator yet, or a broker that is gone

        wait_for("a new coordinator", moved, 60)
        finder.cluster.close()
        assert consumer.committed(tps) == before  # intact on the new coordinator
        produce(cluster, 300, 150)
        # The member keeps consuming (rejoining if its session lapsed) from where it was.
        assert sorted(consume(consumer, 150)) == list(range(300, 450))
        consumer.commit()
    with Consumer(cluster.bootstrap_servers, group_id=GROUP, auto_offset_reset="earliest") as new:
        new.subscribe([TOPIC])
        produce(cluster, 450, 30)
        assert sorted(consume(new, 30)) == list(range(450, 480))  # nothing before is re-read
    cluster.start_node(victim)
