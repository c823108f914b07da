"""Idempotent producer state of one partition: per producer id, its epoch and the sequence
ranges and offsets of its last five batches (Kafka's ``ProducerStateManager``).

Pure: it sees batch headers, never records or files. A leader calls :meth:`check` before it
appends a batch that carries a producer id, and :meth:`update` after; a follower only updates.
After a truncation, or when a replica opens its log, the state is rebuilt from the headers
still in the log, so a new leader knows every batch its predecessor acknowledged.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from raftlog.batch import NO_PRODUCER_ID, BatchHeader
from raftlog.errors import ErrorCode, KafkaError

BATCHES_KEPT = 5  # Kafka's NUM_BATCHES_TO_RETAIN: max.in.flight.requests.per.connection
SEQUENCE_MAX = 2**31 - 1


def next_sequence(sequence: int, count: int = 1) -> int:
    """Sequences wrap from Integer.MAX_VALUE to 0, as Kafka's."""
    return (sequence + count) % (SEQUENCE_MAX + 1)


@dataclass(frozen=True, slots=True)
class BatchRange:
    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    producer_epoch: int
    batches: deque[BatchRange] = field(default_factory=lambda: deque(maxlen=BATCHES_KEPT))


def _range(header: BatchHeader) -> BatchRange:
    return BatchRange(
        header.base_sequence,
        next_sequence(header.base_sequence, header.last_offset_delta),
        header.base_offset,
        header.base_offset + header.last_offset_delta,
        header.max_timestamp,
    )


class ProducerStates:
    def __init__(self) -> None:
        self._producers: dict[int, ProducerEntry] = {}

    def __len__(self) -> int:
        return len(self._producers)

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def check(self, header: BatchHeader) -> BatchRange | None:
        """Validate a batch the leader is about to append. Returns the stored range when the
        batch is a retry of one of the last five (answer with its original offsets, append
        nothing); None when it is the next in sequence; raises INVALID_PRODUCER_EPOCH for a
        fenced epoch, OUT_OF_ORDER_SEQUENCE_NUMBER for a gap."""
        if header.producer_id == NO_PRODUCER_ID:
            return None
        entry = self._producers.get(header.producer_id)
        if entry is None:
            # The producer's first batch here must start its sequence: a later batch that
            # overtook it (concurrent requests arrive in any order) waits for it.
            if header.base_sequence != 0:
                raise _out_of_order(header, expected=0)
            return None
        if header.producer_epoch < entry.producer_epoch:
            raise KafkaError(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"producer {header.producer_id} epoch {header.producer_epoch} is older than "
                f"{entry.producer_epoch}",
            )
        if header.producer_epoch > entry.producer_epoch:
            if header.base_sequence != 0:
                raise _out_of_order(header, expected=0)
            return None
        last = _range(header)
        for stored in entry.batches:
            if (stored.first_sequence, stored.last_sequence) == (
                last.first_sequence,
                last.last_sequence,
            ):
                return stored
        expected = next_sequence(entry.batches[-1].last_sequence) if entry.batches else None
        if expected is not None and header.base_sequence != expected:
            raise _out_of_order(header, expected)
        return None

    def update(self, header: BatchHeader) -> None:
        """Record a batch now in the log (its header carries its offsets)."""
        if header.producer_id == NO_PRODUCER_ID:
            return
        entry = self._producers.get(header.producer_id)
        if entry is None or header.producer_epoch != entry.producer_epoch:
            entry = ProducerEntry(header.producer_epoch)
            self._producers[header.producer_id] = entry
        entry.batches.append(_range(header))

    def rebuild(self, headers: Iterable[BatchHeader]) -> None:
        self._producers.clear()
        for header in headers:
            self.update(header)


def _out_of_order(header: BatchHeader, expected: int) -> KafkaError:
    return KafkaError(
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
        f"producer {header.producer_id} epoch {header.producer_epoch}: sequence "
        f"{header.base_sequence}, expected {expected}",
    )
