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

import heapq
from collections.abc import Iterable

from raftlog.batch import HEADER_SIZE, read_header
from raftlog.errors import InvalidRecordError
from raftlog.txn import read_marker

__all__ = ["drop_aborted"]


def _is_abort_marker(data: bytes, position: int) -> bool:
    """Whether the control batch at ``position`` is an abort marker. A control record of
    another type is no marker: Kafka's consumer ignores unknown control types too."""
    try:
        return not read_marker(data, position).commit
    except InvalidRecordError:
        return False


def drop_aborted(data: bytes, aborted: Iterable[tuple[int, int]]) -> bytes:
    """``data`` (whole RecordBatch v2 batches in offset order) without the batches of aborted
    transactions; ``aborted``: (producer id, first offset) from the fetch response. Returns
    ``data`` itself when nothing is dropped."""
    pending = sorted((first_offset, producer_id) for producer_id, first_offset in aborted)
    if not pending:
        return data  # a sorted list is a heap already
    aborting: set[int] = set()
    kept: list[bytes] = []
    start = position = 0
    while len(data) - position >= HEADER_SIZE:
        header = read_header(data, position)
        end = position + header.size_bytes
        if header.producer_id >= 0:
            while pending and pending[0][0] <= header.last_offset:
                aborting.add(heapq.heappop(pending)[1])
            if header.is_control:
                if _is_abort_marker(data, position):
                    aborting.discard(header.producer_id)
            elif header.is_transactional and header.producer_id in aborting:
                kept.append(data[start:position])  # the run of kept batches before this one
                start = end
        position = end
    if start == 0:
        return data
    kept.append(data[start:position])
    return b"".join(kept)
