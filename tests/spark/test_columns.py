"""The columnar decoder of the data source's read path against the reference decoder: the same
records (offsets, timestamps, keys, values, timestamp types) for every shape of batch, and the
vector path really taken for ordinary records. Pure: no Spark, no cluster."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_schema

from dataplane.client import TopicPartition
from dataplane.client.consumer import FetchedBatches, whole_batches
from raftlog.batch import CRC_OFFSET, HEADER_SIZE, Compression, TimestampType, compute_crc
from raftlog.errors import CorruptRecordError, InvalidRecordError
from raftlog.records import decode_batch, encode_batch
from spark._columns import _layout, _vector_columns, to_record_batch
from spark.source import row_schema

TP = TopicPartition("clicks", 3)
SCHEMA = to_arrow_schema(row_schema(), timezone="UTC")
SCHEMA_HEADERS = to_arrow_schema(row_schema(include_headers=True), timezone="UTC")
BASE_MS = 1_700_000_000_000
Row = tuple[bytes | None, bytes | None, int, tuple[tuple[str, bytes | None], ...]]
BatchSpec = tuple[list[Row], Compression, TimestampType, bool]
Decoded = tuple[int, int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]

blobs = st.one_of(st.none(), st.binary(max_size=20), st.binary(min_size=100, max_size=3000))
headers = st.lists(st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=5))))
records = st.tuples(
    blobs,
    blobs,
    st.one_of(st.integers(0, 5000), st.integers(-(2**40), 2**40)),
    st.one_of(st.just(()), headers.map(tuple)),
)
batch_specs = st.tuples(
    st.lists(records, min_size=1, max_size=8),
    st.sampled_from(list(Compression)),
    st.sampled_from(list(TimestampType)),
    st.booleans(),  # a control batch
)


def build(specs: list[BatchSpec]) -> bytes:
    out, base = [], 0
    for rows, compression, timestamp_type, control in specs:
        entries = [(k, v, BASE_MS + delta, h) for k, v, delta, h in rows]
        out.append(
            encode_batch(
                entries,
                base_offset=base,
                compression=compression,
                timestamp_type=timestamp_type,
                is_control=control,
            )
        )
        base += len(rows)
    return b"".join(out)


def expected(data: bytes, fetch_offset: int, until_offset: int) -> list[Decoded]:
    rows, position = [], 0
    while position < len(data):
        header, batch = decode_batch(data, position)
        position += header.size_bytes
        if header.is_control:
            continue
        rows += [
            (r.offset, r.timestamp * 1000, int(header.timestamp_type), r.key, r.value, r.headers)
            for r in batch
            if fetch_offset <= r.offset < until_offset
        ]
    return rows


def decoded(batch: pa.RecordBatch, with_headers: bool) -> list[Decoded]:
    column = batch.to_pydict()
    assert set(column["topic"]) <= {TP.topic} and set(column["partition"]) <= {TP.partition}
    stamps = batch.column("timestamp").cast(pa.int64()).to_pylist()
    listed = column["headers"] if with_headers else [[] for _ in stamps]
    return [
        (o, t, tt, k, v, tuple((h["key"], h["value"]) for h in hs))
        for o, t, tt, k, v, hs in zip(
            column["offset"],
            stamps,
            column["timestampType"],
            column["key"],
            column["value"],
            listed,
            strict=True,
        )
    ]


@settings(max_examples=150, deadline=None)
@given(st.lists(batch_specs, min_size=1, max_size=4), st.data())
def test_same_records_as_the_reference_decoder(specs: list[BatchSpec], data: st.DataObject) -> None:
    raw = build(specs)
    total = sum(len(rows) for rows, *_ in specs)
    fetch_offset = data.draw(st.integers(0, total - 1))
    until_offset = data.draw(st.integers(fetch_offset, total + 2))
    with_headers = data.draw(st.booleans())
    fetched = whole_batches(TP, raw, fetch_offset)
    batch = to_record_batch(
        fetched, until_offset, SCHEMA_HEADERS if with_headers else SCHEMA, with_headers
    )
    want = expected(raw, fetch_offset, until_offset)
    if not with_headers:
        want = [(*row[:5], ()) for row in want]
    assert decoded(batch, with_headers) == want


def plain_fetch(count: int, value_bytes: int = 1024) -> FetchedBatches:
    rows = [
        (b"key-%d" % n if n % 3 else None, b"v" * value_bytes, BASE_MS + n, ())
        for n in range(count)
    ]
    halves = [rows[: count // 2], rows[count // 2 :]]
    data = encode_batch(halves[0]) + encode_batch(halves[1], base_offset=count // 2)
    return whole_batches(TP, data, 0)


def test_ordinary_records_take_the_vector_path() -> None:
    fetched = plain_fetch(500)
    layout = _layout(fetched, 500)
    assert layout is not None and len(layout.starts) == 500
    columns = _vector_columns(layout)
    assert columns is not None
    assert columns.keys.null_count == 167 and columns.values.to_pylist()[7] == b"v" * 1024
    batch = to_record_batch(fetched, 400, SCHEMA, False)
    assert batch.column("offset").to_pylist() == list(range(400))


def test_records_with_headers_take_the_reference_path() -> None:
    data = encode_batch([(b"k", b"v", BASE_MS, (("h", b"x"),))])
    layout = _layout(whole_batches(TP, data, 0), 1)
    assert layout is not None and _vector_columns(layout) is None
    batch = to_record_batch(whole_batches(TP, data, 0), 1, SCHEMA_HEADERS, True)
    assert batch.column("headers").to_pylist() == [[{"key": "h", "value": b"x"}]]


def test_a_corrupt_batch_raises() -> None:
    data = bytearray(plain_fetch(10).data)
    data[HEADER_SIZE + 20] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC"):
        to_record_batch(whole_batches(TP, bytes(data), 0), 10, SCHEMA, False)


def test_a_record_that_does_not_frame_raises_as_the_reference_says() -> None:
    data = bytearray(encode_batch([(b"key", b"value", BASE_MS, ()), (None, b"x", BASE_MS, ())]))
    data[HEADER_SIZE] += 2  # the first record's length (zigzag) says one byte more
    struct.pack_into(">I", data, CRC_OFFSET, compute_crc(data, 0, len(data) - 12))
    with pytest.raises(InvalidRecordError):
        to_record_batch(whole_batches(TP, bytes(data), 0), 2, SCHEMA, False)
