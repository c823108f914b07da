"""Shared helpers of the Spark tests: a module's SparkSession, topics, producing, reading back."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from dataplane.client import Consumer, Producer, RecordMetadata
from dataplane.tools.local_cluster import LocalCluster, wait_for
from spark.session import local_session
from tests.dataplane.cluster_support import create_topic

READ_DEADLINE_S = 60.0


def session_for(name: str) -> Iterator[SparkSession]:
    session = local_session(f"tests-{name}")
    try:
        yield session
    finally:
        session.stop()


def servers(cluster: LocalCluster) -> str:
    return ",".join(cluster.bootstrap_servers)


def create(cluster: LocalCluster, name: str, partitions: int, **configs: str) -> None:
    create_topic(cluster, name, partitions, 3, dict(configs))


def produce(
    cluster: LocalCluster,
    topic: str,
    values: Sequence[bytes],
    keys: Sequence[bytes | None] | None = None,
    **kwargs: Any,
) -> list[RecordMetadata]:
    with Producer(cluster.bootstrap_servers, linger_ms=5, **kwargs) as producer:
        futures = [
            producer.send(topic, v, key=None if keys is None else keys[n])
            for n, v in enumerate(values)
        ]
        producer.flush(timeout=60)
    return [f.result(timeout=1) for f in futures]


def read(session: SparkSession, cluster: LocalCluster, **options: str) -> DataFrame:
    reader = session.read.format("raftlog").option("raftlog.bootstrap.servers", servers(cluster))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def consume_all(cluster: LocalCluster, topic: str) -> list[tuple[int, int, bytes | None, bytes]]:
    """(partition, offset, key, value) of every record below the high watermarks."""
    seen: list[tuple[int, int, bytes | None, bytes]] = []
    with Consumer(cluster.bootstrap_servers, auto_offset_reset="earliest") as consumer:
        tps = [(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)

        def done() -> bool:
            for tp, records in consumer.poll(timeout_ms=200).items():
                seen.extend((tp.partition, r.offset, r.key, r.value or b"") for r in records)
            return all(consumer.position(tp) >= end for tp, end in ends.items())

        wait_for(f"all of {topic}", done, READ_DEADLINE_S)
    return sorted(seen)
