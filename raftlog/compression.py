"""The compression codecs of RecordBatch v2, in the framings Kafka's Java client writes and reads.

- gzip: one RFC 1952 member as ``java.util.zip.GZIPOutputStream`` writes it (mtime 0, XFL 0,
  OS 255 "unknown", deflate level 6). Reading accepts what ``GZIPInputStream`` accepts: any
  valid header, concatenated members, and trailing bytes that do not start a member (ignored).
- snappy: xerial framing as snappy-java's ``SnappyOutputStream`` writes it (the 16-byte header
  ``\\x82SNAPPY\\x00``, version 1, compatible version 1, then 32 KiB input blocks, each a big-endian
  i32 length and a raw snappy block). Reading also takes concatenated xerial streams and plain
  raw snappy, as ``SnappyInputStream`` does.
- lz4: one LZ4 frame with independent 64 KiB blocks, no content size and no content checksum,
  as Kafka's ``Lz4BlockOutputStream`` writes it. Frames with dependent blocks are refused:
  Kafka cannot read them.
- zstd: zstd frames, with or without a content size (Java's streaming encoder writes none);
  concatenated frames are read.

Every decompression is bounded by ``max_output_bytes`` (default ``DEFAULT_MAX_OUTPUT_BYTES``): a
small corrupt or hostile payload (a "zip bomb") fails with CORRUPT_MESSAGE instead of exhausting
memory. Output is produced incrementally and checked as it grows, so at most a bounded amount
beyond the limit is ever held.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable

import cramjam
import lz4.frame
import zstandard

from raftlog.batch import Compression
from raftlog.errors import CorruptRecordError, UnsupportedCompressionError

Buffer = bytes | bytearray | memoryview

# 64 MiB: far above any batch a Kafka client builds with its defaults (batch.size 16 KiB,
# max.request.size and max.message.bytes 1 MiB) even at a 50:1 compression ratio, and small
# enough that a hostile batch cannot take a broker's or consumer's memory. Callers that knowingly
# handle bigger batches pass their own limit.
DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024 * 1024

GZIP_LEVEL = 6  # java.util.zip.Deflater.DEFAULT_COMPRESSION is zlib's level 6
LZ4_FRAME_LEVEL_MAX = 16  # lz4.frame's LZ4-HC maximum (Kafka's 17 maps to it)
ZSTD_LEVEL_DEFAULT = 3  # Kafka's compression.zstd.level default
# ID1 ID2 CM=deflate FLG=0 MTIME=0 XFL=0 OS=255, byte for byte GZIPOutputStream's header.
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
GZIP_MAGIC = GZIP_HEADER[:2]
GZIP_MEMBER_MIN_BYTES = 18  # 10 header + 2 empty deflate + 8 trailer (CRC-32, ISIZE)
_GZIP_TRAILER = struct.Struct("<II")

XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)  # version 1, compatible version 1
XERIAL_BLOCK_BYTES = 32 * 1024  # snappy-java's default block size
_XERIAL_LENGTH = struct.Struct(">i")
SNAPPY_PREAMBLE_MAX_BYTES = 5  # the uncompressed length of a raw block: a uint32 varint

LZ4_MAGIC = b"\x04\x22\x4d\x18"
LZ4_BLOCK_INDEPENDENCE = 0x20  # bit 5 of the FLG byte, the frame's fifth byte
LZ4_FRAME_MIN_BYTES = 7  # magic, FLG, BD, header checksum
LZ4_OUTPUT_STEP_BYTES = 1024 * 1024  # output asked of the decoder per call
LZ4_CONTENT_SIZE, LZ4_BLOCK_CHECKSUM, LZ4_DICT_ID = 0x08, 0x10, 0x01  # FLG bits
LZ4_BLOCK_MAX_BYTES = {4: 64 * 1024, 5: 256 * 1024, 6: 1024 * 1024, 7: 4 * 1024 * 1024}  # BD
_LZ4_BLOCK_SIZE = struct.Struct("<I")

# A zstd RLE block turns 4 input bytes into 128 KiB; feeding at most remaining/2**16 input
# bytes per call therefore yields at most about half the remaining budget (plus one block).
_ZSTD_STEP_SHIFT = 16
_ZSTD_STEP_MIN_BYTES = 64
_ZSTD_COMPRESSOR = zstandard.ZstdCompressor(level=ZSTD_LEVEL_DEFAULT)
_ZSTD_DECOMPRESSOR = zstandard.ZstdDecompressor()


def compress(codec: int, data: Buffer, level: int | None = None) -> bytes:
    """``data`` compressed with ``codec`` (a :class:`Compression`) in Kafka's framing, at
    ``level`` (Kafka's ``compression.<codec>.level``; None: Kafka's default; snappy has none)."""
    if codec == Compression.NONE:
        return bytes(data)
    if codec == Compression.GZIP:
        return _gzip(data, GZIP_LEVEL if level is None or level < 0 else level)
    if codec == Compression.SNAPPY:
        return _xerial_snappy(memoryview(data))
    if codec == Compression.LZ4:
        return lz4.frame.compress(  # type: ignore[no-any-return]
            data,
            block_size=lz4.frame.BLOCKSIZE_MAX64KB,
            block_linked=False,
            content_checksum=False,
            store_size=False,
            compression_level=_lz4_frame_level(level),
        )
    if codec == Compression.ZSTD:
        if level is None or level == ZSTD_LEVEL_DEFAULT:
            return _ZSTD_COMPRESSOR.compress(data)
        # a compressor per call: one ZstdCompressor may not serve two threads at once
        return zstandard.ZstdCompressor(level=level).compress(data)
    raise UnsupportedCompressionError(f"unknown compression codec id {codec}")


def decompress(codec: int, data: Buffer, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES) -> bytes:
    """``data`` decompressed. CorruptRecordError naming the codec if the payload does not decode
    or would exceed ``max_output_bytes``; UnsupportedCompressionError for an unknown codec id."""
    if codec == Compression.NONE:
        return bytes(data)
    decoder = _DECODERS.get(codec)
    if decoder is None:
        raise UnsupportedCompressionError(f"unknown compression codec id {codec}")
    name = Compression(codec).name.lower()
    if len(data) == 0:
        raise CorruptRecordError(f"{name} payload is empty")
    try:
        return decoder(memoryview(data), max_output_bytes)
    except (zlib.error, zstandard.ZstdError, cramjam.DecompressionError) as error:
        raise CorruptRecordError(f"{name} payload does not decompress: {error}") from error


def _too_large(name: str, limit: int) -> CorruptRecordError:
    return CorruptRecordError(f"{name} payload decompresses to more than {limit} bytes")


# -- gzip ----------------------------------------------------------------------------------------
def _lz4_frame_level(level: int | None) -> int:
    """Kafka's lz4 level (1..17, default 9; 1 is LZ4's fast compressor, above it LZ4-HC) as
    lz4.frame's ``compression_level`` (below 3 the fast compressor, 3..16 LZ4-HC). None (a
    producer's own batches): the fast compressor."""
    if level is None:
        return 0
    return 0 if level <= 1 else min(max(level, 3), LZ4_FRAME_LEVEL_MAX)


def _gzip(data: Buffer, level: int = GZIP_LEVEL) -> bytes:
    deflater = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)  # raw deflate
    body = deflater.compress(data) + deflater.flush()
    trailer = _GZIP_TRAILER.pack(zlib.crc32(data), len(data) & 0xFFFFFFFF)
    return b"".join((GZIP_HEADER, body, trailer))


def _gunzip(view: memoryview, limit: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    rest: Buffer = view
    for _ in range(len(view) // GZIP_MEMBER_MIN_BYTES + 1):  # each member is >= 18 bytes
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip member, trailer checked
        part = inflater.decompress(rest, limit + 1 - total)
        total += len(part)
        if total > limit:
            raise _too_large("gzip", limit)
        if not inflater.eof:
            raise CorruptRecordError("gzip payload is truncated")
        parts.append(part)
        rest = inflater.unused_data
        if rest[:2] != GZIP_MAGIC:
            break  # GZIPInputStream ignores trailing bytes that do not start a member
    return b"".join(parts)


# -- snappy --------------------------------------------------------------------------------------
def _xerial_snappy(view: memoryview) -> bytes:
    parts = [XERIAL_HEADER]
    for start in range(0, len(view), XERIAL_BLOCK_BYTES):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + XERIAL_BLOCK_BYTES]))
        parts += (_XERIAL_LENGTH.pack(len(block)), block)
    return b"".join(parts)


def _unsnappy(view: memoryview, limit: int) -> bytes:
    if view[: len(XERIAL_MAGIC)] != XERIAL_MAGIC:
        return _raw_unsnappy(view, limit)
    parts: list[bytes] = []
    total, position, end = 0, 0, len(view)
    for _ in range(end // 4 + 1):  # each step consumes at least 4 bytes
        if position == end:
            return b"".join(parts)
        if view[position : position + len(XERIAL_MAGIC)] == XERIAL_MAGIC:
            if position + len(XERIAL_HEADER) > end:
                raise CorruptRecordError("snappy payload: xerial header is truncated")
            position += len(XERIAL_HEADER)  # the header, or a concatenated stream's header
            continue
        if position + 4 > end:
            raise CorruptRecordError("snappy payload: xerial block length is truncated")
        (length,) = _XERIAL_LENGTH.unpack_from(view, position)
        if length < 0 or position + 4 + length > end:
            raise CorruptRecordError(f"snappy payload: xerial block of {length} bytes overruns it")
        block = view[position + 4 : position + 4 + length]
        total += _snappy_length(block)
        if total > limit:
            raise _too_large("snappy", limit)
        parts.append(bytes(cramjam.snappy.decompress_raw(block)))
        position += 4 + length
    raise AssertionError("xerial loop ended without consuming its input")


def _raw_unsnappy(view: memoryview, limit: int) -> bytes:
    if _snappy_length(view) > limit:
        raise _too_large("snappy", limit)
    return bytes(cramjam.snappy.decompress_raw(view))


def _snappy_length(block: memoryview) -> int:
    """The uncompressed length a raw snappy block declares (its leading varint), read before
    decoding so the limit is checked first; the decoder checks the block matches it."""
    declared, shift = 0, 0
    for byte in block[:SNAPPY_PREAMBLE_MAX_BYTES]:
        declared |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return declared
    raise CorruptRecordError("snappy payload: a raw block has no valid length preamble")


# -- lz4 -----------------------------------------------------------------------------------------
def _unlz4(view: memoryview, limit: int) -> bytes:
    try:
        return _unlz4_frame(view, limit)
    except RuntimeError as error:  # what lz4.frame raises for a corrupt frame
        raise CorruptRecordError(f"lz4 payload does not decompress: {error}") from error


def _unlz4_frame(view: memoryview, limit: int) -> bytes:
    if len(view) < LZ4_FRAME_MIN_BYTES or view[:4] != LZ4_MAGIC:
        raise CorruptRecordError("lz4 payload is not an LZ4 frame")
    if not view[4] & LZ4_BLOCK_INDEPENDENCE:
        raise CorruptRecordError("lz4 payload has dependent blocks, which Kafka cannot read")
    decompressor = lz4.frame.LZ4FrameDecompressor()
    if _lz4_output_bound(view) <= limit:
        # The framing bounds the output (the decoder refuses a block above the maximum), so
        # decode in one call: asking lz4 for a max_length is much slower.
        out: bytes = decompressor.decompress(view)
        if not decompressor.eof:
            raise CorruptRecordError("lz4 payload is truncated")
        return out
    parts: list[bytes] = []
    total = 0
    data: Buffer = view
    for _ in range(limit // LZ4_OUTPUT_STEP_BYTES + 2):
        part = decompressor.decompress(data, max_length=min(LZ4_OUTPUT_STEP_BYTES, limit + 1))
        data = b""  # the decoder keeps what it has not consumed
        total += len(part)
        if total > limit:
            raise _too_large("lz4", limit)
        parts.append(part)
        if decompressor.eof:
            return b"".join(parts)
        if decompressor.needs_input:
            raise CorruptRecordError("lz4 payload is truncated")
    raise _too_large("lz4", limit)


def _lz4_output_bound(view: memoryview) -> int:
    """The most a frame can decompress to: its block count times its maximum block size, read
    from the framing (FLG, BD, block sizes) without decoding. CorruptRecordError if torn."""
    flg, bd = view[4], view[5]
    block_max_bytes = LZ4_BLOCK_MAX_BYTES.get((bd >> 4) & 0x07)
    if block_max_bytes is None:
        raise CorruptRecordError(f"lz4 payload has an invalid block size id in BD {bd:#04x}")
    position = 6 + (8 if flg & LZ4_CONTENT_SIZE else 0) + (4 if flg & LZ4_DICT_ID else 0) + 1
    checksum_bytes = 4 if flg & LZ4_BLOCK_CHECKSUM else 0
    for blocks in range(len(view) // 4 + 1):  # each block takes at least its 4-byte size
        if position + 4 > len(view):
            raise CorruptRecordError("lz4 payload is truncated")
        (size,) = _LZ4_BLOCK_SIZE.unpack_from(view, position)
        if size == 0:  # the end mark
            return blocks * block_max_bytes
        position += 4 + (size & 0x7FFFFFFF) + checksum_bytes  # high bit: stored uncompressed
    raise AssertionError("lz4 block walk ended without consuming its input")


# -- zstd ----------------------------------------------------------------------------------------
def _unzstd(view: memoryview, limit: int) -> bytes:
    parts: list[bytes] = []
    total, position, end = 0, 0, len(view)
    decompressor = None
    for _ in range(end + 1):  # each step consumes at least one input byte
        if decompressor is None:
            if position == end:
                return b"".join(parts)
            decompressor = _ZSTD_DECOMPRESSOR.decompressobj()
        elif position == end:
            raise CorruptRecordError("zstd payload is truncated")
        step = max(_ZSTD_STEP_MIN_BYTES, (limit - total) >> _ZSTD_STEP_SHIFT)
        chunk = view[position : position + step]
        part = decompressor.decompress(chunk)
        total += len(part)
        if total > limit:
            raise _too_large("zstd", limit)
        parts.append(part)
        position += len(chunk)
        if decompressor.eof:
            position -= len(decompressor.unused_data)
            decompressor = None
    raise AssertionError("zstd loop ended without consuming its input")


_DECODERS: dict[int, Callable[[memoryview, int], bytes]] = {
    Compression.GZIP: _gunzip,
    Compression.SNAPPY: _unsnappy,
    Compression.LZ4: _unlz4,
    Compression.ZSTD: _unzstd,
}
