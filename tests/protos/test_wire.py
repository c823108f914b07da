"""protos.wire: the records-carrying messages written and read around the records, checked
against protobuf's own encoder and parser."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from protos import broker_pb2 as pb
from protos import wire

records = st.binary(max_size=300)
fetch_partitions = st.builds(
    pb.FetchPartitionResponse,
    partition=st.integers(0, 2**31 - 1),
    error_code=st.integers(-1, 120),
    error_message=st.text(max_size=20),
    high_watermark=st.integers(-1, 2**63 - 1),
    log_end_offset=st.integers(-1, 2**40),
    records=records,
    diverging_epoch=st.builds(
        pb.EpochEndOffset, epoch=st.integers(-1, 9), end_offset=st.integers(-1, 9)
    ),
    leader_id=st.integers(-1, 5),
)
fetch_responses = st.builds(
    pb.FetchResponse,
    error_code=st.integers(0, 120),
    topics=st.lists(
        st.builds(
            pb.FetchTopicResponse,
            name=st.text(max_size=12),
            partitions=st.lists(fetch_partitions, max_size=4),
        ),
        max_size=3,
    ),
)
produce_requests = st.builds(
    pb.ProduceRequest,
    acks=st.sampled_from([-1, 0, 1]),
    timeout_ms=st.integers(0, 2**31 - 1),
    topics=st.lists(
        st.builds(
            pb.ProduceTopic,
            name=st.text(max_size=12),
            partitions=st.lists(
                st.builds(pb.ProducePartition, partition=st.integers(0, 99), records=records),
                max_size=4,
            ),
        ),
        max_size=3,
    ),
)


def split(message: Any) -> tuple[Any, list[bytes]]:
    """The message without its records, and the records in message order."""
    skeleton = type(message)()
    skeleton.CopyFrom(message)
    taken = []
    for topic in skeleton.topics:
        for partition in topic.partitions:
            taken.append(partition.records)
            partition.records = b""
    return skeleton, taken


@settings(max_examples=200, deadline=None)
@given(st.one_of(fetch_responses, produce_requests))
def test_encode_is_read_by_protobuf_as_the_whole_message(
    message: pb.FetchResponse | pb.ProduceRequest,
) -> None:
    skeleton, taken = split(message)
    encoded = wire.encode(skeleton, taken)
    assert type(message).FromString(encoded) == message
    assert len(encoded) == message.ByteSize()


@settings(max_examples=200, deadline=None)
@given(st.one_of(fetch_responses, produce_requests))
def test_decode_gives_the_skeleton_and_views_of_the_records(
    message: pb.FetchResponse | pb.ProduceRequest,
) -> None:
    skeleton, taken = split(message)
    data = message.SerializeToString()
    decoded, views = wire.decode(type(message), data)
    assert decoded == skeleton
    assert [bytes(view) for view in views] == taken
    assert all(view.obj is data for view in views if len(view))  # views, not copies


def test_records_given_beside_a_skeleton_must_match_its_partitions() -> None:
    skeleton = pb.FetchResponse(
        topics=[pb.FetchTopicResponse(name="t", partitions=[pb.FetchPartitionResponse()])]
    )
    with pytest.raises(ValueError, match="2 records for 1 partitions"):
        wire.encode(skeleton, [b"a", b"b"])
    with pytest.raises(ValueError, match="0 records for more partitions"):
        wire.encode(skeleton, [])
    skeleton.topics[0].partitions[0].records = b"x"
    with pytest.raises(ValueError, match="must be empty"):
        wire.encode(skeleton, [b"a"])


@pytest.mark.parametrize("data", [b"\x12\x05ab", b"\x12\x80", b"\x13", b"\x12\x03\x12\x09x"])
def test_broken_bytes_raise_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        wire.decode(pb.FetchResponse, data)


def test_each_partition_pairs_partitions_with_their_records_in_message_order() -> None:
    skeleton = pb.FetchResponse(topics=[
        pb.FetchTopicResponse(name="a", partitions=[
            pb.FetchPartitionResponse(partition=0), pb.FetchPartitionResponse(partition=1),
        ]),
        pb.FetchTopicResponse(name="b", partitions=[pb.FetchPartitionResponse(partition=0)]),
    ])  # fmt: skip
    pairs = [
        (t.name, p.partition, r) for t, p, r in wire.each_partition(skeleton, [b"1", b"2", b"3"])
    ]
    assert pairs == [("a", 0, b"1"), ("a", 1, b"2"), ("b", 0, b"3")]
