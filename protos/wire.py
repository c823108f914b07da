"""The two messages that carry records, written and read without copying the records.

``ProduceRequest`` and ``FetchResponse`` have one shape: a message holding ``topics``, each holding
``partitions``, each with a ``records`` bytes field of up to a megabyte or more. Built the plain
way, the records are copied into the partition message, again into its topic (upb copies a
sub-message given to a constructor), again by ``SerializeToString`` into its encoder's buffer and
once more into the bytes it returns; parsing copies them into the parser's arena and once more
into the bytes a field read returns. On a produce leader those copies of its fetch responses were
9% of its CPU, its produce requests' another 3%.

Here the message is a *skeleton* (its partitions' ``records`` left empty) and the records travel
beside it, in message order (topic by topic, partition by partition):

- :func:`encode` serialises the skeleton's small parts with protobuf and joins them with the
  records, framed as protobuf frames them (tag, varint length): one copy. Protobuf reads the
  result as the message with its records (fields may come in any order on the wire).
- :func:`decode` walks the frames of the three levels, parses everything but the records with
  protobuf, and returns the records as ``memoryview`` slices of the received bytes: no copy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from protos import broker_pb2 as pb

__all__ = [
    "FetchAnswer",
    "FetchStreamAnswer",
    "decode",
    "each_partition",
    "encode",
    "fetch_method",
    "fetch_stream_method",
    "produce_method",
]

M = TypeVar("M", bound=Message)
Records = bytes | memoryview

WIRE_VARINT, WIRE_I64, WIRE_LEN, WIRE_I32 = 0, 1, 2, 5
_FIXED_SIZES = {WIRE_I64: 8, WIRE_I32: 4}


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _frame(number: int, size: int) -> bytes:
    """A length-delimited field's tag and length."""
    return _varint(number << 3 | WIRE_LEN) + _varint(size)


def _numbers(message: Message) -> tuple[int, int, int]:
    """The field numbers of ``topics``, their ``partitions`` and those's ``records``."""
    topics = message.DESCRIPTOR.fields_by_name["topics"]
    partitions = topics.message_type.fields_by_name["partitions"]
    records = partitions.message_type.fields_by_name["records"]
    return topics.number, partitions.number, records.number


def _without(message: Message, field: str) -> bytes:
    """The message serialised without one (repeated) field."""
    head = type(message)()
    head.CopyFrom(message)
    head.ClearField(field)
    return head.SerializeToString()


def encode(skeleton: Message, records: Sequence[Records]) -> bytes:
    """The wire bytes of ``skeleton`` with each partition's ``records`` set (one per partition
    in message order; empty ones are left out, as protobuf leaves out an empty bytes field)."""
    topics_number, partitions_number, records_number = _numbers(skeleton)
    parts: list[Records] = [_without(skeleton, "topics")]
    index = 0
    for topic in skeleton.topics:  # type: ignore[attr-defined]
        topic_parts: list[Records] = [_without(topic, "partitions")]
        for partition in topic.partitions:
            if partition.records:
                raise ValueError("a skeleton's records must be empty: they are given beside it")
            head = partition.SerializeToString()
            if index >= len(records):
                raise ValueError(f"{len(records)} records for more partitions")
            data = records[index]
            index += 1
            size = len(head)
            if data:
                frame = _frame(records_number, len(data))
                size += len(frame) + len(data)
                topic_parts += (_frame(partitions_number, size), head, frame, data)
            else:
                topic_parts += (_frame(partitions_number, size), head)
        topic_size = sum(len(part) for part in topic_parts)
        parts.append(_frame(topics_number, topic_size))
        parts += topic_parts
    if index != len(records):
        raise ValueError(f"{len(records)} records for {index} partitions")
    return b"".join(parts)


def _read_varint(data: memoryview, at: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= end or shift > 63:
            raise DecodeError("truncated or overlong varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _fields(data: memoryview, start: int, end: int) -> list[tuple[int, int, int, int, int]]:
    """The fields of the message in ``data[start:end]``: (number, wire type, field start, value
    start, value end)."""
    fields = []
    at = start
    while at < end:
        key, value_at = _read_varint(data, at, end)
        number, wire = key >> 3, key & 7
        if wire == WIRE_VARINT:
            _, value_end = _read_varint(data, value_at, end)
        elif wire == WIRE_LEN:
            size, value_at = _read_varint(data, value_at, end)
            value_end = value_at + size
        elif wire in _FIXED_SIZES:
            value_end = value_at + _FIXED_SIZES[wire]
        else:
            raise DecodeError(f"unexpected wire type {wire} for field {number}")
        if value_end > end:
            raise DecodeError(f"field {number} runs past its message")
        fields.append((number, wire, at, value_at, value_end))
        at = value_end
    return fields


def _split(view: memoryview, start: int, end: int, number: int) -> tuple[list[slice], bytes]:
    """In the message at ``view[start:end]``: where the values of length-delimited field
    ``number`` lie, and the bytes of all its other fields."""
    values: list[slice] = []
    rest: list[memoryview] = []
    for field_number, wire, at, value_start, value_end in _fields(view, start, end):
        if field_number == number and wire == WIRE_LEN:
            values.append(slice(value_start, value_end))
        else:
            rest.append(view[at:value_end])
    return values, b"".join(rest)


def decode(message_type: type[M], data: bytes) -> tuple[M, list[memoryview]]:
    """The message in ``data`` with its partitions' ``records`` left empty, and those records
    (views of ``data``, one per partition in message order, empty when absent)."""
    view = memoryview(data)
    skeleton = message_type()
    topics_number, partitions_number, records_number = _numbers(skeleton)
    records: list[memoryview] = []
    topics, head = _split(view, 0, len(view), topics_number)
    for in_topic in topics:
        topic = skeleton.topics.add()  # type: ignore[attr-defined]
        partitions, topic_head = _split(view, in_topic.start, in_topic.stop, partitions_number)
        for at in partitions:
            found, partition_head = _split(view, at.start, at.stop, records_number)
            topic.partitions.add().ParseFromString(partition_head)
            records.append(view[found[-1]] if found else view[0:0])  # the last wins, as in protobuf
        topic.MergeFromString(topic_head)
    skeleton.MergeFromString(head)
    return skeleton, records


def each_partition(
    skeleton: Message, records: Sequence[Records]
) -> Iterator[tuple[Any, Any, Records]]:
    """(topic, partition, its records) of a skeleton and the records beside it, in message
    order."""
    each = iter(records)
    for topic in skeleton.topics:  # type: ignore[attr-defined]
        for partition in topic.partitions:
            yield topic, partition, next(each)


# -- BrokerService's Produce and Fetch through these ---------------------------------------------
class FetchAnswer(NamedTuple):
    """A fetch response without its partitions' records, and those records in message order."""

    response: pb.FetchResponse
    records: Sequence[Records]

    def message(self) -> pb.FetchResponse:
        """The response with its records inside (a copy of each)."""
        for _, partition, records in each_partition(self.response, self.records):
            partition.records = bytes(records)
        return self.response

    def encode(self) -> bytes:
        return encode(self.response, self.records)

    @classmethod
    def decode(cls, data: bytes) -> FetchAnswer:
        return cls(*decode(pb.FetchResponse, data))


class FetchStreamAnswer(NamedTuple):
    """One message of a FetchStream without its partitions' records, and those records in
    message order (its partitions are FetchResponse's: the same framing)."""

    response: pb.FetchStreamResponse
    records: Sequence[Records]

    def message(self) -> pb.FetchStreamResponse:
        """The message with its records inside (a copy of each)."""
        for _, partition, records in each_partition(self.response, self.records):
            partition.records = bytes(records)
        return self.response

    def encode(self) -> bytes:
        return encode(self.response, self.records)

    @classmethod
    def decode(cls, data: bytes) -> FetchStreamAnswer:
        return cls(*decode(pb.FetchStreamResponse, data))


def _path(method: str) -> str:
    service = pb.DESCRIPTOR.services_by_name["BrokerService"]
    return f"/{service.full_name}/{service.methods_by_name[method].name}"


def produce_method(channel: grpc.Channel) -> grpc.UnaryUnaryMultiCallable:
    """BrokerService.Produce taking a request's bytes made by :func:`encode`."""
    return channel.unary_unary(
        _path("Produce"),
        request_serializer=None,
        response_deserializer=pb.ProduceResponse.FromString,
        _registered_method=True,
    )


def fetch_method(channel: grpc.Channel) -> grpc.UnaryUnaryMultiCallable:
    """BrokerService.Fetch answering a :class:`FetchAnswer` (records: views of the answer)."""
    return channel.unary_unary(
        _path("Fetch"),
        request_serializer=pb.FetchRequest.SerializeToString,
        response_deserializer=FetchAnswer.decode,
        _registered_method=True,
    )


def fetch_stream_method(channel: grpc.Channel) -> grpc.UnaryStreamMultiCallable:
    """BrokerService.FetchStream answering :class:`FetchStreamAnswer` messages."""
    return channel.unary_stream(
        _path("FetchStream"),
        request_serializer=pb.FetchStreamRequest.SerializeToString,
        response_deserializer=FetchStreamAnswer.decode,
        _registered_method=True,
    )
