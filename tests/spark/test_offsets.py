"""The pure core of the data source: offset specs, ranges, minPartitions, maxOffsetsPerTrigger,
options."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dataplane.client import TopicPartition
from spark._offsets import (
    OffsetRange,
    offset_ranges,
    offsets_from_json,
    offsets_to_json,
    parse_assign,
    parse_offset_spec,
    rate_limit,
    resolve_spec,
    split_ranges,
    stream_offset_ranges,
)
from spark._options import parse_read_options, parse_write_options
from spark.errors import DataLossError, OptionError, UnknownTopicError

pytestmark = pytest.mark.timeout(60)
T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)
BASE = {"raftlog.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}


def test_offset_specs() -> None:
    assert parse_offset_spec("startingOffsets", " Earliest ") == "earliest"
    assert parse_offset_spec("x", '{"t": {"0": 5, "1": -2}}') == {T0: 5, T1: -2}
    for bad in (
        "{",
        '{"t": [0]}',
        '{"t": {"a": 1}}',
        '{"t": {"0": -3}}',
        '{"t": {"0": 1.5}}',
        "[]",
    ):
        with pytest.raises(OptionError, match="startingOffsets"):
            parse_offset_spec("startingOffsets", bad)
    assert parse_assign('{"t": [1, 0], "u": [0]}') == [T0, T1, TopicPartition("u", 0)]
    with pytest.raises(OptionError, match="assign"):
        parse_assign('{"t": 1}')


def test_resolve_spec() -> None:
    beginning, end = {T0: 3, T1: 0}, {T0: 10, T1: 7}
    spec = {T0: -2, T1: 4}
    assert resolve_spec("s", spec, [T0, T1], beginning, end, -1) == {T0: 3, T1: 4}
    assert resolve_spec("s", {T0: -1}, [T0, T1], beginning, end, -2) == {T0: 10, T1: 0}
    assert resolve_spec("s", "latest", [T0, T1], beginning, end, -2) == end
    with pytest.raises(UnknownTopicError, match="t-5"):
        resolve_spec("s", {TopicPartition("t", 5): 1}, [T0], beginning, end, -2)


def test_ranges_and_json() -> None:
    ranges = offset_ranges({T0: 2}, {T0: 5, T1: 3})
    assert ranges == [OffsetRange("t", 0, 2, 5), OffsetRange("t", 1, 0, 3)]
    assert offset_ranges({T0: 5}, {T0: 5}) == []
    with pytest.raises(OptionError, match="after end offset"):
        offset_ranges({T0: 6}, {T0: 5})
    assert offsets_from_json(offsets_to_json({T0: 1, T1: 2})) == {T0: 1, T1: 2}
    assert offsets_to_json({T1: 2, T0: 1}) == {"t": {"0": 1, "1": 2}}


def test_a_batch_whose_offsets_retention_deleted_is_data_loss(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A query that died in its first batch restarts from initial offsets taken again: with
    earliest, past what the logged batch was to read once retention moved the log start."""
    with pytest.raises(DataLossError, match=r"t-0 \[\.\., 716\).*failOnDataLoss=false"):
        stream_offset_ranges({T0: 1177, T1: 0}, {T0: 716, T1: 3}, fail_on_data_loss=True)
    ranges = stream_offset_ranges({T0: 1177, T1: 0}, {T0: 716, T1: 3}, fail_on_data_loss=False)
    assert ranges == [OffsetRange("t", 1, 0, 3)]
    assert "skipping them" in caplog.text
    assert stream_offset_ranges({T0: 2}, {T0: 5}, True) == [OffsetRange("t", 0, 2, 5)]


@given(
    st.lists(st.integers(0, 5_000), min_size=1, max_size=6),
    st.integers(1, 64),
)
def test_split_ranges_covers_each_range_exactly(sizes: list[int], min_partitions: int) -> None:
    ranges = [OffsetRange("t", p, 10, 10 + s) for p, s in enumerate(sizes) if s]
    pieces = split_ranges(ranges, min_partitions)
    for r in ranges:
        mine = [p for p in pieces if p.partition == r.partition]
        assert mine[0].from_offset == r.from_offset and mine[-1].until_offset == r.until_offset
        assert all(a.until_offset == b.from_offset for a, b in itertools.pairwise(mine))
        assert all(p.size > 0 for p in mine)
    if ranges and len(ranges) < min_partitions and sum(sizes) >= 2 * min_partitions:
        assert len(pieces) >= min_partitions // 2


@given(
    st.dictionaries(st.integers(0, 7), st.tuples(st.integers(0, 1000), st.integers(0, 1000))),
    st.integers(1, 3000),
)
def test_rate_limit_bounds_and_progress(spans: dict[int, tuple[int, int]], budget: int) -> None:
    start = {TopicPartition("t", p): a for p, (a, _) in spans.items()}
    latest = {TopicPartition("t", p): a + b for p, (a, b) in spans.items()}
    end = rate_limit(start, latest, budget)
    taken = sum(end[tp] - start[tp] for tp in latest)
    available = sum(latest[tp] - start[tp] for tp in latest)
    assert all(start[tp] <= end[tp] <= latest[tp] for tp in latest)
    assert taken == min(budget, available)


def test_read_options() -> None:
    options = parse_read_options(
        {**BASE, "STARTINGOFFSETS": '{"t": {"0": 1}}', "minPartitions": "4"}, streaming=False
    )
    assert options.starting == {T0: 1} and options.min_partitions == 4
    assert options.fail_on_data_loss and not options.include_headers
    kafka = {"kafka.bootstrap.servers": "h:1", "subscribePattern": "t.*"}
    assert parse_read_options(kafka, streaming=True).subscription.pattern == "t.*"
    bad = [
        ({"subscribe": "t"}, "bootstrap"),
        ({**BASE, "assign": '{"t": [0]}'}, "exactly one"),
        ({**BASE, "startingOffsets": "latest"}, "not allowed for batch"),
        ({**BASE, "endingOffsets": "earliest"}, "not allowed"),
        ({**BASE, "maxOffsetsPerTrigger": "10"}, "streaming queries only"),
        ({**BASE, "minPartitions": "zero"}, "integer"),
        ({**BASE, "failOnDataLoss": "maybe"}, "true or false"),
        ({**BASE, "endingOffsets": "{oops"}, "not valid JSON"),
    ]
    for given_options, message in bad:
        with pytest.raises(OptionError, match=message):
            parse_read_options(given_options, streaming=False)
    assert parse_write_options({"kafka.bootstrap.servers": "h:1"}).topic is None
