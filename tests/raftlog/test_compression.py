"""The codecs: Kafka's framings byte for byte, what Java's readers accept, and bounded output."""

from __future__ import annotations

import gzip
import io
import struct
import zlib

import cramjam
import lz4.frame
import pytest
import zstandard
from kafka import codec as kafka_codec

from raftlog.batch import Compression
from raftlog.compression import (
    DEFAULT_MAX_OUTPUT_BYTES,
    XERIAL_BLOCK_BYTES,
    compress,
    decompress,
)
from raftlog.errors import ErrorCode, KafkaError

CODECS = [Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD]
DATA = b"".join(b"record %06d with some repeated text; " % n for n in range(3000))  # ~114 KiB


def corrupt(codec: int, payload: bytes, **kwargs: int) -> str:
    with pytest.raises(KafkaError) as raised:
        decompress(codec, payload, **kwargs)
    assert raised.value.error is ErrorCode.CORRUPT_MESSAGE, raised.value
    return raised.value.message


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_round_trip_and_kafka_python_both_ways(codec: Compression) -> None:
    theirs_encode, theirs_decode = {
        Compression.GZIP: (kafka_codec.gzip_encode, kafka_codec.gzip_decode),
        Compression.SNAPPY: (kafka_codec.snappy_encode, kafka_codec.snappy_decode),
        Compression.LZ4: (kafka_codec.lz4_encode, kafka_codec.lz4_decode),
        Compression.ZSTD: (kafka_codec.zstd_encode, kafka_codec.zstd_decode),
    }[codec]
    ours = compress(codec, DATA)
    assert len(ours) < len(DATA) // 4
    assert decompress(codec, ours) == DATA
    assert decompress(codec, memoryview(bytearray(ours))) == DATA
    assert theirs_decode(ours) == DATA
    assert decompress(codec, theirs_encode(DATA)) == DATA
    assert decompress(codec, compress(codec, b"")) == b""


def test_gzip_is_framed_as_java_gzip_output_stream() -> None:
    out = compress(Compression.GZIP, DATA)
    # ID1 ID2, CM deflate, FLG none, MTIME 0, XFL 0, OS 255 (unknown), as JDK 16+ writes it
    assert out[:10] == bytes.fromhex("1f8b 0800 00000000 00 ff")
    assert struct.unpack("<II", out[-8:]) == (zlib.crc32(DATA), len(DATA))
    assert gzip.decompress(out) == DATA


def test_gzip_reads_what_gzip_input_stream_reads() -> None:
    members = compress(Compression.GZIP, b"first ") + gzip.compress(b"second", mtime=1)
    assert decompress(Compression.GZIP, members) == b"first second"  # concatenated members
    assert decompress(Compression.GZIP, members + b"\x00trailing junk") == b"first second"
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="records.bin", mode="wb", fileobj=buffer, mtime=0) as named:
        named.write(b"named")
    assert buffer.getvalue()[3] == 0x08  # FNAME set: a header field Java reads and skips
    assert decompress(Compression.GZIP, buffer.getvalue()) == b"named"
    assert "truncated" in corrupt(Compression.GZIP, compress(Compression.GZIP, DATA)[:-9])
    bad_trailer = bytearray(compress(Compression.GZIP, DATA))
    bad_trailer[-8] ^= 1  # CRC-32 of the data
    assert "gzip" in corrupt(Compression.GZIP, bytes(bad_trailer))


def test_snappy_is_xerial_framed_as_snappy_java() -> None:
    data = bytes(range(256)) * 300  # 76,800 bytes: three 32 KiB input blocks
    out = compress(Compression.SNAPPY, data)
    assert out[:16] == b"\x82SNAPPY\x00" + bytes.fromhex("00000001 00000001")
    position, blocks = 16, []
    while position < len(out):
        (length,) = struct.unpack_from(">i", out, position)
        blocks.append(
            bytes(cramjam.snappy.decompress_raw(out[position + 4 : position + 4 + length]))
        )
        position += 4 + length
    assert [len(b) for b in blocks] == [XERIAL_BLOCK_BYTES, XERIAL_BLOCK_BYTES, 76_800 - 65_536]
    assert b"".join(blocks) == data


def test_snappy_reads_raw_and_concatenated_xerial_streams() -> None:
    raw = bytes(cramjam.snappy.compress_raw(DATA))
    assert decompress(Compression.SNAPPY, raw) == DATA
    two = compress(Compression.SNAPPY, b"one,") + compress(Compression.SNAPPY, b"two")
    assert decompress(Compression.SNAPPY, two) == b"one,two"
    out = compress(Compression.SNAPPY, DATA)
    assert "overruns" in corrupt(Compression.SNAPPY, out[:-5])
    assert "truncated" in corrupt(Compression.SNAPPY, out[:10])
    assert "snappy" in corrupt(Compression.SNAPPY, b"\xff\xff\xff\xff\xff\xff")


def test_lz4_is_framed_as_kafka_lz4_block_output_stream() -> None:
    out = compress(Compression.LZ4, DATA)
    assert out[:4] == bytes.fromhex("04224d18")  # frame magic
    # FLG 0x60: version 01, independent blocks, no block checksum, no content size, no content
    # checksum. BD 0x40: 64 KiB blocks. Then the header checksum and blocks.
    assert out[4:6] == bytes.fromhex("6040")
    assert out[-4:] == b"\x00\x00\x00\x00"  # end mark, no content checksum after it


def test_lz4_refuses_what_kafka_cannot_read() -> None:
    linked = lz4.frame.compress(DATA, block_linked=True)
    assert "dependent blocks" in corrupt(Compression.LZ4, linked)
    assert "not an LZ4 frame" in corrupt(Compression.LZ4, b"\x00" * 16)
    assert "truncated" in corrupt(Compression.LZ4, compress(Compression.LZ4, DATA)[:-20])
    with_checksum = lz4.frame.compress(DATA, block_linked=False, content_checksum=True)
    assert decompress(Compression.LZ4, with_checksum) == DATA


@pytest.mark.parametrize("limit", [DEFAULT_MAX_OUTPUT_BYTES, len(DATA)])
def test_lz4_reads_every_frame_option_kafka_allows(limit: int) -> None:
    # With 4 MiB blocks the framing cannot prove the output fits ``len(DATA)``: the stepwise,
    # bounded path decodes it; with the default limit the one-call path does.
    for options in (
        {"content_checksum": True},
        {"block_checksum": True, "store_size": True},
        {"block_size": lz4.frame.BLOCKSIZE_MAX4MB},
        {"block_size": lz4.frame.BLOCKSIZE_MAX256KB, "store_size": True},
    ):
        frame = lz4.frame.compress(DATA, block_linked=False, **options)
        assert decompress(Compression.LZ4, frame, max_output_bytes=limit) == DATA, options
        message = corrupt(Compression.LZ4, frame[:-6], max_output_bytes=limit)
        assert "truncated" in message or "lz4" in message
    big_blocks = lz4.frame.compress(DATA, block_linked=False, block_size=lz4.frame.BLOCKSIZE_MAX4MB)
    assert "more than" in corrupt(Compression.LZ4, big_blocks, max_output_bytes=len(DATA) - 1)


def test_zstd_reads_frames_without_content_size_and_concatenated_frames() -> None:
    streaming = zstandard.ZstdCompressor(write_content_size=False)
    assert zstandard.get_frame_parameters(streaming.compress(DATA)).content_size in (
        0,
        zstandard.CONTENTSIZE_UNKNOWN,
    )
    two = streaming.compress(DATA) + streaming.compress(b"tail")
    assert decompress(Compression.ZSTD, two) == DATA + b"tail"
    skippable = b"\x50\x2a\x4d\x18" + struct.pack("<I", 3) + b"abc"
    assert decompress(Compression.ZSTD, skippable + streaming.compress(b"x")) == b"x"
    assert "truncated" in corrupt(Compression.ZSTD, streaming.compress(DATA)[:-3])
    assert "zstd" in corrupt(Compression.ZSTD, b"not zstd at all")


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_decompression_is_bounded(codec: Compression) -> None:
    bomb = compress(codec, b"\x00" * (8 << 20))
    assert len(bomb) < 400_000
    assert len(decompress(codec, bomb, max_output_bytes=8 << 20)) == 8 << 20
    message = corrupt(codec, bomb, max_output_bytes=(8 << 20) - 1)
    assert f"{codec.name.lower()} payload decompresses to more than {(8 << 20) - 1}" in message
    assert "more than 1000 bytes" in corrupt(codec, bomb, max_output_bytes=1000)


def test_zstd_bomb_without_content_size_stops_at_the_default_limit() -> None:
    streaming = zstandard.ZstdCompressor(write_content_size=False)
    bomb = streaming.compress(b"\x00" * (DEFAULT_MAX_OUTPUT_BYTES + 1))
    assert len(bomb) < 10_000
    assert "more than" in corrupt(Compression.ZSTD, bomb)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_empty_payload_is_corrupt(codec: Compression) -> None:
    assert "empty" in corrupt(codec, b"")


@pytest.mark.parametrize("codec_id", [5, 6, 7, -1])
def test_unknown_codec_is_unsupported(codec_id: int) -> None:
    for operation in (compress, decompress):
        with pytest.raises(KafkaError) as raised:
            operation(codec_id, b"data")
        assert raised.value.error is ErrorCode.UNSUPPORTED_COMPRESSION_TYPE


def test_none_is_the_identity() -> None:
    assert compress(Compression.NONE, memoryview(b"abc")) == b"abc"
    assert decompress(Compression.NONE, bytearray(b"abc")) == b"abc"
