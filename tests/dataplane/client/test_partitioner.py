"""Kafka's key partitioner (murmur2) and KIP-480 sticky partitioning."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from dataplane.client.partitioner import (
    StickyPartitioner,
    murmur2,
    partition_for_key,
    to_positive,
)


@given(st.binary(max_size=200))
def test_murmur2_matches_kafka_python(data: bytes) -> None:
    assert murmur2(data) & 0xFFFFFFFF == kafka_python_murmur2(data)


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=1000))
def test_partition_for_key_is_kafkas_formula(key: bytes, count: int) -> None:
    assert partition_for_key(key, count) == (kafka_python_murmur2(key) & 0x7FFFFFFF) % count


def test_murmur2_is_a_signed_java_int() -> None:
    values = [murmur2(bytes([i, i + 1, i + 2])) for i in range(200)]
    assert all(-(2**31) <= v < 2**31 for v in values)
    assert any(v < 0 for v in values)  # Java's int: half of the hashes are negative
    assert all(0 <= to_positive(v) < 2**31 for v in values)
    assert to_positive(-1) == 0x7FFFFFFF  # toPositive clears the sign bit, it is not abs()


def test_sticky_partition_stays_until_a_new_batch() -> None:
    sticky = StickyPartitioner(random.Random(7))
    first = sticky.partition("t", [0, 1, 2, 3], 4)
    assert all(sticky.partition("t", [0, 1, 2, 3], 4) == first for _ in range(50))
    moved = sticky.on_new_batch("t", first, [0, 1, 2, 3], 4)
    assert moved != first
    assert sticky.partition("t", [0, 1, 2, 3], 4) == moved


def test_sticky_only_the_sticky_partition_moves_the_topic_on() -> None:
    sticky = StickyPartitioner(random.Random(1))
    current = sticky.partition("t", [0, 1, 2], 3)
    other = (current + 1) % 3
    assert sticky.on_new_batch("t", other, [0, 1, 2], 3) == current


def test_sticky_picks_among_available_partitions_and_spreads() -> None:
    sticky = StickyPartitioner(random.Random(3))
    seen = set()
    current = sticky.partition("t", [1, 3], 4)
    for _ in range(100):
        assert current in (1, 3)
        seen.add(current)
        current = sticky.on_new_batch("t", current, [1, 3], 4)
    assert seen == {1, 3}


def test_sticky_falls_back_to_all_partitions_when_none_is_available() -> None:
    sticky = StickyPartitioner(random.Random(5))
    picks = set()
    current = sticky.partition("t", [], 3)
    for _ in range(60):
        picks.add(current)
        current = sticky.on_new_batch("t", current, [], 3)
    assert picks == {0, 1, 2}


def test_sticky_topics_are_independent() -> None:
    sticky = StickyPartitioner(random.Random(9))
    a = sticky.partition("a", [0, 1, 2, 3], 4)
    b = sticky.partition("b", [0, 1, 2, 3], 4)
    sticky.on_new_batch("b", b, [0, 1, 2, 3], 4)
    assert sticky.partition("a", [0, 1, 2, 3], 4) == a
