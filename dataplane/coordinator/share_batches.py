"""State batches merged (Kafka's ``PersisterStateBatchCombiner``): the share coordinator's
arithmetic over the runs of offsets (:class:`~dataplane.coordinator.share_partition.StateBatch`)
that make up a share partition's stored state. Pure.

A stored state is a start offset and sorted, disjoint runs; an update is a new start offset and
runs that replace the states of their offsets. :func:`merged` lays the updates written since a
snapshot over it, in order, as a reader does after a restart and as the coordinator does when it
writes the next snapshot. Each run is placed by bisection and the runs it covers are replaced in
one slice, so an update costs O(its runs + log runs) plus the slice's move, never a walk of the
offsets; an offset range is never expanded, whatever its length.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import replace

from dataplane.coordinator.share_partition import StateBatch

UNCHANGED = -1  # an update's start offset that leaves the start where it was (Kafka's -1)


def _first(batch: StateBatch) -> int:
    return batch.first_offset


def _last(batch: StateBatch) -> int:
    return batch.last_offset


def overlay(runs: list[StateBatch], batch: StateBatch) -> None:
    """Give ``batch``'s offsets its state in ``runs`` (sorted, disjoint; kept so): the runs it
    covers go, the ones it cuts keep their other part."""
    first, last = batch.first_offset, batch.last_offset
    low = bisect_left(runs, first, key=_first)  # the first run starting at or after ``first``
    if low > 0 and runs[low - 1].last_offset >= first:
        low -= 1  # the run ``first`` falls in
    high = bisect_right(runs, last, key=_first)  # past the last run starting at or before ``last``
    pieces = []
    if low < high and runs[low].first_offset < first:
        pieces.append(replace(runs[low], last_offset=first - 1))
    pieces.append(batch)
    if low < high and runs[high - 1].last_offset > last:
        pieces.append(replace(runs[high - 1], first_offset=last + 1))
    runs[low:high] = pieces


def trim(runs: list[StateBatch], start_offset: int) -> None:
    """Drop the offsets of ``runs`` below ``start_offset`` (they are done with)."""
    gone = bisect_left(runs, start_offset, key=_last)  # the runs ending below the start
    del runs[:gone]
    if runs and runs[0].first_offset < start_offset:
        runs[0] = replace(runs[0], first_offset=start_offset)


def coalesced(runs: Iterable[StateBatch]) -> tuple[StateBatch, ...]:
    """Adjacent runs of one state and delivery count joined."""
    out: list[StateBatch] = []
    for run in runs:
        last = out[-1] if out else None
        if (
            last is not None
            and last.last_offset + 1 == run.first_offset
            and (last.state, last.delivery_count) == (run.state, run.delivery_count)
        ):
            out[-1] = replace(last, last_offset=run.last_offset)
        else:
            out.append(run)
    return tuple(out)


def merged(
    start_offset: int,
    batches: Iterable[StateBatch],
    updates: Iterable[tuple[int, Iterable[StateBatch]]],
) -> tuple[int, tuple[StateBatch, ...]]:
    """A snapshot (start offset, runs) with the updates (start offset or :data:`UNCHANGED`,
    runs) laid over it in order: the start offset and runs that result."""
    runs: list[StateBatch] = []
    for batch in batches:
        overlay(runs, batch)
    trim(runs, start_offset)
    for update_start, update_batches in updates:
        for batch in update_batches:
            overlay(runs, batch)
        if update_start != UNCHANGED:
            start_offset = update_start
        trim(runs, start_offset)
    return start_offset, coalesced(runs)
