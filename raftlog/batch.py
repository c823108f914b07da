"""The RecordBatch v2 header: the only part of a batch the broker looks at.

Layout (big-endian), byte for byte Kafka's ``DefaultRecordBatch``::

    0  baseOffset            i64     \\ log overhead: rewritten on append,
    8  batchLength           i32      | outside the CRC
    12 partitionLeaderEpoch  i32     /
    16 magic                 i8  = 2
    17 crc                   u32     CRC-32C of bytes [21, 12 + batchLength)
    21 attributes            i16     bits 0-2 compression, 3 timestamp type, 4 transactional,
                                     5 control, 6 delete horizon set
    23 lastOffsetDelta       i32
    27 baseTimestamp         i64
    35 maxTimestamp          i64
    43 producerId            i64
    51 producerEpoch         i16
    53 baseSequence          i32
    57 recordCount           i32
    61 records ...

Everything here works on a batch as bytes plus its header: no record is decoded.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator
from typing import NamedTuple, NoReturn

import crc32c

from raftlog.errors import CorruptRecordError, InvalidRecordError, UnsupportedCompressionError

MAGIC = 2
HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: what batchLength does not count
OFFSET_LENGTH_EPOCH = struct.Struct(">qii")  # the 16 bytes rewritten on append
OFFSET_LENGTH_EPOCH_SIZE = OFFSET_LENGTH_EPOCH.size
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
MAX_TIMESTAMP_OFFSET = 35
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD  # 49

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
DELETE_HORIZON_MASK = 0x40

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
NO_TIMESTAMP = -1

# Idempotence, shared by the producer and the broker: sequences wrap from Integer.MAX_VALUE to 0,
# and a producer has at most BATCHES_KEPT batches of a partition in flight, which is how many the
# broker remembers per producer (Kafka's NUM_BATCHES_TO_RETAIN and the producer's cap on
# max.in.flight.requests.per.connection).
BATCHES_KEPT = 5
SEQUENCE_MAX = 2**31 - 1


def next_sequence(sequence: int, count: int = 1) -> int:
    """Sequences wrap from Integer.MAX_VALUE to 0, as Kafka's."""
    return (sequence + count) % (SEQUENCE_MAX + 1)


class Compression(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


MAX_COMPRESSION_ID = int(Compression.ZSTD)  # a plain int: compared on every batch


class TimestampType(enum.IntEnum):
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size_bytes(self) -> int:
        """Bytes the batch occupies in a log: header, records and log overhead."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType((self.attributes & TIMESTAMP_TYPE_MASK) >> 3)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_MASK)


_new_header = tuple.__new__  # BatchHeader._make without its length check: HEADER has 13 fields


def read_header(buf: bytes | bytearray | memoryview, position: int = 0) -> BatchHeader:
    """The header at ``position``; the caller knows at least HEADER_SIZE bytes are there."""
    return _new_header(BatchHeader, HEADER.unpack_from(buf, position))


def compute_crc(buf: bytes | bytearray | memoryview, position: int, batch_length: int) -> int:
    """CRC-32C of the batch at ``position``: attributes through the last record."""
    view = memoryview(buf)[position + ATTRIBUTES_OFFSET : position + LOG_OVERHEAD + batch_length]
    return crc32c.crc32c(view)


def check_header(header: BatchHeader, available_bytes: int) -> None:
    """Framing checks that need no record decoding. Raises a KafkaError with Kafka's code.

    ``available_bytes`` is how many bytes from the batch's start are present in the buffer.
    One combined test on the hot path (every append and scan); only a failing header pays for
    :func:`_raise_header_error` finding which rule it breaks.
    """
    batch_length = header.batch_length
    if (
        header.magic != MAGIC
        or batch_length < MIN_BATCH_LENGTH
        or batch_length + LOG_OVERHEAD > available_bytes
        or header.attributes & COMPRESSION_MASK > MAX_COMPRESSION_ID
        or header.last_offset_delta < 0
        or header.record_count < 0
    ):
        _raise_header_error(header, available_bytes)


def _raise_header_error(header: BatchHeader, available_bytes: int) -> NoReturn:
    """The first framing rule ``header`` breaks, as the error :func:`check_header` raises."""
    if header.magic != MAGIC:
        raise CorruptRecordError(f"batch magic is {header.magic}, only magic {MAGIC} is supported")
    if header.batch_length < MIN_BATCH_LENGTH:
        raise CorruptRecordError(
            f"batch length {header.batch_length} is below the minimum {MIN_BATCH_LENGTH}"
        )
    if header.size_bytes > available_bytes:
        raise CorruptRecordError(
            f"batch of {header.size_bytes} bytes is truncated to {available_bytes} bytes"
        )
    if header.compression > Compression.ZSTD:
        raise UnsupportedCompressionError(f"unknown compression codec id {header.compression}")
    if header.last_offset_delta < 0 or header.record_count < 0:
        raise InvalidRecordError(
            f"negative lastOffsetDelta ({header.last_offset_delta}) "
            f"or recordCount ({header.record_count})"
        )
    raise AssertionError(f"check_header rejected a header that breaks no rule: {header}")


def verify_batch(buf: bytes | bytearray | memoryview, position: int = 0) -> BatchHeader:
    """Read, frame-check and CRC-check the batch at ``position``; return its header."""
    available = len(buf) - position
    if available < HEADER_SIZE:
        raise CorruptRecordError(f"{available} bytes are too few for a batch header")
    header = _new_header(BatchHeader, HEADER.unpack_from(buf, position))  # read_header, inlined
    check_header(header, available)
    # compute_crc, inlined: every produced and replicated batch passes here
    end = position + LOG_OVERHEAD + header.batch_length
    actual = crc32c.crc32c(memoryview(buf)[position + ATTRIBUTES_OFFSET : end])
    if actual != header.crc:
        raise CorruptRecordError(
            f"batch at offset {header.base_offset} has CRC {actual:#010x}, "
            f"header says {header.crc:#010x}"
        )
    return header


def iter_batches(buf: bytes | bytearray | memoryview) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of each whole, CRC-checked batch of a buffer holding batches back to
    back. Raises CorruptRecordError at the first torn or corrupt batch."""
    position = 0
    end = len(buf)
    while position < end:
        header = verify_batch(buf, position)
        yield position, header
        position += header.size_bytes


def offset_length_epoch(base_offset: int, batch_length: int, leader_epoch: int) -> bytes:
    """The first 16 bytes of a batch, rewritten when a leader assigns offsets."""
    return OFFSET_LENGTH_EPOCH.pack(base_offset, batch_length, leader_epoch)
