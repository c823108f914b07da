"""``log.cache.tail.bytes`` on real nodes: every replica drops what lies behind its partition's
tail from the page cache once written back, and a consumer reading from the beginning still gets
every record, from the disk."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from dataplane.client import Consumer, Producer, TopicPartition
from dataplane.tools.local_cluster import wait_for
from tests.dataplane.cluster_support import consume_values, create_topic, running_cluster
from tests.raftlog.test_page_cache import old_and_tail

MiB = 1 << 20
TAIL_BYTES = MiB
RECORDS = 8 * 1024  # 1000-byte values: ~8 MiB per replica, over 1 MiB segments
WAIT_S = 60.0


def test_replicas_keep_only_the_tail_cached_and_everything_reads_back(tmp_path: Path) -> None:
    overrides: dict[str, str | int] = {"log.cache.tail.bytes": TAIL_BYTES}
    with running_cluster(tmp_path, "page_cache", overrides) as cluster:
        create_topic(cluster, "cached", 1, configs={"segment.bytes": str(MiB)})
        values = [f"{n:08d}".ljust(1000, ".") for n in range(RECORDS)]
        with Producer(cluster.bootstrap_servers, acks="all") as producer:
            for value in values:
                producer.send("cached", value=value.encode())
            producer.flush()
        replicas = sorted(tmp_path.glob("node-*/data/cached-0"))
        assert len(replicas) == 3

        def dropped() -> dict[str, tuple[list[bool], list[bool]]] | None:
            cached = {path.parent.parent.name: old_and_tail(path, TAIL_BYTES) for path in replicas}
            return None if any(any(old) for old, _ in cached.values()) else cached

        # each broker's maintenance thread advises its logs every 100 ms
        cached = wait_for("the old pages of every replica dropped", dropped, WAIT_S)
        assert all(len(old) > 1000 for old, _ in cached.values())
        assert all(tail and all(tail) for _, tail in cached.values()), "the tail stays cached"
        for spec in cluster.specs:  # each replica counted what it released
            url = f"http://{cluster.metrics_address(spec.node_id)}/metrics"
            with urllib.request.urlopen(url, timeout=5) as response:
                metrics = response.read().decode()
            released = re.search(r"^raftlog_page_cache_released_bytes_total (\S+)$", metrics, re.M)
            assert released is not None and float(released.group(1)) >= 5 * MiB
        with Consumer(cluster.bootstrap_servers, group_id=None) as consumer:
            consumer.assign([TopicPartition("cached", 0)])
            consumer.seek_to_beginning()
            assert consume_values(consumer, RECORDS) == values
