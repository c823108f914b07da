"""Every length a request frame claims, checked against the frame before kio reads it.

kio's native (Rust) reader reserves room for as many elements as an array's length claims before
it reads the first one (``Vec::with_capacity``): a 28-byte ShareGroupDescribe frame claiming 2^35
group ids makes it ask for 264 GB, the allocation fails and the process aborts, which no
``except`` can catch (issue 30, found by tests/fuzz/fuzz_kafka_request.py). Kafka's generated
readers refuse such a frame first ("Tried to read N elements, but only M bytes remain"); this
module does the same for kio, from kio's own schema classes.

A walker is compiled once per entity class, as kio's native reader compiles its schema (the same
``kio.serial._introspect`` classification of each field, the same rules: flexible versions use
compact arrays/strings and end every struct with tagged fields, the request header's client_id is
always a legacy nullable string, a nullable struct starts with an int8 marker). It is a tuple of
steps, each ``(frame, position) -> position``; consecutive fixed-size fields are one skip, an
array of fixed-size elements is skipped in one step (Fetch's partitions before v12), and
``bytes``/``records`` fields are skipped by their length, never walked: a 1 MiB Produce costs
what a 1 KiB one does. Each array's claimed element count times its element's smallest encoding
must fit in the bytes left; otherwise :class:`LengthError`.

The walker reads positions exactly as kio does, so on any frame kio would read without error the
two agree field by field, and every array kio reaches was checked first. Where the walker lets a
frame through that kio then refuses (a bool that is neither 0 nor 1, bad UTF-8, a null where none
is allowed), kio's own error stands. Pure: no IO, no kio reader called.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

# A step: the position after what starts at `position` in the frame (raises on bad lengths).
Walk = Callable[[bytes, int], int]

_INT8 = struct.Struct(">b").unpack_from
_INT16 = struct.Struct(">h").unpack_from
_INT32 = struct.Struct(">i").unpack_from
_FIXED_BYTES = {
    "int8": 1, "uint8": 1, "bool": 1,
    "int16": 2, "uint16": 2, "error_code": 2,
    "int32": 4, "uint32": 4, "timedelta_i32": 4,
    "int64": 8, "uint64": 8, "float64": 8, "timedelta_i64": 8, "datetime_i64": 8,
    "uuid": 16,
}  # fmt: skip
_LENGTH_PREFIXED = ("string", "bytes", "records")


class LengthError(ValueError):
    """A length (array count, string or bytes size, varint) the frame cannot hold."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Part:
    """One field's (or array element's) layout: ``fixed`` bytes when ``walk`` is None, else
    read by ``walk``; ``min_bytes`` is its smallest encoding (what an array element is charged
    against the bytes left)."""

    walk: Walk | None
    fixed: int
    min_bytes: int

    def as_walk(self) -> Walk:
        return self.walk if self.walk is not None else _skip(self.fixed)


# -- entry points ---------------------------------------------------------------------------------
@functools.cache
def request_walker(schema: Any) -> Callable[[bytes], int]:
    """The check of a whole request frame (without its size: api key first) of ``schema`` (a
    kio request class): its header (``schema.__header_schema__``) then its body. Returns where
    the body ends; raises :class:`LengthError`."""
    header = entity_walker(schema.__header_schema__)
    body = entity_walker(schema)
    name = schema.__name__

    def check(frame: bytes) -> int:
        try:
            end = body(frame, header(frame, 0))
        except (IndexError, struct.error):
            raise LengthError(f"{name}: the frame ends inside a field") from None
        if end > len(frame):
            raise LengthError(f"{name}: the frame ends inside a field ({end} > {len(frame)})")
        return end

    return check


@functools.cache
def entity_walker(entity: Any, nullable: bool = False) -> Walk:
    """The walk of one ``entity`` (a kio entity class), as kio's ``entity_reader(entity,
    nullable)`` reads it. A walk may run past the frame's end (a fixed skip); the caller checks
    the final position, as :func:`request_walker` does."""
    return _entity_part(entity, nullable).as_walk()


# -- compiling a schema ---------------------------------------------------------------------------
@functools.cache
def _entity_part(entity: Any, nullable: bool) -> _Part:
    flexible = bool(entity.__flexible__)
    is_header = entity.__name__ == "RequestHeader"
    steps: list[Walk] = []
    tagged: dict[int, Walk] = {}
    run = min_bytes = 0  # fixed bytes not yet in a step; the smallest encoding
    for field in dataclasses.fields(entity):
        tag = get_field_tag(field)
        part = _field_part(entity, field, flexible, is_header, tag is not None)
        if tag is not None:
            tagged[int(tag)] = part.as_walk()
            continue
        min_bytes += part.min_bytes
        if part.walk is None:
            run += part.fixed
        else:
            steps.append(_after(run, part.walk))
            run = 0
    if flexible:
        steps.append(_then_tagged_fields(run, _tagged_fields(tagged, entity.__name__)))
        min_bytes += 1
    elif run and steps:
        steps.append(_skip(run))
    if not steps and not nullable:
        return _Part(None, run, run)  # all fixed: skipped in one step, arrays of it too
    walk = _sequence(steps) if steps else _skip(run)
    if nullable:  # KIP-893: an int8 marker, -1 for null
        return _Part(_nullable(walk), 0, 1)
    return _Part(walk, 0, min_bytes)


def _field_part(
    entity: type, field: dataclasses.Field[Any], flexible: bool, is_header: bool, is_tag: bool
) -> _Part:
    if is_header and field.name == "client_id":  # always a legacy string (KIP-482)
        return _primitive("string", flexible=False)
    where = f"{entity.__name__}.{field.name}"
    kind = classify_field(field)
    match kind:
        case PrimitiveField():
            return _primitive(get_schema_field_type(field), flexible)
        case PrimitiveTupleField():
            return _array(_primitive(get_schema_field_type(field), flexible), flexible, where)
        case EntityField(type_=nested):
            # kio reads a struct field as nullable when its type is, tagged or not
            return _entity_part(nested, is_optional(field))
        case EntityTupleField(type_=nested):
            return _array(_entity_part(nested, False), flexible, where)
    raise TypeError(f"{where}: kio field class {kind!r} has no walker")


def _primitive(kafka_type: str, flexible: bool) -> _Part:
    fixed = _FIXED_BYTES.get(kafka_type)
    if fixed is not None:
        return _Part(None, fixed, fixed)
    if kafka_type not in _LENGTH_PREFIXED:
        raise TypeError(f"kafka type {kafka_type!r} has no walker")
    if flexible:
        return _Part(_compact_bytes, 0, 1)
    if kafka_type == "string":
        return _Part(_legacy_string, 0, 2)
    return _Part(_legacy_bytes, 0, 4)  # bytes, records: skipped, never walked


# -- steps ----------------------------------------------------------------------------------------
def _uvarint(frame: bytes, position: int) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes (kio's, and Kafka's, limit) and the position after
    it."""
    byte = frame[position]
    if byte < 0x80:
        return byte, position + 1
    value = byte & 0x7F
    for shift in (7, 14, 21, 28):
        position += 1
        byte = frame[position]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position + 1
    raise LengthError("a varint is too long: the most significant bit of its 5th byte is set")


def _compact_bytes(frame: bytes, position: int) -> int:
    """A compact string or bytes: its length + 1 as a varint (0: null), then the bytes."""
    length = frame[position]
    if length < 0x80:  # a one-byte varint, without the call
        return position + (length or 1)
    length, position = _uvarint(frame, position)
    return position + length - 1


def _legacy_string(frame: bytes, position: int) -> int:
    length: int = _INT16(frame, position)[0]
    if length < -1:
        raise LengthError(f"a string of negative length {length}")
    return position + 2 + max(length, 0)


def _legacy_bytes(frame: bytes, position: int) -> int:
    length: int = _INT32(frame, position)[0]
    if length < -1:
        raise LengthError(f"bytes of negative length {length}")
    return position + 4 + max(length, 0)


def _skip(size: int) -> Walk:
    def skip(frame: bytes, position: int) -> int:
        return position + size

    return skip


def _after(size: int, walk: Walk) -> Walk:
    """``walk`` after ``size`` fixed bytes (one step for a fixed run and what follows it)."""
    if not size:
        return walk

    def after(frame: bytes, position: int) -> int:
        return walk(frame, position + size)

    return after


def _sequence(steps: Sequence[Walk]) -> Walk:
    if len(steps) == 1:
        return steps[0]
    ordered = tuple(steps)

    def sequence(frame: bytes, position: int) -> int:
        for step in ordered:
            position = step(frame, position)
        return position

    return sequence


def _nullable(walk: Walk) -> Walk:
    def nullable(frame: bytes, position: int) -> int:
        (marker,) = _INT8(frame, position)
        return position + 1 if marker == -1 else walk(frame, position + 1)

    return nullable


def _array(element: _Part, flexible: bool, where: str) -> _Part:
    """A compact (flexible) or legacy array of ``element``s: the claimed count times the
    element's smallest encoding must fit in what is left of the frame."""
    size, walk = element.fixed, element.walk
    least = max(element.min_bytes, 1)  # Kafka's rule: an element takes at least one byte

    def elements(frame: bytes, position: int, count: int) -> int:
        if count <= 0:
            return position
        left = len(frame) - position
        if count * least > left:
            raise LengthError(
                f"{where}: Tried to read {count} elements, but only {max(left, 0)} bytes remain"
            )
        if walk is None:
            return position + count * size
        for _ in range(count):
            position = walk(frame, position)
        return position

    if flexible:

        def compact_array(frame: bytes, position: int) -> int:
            count = frame[position]
            if count < 0x80:
                position += 1
            else:
                count, position = _uvarint(frame, position)
            return elements(frame, position, count - 1)  # 0: null

        return _Part(compact_array, 0, 1)

    def legacy_array(frame: bytes, position: int) -> int:
        (count,) = _INT32(frame, position)
        if count < -1:
            raise LengthError(f"{where}: negative array length {count}")
        return elements(frame, position + 4, count)  # -1: null

    return _Part(legacy_array, 0, 4)


def _tagged_fields(tagged: Mapping[int, Walk], name: str) -> Walk:
    """A flexible struct's tagged fields: their count, then each one's tag, size and value. kio
    reads a known tag's value by its schema (not by the size) and refuses an unknown tag."""

    def tagged_fields(frame: bytes, position: int) -> int:
        count, position = _uvarint(frame, position)
        if not count:
            return position
        if count * 2 > len(frame) - position:  # a tag and a size: two bytes at least
            raise LengthError(f"{name}: {count} tagged fields claimed, the frame cannot hold them")
        for _ in range(count):
            tag, position = _uvarint(frame, position)
            _, position = _uvarint(frame, position)
            walk = tagged.get(tag)
            if walk is None:
                raise LengthError(f"{name}: unknown tagged field tag {tag}")
            position = walk(frame, position)
        return position

    return tagged_fields


def _then_tagged_fields(size: int, tagged_fields: Walk) -> Walk:
    """``size`` fixed bytes, then a struct's tagged fields, almost always none (one byte, 0):
    that case without a call, for the elements of Fetch's and Produce's partition arrays."""

    def then_tagged_fields(frame: bytes, position: int) -> int:
        position += size
        if frame[position] == 0:
            return position + 1
        return tagged_fields(frame, position)

    return then_tagged_fields
