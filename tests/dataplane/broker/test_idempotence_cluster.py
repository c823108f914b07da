"""Lost answers against a real 3-node cluster: every broker drops the response of every
``DROP_EVERY``-th Produce request after serving it (``fault.produce.drop.response.every``), so
the producer times out and retries batches that are already stored.

- The idempotent producer (the default) stores every record exactly once, in order, at the offset
  it was acknowledged with, also while the leader of a partition is SIGKILLed mid-way.
- A producer without idempotence, same faults: its retries store records twice, which proves
  the fault point bites.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator

import pytest

from dataplane.client import AdminClient, Consumer, Producer
from dataplane.client.producer import RecordFuture
from dataplane.tools.local_cluster import LocalCluster, wait_for
from tests.dataplane.cluster_support import create_topic, running_cluster

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("dataplane-idempotence")]

DROP_EVERY = 5
REQUEST_TIMEOUT_MS = 1000  # how long the producer waits for a lost answer before retrying
DROP_LOG_LINE = b"fault.produce.drop.response.every="


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    overrides: dict[str, str | int] = {"fault.produce.drop.response.every": DROP_EVERY}
    with running_cluster(tmp_path_factory.mktemp("idempotence"), "idempotence", overrides) as c:
        yield c


def producer(cluster: LocalCluster, idempotent: bool) -> Producer:
    return Producer(
        cluster.bootstrap_servers,
        acks="all",
        enable_idempotence=idempotent,
        linger_ms=2,
        batch_size=600,  # about 20 records a batch: many requests, so many lost answers
        request_timeout_ms=REQUEST_TIMEOUT_MS,
        retry_backoff_ms=50,
        delivery_timeout_ms=120_000,
    )


def read_back(cluster: LocalCluster, topic: str, partitions: int) -> dict[int, list[bytes]]:
    """Every record of ``topic`` up to the end offsets, by partition, in offset order."""
    seen: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    with Consumer(cluster.bootstrap_servers, auto_offset_reset="earliest") as consumer:
        tps = [(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < end for tp, end in ends.items()):
            assert time.monotonic() < deadline, "reading back took too long"
            for tp, records in consumer.poll(timeout_ms=200).items():
                seen[tp.partition] += [r.value or b"" for r in records]
    return seen


def dropped_responses(cluster: LocalCluster) -> int:
    return sum(spec.log_path.read_bytes().count(DROP_LOG_LINE) for spec in cluster.specs)


def test_lost_answers_and_a_leader_sigkill_store_every_record_exactly_once(
    cluster: LocalCluster,
) -> None:
    topic, partitions, count = "exactly-once", 3, 1500  # 75+ batches: 15-30 answers lost
    create_topic(cluster, topic, partitions, configs={"min.insync.replicas": "2"})
    admin = AdminClient(cluster.bootstrap_servers)
    dropped_before = dropped_responses(cluster)
    values = [b"record-%06d" % n for n in range(count)]
    futures: list[RecordFuture] = []
    try:
        with producer(cluster, idempotent=True) as writer:
            for n, value in enumerate(values[: count // 2]):
                futures.append(writer.send(topic, value, key=b"key-%d" % (n % 40)))
            wait_for("acknowledgements", lambda: sum(f.done() for f in futures) > count // 4)
            victim = admin.describe_topics([topic])[topic].partitions[0].leader
            cluster.stop_node(victim, kill=True)
            for n, value in enumerate(values[count // 2 :], start=count // 2):
                futures.append(writer.send(topic, value, key=b"key-%d" % (n % 40)))
            writer.flush(timeout=180)
        cluster.start_node(victim)
        wait_for("the killed leader back in every ISR", lambda: all(
            victim in p.isr for p in admin.describe_topics([topic])[topic].partitions
        ), timeout_s=60)  # fmt: skip
    finally:
        admin.close()
    failed = [f.exception() for f in futures if f.exception() is not None]
    assert not failed, f"{len(failed)} sends failed, the first: {failed[0]}"
    assert dropped_responses(cluster) - dropped_before >= 5, "answers were lost and retried"
    seen = read_back(cluster, topic, partitions)
    stored = [v for values_of in seen.values() for v in values_of]
    duplicates = [v for v, n in collections.Counter(stored).items() if n > 1]
    assert not duplicates, f"{len(duplicates)} records stored twice, e.g. {duplicates[:3]}"
    assert sorted(stored) == values, "every record stored"
    for partition, in_log in seen.items():
        assert in_log == sorted(in_log), f"partition {partition} keeps the send order"
    for future, value in zip(futures, values, strict=True):
        meta = future.result()
        assert seen[meta.partition][meta.offset] == value, "acknowledged at its stored offset"


def test_without_idempotence_the_lost_answers_store_records_twice(cluster: LocalCluster) -> None:
    topic, count = "at-least-once", 600
    create_topic(cluster, topic, 1, configs={"min.insync.replicas": "2"})
    values = [b"plain-%06d" % n for n in range(count)]
    with producer(cluster, idempotent=False) as writer:
        futures = [writer.send(topic, value) for value in values]
        writer.flush(timeout=180)
    assert all(f.exception() is None for f in futures), "every send acknowledged, eventually"
    stored = read_back(cluster, topic, 1)[0]
    counts = collections.Counter(stored)
    assert set(counts) == set(values), "nothing lost"
    assert sum(n - 1 for n in counts.values()) > 0, "a retry after a lost answer duplicates"
