"""RecordBatch v2 bytes straight into Arrow columns: the data source's read path.

Decoding record by record into Python objects costs microseconds a record, which caps a
Spark task far below what Spark itself ingests, so fetched batches are decoded a column at a
time instead:

1. each batch's header and CRC are checked (``verify_batch``) and a compressed payload is
   decompressed; control batches and batches outside the wanted offsets are skipped;
2. a tight loop hops from record to record by their length prefixes (the one sequential
   dependency of the format), noting where each record's body starts and ends;
3. pyarrow compute reads every record's fields at once: the bytes at the computed positions
   are gathered with ``take`` and the varints decoded with vector arithmetic; keys and values
   are then cut out of the buffer by one ``take`` over a binary array whose offsets are the
   field boundaries (the only copy of the data).

The vector path takes records whose varints fit ``VARINT_MAX_BYTES`` (lengths and timestamp
deltas below 128 MiB and 37 hours; offset deltas below 2**20) and that carry no headers. It
checks each record's framing (every varint ends, the fields end exactly where the record's
length says) and hands any fetch that fails a check to the reference decoder
(:func:`raftlog.records.decode_batch`), which decodes it or raises the precise error; so the
two paths accept and return the same records.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from dataplane.client.consumer import FetchedBatches
from raftlog.batch import HEADER_SIZE, BatchHeader, Compression, TimestampType, verify_batch
from raftlog.compression import DEFAULT_MAX_OUTPUT_BYTES, decompress
from raftlog.records import Record, decode_batch

VARINT_MAX_BYTES = 4  # longer varints (rare: huge records or timestamp gaps) take the slow path
OFFSET_DELTA_MAX_BYTES = 3
MAX_BUFFER_BYTES = 2**31 - 1  # int32 Arrow offsets
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")


@dataclass
class _Layout:
    """Where the records of a fetch are in one buffer, and their batches' header fields."""

    buffer: bytes
    starts: list[int] = field(default_factory=list)  # a record's attributes byte
    ends: list[int] = field(default_factory=list)  # one past a record's last byte
    batch_of: list[int] = field(default_factory=list)  # index into the per-batch lists
    base_offsets: list[int] = field(default_factory=list)
    base_timestamps: list[int] = field(default_factory=list)
    append_times: list[int] = field(default_factory=list)  # LogAppendTime, else -1


def _payloads(
    fetched: FetchedBatches, until_offset: int
) -> list[tuple[BatchHeader, bytes, int, int]]:
    """(header, buffer, start, end) of the records of each CRC-checked data batch that holds
    offsets in ``[fetch_offset, until_offset)``; a compressed payload is decompressed."""
    data, position, found = fetched.data, 0, []
    while position < len(data):
        header = verify_batch(data, position)
        start, end = position + HEADER_SIZE, position + header.size_bytes
        position = end
        if header.is_control or header.next_offset <= fetched.fetch_offset:
            continue
        if header.base_offset >= until_offset:
            break
        if header.compression == Compression.NONE:
            found.append((header, data, start, end))
        else:
            view = memoryview(data)[start:end]
            payload = decompress(header.compression, view, DEFAULT_MAX_OUTPUT_BYTES)
            found.append((header, payload, 0, len(payload)))
    return found


def _hop(buffer: bytes, position: int, end: int, count: int, layout: _Layout) -> bool:
    """Note the bounds of ``count`` records from ``position`` by their length varints; False
    when they do not tile ``[position, end)`` exactly (the reference decoder says why)."""
    starts, ends = layout.starts, layout.ends
    for _ in range(count):
        u = buffer[position]
        if u < 0x80:
            position += 1
        elif buffer[position + 1] < 0x80:
            u, position = (u & 0x7F) | (buffer[position + 1] << 7), position + 2
        elif buffer[position + 2] < 0x80:
            u = (u & 0x7F) | ((buffer[position + 1] & 0x7F) << 7) | (buffer[position + 2] << 14)
            position += 3
        else:
            return False
        if u & 1:
            return False  # a negative length
        starts.append(position)
        position += u >> 1
        ends.append(position)
        if position > end:
            return False
    return position == end


def _layout(fetched: FetchedBatches, until_offset: int) -> _Layout | None:
    """The records' positions in one buffer (the fetched bytes themselves unless a batch was
    compressed); None when a batch's records do not frame."""
    payloads = _payloads(fetched, until_offset)
    if all(buffer is fetched.data for _, buffer, _, _ in payloads):
        layout = _Layout(fetched.data)
        regions = [(header, start, end) for header, _, start, end in payloads]
    else:  # one buffer: the record regions back to back
        regions, pieces, size = [], [], 0
        for header, buffer, start, end in payloads:
            pieces.append(memoryview(buffer)[start:end])
            regions.append((header, size, size + end - start))
            size += end - start
        layout = _Layout(b"".join(pieces))
    if len(layout.buffer) > MAX_BUFFER_BYTES:
        return None
    for index, (header, start, end) in enumerate(regions):
        try:
            if not _hop(layout.buffer, start, end, header.record_count, layout):
                return None
        except IndexError:
            return None
        layout.batch_of.extend(itertools.repeat(index, header.record_count))
        layout.base_offsets.append(header.base_offset)
        layout.base_timestamps.append(header.base_timestamp)
        log_append = header.timestamp_type == TimestampType.LOG_APPEND_TIME
        layout.append_times.append(header.max_timestamp if log_append else -1)
    return layout


def _varints(u8: pa.Array, positions: pa.Array, max_bytes: int) -> tuple[pa.Array, pa.Array, bool]:
    """The zigzag varints at ``positions`` (int64): their values, the positions after them,
    and whether every one ended within ``max_bytes`` bytes."""
    last = len(u8) - 1
    value = nxt = more = None
    for k in range(max_bytes):  # positions past the buffer are clamped: framing checks catch them
        at = pc.min_element_wise(pc.add(positions, k), last)
        byte = pc.take(u8, at).cast(pa.int64())
        part = pc.shift_left(pc.bit_wise_and(byte, 0x7F), 7 * k)
        if value is None or nxt is None or more is None:
            value, nxt, more = part, pc.add(positions, 1), pc.greater_equal(byte, 0x80)
        else:
            value = pc.if_else(more, pc.bit_wise_or(value, part), value)
            nxt = pc.if_else(more, pc.add(nxt, 1), nxt)
            more = pc.and_(more, pc.greater_equal(byte, 0x80))
        if not pc.any(more).as_py():
            break
    assert value is not None and nxt is not None and more is not None, "max_bytes >= 1"
    decoded = pc.bit_wise_xor(pc.shift_right(value, 1), pc.negate(pc.bit_wise_and(value, 1)))
    return decoded, nxt, not pc.any(more).as_py()


@dataclass(frozen=True)
class _Columns:
    offsets: pa.Array
    timestamps_ms: pa.Array
    timestamp_types: pa.Array
    keys: pa.Array
    values: pa.Array


def _cut(buffer: bytes, bounds: Sequence[pa.Array], n: int) -> tuple[pa.Array, pa.Array]:
    """Keys and values: ``bounds`` are key start, key end, value start, value end of every
    record, and sorted they are the offsets of a binary array over ``buffer`` whose segments
    alternate key, gap, value, gap."""
    merged = pa.chunked_array(bounds).combine_chunks()
    offsets = pc.take(merged, pc.sort_indices(merged)).cast(pa.int32())
    segments = pa.Array.from_buffers(
        pa.binary(), 4 * n - 1, [None, offsets.buffers()[1], pa.py_buffer(buffer)]
    )
    key_index = pa.array(range(0, 4 * n, 4), pa.int64())
    return pc.take(segments, key_index), pc.take(segments, pc.add(key_index, 2))


def _vector_columns(layout: _Layout) -> _Columns | None:
    """Every record's fields by vector arithmetic; None when a record is beyond the vector
    path (long varints, headers) or does not frame."""
    n = len(layout.starts)
    u8 = pa.Array.from_buffers(pa.uint8(), len(layout.buffer), [None, pa.py_buffer(layout.buffer)])
    ends = pa.array(layout.ends, pa.int64())
    starts = pc.add(pa.array(layout.starts, pa.int64()), 1)  # past the attributes byte
    timestamp_delta, at, ok_timestamp = _varints(u8, starts, VARINT_MAX_BYTES)
    offset_delta, at, ok_offset = _varints(u8, at, OFFSET_DELTA_MAX_BYTES)
    key_length, key_start, ok_key = _varints(u8, at, VARINT_MAX_BYTES)
    key_end = pc.add(key_start, pc.max_element_wise(key_length, 0))
    value_length, value_start, ok_value = _varints(
        u8, pc.min_element_wise(key_end, len(u8) - 1), VARINT_MAX_BYTES
    )
    value_end = pc.add(value_start, pc.max_element_wise(value_length, 0))
    framed = pc.and_(
        pc.and_(pc.greater_equal(key_length, -1), pc.greater_equal(value_length, -1)),
        pc.equal(pc.add(value_end, 1), ends),  # one byte left: the header count...
    )
    if not (ok_timestamp and ok_offset and ok_key and ok_value and pc.all(framed).as_py()):
        return None
    if pc.any(pc.not_equal(pc.take(u8, value_end), 0)).as_py():  # ...and it is 0
        return None
    batch_of = pa.array(layout.batch_of, pa.int32())
    append_time = pc.take(pa.array(layout.append_times, pa.int64()), batch_of)
    created = pc.add(
        pc.take(pa.array(layout.base_timestamps, pa.int64()), batch_of), timestamp_delta
    )
    log_append = pc.greater_equal(append_time, 0)
    keys, values = _cut(layout.buffer, [key_start, key_end, value_start, value_end], n)
    return _Columns(
        offsets=pc.add(pc.take(pa.array(layout.base_offsets, pa.int64()), batch_of), offset_delta),
        timestamps_ms=pc.if_else(log_append, append_time, created),
        timestamp_types=pc.cast(log_append, pa.int32()),
        keys=_nulls_where(pc.equal(key_length, -1), keys),
        values=_nulls_where(pc.equal(value_length, -1), values),
    )


def _nulls_where(mask: pa.Array, array: pa.Array) -> pa.Array:
    if not pc.any(mask).as_py():
        return array
    return pc.if_else(mask, pa.scalar(None, array.type), array)


def _reference_records(
    fetched: FetchedBatches, until_offset: int
) -> list[tuple[Record, BatchHeader]]:
    """The slow path: every wanted record decoded by ``decode_batch``, with its batch's header."""
    found: list[tuple[Record, BatchHeader]] = []
    position = 0
    while position < len(fetched.data):
        header, records = decode_batch(fetched.data, position)
        position += header.size_bytes
        if not header.is_control:
            found += [(r, header) for r in records]
    return [(r, h) for r, h in found if fetched.fetch_offset <= r.offset < until_offset]


def _with_row_layout(
    fetched: FetchedBatches, columns: _Columns, headers: pa.Array | None, schema: pa.Schema
) -> pa.RecordBatch:
    n = len(columns.offsets)
    arrays = [
        columns.keys,
        columns.values,
        pa.repeat(pa.scalar(fetched.tp.topic, pa.string()), n),
        pa.repeat(pa.scalar(fetched.tp.partition, pa.int32()), n),
        columns.offsets,
        pc.multiply(columns.timestamps_ms, 1000).cast(TIMESTAMP_TYPE),
        columns.timestamp_types,
    ]
    if headers is not None:
        arrays.append(headers)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _reference_batch(
    fetched: FetchedBatches, until_offset: int, schema: pa.Schema, include_headers: bool
) -> pa.RecordBatch:
    pairs = _reference_records(fetched, until_offset)
    columns = _Columns(
        offsets=pa.array([r.offset for r, _ in pairs], pa.int64()),
        timestamps_ms=pa.array([r.timestamp for r, _ in pairs], pa.int64()),
        timestamp_types=pa.array([int(h.timestamp_type) for _, h in pairs], pa.int32()),
        keys=pa.array([r.key for r, _ in pairs], pa.binary()),
        values=pa.array([r.value for r, _ in pairs], pa.binary()),
    )
    headers = None
    if include_headers:
        headers = pa.array(
            [[{"key": k, "value": v} for k, v in r.headers] for r, _ in pairs],
            schema.field("headers").type,
        )
    return _with_row_layout(fetched, columns, headers, schema)


def _no_headers(n: int, schema: pa.Schema) -> pa.Array:
    """``n`` empty header lists."""
    list_type = schema.field("headers").type
    offsets = pa.repeat(pa.scalar(0, pa.int32()), n + 1)
    return pa.ListArray.from_arrays(offsets, pa.array([], list_type.value_type), type=list_type)


def to_record_batch(
    fetched: FetchedBatches, until_offset: int, schema: pa.Schema, include_headers: bool
) -> pa.RecordBatch:
    """The records of ``fetched`` with offsets in ``[fetch_offset, until_offset)`` as one Arrow
    batch in the Kafka connector's row layout (``schema``)."""
    layout = _layout(fetched, until_offset)
    columns = None if layout is None or not layout.starts else _vector_columns(layout)
    if columns is None:
        return _reference_batch(fetched, until_offset, schema, include_headers)
    wanted = pc.and_(
        pc.greater_equal(columns.offsets, fetched.fetch_offset),
        pc.less(columns.offsets, until_offset),
    )
    headers = _no_headers(len(columns.offsets), schema) if include_headers else None
    batch = _with_row_layout(fetched, columns, headers, schema)
    return batch if pc.all(wanted).as_py() else batch.filter(wanted)
