"""Writing and reading back one partition (partition 0) in the power-loss cluster tests."""

from __future__ import annotations

from dataplane.client import Consumer, Producer, TopicPartition
from dataplane.tools.local_cluster import wait_for


def produce(bootstrap: list[str], topic: str, prefix: str, count: int) -> dict[str, int]:
    """Send ``count`` records with acks=all to partition 0; value -> the offset it was
    acknowledged at."""
    with Producer(bootstrap, acks="all", delivery_timeout_ms=60_000) as producer:
        futures = {
            f"{prefix}-{n}": producer.send(topic, f"{prefix}-{n}".encode(), partition=0)
            for n in range(count)
        }
        producer.flush(60)
        return {value: future.result().offset for value, future in futures.items()}


def read_all(bootstrap: list[str], topic: str) -> dict[int, str]:
    """Every record of partition 0 up to its end offset now: offset -> value."""
    tp = TopicPartition(topic, 0)
    stored: dict[int, str] = {}
    with Consumer(bootstrap, request_timeout_ms=10_000) as consumer:
        end = consumer.end_offsets([tp])[tp]
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)

        def done() -> bool:
            for record in consumer.poll(200).get(tp, []):
                stored[record.offset] = (record.value or b"").decode()
            return consumer.position(tp) >= end

        wait_for("every record of the partition", done, 60)
    return stored
