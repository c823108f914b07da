"""The write path's pure parts: the column-at-once murmur2 against the per-key one (and so
against Java's partitioner), each row's partition, and settling per batch. No Spark, no cluster
(``test_batch.py`` writes through Spark to a real cluster and checks where the keys landed)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.client import BatchResult, TopicPartition
from dataplane.client.partitioner import murmur2, partition_for_key, to_positive
from raftlog.errors import ErrorCode, KafkaError
from spark._key_hash import positive_murmur2
from spark._writer import _key_partitions, _Pending

keys = st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(keys, st.integers(0, 5), st.sampled_from([pa.binary(), pa.large_binary()]))
def test_the_column_hash_is_kafkas_murmur2_of_each_key(
    values: list[bytes | None], cut: int, arrow_type: pa.DataType
) -> None:
    column = pa.array(values, arrow_type).slice(min(cut, len(values)))  # a slice: offset > 0
    expected = [to_positive(murmur2(k)) for k in values[min(cut, len(values)) :] if k is not None]
    hashed = positive_murmur2(column).tolist()
    assert [h for h, k in zip(hashed, column.to_pylist(), strict=True) if k is not None] == (
        expected
    )


@given(st.lists(st.text(max_size=12), max_size=30))
def test_string_keys_hash_as_their_utf8_bytes(values: list[str]) -> None:
    for arrow_type in (pa.string(), pa.large_string()):
        assert positive_murmur2(pa.array(values, arrow_type)).tolist() == [
            to_positive(murmur2(v.encode())) for v in values
        ]


def test_known_values_and_bad_types() -> None:
    # Kafka's own test vectors (UtilsTest.testMurmur2), made positive
    vectors = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536}
    hashed = positive_murmur2(pa.array(list(vectors), pa.binary())).tolist()
    assert hashed == [to_positive(h) for h in vectors.values()]
    assert positive_murmur2(pa.array([], pa.binary())).tolist() == []
    with pytest.raises(TypeError, match="binary or string"):
        positive_murmur2(pa.array([1, 2]))


class _Partitions:
    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def partitions_for(self, topic: str) -> list[int]:
        return list(range(self.counts[topic]))


def test_each_rows_partition_explicit_then_key_then_sticky() -> None:
    batch = pa.RecordBatch.from_pydict({
        "key": pa.array([b"a", None, b"b", b"c", None], pa.binary()),
        "partition": pa.array([None, None, 0, None, 4], pa.int32()),
        "value": pa.array([b"v"] * 5, pa.binary()),
    })  # fmt: skip
    topics = ["t", "t", "t", "u", "t"]
    chosen = _key_partitions(_Partitions({"t": 3, "u": 7}), batch, topics)  # type: ignore[arg-type]
    assert chosen == [partition_for_key(b"a", 3), None, 0, partition_for_key(b"c", 7), 4]
    no_keys = pa.RecordBatch.from_pydict({"value": pa.array([b"v"], pa.binary())})
    assert _key_partitions(_Partitions({}), no_keys, ["t"]) is None  # type: ignore[arg-type]


def test_settling_counts_records_per_batch_and_raises_a_failed_batchs_error() -> None:
    pending = _Pending()
    first, second, third = (BatchResult(TopicPartition("t", p)) for p in (0, 1, 0))
    pending.batches.update({first: 3, second: 2, third: 4})
    first.succeed(0, -1)
    third.succeed(3, -1)
    pending.settle()  # the second is still out: the third waits behind it
    assert pending.result.records == {("t", 0): 3}
    assert list(pending.batches) == [second, third]
    second.fail(KafkaError(ErrorCode.MESSAGE_TOO_LARGE, "too large"))
    with pytest.raises(KafkaError, match="too large"):
        pending.settle()
