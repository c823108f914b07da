"""Which partition of an internal topic holds a coordinator's key: Kafka's
``Utils.abs(key.hashCode()) % partitions``, with Java's ``String.hashCode``.

A group's offsets and state live in one ``__consumer_offsets`` partition, a transactional id's
state in one ``__transaction_state`` partition, chosen this way, so a raftlog cluster puts each
where a Kafka cluster would. Pure and shared: the coordinators use it to route, the chaos checker
to know which partition's unclean election can take a group's commits back."""

from __future__ import annotations


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units), as a signed 32-bit int."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for(key: str, partitions: int) -> int:
    """Kafka's ``Utils.abs(key.hashCode()) % partitions``: the same group (or transactional
    id), the same partition as a Kafka cluster would pick."""
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions
