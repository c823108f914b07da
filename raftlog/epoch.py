"""The leader-epoch cache: (epoch → first offset written in that epoch), checkpointed to disk.

Followers ask the leader for ``end_offset_for_epoch(their last epoch)`` and truncate to it, which
is how a replica that missed a leader change finds where its log diverged (Kafka KIP-101/279).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from raftlog.checkpoint import fsync_path, read_checkpoint, write_checkpoint

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1
CHECKPOINT_NAME = "leader-epoch-checkpoint"


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


class LeaderEpochCache:
    """Entries strictly increasing in both epoch and start offset."""

    def __init__(self, directory: Path, *, load: bool = True) -> None:
        """Load the checkpoint (StorageError if it is malformed) unless ``load`` is False."""
        self._path = directory / CHECKPOINT_NAME
        loaded = (read_checkpoint(self._path, fields=2) or []) if load else []
        self._entries = [EpochEntry(epoch, offset) for epoch, offset in loaded]
        self.unsynced = False  # an assign's write waits for `sync_file` (the log's flush)

    def rebuild(self, batches: Iterable[tuple[int, int]]) -> None:
        """Rebuild from (partition leader epoch, base offset) of every batch, oldest first."""
        self._entries = []
        for epoch, base_offset in batches:
            if epoch > self.latest_epoch:
                self._entries.append(EpochEntry(epoch, base_offset))
        self._flush()

    def rebuild_from(self, start_offset: int, batches: Iterable[tuple[int, int]]) -> None:
        """Replace the entries from ``start_offset`` on with those of (partition leader epoch,
        base offset) of the batches from there, oldest first. After an unclean start the
        recovered batches are the truth: the checkpoint may describe batches a power cut took
        back (a follower's truncation undone). Entries equal to the checkpoint's are not written
        again (each partition of a broker that was killed comes through here). Written, not
        fsynced (Kafka's loader truncates its cache with ``truncateFromEndAsyncFlush``): the
        log fsyncs it (`sync_file`) before it moves its recovery point past the recovered
        batches; until then a power cut leaves them to be recovered, and this derived, again.
        A killed broker's empty partitions, whose leader epoch started at an empty log, so
        cost no fsync here."""
        before = list(self._entries)
        self._entries = [entry for entry in self._entries if entry.start_offset < start_offset]
        for epoch, base_offset in batches:
            if epoch > self.latest_epoch:
                self._entries.append(EpochEntry(epoch, base_offset))
        if self._entries != before:
            self._flush(durable=False)

    @property
    def entries(self) -> tuple[EpochEntry, ...]:
        return tuple(self._entries)

    @property
    def latest_epoch(self) -> int:
        return self._entries[-1].epoch if self._entries else UNDEFINED_EPOCH

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch the record at ``offset`` was written in."""
        n = bisect.bisect_right([entry.start_offset for entry in self._entries], offset) - 1
        return self._entries[n].epoch if n >= 0 else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset`` (a no-op unless the epoch is new).

        Written, not fsynced (Kafka's KAFKA-15046: an fsync per leader change, on every
        partition a broker leads, stalled it 100-400 ms under writeback; here it was two of
        the few fsyncs a new partition cost). The log's ``flush`` calls `sync_file` after the
        records it makes durable and before it returns, so before the recovery point passes
        them; a new epoch whose records a power cut left beyond the recovery point is rebuilt
        from their batches when the log recovers them. Truncations
        stay durable at once (they must not be undone under later epochs)."""
        if epoch < 0 or epoch <= self.latest_epoch:
            return
        # A new epoch can start below an older one's start only after a truncation we missed;
        # drop the entries it supersedes so both columns stay increasing.
        self._entries = [entry for entry in self._entries if entry.start_offset < start_offset]
        self._entries.append(EpochEntry(epoch, start_offset))
        self._flush(durable=False)

    def sync_file(self) -> bool:
        """fsync the last assign's write; True if there was one: its name (a rename) is
        durable once the caller fsyncs the directory."""
        if not self.unsynced:
            return False
        fsync_path(self._path)
        self.unsynced = False
        return True

    def end_offset_for_epoch(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(largest epoch <= ``epoch``, the offset where the next higher epoch starts), as
        Kafka's ``LeaderEpochFileCache.endOffsetFor``: the follower truncates to that offset."""
        if epoch == UNDEFINED_EPOCH or not self._entries:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if epoch == self.latest_epoch:
            return epoch, log_end_offset
        epochs = [entry.epoch for entry in self._entries]
        higher = bisect.bisect_right(epochs, epoch)
        if higher == len(epochs):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if higher == 0:
            return epoch, self._entries[0].start_offset
        return self._entries[higher - 1].epoch, self._entries[higher].start_offset

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs starting at or after ``end_offset`` (the log was truncated there)."""
        kept = [entry for entry in self._entries if entry.start_offset < end_offset]
        if kept != self._entries:
            self._entries = kept
            self._flush()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at ``start_offset``: drop epochs wholly below it, and move the start
        of the epoch that covers it up to it."""
        covering = [entry for entry in self._entries if entry.start_offset <= start_offset]
        later = [entry for entry in self._entries if entry.start_offset > start_offset]
        kept = ([EpochEntry(covering[-1].epoch, start_offset)] if covering else []) + later
        if kept != self._entries:
            self._entries = kept
            self._flush()

    def clear(self) -> None:
        self._entries = []
        self._flush()

    def _flush(self, *, durable: bool = True) -> None:
        write_checkpoint(self._path, [tuple(entry) for entry in self._entries], durable=durable)
        self.unsynced = not durable  # a durable write holds every entry before it too
