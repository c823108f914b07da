"""Batches and a manual clock for the storage tests."""

from __future__ import annotations

from collections.abc import Sequence

from raftlog.batch import Compression
from raftlog.records import Record, encode_batch

BASE_TIMESTAMP_MS = 1_700_000_000_000


class ManualClock:
    """An injected clock the test moves by hand."""

    def __init__(self, now_ms: int = BASE_TIMESTAMP_MS) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


def make_batch(
    values: Sequence[bytes | None],
    *,
    keys: Sequence[bytes | None] | None = None,
    timestamp_ms: int = BASE_TIMESTAMP_MS,
    compression: Compression = Compression.NONE,
) -> bytes:
    keys = keys if keys is not None else [None] * len(values)
    records = [
        Record(offset=-1, timestamp=timestamp_ms + n, key=key, value=value)
        for n, (key, value) in enumerate(zip(keys, values, strict=True))
    ]
    return encode_batch(records, compression=compression)


def values_of(n: int, size: int = 100, tag: str = "v") -> list[bytes]:
    return [f"{tag}{i:08d}".encode().ljust(size, b".") for i in range(n)]
