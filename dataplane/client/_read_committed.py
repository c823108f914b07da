"""What a read_committed consumer keeps of a fetch (Kafka's ``Fetcher``/``CompletedFetch``).

A read_committed Fetch stops at the last stable offset and lists the aborted transactions
that overlap the fetched range: (producer id, first offset). The consumer walks the batches in
offset order, keeping the producers whose aborted transaction has started by the end of the
current batch in an *aborted set*: a transactional batch of a producer in the set is dropped,
and that producer's abort marker (a control batch) takes it out again, so its later
transactions are read. Control batches themselves are never returned as records (the decoder
skips them at either isolation level).
"""

from __future__ import annotations

from collections.abc import Iterable

from raftlog.txn import aborted_data_batches

__all__ = ["drop_aborted"]


def drop_aborted(data: bytes, aborted: Iterable[tuple[int, int]]) -> bytes:
    """``data`` (whole RecordBatch v2 batches in offset order) without the batches of aborted
    transactions; ``aborted``: (producer id, first offset) from the fetch response. Returns
    ``data`` itself when nothing is dropped."""
    kept: list[bytes] = []
    start = 0
    pairs = ((first_offset, producer_id) for producer_id, first_offset in aborted)
    for position, header in aborted_data_batches(data, pairs):
        kept.append(data[start:position])  # the run of kept batches before this one
        start = position + header.size_bytes
    if start == 0:
        return data
    kept.append(data[start:])
    return b"".join(kept)
