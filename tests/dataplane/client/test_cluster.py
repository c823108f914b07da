"""The client library against a real 3-node cluster: round trips over every acks setting and
compression type, offsets by time, metrics over HTTP, and a leader SIGKILL under acks=all load
that loses no acknowledged record while the old leader comes back as a follower."""

from __future__ import annotations

import functools
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest

from dataplane.client import AdminClient, Consumer, Producer, RecordMetadata
from dataplane.client.producer import RecordFuture
from dataplane.tools.local_cluster import LocalCluster, wait_for
from tests.dataplane.cluster_support import create_topic, running_cluster

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("dataplane-client")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("client"), "client") as running:
        yield running


def create(cluster: LocalCluster, name: str, partitions: int, **configs: str) -> None:
    create_topic(cluster, name, partitions, 3, dict(configs))


def consume_all(
    cluster: LocalCluster, topic: str, partitions: int, expected: int | None = None
) -> dict[int, list[bytes]]:
    """Every record up to the end offsets, or (with acks 0/1 the high watermark may still be
    moving) until ``expected`` records arrived."""
    seen: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    with Consumer(cluster.bootstrap_servers, auto_offset_reset="earliest") as consumer:
        tps = [(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)

        def done() -> bool:
            if expected is not None:
                return sum(len(v) for v in seen.values()) >= expected
            return all(consumer.position(tp) >= end for tp, end in ends.items())

        deadline = time.monotonic() + 60
        while not done():
            assert time.monotonic() < deadline, "consuming took too long"
            for tp, records in consumer.poll(timeout_ms=200).items():
                seen[tp.partition] += [r.value or b"" for r in records]
    return seen


@pytest.mark.parametrize("acks", ["all", 1, 0])
@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_round_trip(cluster: LocalCluster, acks: str | int, compression: str) -> None:
    topic = f"rt-{acks}-{compression}"
    create(cluster, topic, 2)
    values = [b"%s-%d-" % (topic.encode(), n) * 4 for n in range(300)]
    with Producer(
        cluster.bootstrap_servers,
        acks=acks,  # type: ignore[arg-type]
        compression_type=compression,  # type: ignore[arg-type]
        linger_ms=2,
    ) as producer:
        futures = [producer.send(topic, v, key=b"k%d" % (n % 7)) for n, v in enumerate(values)]
        producer.flush(timeout=60)
    metadata = [f.result(timeout=1) for f in futures]
    if acks != 0:
        assert all(m.offset >= 0 for m in metadata)
    seen = consume_all(cluster, topic, 2, expected=len(values))
    assert sorted(v for vs in seen.values() for v in vs) == sorted(values)
    for m, v in zip(metadata, values, strict=True):
        assert v in seen[m.partition], "a record is in the partition its key hashed to"


def test_offsets_for_times_and_end_offsets(cluster: LocalCluster) -> None:
    create(cluster, "timed", 1)
    base_ms = int(time.time() * 1000) - 60_000
    with Producer(cluster.bootstrap_servers) as producer:
        for n in range(10):
            producer.send("timed", b"%d" % n, timestamp_ms=base_ms + n * 1000)
        producer.flush(timeout=30)
    with Consumer(cluster.bootstrap_servers) as consumer:
        tp = ("timed", 0)
        found = consumer.offsets_for_times({tp: base_ms + 4500})
        assert [(k.topic, k.partition, v) for k, v in found.items()] == [
            ("timed", 0, (5, base_ms + 5000))
        ]
        assert list(consumer.end_offsets([tp]).values()) == [10]
        assert list(consumer.beginning_offsets([tp]).values()) == [0]


def test_metrics_are_served_over_http(cluster: LocalCluster) -> None:
    create(cluster, "metered", 1)
    with Producer(cluster.bootstrap_servers) as producer:
        producer.send("metered", b"x" * 100).result(timeout=30)
    text = "\n".join(_scrape(cluster))
    for name in (
        'raftlog_bytes_in_total{topic="metered"}',
        "raftlog_request_latency_seconds_bucket",
        'raftlog_partition_high_watermark{partition="0",topic="metered"}',
        "raftlog_under_replicated_partitions",
        "raftlog_controller_active",
        "raftlog_controller_raft_tick_gap_max_seconds",
        "raftlog_isr_shrinks_total",
        "raftlog_page_cache_released_bytes_total",
    ):
        assert name in text, f"{name} missing from /metrics"
    assert sum("raftlog_controller_active 1.0" in body for body in _scrape(cluster)) == 1
    # a deleted topic's series go with it (Kafka's maybeRemoveTopicMetrics)
    admin = AdminClient(cluster.bootstrap_servers)
    try:
        assert admin.delete_topics(["metered"]) == {"metered": None}
    finally:
        admin.close()
    wait_for(
        "the deleted topic's series to go",
        lambda: not any('topic="metered"' in body for body in _scrape(cluster)),
    )


def _scrape(cluster: LocalCluster) -> list[str]:
    bodies = []
    for spec in cluster.specs:
        url = f"http://{cluster.metrics_address(spec.node_id)}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            bodies.append(response.read().decode())
    return bodies


def test_leader_sigkill_under_acks_all_load_loses_nothing(cluster: LocalCluster) -> None:
    create(cluster, "load", 3, **{"min.insync.replicas": "2"})
    admin = AdminClient(cluster.bootstrap_servers)
    acked: list[tuple[RecordMetadata, bytes]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def on_done(value: bytes, future: RecordFuture) -> None:
        if future.exception() is None:
            with lock:
                acked.append((future.result(), value))

    def produce() -> None:
        with Producer(cluster.bootstrap_servers, linger_ms=2) as producer:
            n = 0
            while not stop.is_set():
                value = b"value-%08d" % n
                producer.send("load", value, key=b"%d" % (n % 50)).add_done_callback(
                    functools.partial(on_done, value)
                )
                n += 1
                if n % 200 == 0:
                    producer.flush(timeout=60)  # bound the backlog: steady load, not a flood
            producer.flush(timeout=60)

    writer = threading.Thread(target=produce)
    writer.start()
    try:
        wait_for("some acknowledged records", lambda: len(acked) > 2000, timeout_s=60)
        victim = admin.describe_topics(["load"])["load"].partitions[0].leader
        cluster.stop_node(victim, kill=True)
        acked_at_kill = len(acked)
        wait_for("writes to resume", lambda: len(acked) > acked_at_kill + 2000, timeout_s=60)
        cluster.start_node(victim)
        wait_for("the old leader back in every ISR", lambda: all(
            victim in p.isr for p in admin.describe_topics(["load"])["load"].partitions
        ), timeout_s=60)  # fmt: skip
        partition_0 = admin.describe_topics(["load"])["load"].partitions[0]
        assert partition_0.leader != victim, "the old leader returned as a follower"
    finally:
        stop.set()
        writer.join(timeout=120)
        admin.close()
    seen = consume_all(cluster, "load", 3)
    stored = [v for values in seen.values() for v in values]
    assert len(set(stored)) == len(stored), "no record is stored twice"
    with lock:
        assert len(acked) > acked_at_kill
        for meta, value in acked:
            assert seen[meta.partition][meta.offset] == value, f"acknowledged {meta} is gone"


def test_sigterm_is_a_controlled_shutdown_that_moves_leadership_first(
    cluster: LocalCluster,
) -> None:
    create(cluster, "graceful", 1, **{"min.insync.replicas": "2"})
    admin = AdminClient(cluster.bootstrap_servers)
    try:
        leader = admin.describe_topics(["graceful"])["graceful"].partitions[0].leader
        with Producer(cluster.bootstrap_servers, linger_ms=1) as producer:
            before = [producer.send("graceful", b"before-%d" % n) for n in range(200)]
            cluster.stop_node(leader)  # SIGTERM
            after = [producer.send("graceful", b"after-%d" % n) for n in range(200)]
            producer.flush(timeout=60)
        assert all(f.exception() is None for f in before + after), "no write failed"
        moved = admin.describe_topics(["graceful"])["graceful"].partitions[0]
        assert moved.leader not in (leader, -1)
        log = cluster.spec(leader).log_path.read_text()
        assert "controlled shutdown granted" in log
        cluster.start_node(leader)
        wait_for("the node back in the ISR", lambda: leader in (
            admin.describe_topics(["graceful"])["graceful"].partitions[0].isr))  # fmt: skip
    finally:
        admin.close()
    assert len(consume_all(cluster, "graceful", 1)[0]) == 400
