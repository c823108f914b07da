"""compression.type on the leader's append (Kafka's LogValidator): a codec recompresses batches
in any other codec, keeping producer id, epoch, sequence and timestamps; batches already in it
pass through untouched; ``producer`` keeps every batch's codec; followers store the leader's
bytes. Also segment.jitter.ms's share per log."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftlog.batch import HEADER_SIZE, Compression, TimestampType, read_header
from raftlog.config import LogConfig
from raftlog.log import Log, segment_jitter_ms
from raftlog.records import ProducerRecord, decode_batch, encode_batch, recompress_batch

RECORDS: list[ProducerRecord] = [
    (b"key-%d" % i, b"value " * 50 + b"%d" % i, 1_000 + i, ()) for i in range(20)
]


def _batch(codec: Compression = Compression.NONE, **fields: object) -> bytes:
    return encode_batch(RECORDS, compression=codec, **fields)  # type: ignore[arg-type]


def _open(path: Path, **config: str) -> Log:
    return Log(path / "topic-0", LogConfig.parse(config))


def _stored(log: Log) -> bytes:
    return log.read(0, 10 * 1024 * 1024)


@pytest.mark.parametrize("target", ["uncompressed", "gzip", "snappy", "lz4", "zstd"])
@pytest.mark.parametrize("source", list(Compression))
def test_leader_stores_batches_in_the_topics_codec(
    tmp_path: Path, source: Compression, target: str
) -> None:
    log = _open(tmp_path, **{"compression.type": target})
    produced = _batch(source, producer_id=42, producer_epoch=3, base_sequence=7)
    log.append(produced, leader_epoch=5, from_client=True)
    header, records = decode_batch(_stored(log))
    expected = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}[target]
    assert header.compression == expected
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 7)
    assert (header.base_timestamp, header.max_timestamp) == (1_000, 1_019)
    assert [(r.key, r.value, r.timestamp) for r in records] == [e[:3] for e in RECORDS]
    assert [r.offset for r in records] == list(range(20))


def test_a_batch_already_in_the_codec_passes_through_untouched(tmp_path: Path) -> None:
    log = _open(tmp_path, **{"compression.type": "zstd"})
    produced = _batch(Compression.ZSTD)
    assert log._recompressed(produced, int(Compression.ZSTD)) is produced
    log.append(produced, leader_epoch=0)
    assert _stored(log)[16:] == produced[16:]  # only baseOffset, length, epoch rewritten


def test_producer_keeps_each_batchs_codec(tmp_path: Path) -> None:
    log = _open(tmp_path)  # compression.type=producer, Kafka's default
    gzip, plain = _batch(Compression.GZIP), _batch()
    log.append(gzip + plain, leader_epoch=0)
    stored = _stored(log)
    first = read_header(stored)
    assert first.compression == Compression.GZIP
    assert read_header(stored, first.size_bytes).compression == Compression.NONE


def test_only_the_batches_in_another_codec_are_rewritten(tmp_path: Path) -> None:
    log = _open(tmp_path, **{"compression.type": "lz4"})
    log.append(_batch(Compression.LZ4) + _batch() + _batch(Compression.LZ4), leader_epoch=0)
    stored = _stored(log)
    position, codecs = 0, []
    while position < len(stored):
        header = read_header(stored, position)
        codecs.append(header.compression)
        position += header.size_bytes
    assert codecs == [Compression.LZ4] * 3


def test_control_batches_keep_their_codec(tmp_path: Path) -> None:
    log = _open(tmp_path, **{"compression.type": "zstd"})
    marker = encode_batch(
        [(b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", 1_000, ())],
        producer_id=9, producer_epoch=0, is_transactional=True, is_control=True,
    )  # fmt: skip
    log.append(marker, leader_epoch=0)
    assert read_header(_stored(log)).compression == Compression.NONE


def test_followers_store_the_leaders_bytes(tmp_path: Path) -> None:
    log = _open(tmp_path, **{"compression.type": "zstd"})
    produced = _batch(Compression.GZIP)
    log.append_as_follower(produced)
    assert _stored(log) == produced


def test_log_append_time_stamps_the_recompressed_batch(tmp_path: Path) -> None:
    log = Log(
        tmp_path / "topic-0",
        LogConfig.parse({"compression.type": "zstd", "message.timestamp.type": "LogAppendTime"}),
        clock=lambda: 5_000_000,
    )
    info = log.append(_batch(), leader_epoch=0)
    header, _ = decode_batch(_stored(log))
    assert header.compression == Compression.ZSTD
    assert header.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert header.max_timestamp == info.log_append_time_ms == 5_000_000


def test_compression_levels_reach_the_codec() -> None:
    plain = _batch()
    fast = recompress_batch(plain, Compression.GZIP, 1)
    best = recompress_batch(plain, Compression.GZIP, 9)
    assert fast[HEADER_SIZE:] != best[HEADER_SIZE:]
    for level in (1, 9, 17):
        assert decode_batch(recompress_batch(plain, Compression.LZ4, level))[1][0].key == b"key-0"
    for level in (-5, 3, 19):
        assert decode_batch(recompress_batch(plain, Compression.ZSTD, level))[1][0].key == b"key-0"


def test_segment_jitter_is_a_stable_share_below_its_bound() -> None:
    config = LogConfig.parse({"segment.ms": "1000", "segment.jitter.ms": "600"})
    shares = {segment_jitter_ms(config, f"topic-{p}") for p in range(50)}
    assert all(0 <= share < 600 for share in shares) and len(shares) > 10
    assert segment_jitter_ms(config, "topic-3") == segment_jitter_ms(config, "topic-3")
    assert segment_jitter_ms(LogConfig(), "topic-3") == 0
    wide = LogConfig.parse({"segment.ms": "100", "segment.jitter.ms": "100000"})
    assert segment_jitter_ms(wide, "topic-3") < 100  # bounded by segment.ms too
