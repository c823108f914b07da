"""Kafka's murmur2 of a whole Arrow column of keys at once: the write path's partitioner.

A write task sends each keyed row to ``positive(murmur2(key)) % partitions``, as every Kafka
producer does (``dataplane.client.partitioner``). Hashed one row at a time in Python that was
~13% of a task's sending thread; here it is a handful of NumPy operations per 4-byte word of the
longest key, over every row of the Arrow batch, reading the column's buffers without a copy.
Byte for byte the same as :func:`dataplane.client.partitioner.murmur2` (a property test holds
the two together).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_SEED = np.uint32(0x9747B28C)
_M = np.uint32(0x5BD1E995)
_POSITIVE = np.uint32(0x7FFFFFFF)
_OFFSET_TYPES = {
    pa.binary(): np.int32,
    pa.string(): np.int32,
    pa.large_binary(): np.int64,
    pa.large_string(): np.int64,
}


def positive_murmur2(keys: pa.Array) -> np.ndarray:
    """``to_positive(murmur2(key))`` of every key of a binary or string column (UTF-8 bytes),
    as uint32; a null key's entry is meaningless (the caller checks ``keys.is_null()``)."""
    offset_type = _OFFSET_TYPES.get(keys.type)
    if offset_type is None:
        raise TypeError(f"keys must be binary or string, not {keys.type}")
    rows = len(keys)
    _, offsets_buffer, data_buffer = keys.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=offset_type, count=keys.offset + rows + 1)
    offsets = offsets[keys.offset :].astype(np.int64)
    data = (
        np.frombuffer(data_buffer, dtype=np.uint8)
        if data_buffer is not None
        else np.zeros(0, np.uint8)
    )
    starts, lengths = offsets[:-1], np.diff(offsets)
    with np.errstate(over="ignore"):  # uint32 arithmetic wraps, as Java's int does
        h = _SEED ^ lengths.astype(np.uint32)
        words = lengths // 4
        for index in range(int(words.max(initial=0))):
            has = np.nonzero(words > index)[0]
            at = starts[has] + 4 * index
            k = (
                data[at].astype(np.uint32)
                | (data[at + 1].astype(np.uint32) << 8)
                | (data[at + 2].astype(np.uint32) << 16)
                | (data[at + 3].astype(np.uint32) << 24)
            )
            k *= _M
            k ^= k >> 24
            k *= _M
            h[has] = (h[has] * _M) ^ k
        extra = lengths & 3
        tail = starts + (lengths - extra)
        for byte, shift in ((2, 16), (1, 8), (0, 0)):
            has = np.nonzero(extra > byte)[0]
            h[has] ^= data[tail[has] + byte].astype(np.uint32) << shift
        has = np.nonzero(extra > 0)[0]
        h[has] *= _M
        h ^= h >> 13
        h *= _M
        h ^= h >> 15
    return h & _POSITIVE
