"""Records inside a RecordBatch v2: encoding and decoding, byte for byte Kafka's ``DefaultRecord``.

Record layout::

    length          varint   bytes that follow
    attributes      int8     unused, 0
    timestampDelta  varlong  timestamp - batch baseTimestamp
    offsetDelta     varint   offset - batch baseOffset
    keyLength       varint   -1 = null key
    key             bytes
    valueLength     varint   -1 = null value
    value           bytes
    headerCount     varint
    headers         (keyLength varint, key utf-8, valueLength varint (-1 = null), value)*

Varints are zigzag base-128 as Kafka's ``ByteUtils``: a varint is a signed 32-bit int in at most
5 bytes, a varlong a signed 64-bit int in at most 10; :func:`decode_varint` refuses a longer one
as INVALID_RECORD.

This is the client-side hot path (producers encode, consumers decode). Encoding is a flat Python
loop: small varints come from a table, the record length is computed rather than measured, and
one ``b"".join`` builds the batch (it measured faster than aiokafka's compiled builder, whose
per-record call costs more than our loop). Decoding checks the batch header and CRC here, then
parses the records with aiokafka's Cython ``DefaultRecordBatch`` (see :func:`_decode_records`),
which reads lengths as Kafka's Java client does. The broker never calls this module on its
produce or fetch path; clients, the compactor and tools do.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, cast

import crc32c
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatch as _ParsedBatch

from raftlog.batch import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_MASK,
    CONTROL_MASK,
    CRC_OFFSET,
    DELETE_HORIZON_MASK,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    MAX_TIMESTAMP_OFFSET,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    BatchHeader,
    Compression,
    TimestampType,
    compute_crc,
    iter_batches,
    verify_batch,
)
from raftlog.compression import DEFAULT_MAX_OUTPUT_BYTES, compress, decompress
from raftlog.errors import CorruptRecordError, InvalidRecordError

Buffer = bytes | bytearray | memoryview
Headers = tuple[tuple[str, bytes | None], ...]
# What a producer hands over: (key, value, timestamp_ms, headers); offsets are the index.
ProducerRecord = tuple[bytes | None, bytes | None, int, Headers]
T = TypeVar("T")


class ParsedRecord(Protocol):
    """A record as the parser yields it (aiokafka's ``DefaultRecord``); ``headers`` is a list,
    which a builder turns into :data:`Headers` (``tuple(headers)``)."""

    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> list[tuple[str, bytes | None]]: ...


# Builds what a decoder returns from one batch's parsed records, in one comprehension: a client
# makes its own record type straight from the parser's (the consumer's per-record cost).
RecordsBuilder = Callable[[Iterator[ParsedRecord]], list[T]]

MAX_VARINT_BYTES = 5
MAX_VARLONG_BYTES = 10
RECORD_MIN_BYTES = 7  # length, attributes, timestampDelta, offsetDelta, key, value, headerCount
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_U32_MASK = (1 << 32) - 1
_U64_MASK = (1 << 64) - 1
_CRC = struct.Struct(">I")
_ATTRIBUTES = struct.Struct(">h")
_LENGTH = struct.Struct(">i")
LENGTH_OFFSET = 8  # batchLength, after baseOffset
_TIMESTAMP = struct.Struct(">q")
# What the record parser may read past a batch's end: one varlong, the longest field it reads
# before a bounds check (see _decode_records).
_SLACK = bytes(MAX_VARLONG_BYTES)


@dataclass(frozen=True, slots=True)
class Record:
    """A record with its absolute offset (-1 before the log assigns one) and timestamp (ms)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers = ()


# Building a frozen dataclass through __init__ costs a guarded object.__setattr__ per field; the
# decoder, which builds one Record per record read, fills the slots directly: twice as fast.
def _slot_setter(name: str) -> Callable[[Record, object], None]:
    setter: Callable[[Record, object], None] = getattr(Record, name).__set__
    return setter


_NEW_RECORD: Callable[[type[Record]], Record] = object.__new__
_SET_OFFSET = _slot_setter("offset")
_SET_TIMESTAMP = _slot_setter("timestamp")
_SET_KEY = _slot_setter("key")
_SET_VALUE = _slot_setter("value")
_SET_HEADERS = _slot_setter("headers")


# -- varints -------------------------------------------------------------------------------------
def _unsigned_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:  # bounded: at most 10 rounds for a 64-bit value
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_TABLE_SIZE = 1 << 14
# _SMALL[n] is the zigzag varint of 0 <= n < _TABLE_SIZE (zigzag of n >= 0 is 2n): every length
# and offset delta of a batch of records up to 16 KiB takes one lookup.
_SMALL = tuple(_unsigned_varint(n << 1) for n in range(_TABLE_SIZE))
_NULL_LENGTH = b"\x01"  # zigzag(-1)
_NO_HEADERS = b"\x00"
_RECORD_ATTRIBUTES = b"\x00"


def encode_varint(value: int) -> bytes:
    """Zigzag varint of a signed 32-bit int (``ByteUtils.writeVarint``)."""
    if 0 <= value < _TABLE_SIZE:
        return _SMALL[value]
    if not INT32_MIN <= value <= INT32_MAX:
        raise InvalidRecordError(f"{value} does not fit a varint (signed 32 bits)")
    return _unsigned_varint(((value << 1) ^ (value >> 31)) & _U32_MASK)


def encode_varlong(value: int) -> bytes:
    """Zigzag varint of a signed 64-bit int (``ByteUtils.writeVarlong``)."""
    if 0 <= value < _TABLE_SIZE:
        return _SMALL[value]
    if not INT64_MIN <= value <= INT64_MAX:
        raise InvalidRecordError(f"{value} does not fit a varlong (signed 64 bits)")
    return _unsigned_varint(((value << 1) ^ (value >> 63)) & _U64_MASK)


def decode_varint(buf: Buffer, position: int) -> tuple[int, int]:
    """(value, next position) of the zigzag varint at ``position`` (``ByteUtils.readVarint``:
    at most 5 bytes; bits beyond 32 are dropped, as Java's int arithmetic drops them)."""
    try:
        unsigned, position = _unsigned_at(buf, position, MAX_VARINT_BYTES)
    except IndexError:
        raise InvalidRecordError(f"varint at position {position} is cut short") from None
    return (unsigned >> 1) ^ -(unsigned & 1), position


def decode_varlong(buf: Buffer, position: int) -> tuple[int, int]:
    """(value, next position) of the zigzag varlong at ``position`` (at most 10 bytes)."""
    try:
        unsigned, position = _unsigned_at(buf, position, MAX_VARLONG_BYTES)
    except IndexError:
        raise InvalidRecordError(f"varlong at position {position} is cut short") from None
    return (unsigned >> 1) ^ -(unsigned & 1), position


def _unsigned_at(buf: Buffer, position: int, max_bytes: int) -> tuple[int, int]:
    """The raw (still zigzag-encoded) varint at ``position``, masked to 32 bits for a varint
    and 64 for a varlong, and the next position. IndexError if the buffer ends first."""
    unsigned = shift = 0
    for n in range(position, position + max_bytes):
        byte = buf[n]
        unsigned |= (byte & 0x7F) << shift
        if byte < 0x80:
            return unsigned & (_U32_MASK if max_bytes == MAX_VARINT_BYTES else _U64_MASK), n + 1
        shift += 7
    raise InvalidRecordError(f"varint at position {position} is longer than {max_bytes} bytes")


def _zigzag(unsigned: int) -> int:
    return (unsigned >> 1) ^ -(unsigned & 1)


# -- encoding ------------------------------------------------------------------------------------
def encode_batch(
    records: Sequence[Record] | Sequence[ProducerRecord],
    *,
    base_offset: int = 0,
    compression: int = Compression.NONE,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    timestamp_type: int = TimestampType.CREATE_TIME,
    is_transactional: bool = False,
    is_control: bool = False,
    delete_horizon_ms: int | None = None,
    last_offset_delta: int | None = None,
) -> bytes:
    """One complete RecordBatch v2 holding ``records``.

    ``records`` are all :class:`Record` or all ``(key, value, timestamp_ms, headers)`` tuples
    (the producer's fast path). A tuple's offset delta is its index; a Record's is
    ``offset - base_offset`` when its offset is set (>= 0), else its index, and the deltas must
    increase (the compactor leaves gaps). ``last_offset_delta`` keeps a compacted batch's
    original last offset. baseTimestamp is the first record's timestamp, or with
    ``delete_horizon_ms`` (KIP-534, attribute bit 6) the horizon.
    """
    if not records:
        raise InvalidRecordError("a record batch must hold at least one record")
    try:  # what a caller's bad input raises: a 3-tuple, a str value, a tuple among Records...
        entries, deltas = _entries_and_deltas(records, base_offset)
        base_timestamp = entries[0][2] if delete_horizon_ms is None else delete_horizon_ms
        payload = b"".join(_encode_records(entries, deltas, base_timestamp))
        max_timestamp = max(entry[2] for entry in entries)
    except (TypeError, ValueError, AttributeError) as error:
        raise InvalidRecordError(f"a record cannot be encoded: {error}") from error
    if compression != Compression.NONE:
        payload = compress(compression, payload)
    last_delta = deltas[-1] if last_offset_delta is None else last_offset_delta
    if last_delta < deltas[-1]:
        raise InvalidRecordError(f"lastOffsetDelta {last_delta} is below a record's offset delta")
    attributes = _attributes(
        compression, timestamp_type, is_transactional, is_control, delete_horizon_ms is not None
    )
    fields = (
        base_offset,
        HEADER_SIZE - LOG_OVERHEAD + len(payload),
        partition_leader_epoch,
        MAGIC,
        0,  # crc, filled in below
        attributes,
        last_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        len(entries),
    )
    try:
        header = HEADER.pack(*fields)
    except struct.error as error:
        raise InvalidRecordError(f"a batch header field is out of range: {error}") from None
    crc = crc32c.crc32c(payload, crc32c.crc32c(header[ATTRIBUTES_OFFSET:]))
    return b"".join((header[:CRC_OFFSET], _CRC.pack(crc), header[ATTRIBUTES_OFFSET:], payload))


def _attributes(
    compression: int,
    timestamp_type: int,
    is_transactional: bool,
    is_control: bool,
    has_delete_horizon: bool,
) -> int:
    if timestamp_type not in (TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME):
        raise InvalidRecordError(f"unknown timestamp type {timestamp_type}")
    attributes = compression | (timestamp_type << 3)
    attributes |= TRANSACTIONAL_MASK if is_transactional else 0
    attributes |= CONTROL_MASK if is_control else 0
    attributes |= DELETE_HORIZON_MASK if has_delete_horizon else 0
    return attributes


def _entries_and_deltas(
    records: Sequence[Record] | Sequence[ProducerRecord], base_offset: int
) -> tuple[Sequence[ProducerRecord], Sequence[int]]:
    """The records as producer tuples, and their offset deltas."""
    if isinstance(records[0], Record):
        kept = cast(Sequence[Record], records)
        entries = [(r.key, r.value, r.timestamp, r.headers) for r in kept]
        return entries, _offset_deltas(kept, base_offset)
    return cast(Sequence[ProducerRecord], records), range(len(records))


def _offset_deltas(records: Sequence[Record], base_offset: int) -> list[int]:
    deltas = [r.offset - base_offset if r.offset >= 0 else n for n, r in enumerate(records)]
    if deltas[0] < 0 or deltas[-1] > INT32_MAX:
        raise InvalidRecordError(
            f"record offsets {deltas[0] + base_offset}..{deltas[-1] + base_offset} "
            f"do not fit a batch at base offset {base_offset}"
        )
    for previous, delta in itertools.pairwise(deltas):  # bounded by the batch
        if delta <= previous:
            raise InvalidRecordError(f"record offset deltas must increase: {previous}, {delta}")
    return deltas


def _encode_records(
    entries: Sequence[ProducerRecord], deltas: Sequence[int], base_timestamp: int
) -> list[bytes]:
    """The encoded records as parts for one join. Flat on purpose: this is the producer's
    per-record cost. The record length is summed from the parts, not measured after a join."""
    small, size = _SMALL, _TABLE_SIZE
    parts: list[bytes] = []
    for delta, (key, value, timestamp, headers) in zip(deltas, entries, strict=True):
        timestamp_delta = timestamp - base_timestamp
        if 0 <= timestamp_delta < size:
            timestamp_bytes = small[timestamp_delta]
        else:
            timestamp_bytes = encode_varlong(timestamp_delta)
        offset_bytes = small[delta] if delta < size else encode_varint(delta)
        if key is None:
            key_bytes, key_length = b"", _NULL_LENGTH
        else:
            key_bytes, n = key, len(key)
            key_length = small[n] if n < size else encode_varint(n)
        if value is None:
            value_bytes, value_length = b"", _NULL_LENGTH
        else:
            value_bytes, n = value, len(value)
            value_length = small[n] if n < size else encode_varint(n)
        header_bytes = _encode_headers(headers) if headers else _NO_HEADERS
        body_size = (
            1
            + len(timestamp_bytes)
            + len(offset_bytes)
            + len(key_length)
            + len(key_bytes)
            + len(value_length)
            + len(value_bytes)
            + len(header_bytes)
        )
        parts += (
            small[body_size] if body_size < size else encode_varint(body_size),
            _RECORD_ATTRIBUTES,
            timestamp_bytes,
            offset_bytes,
            key_length,
            key_bytes,
            value_length,
            value_bytes,
            header_bytes,
        )
    return parts


def _encode_headers(headers: Headers) -> bytes:
    parts = [encode_varint(len(headers))]
    for header_key, header_value in headers:
        try:
            encoded_key = header_key.encode()
        except UnicodeEncodeError as error:
            raise InvalidRecordError(f"a header key is not encodable as UTF-8: {error}") from None
        parts += (encode_varint(len(encoded_key)), encoded_key)
        if header_value is None:
            parts.append(_NULL_LENGTH)
        else:
            parts += (encode_varint(len(header_value)), header_value)
    return b"".join(parts)


def set_log_append_time(batch: Buffer, timestamp_ms: int) -> bytes:
    """What a broker does for ``message.timestamp.type=LogAppendTime``: the batch with attribute
    bit 3 set, maxTimestamp = ``timestamp_ms`` and the CRC recomputed; nothing else changes.
    The CRC is checked first, so a corrupt batch is never given a fresh, valid CRC."""
    header = verify_batch(batch)
    if header.size_bytes != len(batch):
        raise CorruptRecordError(
            f"expected one batch of {header.size_bytes} bytes, got {len(batch)} bytes"
        )
    out = bytearray(batch)
    _ATTRIBUTES.pack_into(out, ATTRIBUTES_OFFSET, header.attributes | TIMESTAMP_TYPE_MASK)
    _TIMESTAMP.pack_into(out, MAX_TIMESTAMP_OFFSET, timestamp_ms)
    _CRC.pack_into(out, CRC_OFFSET, compute_crc(out, 0, header.batch_length))
    return bytes(out)


def recompress_batch(
    batch: Buffer,
    codec: int,
    level: int | None = None,
    *,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
) -> bytes:
    """What a leader does for a topic whose ``compression.type`` is a codec other than the
    batch's (Kafka's LogValidator): the batch with its records' bytes decompressed and
    compressed again with ``codec`` at ``level``; batchLength, the compression bits and the
    CRC follow. Everything else (offsets, timestamps, producer id, epoch and sequence, the
    transactional bit) is kept, so idempotence and transactions see the same batch. The CRC
    is checked first, so a corrupt batch is never given a fresh, valid CRC."""
    header = verify_batch(batch)
    if header.size_bytes != len(batch):
        raise CorruptRecordError(
            f"expected one batch of {header.size_bytes} bytes, got {len(batch)} bytes"
        )
    view = memoryview(batch)
    payload: Buffer = view[HEADER_SIZE:]
    if header.compression != Compression.NONE:
        payload = decompress(header.compression, payload, max_output_bytes)
    if codec != Compression.NONE:
        payload = compress(codec, payload, level)
    out = bytearray(view[:HEADER_SIZE])
    out += payload
    _LENGTH.pack_into(out, LENGTH_OFFSET, len(out) - LOG_OVERHEAD)
    attributes = (header.attributes & ~COMPRESSION_MASK) | codec
    _ATTRIBUTES.pack_into(out, ATTRIBUTES_OFFSET, attributes)
    _CRC.pack_into(out, CRC_OFFSET, compute_crc(out, 0, len(out) - LOG_OVERHEAD))
    return bytes(out)


# -- decoding ------------------------------------------------------------------------------------
def decode_batch(
    buf: Buffer, position: int = 0, *, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
) -> tuple[BatchHeader, list[Record]]:
    """The header and records of the batch at ``position``, after its CRC is checked.
    CORRUPT_MESSAGE for framing, CRC or a payload that does not decompress (or decompresses to
    more than ``max_output_bytes``), UNSUPPORTED_COMPRESSION_TYPE for an unknown codec id,
    INVALID_RECORD for malformed records. Control batches decode like any other."""
    header = verify_batch(buf, position)
    return header, _decode_payload(buf, position, header, max_output_bytes, _build_records)


def decode_batch_as(
    buf: Buffer,
    position: int,
    build: RecordsBuilder[T],
    *,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
) -> tuple[BatchHeader, list[T]]:
    """:func:`decode_batch`, the records made by ``build`` from the parsed records (see
    :data:`RecordsBuilder`) instead of as :class:`Record`."""
    header = verify_batch(buf, position)
    return header, _decode_payload(buf, position, header, max_output_bytes, build)


def iter_records(
    buf: Buffer, *, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
) -> Iterator[Record]:
    """Every record of a buffer of whole batches back to back (what a fetch returns), decoded
    lazily one batch at a time. Raises at the first corrupt, torn or malformed batch."""
    for position, header in iter_batches(buf):
        yield from _decode_payload(buf, position, header, max_output_bytes, _build_records)


def _decode_payload(
    buf: Buffer, position: int, header: BatchHeader, max_output_bytes: int, build: RecordsBuilder[T]
) -> list[T]:
    end = position + header.size_bytes
    if header.compression != Compression.NONE:
        payload = memoryview(buf)[position + HEADER_SIZE : end]
        data = decompress(header.compression, payload, max_output_bytes)
        _check_record_count(header, len(data))
        # The parser takes a whole batch: this one's header, marked uncompressed, before the
        # decompressed records, then the slack it may read into.
        whole = bytearray(buf[position : position + HEADER_SIZE])
        _ATTRIBUTES.pack_into(whole, ATTRIBUTES_OFFSET, header.attributes & ~COMPRESSION_MASK)
        whole += data
        whole += _SLACK
        view = memoryview(whole)[: len(whole) - len(_SLACK)]
    else:
        _check_record_count(header, header.size_bytes - HEADER_SIZE)
        view = memoryview(buf)[position:end]
        if len(buf) - end < len(_SLACK):
            view = memoryview(bytes(view) + _SLACK)[: header.size_bytes]
    return _decode_records(view, build)


def _check_record_count(header: BatchHeader, records_size: int) -> None:
    if header.record_count * RECORD_MIN_BYTES > records_size:
        raise InvalidRecordError(
            f"{records_size} bytes of records cannot hold the {header.record_count} records "
            f"the header declares"
        )


def _decode_records(batch: memoryview, build: RecordsBuilder[T]) -> list[T]:
    """The records of one whole, uncompressed ``batch``, parsed by aiokafka's Cython
    ``DefaultRecordBatch`` (a C loop: ~0.15 µs a record against ~1 µs for the flat Python loop
    this replaced) and made by ``build``. The batch's CRC and header were checked before.

    The parser reads a varint's bytes before it compares its position with the batch's end, so
    ``batch`` must be followed by at least :data:`_SLACK` readable bytes: the next batch of the
    same buffer, or the padding :func:`_decode_payload` adds. It reads lengths as Kafka's
    ``DefaultRecord.readFrom`` does (any negative key or value length is null), checks every
    field against the batch and every record against its declared length; what it rejects, and
    a header key that is not UTF-8, is INVALID_RECORD."""
    try:
        return build(iter(_ParsedBatch(batch)))
    except CorruptRecordException as error:
        raise InvalidRecordError(f"malformed record: {error}") from None
    except UnicodeDecodeError as error:
        raise InvalidRecordError(f"a record header key is not UTF-8: {error}") from None
    except (OverflowError, MemoryError):  # a length near 2**63 that wrapped the bounds check
        raise InvalidRecordError("a record field's length is out of range") from None


def _build_records(parsed: Iterator[ParsedRecord]) -> list[Record]:
    return [
        _build_record(r.offset, r.timestamp, r.key, r.value, tuple(h) if (h := r.headers) else ())
        for r in parsed
    ]


def _build_record(
    offset: int, timestamp: int, key: bytes | None, value: bytes | None, headers: Headers
) -> Record:
    record = _NEW_RECORD(Record)
    _SET_OFFSET(record, offset)
    _SET_TIMESTAMP(record, timestamp)
    _SET_KEY(record, key)
    _SET_VALUE(record, value)
    _SET_HEADERS(record, headers)
    return record
