"""Kafka protocol benchmark: librdkafka (confluent-kafka) against the KAFKA listener, next to
raftlog's own gRPC client on the same cluster.

``python -m bench.kafka_protocol_bench --out bench/results/latest.json [--quick]``

A LocalCluster of 3 combined nodes on 127.0.0.67-69 (reserved for this benchmark), data in a
temporary directory removed afterwards. One topic per client (6 partitions, replication factor 3,
``min.insync.replicas`` 2); 1 KiB records with acks=all and idempotence:

1. confluent-kafka's Producer (``linger.ms`` 5, its default ``batch.size``), timed from the first
   ``produce`` to the end of ``flush``: records/s and MB/s of acknowledged records.
2. confluent-kafka's Consumer (``assign``, every partition from the beginning, no group, its
   default fetch settings: ``fetch.wait.max.ms`` 500, ``fetch.min.bytes`` 1,
   ``max.partition.fetch.bytes`` 1 MiB, ``queued.max.messages.kbytes`` 64 MiB, as the gRPC
   client's): records/s until every record was read, timed from ``assign`` once the consumer
   has the topic's metadata, as the gRPC client is timed from its ``assign``. (Assigned a
   partition whose leader it does not know yet, librdkafka starts an offset-query timer and
   sends ListOffsets when it fires, ~0.5 s later in its debug log: that wait, not the broker,
   put 0.5-1.2 s before the first record in runs of this bench, whose committed 200,000-record
   consume took 2.2 s.)
3. The same two figures with raftlog's gRPC client (``raftlog perf produce`` / ``perf consume``'s
   cores) and the same record count, on its own topic.

MB is 10**6 bytes of values. Every wait polls a condition with a deadline.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import Producer as RdProducer
from confluent_kafka import TopicPartition as RdTopicPartition
from rich.console import Console
from rich.table import Table

from bench import bench_main
from dataplane.client import AdminClient, NewTopic
from dataplane.tools.local_cluster import LocalCluster, pick_cluster_port, wait_for
from dataplane.tools.perf import run_consume_perf, run_produce_perf

FIRST_HOST = 67  # 127.0.0.67-69 are this benchmark's
PARTITIONS = 6
RECORD_BYTES = 1024
RECORDS = {"full": 200_000, "quick": 5_000}
WAIT_S = 120.0


@contextmanager
def cluster_in(workdir: Path, console: Console) -> Iterator[LocalCluster]:
    root = Path(tempfile.mkdtemp(prefix="kafka-protocol-", dir=workdir))
    hosts = [f"127.0.0.{FIRST_HOST + n}" for n in range(3)]
    cluster = LocalCluster(root, nodes=3, first_host=FIRST_HOST, port=pick_cluster_port(hosts))
    try:
        console.log(
            f"starting 3 nodes; KAFKA listeners {', '.join(cluster.kafka_bootstrap_servers)}"
        )
        cluster.up(timeout_s=WAIT_S)
        yield cluster
    finally:
        cluster.down()
        shutil.rmtree(root, ignore_errors=True)


def create_topic(cluster: LocalCluster, name: str) -> None:
    admin = AdminClient(cluster.bootstrap_servers)
    try:
        configs = {"min.insync.replicas": "2"}
        errors = admin.create_topics([NewTopic(name, PARTITIONS, 3, configs=configs)])
        if errors[name] is not None:
            raise RuntimeError(f"cannot create {name}: {errors[name]}")
        wait_for(
            f"leaders of {name}",
            lambda: all(p.leader >= 0 for p in admin.describe_topics([name])[name].partitions),
            WAIT_S,
        )
    finally:
        admin.close()


def rd_produce(servers: str, topic: str, records: int) -> dict[str, Any]:
    value = os.urandom(RECORD_BYTES)
    acknowledged = failed = 0

    def on_delivery(error: object, message: object) -> None:
        nonlocal acknowledged, failed
        if error is None:
            acknowledged += 1
        else:
            failed += 1

    producer = RdProducer({
        "bootstrap.servers": servers, "enable.idempotence": True, "acks": "all",
        "linger.ms": 5, "queue.buffering.max.messages": 1_000_000,
    })  # fmt: skip
    started = time.perf_counter()
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, value=value, on_delivery=on_delivery)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(WAIT_S)
    seconds = time.perf_counter() - started
    if left or failed:
        raise RuntimeError(f"librdkafka: {left} records undelivered, {failed} failed")
    return _figures(acknowledged, seconds)


def rd_consume(servers: str, topic: str, records: int) -> dict[str, Any]:
    consumer = RdConsumer({
        "bootstrap.servers": servers, "group.id": "bench-assign-only",
        "enable.auto.commit": False,
    })  # fmt: skip
    try:
        consumer.list_topics(topic, timeout=WAIT_S)  # the leaders, before the clock starts
        started = time.perf_counter()
        consumer.assign([RdTopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        read = 0
        deadline = started + WAIT_S
        while read < records:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"librdkafka consumer read {read} of {records}")
            for message in consumer.consume(num_messages=10_000, timeout=0.5):
                if message.error() is None:
                    read += 1
        return _figures(read, time.perf_counter() - started)
    finally:
        consumer.close()


def _figures(records: int, seconds: float) -> dict[str, Any]:
    return {
        "records": records,
        "seconds": round(seconds, 3),
        "records_per_s": round(records / seconds),
        "mb_per_s": round(records * RECORD_BYTES / seconds / 1e6, 1),
    }


def run(workdir: Path, records: int, console: Console) -> dict[str, Any]:
    load_start = os.getloadavg()
    with cluster_in(workdir, console) as cluster:
        create_topic(cluster, "rd-perf")
        create_topic(cluster, "grpc-perf")
        servers = ",".join(cluster.kafka_bootstrap_servers)
        console.log(f"confluent-kafka produce: {records:,} records of {RECORD_BYTES} B, acks=all")
        rd_produced = rd_produce(servers, "rd-perf", records)
        console.log("confluent-kafka consume")
        rd_consumed = rd_consume(servers, "rd-perf", records)
        console.log("gRPC client produce and consume, same count")
        produced = run_produce_perf(cluster.bootstrap_servers, "grpc-perf", records, RECORD_BYTES)
        consumed = run_consume_perf(cluster.bootstrap_servers, "grpc-perf", records)
    return {
        "nodes": 3,
        "partitions": PARTITIONS,
        "replication_factor": 3,
        "record_bytes": RECORD_BYTES,
        "acks": "all",
        "idempotence": True,
        "confluent_kafka": {"produce": rd_produced, "consume": rd_consumed},
        "grpc_client": {
            "produce": _figures(produced.records, produced.seconds),
            "consume": _figures(consumed.records, consumed.seconds),
        },
        "load_avg_start": [round(x, 2) for x in load_start],
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
    }


def print_report(console: Console, figures: dict[str, Any]) -> None:
    table = Table(title="Kafka protocol (librdkafka) vs gRPC client: 1 KiB, acks=all, RF 3")
    for column in ("client", "produce records/s", "produce MB/s", "consume records/s"):
        table.add_column(column, justify="right")
    for name, key in (("confluent-kafka", "confluent_kafka"), ("raftlog gRPC", "grpc_client")):
        row = figures[key]
        table.add_row(
            name, f"{row['produce']['records_per_s']:,}", f"{row['produce']['mb_per_s']}",
            f"{row['consume']['records_per_s']:,}",
        )  # fmt: skip
    console.print(table)


def main(argv: Sequence[str] | None = None) -> int:
    def figures(workdir: Path, quick: bool, progress: Console) -> dict[str, Any]:
        return run(workdir, RECORDS["quick" if quick else "full"], progress)

    return bench_main(argv, __doc__.splitlines()[0], "kafka_protocol", figures, print_report)


if __name__ == "__main__":
    sys.exit(main())
