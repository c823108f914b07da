"""The length walker (dataplane/kafka/length_walker.py): every length a request claims is checked
against the frame before kio's native reader, which reserves what an array claims, sees it.

Pure tests per kind of field on small kio-style entities (each valid case also read by kio's own
reader, which must end where the walker does), the fuzzer's 28-byte ShareGroupDescribe, and a
property over every served (api key, version): a random request written by kio's writer is
accepted to its last byte, and the same frame cut short, or with any array, string or bytes
length raised past what is left, is refused before kio is called.
"""

# No `from __future__ import annotations`: kio reads the entities' field types at runtime.

import base64
import dataclasses
import datetime
import functools
import io
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.serial import _introspect as introspect
from kio.serial import entity_reader, entity_writer
from kio.serial import writers as kio_writers

from dataplane.kafka import codec as kc
from dataplane.kafka.length_walker import LengthError, entity_walker, request_walker


# -- small entities, one per kind of field -------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class LegacyInts:
    __flexible__: ClassVar[bool] = False
    ids: tuple[int, ...] | None = field(metadata={"kafka_type": "int32"})
    name: str | None = field(metadata={"kafka_type": "string"})


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactNames:
    __flexible__: ClassVar[bool] = True
    names: tuple[str, ...] = field(metadata={"kafka_type": "string"})
    flag: bool = field(metadata={"kafka_type": "bool"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Partition:
    __flexible__: ClassVar[bool] = True
    index: int = field(metadata={"kafka_type": "int32"})
    records: bytes | None = field(metadata={"kafka_type": "records"})
    replicas: tuple[int, ...] = field(metadata={"kafka_type": "int32"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Topic:
    __flexible__: ClassVar[bool] = True
    name: str = field(metadata={"kafka_type": "string"})
    partitions: tuple[Partition, ...] = field(metadata={"kafka_type": "struct"})
    leader: Partition | None = field(metadata={"kafka_type": "struct"})
    # a tagged field: a tag, a size, then the value (here an array of its own)
    extra: tuple[int, ...] = field(metadata={"kafka_type": "int64", "tag": 3}, default=())


@dataclass(frozen=True, slots=True, kw_only=True)
class LegacyOffset:
    __flexible__: ClassVar[bool] = False
    partition: int = field(metadata={"kafka_type": "int32"})
    offset: int = field(metadata={"kafka_type": "int64"})


@dataclass(frozen=True, slots=True, kw_only=True)
class LegacyTopic:
    __flexible__: ClassVar[bool] = False
    name: str = field(metadata={"kafka_type": "string"})
    offsets: tuple[LegacyOffset, ...] = field(metadata={"kafka_type": "struct"})


def encoded(entity: Any) -> bytes:
    buffer = io.BytesIO()
    entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


def walked(entity_type: type, data: bytes) -> int:
    """Where the walk of ``data`` ends, checked as request_walker checks a frame."""
    try:
        end = entity_walker(entity_type)(data, 0)
    except (IndexError, struct.error):
        raise LengthError("the frame ends inside a field") from None
    if end > len(data):
        raise LengthError(f"ends at {end} of {len(data)}")
    return end


def assert_agrees_with_kio(entity: Any) -> None:
    data = encoded(entity)
    value, size = entity_reader(type(entity))(data, 0)
    assert value == entity
    assert walked(type(entity), data) == size == len(data)


def i32(value: int) -> bytes:
    return struct.pack(">i", value)


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def test_valid_entities_of_every_kind_end_where_kio_ends() -> None:
    partition = Partition(index=1, records=b"r" * 300, replicas=(1, 2, 3))
    for entity in (
        LegacyInts(ids=(1, 2, 3), name="a"),
        LegacyInts(ids=None, name=None),
        LegacyInts(ids=(), name=""),
        CompactNames(names=("a", "bc" * 100), flag=True),
        CompactNames(names=(), flag=False),
        Partition(index=0, records=None, replicas=()),
        Topic(name="t", partitions=(partition, partition), leader=None),
        Topic(name="t", partitions=(), leader=partition, extra=(5, 6)),
        LegacyTopic(name="t", offsets=(LegacyOffset(partition=0, offset=9),) * 4),
    ):
        assert_agrees_with_kio(entity)


NO_TOPIC = b"\x02t" + b"\x01" + b"\xff"  # Topic "t": no partitions, no leader; tags follow


@pytest.mark.parametrize(
    ("entity_type", "data", "refusal"),
    [
        # legacy array of fixed elements: 3 int32 claimed, 8 bytes left
        (LegacyInts, i32(3) + i32(1) + i32(2) + b"\xff\xff", "Tried to read 3 elements"),
        (LegacyInts, i32(2**31 - 1) + b"\xff\xff", "Tried to read 2147483647 elements"),
        (LegacyInts, i32(-2) + b"\xff\xff", "negative array length -2"),
        # a legacy string longer than the frame, a negative one
        (LegacyInts, i32(-1) + b"\x00\x09abc", "ends at"),
        (LegacyInts, i32(-1) + b"\xff\xfe", "negative length -2"),
        # compact array: the fuzzer's 2^35 group ids
        (CompactNames, b"\xff\xff\xff\xff\x7a" + b"zz\x00\x00", "Tried to read 33017561086"),
        (CompactNames, uvarint(6) + b"\x02a" + b"\x01\x00", "Tried to read 5 elements"),
        (CompactNames, b"\xff\xff\xff\xff\xff\x01", "varint is too long"),
        # nested: the second partition's replicas claim too many
        (
            Topic,
            b"\x02t"
            + uvarint(3)
            + (i32(0) + b"\x01" + b"\x01\x00")
            + (i32(1) + b"\x01")
            + uvarint(1000)
            + b"\x00\x00",
            "Partition.replicas: Tried to read 999 elements",
        ),
        # a records field longer than the frame: skipped by its length, and the end is past
        (Partition, i32(0) + uvarint(1 << 20) + b"x" * 10 + b"\x01\x00", "ends inside|ends at"),
        # tagged fields: an unknown tag, a known one whose array claims too much, too many
        (Topic, NO_TOPIC + b"\x01" + b"\x07\x01\x00", "unknown tagged field tag 7"),
        (
            Topic,
            NO_TOPIC + b"\x01\x03\x09" + uvarint(100) + i32(0),
            "Topic.extra: Tried to read 99",
        ),
        (Topic, NO_TOPIC + uvarint(50) + b"\x03\x01", "50 tagged fields"),
        # a nullable struct marked present, with nothing after it
        (Topic, b"\x02t\x01\x01", "ends inside"),
        # legacy array of legacy structs (12 bytes each) claiming 2 with 12 left
        (LegacyTopic, b"\x00\x01t" + i32(2) + i32(0) + b"\x00" * 8, "Tried to read 2 elements"),
    ],
)
def test_lengths_the_frame_cannot_hold_are_refused(
    entity_type: type, data: bytes, refusal: str
) -> None:
    with pytest.raises(LengthError, match=refusal):
        walked(entity_type, data)


def test_a_fixed_element_array_is_skipped_in_one_step_and_records_are_never_walked() -> None:
    """Fetch's partitions before v12 are fixed-size: skipped without a loop; a 1 MiB records
    field is skipped by its length: the walk does not grow with the records."""
    legacy = LegacyTopic(name="t", offsets=(LegacyOffset(partition=0, offset=1),) * 10_000)
    assert walked(LegacyTopic, encoded(legacy)) == len(encoded(legacy))
    big = Partition(index=0, records=b"\0" * (1 << 20), replicas=())
    assert walked(Partition, encoded(big)) == len(encoded(big))


CRASH_INPUT = base64.b64decode("ANUAAAAHAARmdXp6AP////96egAA")  # tests/fuzz/regressions


def test_the_fuzzers_28_byte_share_group_describe_is_refused_before_kio_reads_it() -> None:
    # the fuzz target's first two bytes pick the (api key, version), the rest is the frame after
    assert PAIRS[int.from_bytes(CRASH_INPUT[:2], "big") % len(PAIRS)] == (77, 1)
    frame = kc.API_KEY_VERSION.pack(kc.API_SHARE_GROUP_DESCRIBE, 1) + CRASH_INPUT[2:]
    with kio_forbidden(), pytest.raises(kc.FrameError, match="Tried to read 33017561086"):
        kc.parse_request(frame)


def test_the_request_header_is_walked_too() -> None:
    """client_id is a legacy string even in flexible headers; a header claiming more is
    refused."""
    frame = kc.API_KEY_VERSION.pack(kc.API_SHARE_GROUP_DESCRIBE, 1) + i32(7) + b"\x7f\xff"
    with kio_forbidden(), pytest.raises(kc.FrameError, match="frame ends"):
        kc.parse_request(frame + b"abc")


@contextmanager
def kio_forbidden() -> Iterator[None]:
    """kio's reader replaced by one that fails the test: a refusal must come first."""

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("kio's reader was called")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kc, "entity_reader", forbidden)
        yield


# -- the property, over every served (api key, version) ------------------------------------------
PAIRS = tuple(
    (key, version) for key, (low, high) in sorted(kc.SUPPORTED.items())
    for version in range(low, high + 1)
)  # fmt: skip
_INTS = {
    "int8": (-(2**7), 2**7 - 1), "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1),
    "uint8": (0, 2**8 - 1), "uint16": (0, 2**16 - 1), "uint32": (0, 2**32 - 1),
    "uint64": (0, 2**64 - 1),
}  # fmt: skip


def _primitive(kind: str) -> st.SearchStrategy[Any]:
    if kind in _INTS:
        return st.integers(*_INTS[kind])
    ms = st.integers(0, 2**31 - 1)
    strategies: dict[str, st.SearchStrategy[Any]] = {
        "bool": st.booleans(),
        "float64": st.floats(allow_nan=False),
        "string": st.text(max_size=6),
        "bytes": st.binary(max_size=12),
        "records": st.binary(max_size=40),
        "uuid": st.uuids(),
        "error_code": st.sampled_from(list(KioErrorCode)),
        "timedelta_i32": ms.map(lambda v: datetime.timedelta(milliseconds=v)),
        "timedelta_i64": ms.map(lambda v: datetime.timedelta(milliseconds=v)),
        "datetime_i64": ms.map(lambda v: datetime.datetime.fromtimestamp(v, datetime.UTC)),
    }
    return strategies[kind]


def _field_values(f: dataclasses.Field[Any]) -> st.SearchStrategy[Any]:
    kind = introspect.classify_field(f)
    values: st.SearchStrategy[Any]
    match kind:
        case introspect.PrimitiveField():
            values = _primitive(introspect.get_schema_field_type(f))
        case introspect.PrimitiveTupleField():
            element = _primitive(introspect.get_schema_field_type(f))
            values = st.lists(element, max_size=3).map(tuple)
        case introspect.EntityField(type_=nested):
            values = entities(nested)
        case introspect.EntityTupleField(type_=nested):
            values = st.lists(entities(nested), max_size=2).map(tuple)
    if introspect.is_optional(f) and introspect.get_field_tag(f) is None:
        return st.none() | values
    return values


@functools.cache
def entities(entity_type: type) -> st.SearchStrategy[Any]:
    return st.builds(
        entity_type, **{f.name: _field_values(f) for f in dataclasses.fields(entity_type)}
    )


@contextmanager
def recorded_lengths(main: io.BytesIO) -> Iterator[list[tuple[str, int, int]]]:
    """The (kind, position, width) of every array, and non-nullable string/bytes, length kio's
    writer puts in ``main`` (not those inside a tagged field's own buffer)."""
    lengths: list[tuple[str, int, int]] = []

    def recording(name: str, kind: str, width: Callable[[Any], int]) -> Callable[..., None]:
        original = getattr(kio_writers, name)

        def write(buffer: Any, value: Any) -> None:
            if buffer is main:
                lengths.append((kind, buffer.tell(), width(value)))
            original(buffer, value)

        return write

    def compact_width(value: Any) -> int:
        size = -1 if value is None else len(value.encode() if isinstance(value, str) else value)
        return len(uvarint(size + 1))

    patches = {
        "write_compact_array_length": recording(
            "write_compact_array_length", "compact", lambda v: len(uvarint(v + 1))
        ),
        "write_legacy_array_length": recording("write_legacy_array_length", "int32", lambda v: 4),
        "write_nullable_compact_string": recording(
            "write_nullable_compact_string", "compact", compact_width
        ),
        "write_nullable_legacy_string": recording(
            "write_nullable_legacy_string", "int16", lambda v: 2
        ),
        "write_nullable_legacy_bytes": recording(
            "write_nullable_legacy_bytes", "int32", lambda v: 4
        ),
    }
    originals = {name: getattr(kio_writers, name) for name in patches}
    for name, patch in patches.items():
        setattr(kio_writers, name, patch)
    try:
        yield lengths
    finally:
        for name, original in originals.items():
            setattr(kio_writers, name, original)


def request_frame(
    api_key: int, version: int, body: Any
) -> tuple[bytes, list[tuple[str, int, int]]]:
    schema = kc.request_schema(api_key, version)
    header_schema = schema.__header_schema__
    header = kc.to_entity(header_schema, {
        "request_api_key": api_key, "request_api_version": version, "correlation_id": 1,
        "client_id": "walker",
    })  # fmt: skip
    buffer = io.BytesIO()
    with recorded_lengths(buffer) as lengths:
        entity_writer(header_schema)(buffer, header)
        entity_writer(schema)(buffer, body)
    return buffer.getvalue(), lengths


def inflated(frame: bytes, kind: str, position: int, width: int) -> bytes | None:
    """``frame`` with the length at ``position`` claiming more than the bytes after it (same
    width, so nothing else moves), or None when that width cannot say so."""
    left = len(frame) - position - width
    if kind == "int32":
        claim = struct.pack(">i", left + 1)
    elif kind == "int16":
        if left + 1 > 2**15 - 1:
            return None
        claim = struct.pack(">h", left + 1)
    else:  # compact: the count or length plus one, padded to the same width
        value = left + 2
        if value >= 1 << (7 * width):
            return None
        claim = bytes(
            (value >> (7 * i)) & 0x7F | (0x80 if i < width - 1 else 0) for i in range(width)
        )
    return frame[:position] + claim + frame[position + width :]


@st.composite
def requests(draw: st.DrawFn) -> tuple[int, int, Any]:
    api_key, version = draw(st.sampled_from(PAIRS))
    return api_key, version, draw(entities(kc.request_schema(api_key, version)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests(), st.data())
def test_kio_written_requests_are_accepted_and_any_inflated_length_refused(
    request: tuple[int, int, Any], data: st.DataObject
) -> None:
    api_key, version, body = request
    frame, lengths = request_frame(api_key, version, body)
    schema = kc.request_schema(api_key, version)
    assert request_walker(schema)(frame) == len(frame)
    _, offset = entity_reader(schema.__header_schema__)(frame, 0)
    assert offset + entity_reader(schema)(frame, offset)[1] == len(frame)

    cut = data.draw(st.integers(0, len(frame) - 1), label="cut")
    with pytest.raises(LengthError):
        request_walker(schema)(frame[:cut])

    assume(lengths)
    kind, position, width = data.draw(st.sampled_from(lengths), label="length")
    mutated = inflated(frame, kind, position, width)
    assume(mutated is not None)
    assert mutated is not None
    with kio_forbidden(), pytest.raises(kc.FrameError):
        kc.parse_request(mutated)
