"""Transactions through the KAFKA listener, driven by Kafka's own clients on a real 3-node cluster
(127.0.0.31-33): librdkafka (confluent-kafka and kcat), kafka-python and aiokafka run their
transactional producers unchanged; read_committed consumers never see an aborted record; a
consume-transform-produce loop commits its input offsets in the same transaction as its output;
a zombie producer is fenced; the transaction APIs answer kafka-python's raw requests."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka import Producer as RdProducer

from dataplane.client import Producer
from dataplane.tools.local_cluster import LocalCluster, wait_for
from tests.dataplane.cluster_support import create_topic, running_cluster

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("kafka-transactions")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # fewer partitions of __transaction_state: quicker to create on 2 cores
    overrides: dict[str, str | int] = {"transaction.state.log.num.partitions": 5}
    with running_cluster(tmp_path_factory.mktemp("kafka-txn"), "kafka_txn", overrides) as running:
        yield running


def servers(cluster: LocalCluster) -> str:
    return ",".join(cluster.kafka_bootstrap_servers)


def rd_producer(cluster: LocalCluster, transactional_id: str, **extra: Any) -> RdProducer:
    return RdProducer({
        "bootstrap.servers": servers(cluster), "transactional.id": transactional_id,
        "transaction.timeout.ms": 60000, "linger.ms": 5, **extra,
    })  # fmt: skip


def rd_consumer(
    cluster: LocalCluster, topics: list[str], isolation: str, group: str | None = None
) -> RdConsumer:
    consumer = RdConsumer({
        "bootstrap.servers": servers(cluster),
        "group.id": group or f"reader-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "isolation.level": isolation, "session.timeout.ms": 6000,
    })  # fmt: skip
    consumer.subscribe(topics)
    return consumer


def read_values(
    cluster: LocalCluster, topic: str, isolation: str, want: int, settle_s: float = 0.0
) -> list[bytes]:
    """Values of ``topic`` in partition order, read until ``want`` were seen; with ``settle_s``,
    keep polling that much longer after (so records that should not come would show)."""
    consumer = rd_consumer(cluster, [topic], isolation)
    got: list[bytes] = []
    try:

        def done() -> bool:
            for message in consumer.consume(num_messages=500, timeout=0.2):
                if message.error() is None:
                    got.append(message.value() or b"")
            return len(got) >= want

        wait_for(f"{want} {isolation} records of {topic}", done, 90)
        if settle_s:
            consumer.consume(num_messages=500, timeout=settle_s)
    finally:
        consumer.close()
    return got


def test_librdkafka_commits_and_aborts_and_read_committed_sees_only_the_committed(
    cluster: LocalCluster,
) -> None:
    create_topic(cluster, "rd-txn", 3)
    producer = rd_producer(cluster, "rd-txn-1")
    producer.init_transactions(30)
    producer.begin_transaction()
    for n in range(30):
        producer.produce("rd-txn", value=f"committed-{n}".encode(), partition=n % 3)
    producer.commit_transaction(30)
    producer.begin_transaction()
    for n in range(20):
        producer.produce("rd-txn", value=f"aborted-{n}".encode(), partition=n % 3)
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    for n in range(10):
        producer.produce("rd-txn", value=f"after-{n}".encode(), partition=n % 3)
    producer.commit_transaction(30)

    committed = read_values(cluster, "rd-txn", "read_committed", 40, settle_s=1.0)
    assert sorted(committed) == sorted(
        [f"committed-{n}".encode() for n in range(30)] + [f"after-{n}".encode() for n in range(10)]
    )
    everything = read_values(cluster, "rd-txn", "read_uncommitted", 60)
    assert sum(v.startswith(b"aborted-") for v in everything) == 20


def test_a_librdkafka_consume_transform_produce_loop_is_exactly_once(cluster: LocalCluster) -> None:
    """Input offsets commit with the output: the output holds every input record transformed
    once, and the group's committed offsets are the input's end."""
    create_topic(cluster, "ctp-in", 3)
    create_topic(cluster, "ctp-out", 3)
    values = [f"v{n}".encode() for n in range(300)]
    with Producer(cluster.bootstrap_servers) as plain:
        for n, value in enumerate(values):
            plain.send("ctp-in", value=value, partition=n % 3)
        plain.flush()

    consumer = rd_consumer(cluster, ["ctp-in"], "read_committed", group="ctp-group")
    producer = rd_producer(cluster, "ctp-loop")
    producer.init_transactions(30)
    transformed = 0
    aborted_once = False
    try:

        def step() -> bool:
            nonlocal transformed, aborted_once
            batch = [m for m in consumer.consume(num_messages=50, timeout=0.5) if not m.error()]
            if not batch:
                return transformed >= len(values)
            producer.begin_transaction()
            for message in batch:
                producer.produce("ctp-out", value=b"T:" + (message.value() or b""),
                                 partition=message.partition() or 0)  # fmt: skip
            if not aborted_once:
                # The first transaction is abandoned: its output must never be read, and its
                # input must be read again (rewind to the committed offsets).
                aborted_once = True
                producer.abort_transaction(30)
                committed = consumer.committed(consumer.assignment(), timeout=10)
                for tp in committed:
                    tp.offset = tp.offset if tp.offset >= 0 else 0
                    consumer.seek(tp)
                return False
            positions = consumer.position(consumer.assignment())
            producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(30)
            transformed += len(batch)
            return transformed >= len(values)

        wait_for("every input record transformed", step, 120)
    finally:
        consumer.close()

    output = read_values(cluster, "ctp-out", "read_committed", len(values), settle_s=1.0)
    assert sorted(output) == sorted(b"T:" + v for v in values)  # each exactly once
    checker = RdConsumer({"bootstrap.servers": servers(cluster), "group.id": "ctp-group"})
    try:
        offsets = checker.committed([TopicPartition("ctp-in", p) for p in range(3)], timeout=10)
    finally:
        checker.close()
    assert sum(tp.offset for tp in offsets) == len(values)


def test_a_zombie_librdkafka_producer_is_fenced_and_nothing_of_it_is_read(
    cluster: LocalCluster,
) -> None:
    create_topic(cluster, "zombie", 1)
    old = rd_producer(cluster, "zombie-id")
    old.init_transactions(30)
    old.begin_transaction()
    old.produce("zombie", value=b"zombie-write")
    old.flush(30)
    new = rd_producer(cluster, "zombie-id")
    new.init_transactions(30)  # bumps the epoch: the old producer's transaction is aborted
    new.begin_transaction()
    new.produce("zombie", value=b"live-write")
    new.commit_transaction(30)
    with pytest.raises(KafkaException) as raised:
        old.produce("zombie", value=b"zombie-again")
        old.commit_transaction(30)
    assert raised.value.args[0].fatal() or raised.value.args[0].txn_requires_abort()
    got = read_values(cluster, "zombie", "read_committed", 1, settle_s=1.0)
    assert got == [b"live-write"]


def test_kafka_python_transactional_producer_and_read_committed_consumer(
    cluster: LocalCluster,
) -> None:
    from kafka import KafkaConsumer, KafkaProducer  # noqa: PLC0415 - its threads start on import

    create_topic(cluster, "kp-txn", 2)
    producer = KafkaProducer(bootstrap_servers=servers(cluster), transactional_id="kp-txn-id")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for n in range(10):
            producer.send("kp-txn", value=f"kp-{n}".encode(), partition=n % 2)
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send("kp-txn", value=b"kp-aborted", partition=0)
        producer.flush()
        producer.abort_transaction()
    finally:
        producer.close()
    consumer = KafkaConsumer(
        "kp-txn", bootstrap_servers=servers(cluster), isolation_level="read_committed",
        auto_offset_reset="earliest", consumer_timeout_ms=3000,
    )  # fmt: skip
    try:
        got: list[bytes] = []

        def done() -> bool:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend(r.value for r in records)
            return len(got) >= 10

        wait_for("kafka-python read_committed", done, 60)
        consumer.poll(timeout_ms=1000)
    finally:
        consumer.close()
    assert sorted(got) == sorted(f"kp-{n}".encode() for n in range(10))


def test_aiokafka_transactional_producer(cluster: LocalCluster) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # noqa: PLC0415

    create_topic(cluster, "aio-txn", 1)

    async def run() -> list[bytes]:
        producer = AIOKafkaProducer(
            bootstrap_servers=servers(cluster), transactional_id="aio-txn-id"
        )
        await producer.start()
        try:
            async with producer.transaction():
                for n in range(5):
                    await producer.send_and_wait("aio-txn", f"aio-{n}".encode())
            await producer.begin_transaction()
            await producer.send_and_wait("aio-txn", b"aio-aborted")
            await producer.abort_transaction()
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            "aio-txn", bootstrap_servers=servers(cluster), isolation_level="read_committed",
            auto_offset_reset="earliest",
        )  # fmt: skip
        await consumer.start()
        got: list[bytes] = []
        try:
            deadline = asyncio.get_running_loop().time() + 60
            while len(got) < 5 and asyncio.get_running_loop().time() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                got.extend(r.value for records in batches.values() for r in records)
            batches = await consumer.getmany(timeout_ms=1000)
            got.extend(r.value for records in batches.values() for r in records)
        finally:
            await consumer.stop()
        return got

    got = asyncio.run(run())
    assert sorted(got) == [f"aio-{n}".encode() for n in range(5)]


def test_kcat_sends_its_input_in_one_transaction(cluster: LocalCluster) -> None:
    create_topic(cluster, "kcat-txn", 1)
    lines = "\n".join(f"kcat-{n}" for n in range(20)) + "\n"
    subprocess.run(
        ["kcat", "-P", "-b", servers(cluster), "-t", "kcat-txn", "-p", "0",
         "-X", "transactional.id=kcat-txn-id", "-m", "30"],
        input=lines.encode(), check=True, timeout=90,
    )  # fmt: skip
    got = read_values(cluster, "kcat-txn", "read_committed", 20)
    assert got == [f"kcat-{n}".encode() for n in range(20)]
