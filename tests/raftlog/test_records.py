"""The record codec against hand-assembled golden bytes, kafka-python, and its own inverse."""

from __future__ import annotations

import struct
from typing import Any

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record._crc32c import crc as reference_crc32c
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kafka.record.util import encode_varint as reference_encode_varint

from raftlog import records as records_module
from raftlog.batch import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    HEADER_SIZE,
    MAGIC_OFFSET,
    Compression,
    TimestampType,
    read_header,
    verify_batch,
)
from raftlog.errors import ErrorCode, KafkaError
from raftlog.records import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    Record,
    decode_batch,
    decode_varint,
    decode_varlong,
    encode_batch,
    encode_varint,
    encode_varlong,
    iter_records,
    set_log_append_time,
)

TS = 1_700_000_000_000  # 0x0000018bcfe56800
ALL_CODECS = list(Compression)


def recrc(batch: bytes | bytearray) -> bytes:
    """The batch with a valid CRC again: for tampering past the CRC check."""
    out = bytearray(batch)
    out[CRC_OFFSET:ATTRIBUTES_OFFSET] = struct.pack(">I", crc32c.crc32c(out[ATTRIBUTES_OFFSET:]))
    return bytes(out)


def fails_with(error: ErrorCode, buf: bytes, **kwargs: int) -> str:
    with pytest.raises(KafkaError) as raised:
        decode_batch(buf, **kwargs)
    assert raised.value.error is error, raised.value
    return raised.value.message


# -- golden bytes, assembled by hand from the RecordBatch v2 specification ----------------------
GOLDEN_ONE = bytes.fromhex(
    "0000000000000000"  # baseOffset 0
    "00000040"  # batchLength 64 = 49 header bytes after this field + 15 record bytes
    "ffffffff"  # partitionLeaderEpoch -1
    "02"  # magic 2
    "db5e9cdd"  # crc: CRC-32C of everything from attributes on
    "0000"  # attributes: no compression, CreateTime, not transactional, not control
    "00000000"  # lastOffsetDelta 0
    "0000018bcfe56800"  # baseTimestamp 1700000000000
    "0000018bcfe56800"  # maxTimestamp 1700000000000
    "ffffffffffffffff"  # producerId -1
    "ffff"  # producerEpoch -1
    "ffffffff"  # baseSequence -1
    "00000001"  # recordCount 1
    # the record
    "1c"  # length 14 (zigzag 28)
    "00"  # attributes
    "00"  # timestampDelta 0
    "00"  # offsetDelta 0
    "06"  # keyLength 3 (zigzag 6)
    "6b6579"  # "key"
    "0a"  # valueLength 5
    "76616c7565"  # "value"
    "00"  # headerCount 0
)
GOLDEN_ONE_CRC = 0xDB5E9CDD

GOLDEN_TWO = bytes.fromhex(
    "000000000000002a"  # baseOffset 42
    "0000004f"  # batchLength 79 = 49 + 17 + 13
    "00000007"  # partitionLeaderEpoch 7
    "02"  # magic 2
    "c2db6105"  # crc
    "0010"  # attributes: transactional (bit 4)
    "00000001"  # lastOffsetDelta 1
    "0000018bcfe56800"  # baseTimestamp 1700000000000 (the first record's)
    "0000018bcfe5692c"  # maxTimestamp 1700000000300
    "00000000000004d2"  # producerId 1234
    "0005"  # producerEpoch 5
    "00000011"  # baseSequence 17
    "00000002"  # recordCount 2
    # record 0: offset 42, null key, value "hello", header ("h1", b"x")
    "20"  # length 16
    "00"  # attributes
    "00"  # timestampDelta 0
    "00"  # offsetDelta 0
    "01"  # keyLength -1: null
    "0a"  # valueLength 5
    "68656c6c6f"  # "hello"
    "02"  # headerCount 1
    "04"  # header keyLength 2
    "6831"  # "h1"
    "02"  # header valueLength 1
    "78"  # "x"
    # record 1: offset 43, timestamp +300, key "k", null value, header ("h2", null)
    "18"  # length 12
    "00"  # attributes
    "d804"  # timestampDelta 300 (zigzag 600: two varint bytes)
    "02"  # offsetDelta 1
    "02"  # keyLength 1
    "6b"  # "k"
    "01"  # valueLength -1: null
    "02"  # headerCount 1
    "04"  # header keyLength 2
    "6832"  # "h2"
    "01"  # header valueLength -1: null
)
GOLDEN_TWO_CRC = 0xC2DB6105
GOLDEN_TWO_RECORDS = [
    Record(42, TS, None, b"hello", (("h1", b"x"),)),
    Record(43, TS + 300, b"k", None, (("h2", None),)),
]
GOLDEN_TWO_ARGS: dict[str, Any] = {
    "base_offset": 42,
    "partition_leader_epoch": 7,
    "producer_id": 1234,
    "producer_epoch": 5,
    "base_sequence": 17,
    "is_transactional": True,
}


def test_golden_single_record() -> None:
    assert crc32c.crc32c(GOLDEN_ONE[ATTRIBUTES_OFFSET:]) == GOLDEN_ONE_CRC
    assert reference_crc32c(GOLDEN_ONE[ATTRIBUTES_OFFSET:]) == GOLDEN_ONE_CRC
    assert encode_batch([Record(-1, TS, b"key", b"value")]) == GOLDEN_ONE
    assert encode_batch([(b"key", b"value", TS, ())]) == GOLDEN_ONE
    header, records = decode_batch(GOLDEN_ONE)
    assert header.crc == GOLDEN_ONE_CRC
    assert records == [Record(0, TS, b"key", b"value")]


def test_golden_producer_batch_with_headers_and_nulls() -> None:
    assert crc32c.crc32c(GOLDEN_TWO[ATTRIBUTES_OFFSET:]) == GOLDEN_TWO_CRC
    assert reference_crc32c(GOLDEN_TWO[ATTRIBUTES_OFFSET:]) == GOLDEN_TWO_CRC
    assert encode_batch(GOLDEN_TWO_RECORDS, **GOLDEN_TWO_ARGS) == GOLDEN_TWO
    header, records = decode_batch(GOLDEN_TWO)
    assert records == GOLDEN_TWO_RECORDS
    assert (header.base_offset, header.partition_leader_epoch, header.crc) == (42, 7, 0xC2DB6105)
    assert header.is_transactional and not header.is_control
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (1234, 5, 17)


def test_golden_batches_read_by_kafka_python() -> None:
    assert kafka_python_records(GOLDEN_ONE) == [Record(0, TS, b"key", b"value")]
    assert kafka_python_records(GOLDEN_TWO) == GOLDEN_TWO_RECORDS


# -- varints -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (-1, "01"),
        (1, "02"),
        (63, "7e"),
        (-64, "7f"),
        (64, "8001"),
        (8191, "fe7f"),
        (8192, "808001"),
        (INT32_MAX, "feffffff0f"),
        (INT32_MIN, "ffffffff0f"),
    ],
)
def test_varint_vectors(value: int, encoded: str) -> None:
    assert encode_varint(value).hex() == encoded
    assert decode_varint(bytes.fromhex(encoded), 0) == (value, len(encoded) // 2)


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (INT64_MAX, "feffffffffffffffff01"),
        (INT64_MIN, "ffffffffffffffffff01"),
        (INT32_MAX + 1, "8080808010"),
        (-(1 << 40), "ffffffffff3f"),  # zigzag 2**41 - 1: 41 one bits
    ],
)
def test_varlong_vectors(value: int, encoded: str) -> None:
    assert encode_varlong(value).hex() == encoded
    assert decode_varlong(bytes.fromhex(encoded), 0) == (value, len(encoded) // 2)


@given(st.integers(INT32_MIN, INT32_MAX))
@settings(max_examples=300)
def test_varint_round_trip_matches_kafka_python(value: int) -> None:
    encoded = encode_varint(value)
    reference = bytearray()
    reference_encode_varint(value, reference.append)
    assert encoded == bytes(reference)
    assert len(encoded) <= 5
    assert decode_varint(b"\xaa" + encoded + b"\xbb", 1) == (value, 1 + len(encoded))


@given(st.integers(INT64_MIN, INT64_MAX))
@settings(max_examples=300)
def test_varlong_round_trip_matches_kafka_python(value: int) -> None:
    encoded = encode_varlong(value)
    reference = bytearray()
    reference_encode_varint(value, reference.append)
    assert encoded == bytes(reference)
    assert len(encoded) <= 10
    assert decode_varlong(encoded, 0) == (value, len(encoded))


def test_over_long_and_out_of_range_varints_are_invalid_records() -> None:
    for decode, too_long in (
        (decode_varint, b"\x80" * 5 + b"\x00"),
        (decode_varlong, b"\x80" * 10),
    ):
        with pytest.raises(KafkaError) as raised:
            decode(too_long, 0)
        assert raised.value.error is ErrorCode.INVALID_RECORD
    with pytest.raises(KafkaError) as raised:
        decode_varint(b"\x80\x80", 0)  # cut short
    assert raised.value.error is ErrorCode.INVALID_RECORD
    for encode, value in ((encode_varint, INT32_MAX + 1), (encode_varlong, INT64_MIN - 1)):
        with pytest.raises(KafkaError):
            encode(value)
    # As Java's int arithmetic: bits beyond 32 in a fifth byte are dropped, not an error.
    assert decode_varint(b"\xff\xff\xff\xff\x7f", 0) == (INT32_MIN, 5)


# -- kafka-python cross-check --------------------------------------------------------------------
def kafka_python_records(buf: bytes) -> list[Record]:
    out: list[Record] = []
    batches = MemoryRecords(bytes(buf))
    for _ in range(1000):
        batch = batches.next_batch()
        if batch is None:
            return out
        assert batch.validate_crc()
        out += [Record(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in batch]
    raise AssertionError("too many batches")


VARIED = [
    Record(-1, TS, None, b"v" * 10),  # null key
    Record(-1, TS + 1, b"k1", None),  # null value (tombstone)
    Record(-1, TS - 5, b"k2", b""),  # empty value, timestamp before the base
    Record(-1, TS + 2, b"", b"x" * 200, (("trace", b"\x00\x01"), ("none", None), ("", b""))),
    Record(-1, TS + 1000, b"k" * 130, b"y" * 20_000),  # 2- and 3-byte varint lengths
    Record(-1, -1, b"neg", b"negative timestamp"),
    Record(-1, 1 << 50, b"big", b"large timestamp"),
]


def expected_varied(base_offset: int = 0) -> list[Record]:
    return [
        Record(base_offset + n, r.timestamp, r.key, r.value, r.headers)
        for n, r in enumerate(VARIED)
    ]


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: c.name)
def test_batches_built_by_kafka_python_decode(codec: Compression) -> None:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=True,
        producer_id=77,
        producer_epoch=3,
        base_sequence=1000,
        batch_size=1 << 20,
    )
    for n, r in enumerate(VARIED):
        assert builder.append(n, r.timestamp, r.key, r.value, list(r.headers)) is not None
    buf = bytes(builder.build())
    header, records = decode_batch(buf)
    assert header.compression == codec  # the payload compresses, so kafka-python kept the codec
    assert records == expected_varied()
    assert header.is_transactional
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (77, 3, 1000)
    assert header.max_timestamp == 1 << 50


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: c.name)
def test_our_batches_decode_with_kafka_python(codec: Compression) -> None:
    buf = encode_batch(
        VARIED,
        base_offset=1000,
        compression=codec,
        producer_id=77,
        producer_epoch=3,
        base_sequence=1000,
        partition_leader_epoch=9,
        is_transactional=True,
    )
    batch = MemoryRecords(buf).next_batch()
    assert isinstance(batch, DefaultRecordBatch)
    assert batch.validate_crc()
    assert (batch.compression_type, batch.is_transactional) == (codec, True)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (77, 3, 1000)
    assert (batch.base_offset, batch.leader_epoch, batch.last_offset_delta) == (1000, 9, 6)
    assert (batch.first_timestamp, batch.max_timestamp) == (TS, 1 << 50)
    assert kafka_python_records(buf) == expected_varied(1000)


def test_log_append_time_keeps_crc_valid_and_kafka_python_reads_it() -> None:
    original = encode_batch(VARIED[:3], compression=Compression.LZ4)
    stamped = set_log_append_time(original, TS + 99_999)
    assert len(stamped) == len(original)
    header = verify_batch(stamped)  # the CRC checks out
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert header.max_timestamp == TS + 99_999
    # Only the attributes, maxTimestamp and the CRC changed.
    changed = [n for n, (a, b) in enumerate(zip(original, stamped, strict=True)) if a != b]
    assert {n for n in changed if not CRC_OFFSET <= n < ATTRIBUTES_OFFSET} <= {
        22,
        35,
        36,
        37,
        38,
        39,
        40,
        41,
        42,
    }
    assert [r.timestamp for r in decode_batch(stamped)[1]] == [TS + 99_999] * 3
    batch = MemoryRecords(stamped).next_batch()
    assert batch.validate_crc()
    assert batch.timestamp_type == 1
    assert [r.timestamp for r in batch] == [TS + 99_999] * 3


def test_set_log_append_time_refuses_a_corrupt_batch() -> None:
    corrupt = bytearray(GOLDEN_ONE)
    corrupt[-2] ^= 0xFF
    with pytest.raises(KafkaError) as raised:
        set_log_append_time(bytes(corrupt), TS)
    assert raised.value.error is ErrorCode.CORRUPT_MESSAGE
    with pytest.raises(KafkaError):
        set_log_append_time(GOLDEN_ONE + b"\x00", TS)


# -- round trips ---------------------------------------------------------------------------------
headers_strategy = st.lists(
    st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=20)), max_size=3
).map(tuple)
record_strategy = st.tuples(
    st.none() | st.binary(max_size=40),
    st.none() | st.binary(max_size=300),
    st.integers(-(1 << 40), 1 << 40),
    headers_strategy,
)


@given(
    entries=st.lists(record_strategy, min_size=1, max_size=12),
    codec=st.sampled_from(ALL_CODECS),
    base_offset=st.integers(0, 1 << 40),
    gaps=st.lists(st.integers(1, 3000), min_size=12, max_size=12),
    as_records=st.booleans(),
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_round_trip(
    entries: list[tuple[bytes | None, bytes | None, int, tuple[tuple[str, bytes | None], ...]]],
    codec: Compression,
    base_offset: int,
    gaps: list[int],
    as_records: bool,
) -> None:
    if as_records:  # the compactor's form: absolute offsets with gaps
        offsets = [base_offset + sum(gaps[:n]) for n in range(len(entries))]
        records = [Record(o, t, k, v, h) for o, (k, v, t, h) in zip(offsets, entries, strict=False)]
        buf = encode_batch(records, base_offset=base_offset, compression=codec)
    else:  # the producer's form: offsets follow the index
        offsets = [base_offset + n for n in range(len(entries))]
        records = [Record(o, t, k, v, h) for o, (k, v, t, h) in zip(offsets, entries, strict=False)]
        buf = encode_batch(entries, base_offset=base_offset, compression=codec)
    header, decoded = decode_batch(buf)
    assert decoded == records
    assert header.record_count == len(records)
    assert header.last_offset == offsets[-1]
    assert header.base_timestamp == entries[0][2]
    assert header.max_timestamp == max(t for _, _, t, _ in entries)
    assert list(iter_records(buf + buf)) == records + records


def test_compacted_batch_keeps_its_last_offset_delta() -> None:
    records = [Record(10, TS, b"a", b"1"), Record(14, TS + 1, b"b", b"2")]
    buf = encode_batch(records, base_offset=10, last_offset_delta=9)
    header, decoded = decode_batch(buf)
    assert (header.record_count, header.last_offset_delta, header.next_offset) == (2, 9, 20)
    assert decoded == records
    assert kafka_python_records(buf) == records


@pytest.mark.parametrize(
    "records",
    [
        [Record(5, TS, b"a", b"1"), Record(5, TS, b"b", b"2")],  # not increasing
        [Record(3, TS, b"a", b"1")],  # below the base offset
        [Record(-1, TS, b"a", b"1"), Record(0, TS, b"b", b"2")],  # index then offset collide
    ],
)
def test_bad_offsets_are_refused(records: list[Record]) -> None:
    with pytest.raises(KafkaError) as raised:
        encode_batch(records, base_offset=4 if records[0].offset == 3 else 0)
    assert raised.value.error is ErrorCode.INVALID_RECORD


def test_empty_or_malformed_input_is_refused() -> None:
    mixed = [Record(-1, TS, b"k", b"v"), (b"k", b"v", TS, ())]
    for bad in ([], [(b"k", b"v", TS)], [(b"k", "text", TS, ())], mixed, mixed[::-1]):
        with pytest.raises(KafkaError) as raised:
            encode_batch(bad)  # type: ignore[arg-type]
        assert raised.value.error is ErrorCode.INVALID_RECORD
    with pytest.raises(KafkaError):
        encode_batch([(b"k", b"v", TS, ())], producer_epoch=1 << 20)  # not an i16
    with pytest.raises(KafkaError) as raised:
        encode_batch([(b"k", b"v", TS, ())], compression=6)
    assert raised.value.error is ErrorCode.UNSUPPORTED_COMPRESSION_TYPE


def test_delete_horizon_sets_bit_6_and_base_timestamp() -> None:
    horizon = TS + 86_400_000
    records = [Record(0, TS, b"a", None), Record(1, TS + 5, b"b", b"2")]
    buf = encode_batch(records, delete_horizon_ms=horizon)
    header, decoded = decode_batch(buf)
    assert header.has_delete_horizon and header.attributes == 0x40
    assert (header.base_timestamp, header.max_timestamp) == (horizon, TS + 5)
    assert decoded == records  # negative timestamp deltas, relative to the horizon
    assert kafka_python_records(buf) == records


def test_log_append_time_batch_reports_max_timestamp_for_every_record() -> None:
    buf = encode_batch(
        [(b"a", b"1", TS, ()), (b"b", b"2", TS + 7, ())],
        timestamp_type=TimestampType.LOG_APPEND_TIME,
    )
    assert [r.timestamp for r in decode_batch(buf)[1]] == [TS + 7, TS + 7]


def test_control_batches_decode_like_any_other() -> None:
    # An end-transaction marker: key = version 0, type 1 (commit); value = version 0, epoch 3.
    marker = (b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x03", TS, ())
    buf = encode_batch([marker], producer_id=9, producer_epoch=1, is_control=True)
    header, records = decode_batch(buf)
    assert header.is_control and not header.is_transactional
    assert records == [Record(0, TS, marker[0], marker[1])]
    assert next(iter(MemoryRecords(buf).next_batch())).commit


def test_decode_at_a_position_and_from_any_buffer() -> None:
    buf = GOLDEN_ONE + GOLDEN_TWO
    assert decode_batch(buf, len(GOLDEN_ONE))[1] == GOLDEN_TWO_RECORDS
    assert decode_batch(bytearray(buf), len(GOLDEN_ONE))[1] == GOLDEN_TWO_RECORDS
    assert decode_batch(memoryview(buf), len(GOLDEN_ONE))[1] == GOLDEN_TWO_RECORDS
    assert list(iter_records(memoryview(buf))) == [
        Record(0, TS, b"key", b"value"),
        *GOLDEN_TWO_RECORDS,
    ]


def test_iter_records_is_lazy_batch_by_batch() -> None:
    good = encode_batch([(b"a", b"1", TS, ()), (b"b", b"2", TS, ())], compression=Compression.ZSTD)
    torn = GOLDEN_ONE[:-3]
    records = iter_records(good + torn)
    assert [next(records).key, next(records).key] == [b"a", b"b"]  # before the torn batch
    with pytest.raises(KafkaError) as raised:
        next(records)
    assert raised.value.error is ErrorCode.CORRUPT_MESSAGE


# -- corrupt and malformed batches ---------------------------------------------------------------
def test_flipped_byte_is_corrupt_message() -> None:
    for position in (ATTRIBUTES_OFFSET, 30, HEADER_SIZE, len(GOLDEN_TWO) - 1):
        flipped = bytearray(GOLDEN_TWO)
        flipped[position] ^= 0x01
        fails_with(ErrorCode.CORRUPT_MESSAGE, bytes(flipped))


def test_wrong_magic_and_truncation_are_corrupt_message() -> None:
    wrong_magic = bytearray(GOLDEN_ONE)
    wrong_magic[MAGIC_OFFSET] = 1
    assert "magic" in fails_with(ErrorCode.CORRUPT_MESSAGE, bytes(wrong_magic))
    for length in (0, 10, HEADER_SIZE - 1, HEADER_SIZE, len(GOLDEN_ONE) - 1):
        fails_with(ErrorCode.CORRUPT_MESSAGE, GOLDEN_ONE[:length])


@pytest.mark.parametrize("codec_id", [5, 6, 7])
def test_unknown_compression_is_unsupported(codec_id: int) -> None:
    tampered = bytearray(GOLDEN_ONE)
    tampered[ATTRIBUTES_OFFSET + 1] |= codec_id
    fails_with(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, recrc(tampered))


def tamper_record(golden: bytes, offset_in_records: int, replacement: bytes) -> bytes:
    out = bytearray(golden)
    position = HEADER_SIZE + offset_in_records
    out[position : position + len(replacement)] = replacement
    return recrc(out)


@pytest.mark.parametrize(
    ("tampered", "damage"),
    [
        (tamper_record(GOLDEN_ONE, 0, b"\x1e"), "record of 15 bytes overruns the batch"),
        (tamper_record(GOLDEN_ONE, 0, b"\x1a"), "fields run 1 bytes past its length"),
        (tamper_record(GOLDEN_TWO, 0, b"\x22"), "declares 1 more bytes than its fields hold"),
        (tamper_record(GOLDEN_ONE, 0, b"\x1d"), "negative record length -15"),
        (tamper_record(GOLDEN_ONE, 4, b"\x20"), "field of 16 bytes overruns its record"),
        (tamper_record(GOLDEN_ONE, 8, b"\x7f"), "a negative value length shifts the fields"),
        (tamper_record(GOLDEN_ONE, 3, b"\x80" * 5), "varint longer than 5 bytes"),
        (tamper_record(GOLDEN_ONE, 2, b"\x80" * 10), "varlong longer than 10 bytes"),
        (tamper_record(GOLDEN_TWO, 12, b"\x01"), "a record header has a null key"),
        (tamper_record(GOLDEN_TWO, 11, b"\x03"), "invalid header count -2"),
        (tamper_record(GOLDEN_TWO, 11, b"\x7e"), "invalid header count 63"),
        (tamper_record(GOLDEN_TWO, 13, b"\xff"), "header key is not UTF-8"),
        *(
            (tamper_record(GOLDEN_ONE, 4, encode_varlong(length)), f"key of {length} bytes")
            for length in (1 << 31, 1 << 62, INT64_MAX - 40, INT64_MAX)
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_malformed_record_with_valid_crc_is_invalid_record(tampered: bytes, damage: str) -> None:
    assert "record" in fails_with(ErrorCode.INVALID_RECORD, tampered)
    assert "record" in fails_with(ErrorCode.INVALID_RECORD, tampered + GOLDEN_ONE)  # not last


def test_the_record_parser_is_compiled() -> None:
    """The consumer's per-record cost is aiokafka's Cython parser, not its pure-Python fallback
    (which it takes silently when the extension is missing or AIOKAFKA_NO_EXTENSIONS is set)."""
    assert "_crecords" in records_module._ParsedBatch.__module__  # type: ignore[attr-defined]


def with_record_count(golden: bytes, count: int) -> bytes:
    out = bytearray(golden)
    struct.pack_into(">i", out, HEADER_SIZE - 4, count)
    return recrc(out)


def test_record_count_mismatch_is_invalid_record() -> None:
    assert read_header(GOLDEN_TWO).record_count == 2
    fails_with(ErrorCode.INVALID_RECORD, with_record_count(GOLDEN_TWO, 1))
    fails_with(ErrorCode.INVALID_RECORD, with_record_count(GOLDEN_TWO, 3))
    fails_with(ErrorCode.INVALID_RECORD, with_record_count(GOLDEN_TWO, 0))
    fails_with(ErrorCode.INVALID_RECORD, with_record_count(GOLDEN_TWO, 1 << 30))


def test_trailing_garbage_inside_the_batch_is_invalid_record() -> None:
    out = bytearray(GOLDEN_ONE + b"\x00\x00")
    struct.pack_into(">i", out, 8, len(out) - 12)  # batchLength covers the garbage
    fails_with(ErrorCode.INVALID_RECORD, recrc(out))


@pytest.mark.parametrize("codec", ALL_CODECS[1:], ids=lambda c: c.name)
def test_compressed_payload_limits_and_corruption(codec: Compression) -> None:
    buf = encode_batch([(b"k", b"\x00" * 100_000, TS, ())], compression=codec)
    assert len(buf) < 20_000
    message = fails_with(ErrorCode.CORRUPT_MESSAGE, buf, max_output_bytes=50_000)
    assert codec.name.lower() in message and "50000" in message
    assert decode_batch(buf, max_output_bytes=200_000)[1][0].value == b"\x00" * 100_000
    garbled = bytearray(buf)
    garbled[HEADER_SIZE + 4 : -1] = b"\xa5" * (len(buf) - HEADER_SIZE - 5)  # after the magic
    message = fails_with(ErrorCode.CORRUPT_MESSAGE, recrc(garbled))
    assert codec.name.lower() in message


@given(
    entries=st.lists(record_strategy, min_size=1, max_size=4),
    codec=st.sampled_from(ALL_CODECS),
    edits=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=4),
)
@settings(max_examples=200, deadline=None)
def test_any_damage_behind_a_valid_crc_is_a_kafka_error(
    entries: list[tuple[bytes | None, bytes | None, int, tuple[tuple[str, bytes | None], ...]]],
    codec: Compression,
    edits: list[tuple[int, int]],
) -> None:
    damaged = bytearray(encode_batch(entries, compression=codec))
    for position, byte in edits:
        damaged[HEADER_SIZE + position % (len(damaged) - HEADER_SIZE)] = byte
    try:
        decode_batch(recrc(damaged))
    except KafkaError as error:  # nothing else: no IndexError, ValueError, UnicodeError...
        assert error.error in (ErrorCode.CORRUPT_MESSAGE, ErrorCode.INVALID_RECORD)
