"""Choosing a partition for a record, as Kafka's producer does.

* A record with a key goes to ``positive(murmur2(key)) % partition_count``: byte for byte
  ``org.apache.kafka.common.utils.Utils.murmur2`` and ``Utils.toPositive`` (``& 0x7fffffff``),
  so keys land on the same partitions as with a Java producer.
* A record without a key uses sticky partitioning (KIP-480): the producer sticks to one
  partition per topic until a new batch would be opened for it (the previous batch was sent
  or filled), then picks another one at random among the partitions whose leader is known.

Pure: the random generator is passed in.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence

_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_MASK32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 of ``data`` as Java's signed int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    body = length & ~3
    for (word,) in struct.iter_unpack("<I", data[:body]):
        k = (word * _M) & _MASK32
        k ^= k >> _R
        k = (k * _M) & _MASK32
        h = ((h * _M) & _MASK32) ^ k
    extra = length & 3
    if extra >= 3:
        h ^= data[body + 2] << 16
    if extra >= 2:
        h ^= data[body + 1] << 8
    if extra >= 1:
        h ^= data[body]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(number: int) -> int:
    """Kafka's ``Utils.toPositive``: clear the sign bit (not ``abs``)."""
    return number & 0x7FFFFFFF


def partition_for_key(key: bytes, partition_count: int) -> int:
    if partition_count <= 0:
        raise ValueError(f"partition_count must be positive, got {partition_count}")
    return to_positive(murmur2(key)) % partition_count


class StickyPartitioner:
    """KIP-480's per-topic sticky partition for records without a key. Not thread-safe: the
    producer calls it under its own lock."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._sticky: dict[str, int] = {}

    def current(self, topic: str, partition_count: int) -> int | None:
        """The topic's sticky partition, None when one must be chosen (on every send: cheap)."""
        current = self._sticky.get(topic)
        return None if current is None or current >= partition_count else current

    def partition(self, topic: str, available: Sequence[int], partition_count: int) -> int:
        """The topic's current sticky partition, choosing one when there is none yet."""
        current = self._sticky.get(topic)
        if current is None or current >= partition_count:
            current = self._choose(topic, available, partition_count, previous=None)
        return current

    def on_new_batch(
        self, topic: str, previous: int, available: Sequence[int], partition_count: int
    ) -> int:
        """A new batch would be opened for ``previous``: move on (Kafka's ``onNewBatch``).
        Only the partition that was sticky moves the topic on; the new choice differs from
        ``previous`` whenever another partition is possible."""
        current = self._sticky.get(topic)
        if current is not None and current != previous:
            return current
        return self._choose(topic, available, partition_count, previous=previous)

    def _choose(
        self, topic: str, available: Sequence[int], partition_count: int, previous: int | None
    ) -> int:
        if partition_count <= 0:
            raise ValueError(f"partition_count must be positive, got {partition_count}")
        pool = [p for p in available if p < partition_count] or list(range(partition_count))
        if previous is not None and len(pool) > 1:
            pool = [p for p in pool if p != previous]
        choice = pool[self._rng.randrange(len(pool))]
        self._sticky[topic] = choice
        return choice
