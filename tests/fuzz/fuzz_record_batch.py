"""Fuzz target: RecordBatch v2 decoding, with and without compression, and the leader's append.

The first byte picks a codec and a log; the rest is a buffer of batches. It goes through the
client's decoders (raftlog/records.py ``decode_batch``, ``iter_records``), the leader's
recompression (``recompress_batch``) and ``Log.append`` as a produce from a client reaches it
(CRC, framing, keys of a compacted topic, LogAppendTime, compression.type). Bad input must raise
``KafkaError`` (CORRUPT_MESSAGE, INVALID_RECORD, UNSUPPORTED_COMPRESSION_TYPE, ...) and leave
the log exactly as it was; decompression is bounded (``max_output_bytes``).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

from raftlog.config import LogConfig
from raftlog.errors import KafkaError
from raftlog.log import Log
from raftlog.records import decode_batch, iter_records, recompress_batch

MAX_OUTPUT_BYTES = 1024 * 1024  # a bomb that inflates past this is CORRUPT_MESSAGE
LOG_BYTES_MAX = 32 * 1024 * 1024  # a fresh set of logs past this
ALLOWED = (KafkaError,)
CONFIGS = (
    LogConfig(),
    LogConfig.model_validate({"cleanup.policy": "compact", "compression.type": "zstd"}),
    LogConfig.model_validate(
        {"message.timestamp.type": "LogAppendTime", "compression.type": "gzip"}
    ),
    LogConfig.model_validate({"compression.type": "lz4", "max.message.bytes": 4096}),
)


class Logs:
    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="raftlog-fuzz-logs-"))
        self.logs = [Log(self.directory / f"t-{i}", c) for i, c in enumerate(CONFIGS)]

    def size_bytes(self) -> int:
        return sum(log.size_bytes for log in self.logs)

    def close(self) -> None:
        for log in self.logs:
            log.close()
        shutil.rmtree(self.directory, ignore_errors=True)


_logs: Logs | None = None


def _the_logs() -> Logs:
    global _logs  # noqa: PLW0603  (one set per fuzzing process)
    if _logs is not None and _logs.size_bytes() > LOG_BYTES_MAX:
        _logs.close()
        _logs = None
    if _logs is None:
        _logs = Logs()
    return _logs


def fuzz_one(data: bytes) -> None:
    if not data:
        return
    selector, buf = data[0], data[1:]
    with contextlib.suppress(*ALLOWED):
        decode_batch(buf, max_output_bytes=MAX_OUTPUT_BYTES)
    try:
        for _ in iter_records(buf, max_output_bytes=MAX_OUTPUT_BYTES):
            pass
    except ALLOWED:
        pass
    with contextlib.suppress(*ALLOWED):
        recompress_batch(buf, selector % 5, max_output_bytes=MAX_OUTPUT_BYTES)
    log = _the_logs().logs[selector % len(CONFIGS)]
    before = (log.log_end_offset, log.size_bytes, log.epochs.latest_epoch)
    try:
        log.append(buf, leader_epoch=3, from_client=bool(selector & 0x80))
    except ALLOWED:
        after = (log.log_end_offset, log.size_bytes, log.epochs.latest_epoch)
        assert after == before, f"a refused append changed the log: {before} -> {after}"


if __name__ == "__main__":
    from tests.fuzz.runner import main

    main(fuzz_one)
