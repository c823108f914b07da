"""What a share group with ``share.isolation.level=read_committed`` (Kafka 4.1's group config,
KIP-932) may acquire of a read. Pure: bytes and the read's aborted transactions in, offsets out.

A read_committed share fetch reads the log only up to the last stable offset (so an open
transaction's records wait until it ends) and gets the aborted transactions that meet the range
read, (producer id, first offset), as a read_committed consumer's fetch does. The data batches
of those transactions are never delivered: Kafka's share partition acquires nothing of them and
archives their offsets (``ShareFetchUtils``' filter of aborted transactional records), so the
share-partition start offset moves past them as past a control batch. Which batches those are
is the consumer's rule (Kafka's ``CompletedFetch``): walk the batches in offset order, a
producer enters the *aborting* set when its aborted transaction's first offset is reached, its
transactional data batches are dropped while it is in the set, and its abort marker takes it
out again, so its later transactions are read.

With ``read_uncommitted`` (the default, Kafka 4.0's only behaviour) a share fetch reads up to the
high watermark and every data batch is delivered, aborted or not.
"""

from __future__ import annotations

from collections.abc import Iterable

from raftlog.txn import AbortedTxn, aborted_data_batches


def aborted_batches(
    records: bytes | memoryview, aborted: Iterable[AbortedTxn]
) -> list[tuple[int, int]]:
    """(first offset, last offset) of each data batch of ``records`` (whole batches in offset
    order, as a read returns them) that belongs to one of the ``aborted`` transactions."""
    pairs = ((txn.first_offset, txn.producer_id) for txn in aborted)
    return [
        (header.base_offset, header.last_offset)
        for _, header in aborted_data_batches(records, pairs)
    ]
