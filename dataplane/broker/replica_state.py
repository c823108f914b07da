"""The replication arithmetic of a partition leader, as plain functions over plain values.

No locks, clocks or logs here: the caller passes ``now_ms`` and the offsets it read, and gets
back new values. This is Kafka's ``Replica.updateFetchState``, ``Partition.maybeIncrementLeaderHW``,
``getOutOfSyncReplicas`` and ``isFollowerInSync``, kept apart so hypothesis can drive them.

Words: the log end offset (LEO) is the next offset a log will write; the high watermark (HW) is
the first offset not yet replicated to every member of the ISR; a follower's LEO is what it has
asked the leader for (its fetch offset), which proves it holds everything below.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from raftlog.errors import ErrorCode

UNKNOWN_OFFSET = -1


@dataclass(frozen=True, slots=True)
class FollowerState:
    """What the leader knows of one follower. ``log_end_offset`` is -1 until it fetches."""

    broker_id: int
    log_end_offset: int = UNKNOWN_OFFSET
    last_caught_up_ms: int = 0
    # the leader's LEO and the time at the previous fetch (Kafka's lastFetchLeaderLogEndOffset)
    last_fetch_leader_leo: int = UNKNOWN_OFFSET
    last_fetch_ms: int = 0
    # the follower's own log start offset, as its last fetch reported it (DeleteRecords waits
    # for it: Kafka's ``Replica.logStartOffset``)
    log_start_offset: int = UNKNOWN_OFFSET


def after_fetch(
    state: FollowerState,
    fetch_offset: int,
    leader_leo: int,
    now_ms: int,
    log_start_offset: int = UNKNOWN_OFFSET,
) -> FollowerState:
    """The follower fetched from ``fetch_offset`` when the leader's LEO was ``leader_leo``,
    reporting its log start offset ``log_start_offset``.

    It is caught up *now* if it asked for the leader's end; it was caught up at its previous
    fetch if it now asks for at least what the leader had then. The caught-up time never goes back.
    """
    if fetch_offset >= leader_leo:
        caught_up_ms = now_ms
    elif fetch_offset >= state.last_fetch_leader_leo >= 0:
        caught_up_ms = state.last_fetch_ms
    else:
        caught_up_ms = state.last_caught_up_ms
    return FollowerState(
        state.broker_id,
        fetch_offset,
        max(state.last_caught_up_ms, caught_up_ms),
        leader_leo,
        now_ms,
        log_start_offset,
    )


def low_watermark(
    leader_log_start: int,
    followers: Mapping[int, FollowerState],
    replicas: Collection[int],
    alive: Collection[int],
) -> int:
    """The lowest log start offset over the leader and its live followers (Kafka's
    ``lowWatermarkIfLeader``): DeleteRecords is done when it reaches the requested offset.
    A replica on a broker that is not alive does not hold it back; a live one that has not
    reported yet (-1) does."""
    low = leader_log_start
    for broker_id in replicas:
        follower = followers.get(broker_id)
        if follower is not None and broker_id in alive:
            low = min(low, follower.log_start_offset)
    return low


def high_watermark(
    current_hw: int,
    leader_id: int,
    leader_leo: int,
    followers: Mapping[int, FollowerState],
    isr: Collection[int],
) -> int:
    """The minimum LEO over ``isr`` (the leader's own included), never below ``current_hw``.

    A member whose LEO is unknown (it has not fetched from this leader yet) holds the HW where
    it is: a new leader does not advance it until every ISR member reported.
    """
    candidate = leader_leo
    for broker_id in isr:
        if broker_id == leader_id:
            continue
        follower = followers.get(broker_id)
        leo = UNKNOWN_OFFSET if follower is None else follower.log_end_offset
        if leo < 0:
            return current_hw
        candidate = min(candidate, leo)
    return max(current_hw, candidate)


def out_of_sync(
    leader_id: int,
    isr: Collection[int],
    followers: Mapping[int, FollowerState],
    now_ms: int,
    lag_max_ms: int,
) -> set[int]:
    """ISR members that have not been caught up for longer than ``replica.lag.time.max.ms``."""
    lagging = set()
    for broker_id in isr:
        if broker_id == leader_id:
            continue
        follower = followers.get(broker_id)
        if follower is None or now_ms - follower.last_caught_up_ms > lag_max_ms:
            lagging.add(broker_id)
    return lagging


def may_join_isr(
    follower: FollowerState, isr: Collection[int], high_watermark: int, epoch_start_offset: int
) -> bool:
    """A replica outside the ISR rejoins once it holds everything up to the HW and everything
    this leader wrote before its own epoch began (Kafka's ``isFollowerInSync``)."""
    return (
        follower.broker_id not in isr
        and follower.log_end_offset >= high_watermark
        and follower.log_end_offset >= epoch_start_offset
    )


def acks_all_outcome(
    required_offset: int, high_watermark: int, isr_size: int, min_insync_replicas: int
) -> ErrorCode | None:
    """For acks=all: None while the HW is below ``required_offset``; then NONE, or
    NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR shrank below ``min.insync.replicas`` meanwhile."""
    if high_watermark < required_offset:
        return None
    if isr_size >= min_insync_replicas:
        return ErrorCode.NONE
    return ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
