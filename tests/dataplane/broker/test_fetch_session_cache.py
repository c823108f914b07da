"""The fetch session core (KIP-227, dataplane/broker/fetch_sessions.py) as Kafka's
FetchSessionTest states it: contexts by session id and epoch, incremental answers naming only
what changed, forgotten partitions, and the cache's eviction order."""

from __future__ import annotations

import random

import pytest

from dataplane.broker.fetch_sessions import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    FetchSessionCache,
    FullContext,
    IncrementalContext,
    PartitionKey,
    PartitionOutcome,
    PartitionRequest,
    SessionErrorContext,
    SessionlessContext,
    next_epoch,
)
from raftlog.errors import ErrorCode

EVICTION_MS = 1000
Wanted = list[tuple[PartitionKey, PartitionRequest]]


def wanted(*keys: PartitionKey, offset: int = 0) -> Wanted:
    return [(key, PartitionRequest(offset, -1, -1, 1 << 20)) for key in keys]


def quiet(hw: int = 10) -> PartitionOutcome:
    """A partition with nothing new: no records, the same offsets."""
    return PartitionOutcome(0, 0, hw, hw, 0)


def cache(slots: int = 10) -> FetchSessionCache:
    return FetchSessionCache(slots, EVICTION_MS, random.Random(7))


def open_session(c: FetchSessionCache, keys: list[PartitionKey], now_ms: int = 0) -> int:
    context = c.new_context(INVALID_SESSION_ID, INITIAL_EPOCH, wanted(*keys), [], now_ms)
    assert isinstance(context, FullContext)
    return context.respond([quiet() for _ in keys], now_ms).session_id


@pytest.mark.parametrize(
    ("epoch", "after"),
    [(0, 1), (1, 2), (2**31 - 1, 1), (FINAL_EPOCH, FINAL_EPOCH), (-5, FINAL_EPOCH)],
)
def test_next_epoch_wraps_to_one_and_the_final_epoch_stays(epoch: int, after: int) -> None:
    assert next_epoch(epoch) == after


def test_a_full_fetch_opens_a_session_and_answers_every_partition() -> None:
    c = cache()
    keys = [("t", 0), ("t", 1), ("u", 0)]
    context = c.new_context(0, INITIAL_EPOCH, wanted(*keys), [], 0)
    assert isinstance(context, FullContext)
    assert [key for key, _ in context.partitions] == keys
    answer = context.respond([quiet(), quiet(), quiet()], 0)
    assert answer.error is ErrorCode.NONE and answer.included is None
    assert answer.session_id > 0 and len(c) == 1 and c.total_partitions == 3
    session = c.get(answer.session_id)
    assert session is not None and session.epoch == 1


def test_an_incremental_fetch_names_only_changed_partitions() -> None:
    c = cache()
    keys = [("t", 0), ("t", 1), ("t", 2), ("t", 3), ("t", 4), ("t", 5), ("t", 6)]
    session_id = open_session(c, keys)
    context = c.new_context(session_id, 1, [], [], 10)
    assert isinstance(context, IncrementalContext)
    assert [key for key, _ in context.partitions] == keys  # every partition of it is read
    outcomes = [
        quiet(),  # nothing new
        PartitionOutcome(100, 0, 10, 10, 0),  # records
        quiet(hw=11)._replace(last_stable_offset=10),  # the high watermark moved
        PartitionOutcome(0, 6, -1, -1, -1),  # an error (NOT_LEADER_OR_FOLLOWER)
        quiet()._replace(log_start_offset=5),  # log start moved (DeleteRecords, retention)
        quiet()._replace(preferred_read_replica=2),  # KIP-392: read elsewhere
        quiet()._replace(last_stable_offset=9),  # a transaction opened below the high watermark
    ]
    answer = context.respond(outcomes, 10)
    assert answer.error is ErrorCode.NONE and answer.session_id == session_id
    assert answer.included == [False, True, True, True, True, True, True]
    # told once: the next fetch with the same state names none but the erroring partition
    # (its high watermark was forgotten) and the preferred replica (always named)
    again = c.new_context(session_id, 2, [], [], 20)
    assert isinstance(again, IncrementalContext)
    by_key = dict(zip(keys, outcomes, strict=True))
    repeat = [by_key[key]._replace(records_bytes=0) for key, _ in again.partitions]
    included = again.respond(repeat, 20).included
    assert included is not None
    named = {key for (key, _), shown in zip(again.partitions, included, strict=True) if shown}
    assert named == {("t", 3), ("t", 5)}


def test_partitions_that_returned_records_move_to_the_end_of_the_session() -> None:
    c = cache()
    keys = [("t", 0), ("t", 1), ("t", 2)]
    session_id = open_session(c, keys)
    context = c.new_context(session_id, 1, [], [], 1)
    assert isinstance(context, IncrementalContext)
    context.respond([PartitionOutcome(5, 0, 10, 10, 0), quiet(), quiet()], 1)
    nxt = c.new_context(session_id, 2, [], [], 2)
    assert isinstance(nxt, IncrementalContext)
    assert [key for key, _ in nxt.partitions] == [("t", 1), ("t", 2), ("t", 0)]


def test_an_incremental_fetch_adds_updates_and_forgets_partitions() -> None:
    c = cache()
    session_id = open_session(c, [("t", 0), ("t", 1)])
    context = c.new_context(
        session_id, 1, wanted(("t", 0), ("u", 0), offset=42), [("t", 1), ("x", 9)], 5
    )
    assert isinstance(context, IncrementalContext)
    assert [(key, r.fetch_offset) for key, r in context.partitions] == [
        (("t", 0), 42), (("u", 0), 42),
    ]  # fmt: skip
    assert c.total_partitions == 2
    # a new partition is always named the first time (its high watermark is news)
    included = context.respond([quiet(), quiet()], 5).included
    assert included == [False, True]


def test_forgetting_every_partition_closes_the_session() -> None:
    c = cache()
    session_id = open_session(c, [("t", 0)])
    context = c.new_context(session_id, 1, [], [("t", 0)], 5)
    assert isinstance(context, SessionlessContext)
    assert context.partitions == [] and len(c) == 0
    assert c.new_context(session_id, 2, [], [], 6).respond(None, 6).error is (
        ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    )


@pytest.mark.parametrize("epoch", [2, 5, 2**31 - 1])
def test_a_wrong_epoch_is_refused_and_the_session_stays(epoch: int) -> None:
    c = cache()
    session_id = open_session(c, [("t", 0)])
    context = c.new_context(session_id, epoch, wanted(("t", 1)), [], 1)
    assert isinstance(context, SessionErrorContext)
    assert context.partitions == []
    answer = context.respond(None, 1)
    assert (answer.error, answer.session_id, answer.included) == (
        ErrorCode.INVALID_FETCH_SESSION_EPOCH, INVALID_SESSION_ID, [],
    )  # fmt: skip
    session = c.get(session_id)
    assert session is not None and list(session.partitions) == [("t", 0)]  # unchanged
    assert isinstance(c.new_context(session_id, 1, [], [], 2), IncrementalContext)


def test_an_unknown_session_is_not_found() -> None:
    context = cache().new_context(12345, 1, wanted(("t", 0)), [], 0)
    assert isinstance(context, SessionErrorContext)
    assert context.error is ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_a_duplicate_of_an_incremental_fetch_gets_the_epoch_error() -> None:
    """Two fetches at one epoch (a client retry racing its original): the second is refused
    up front; one answered after the session moved on is refused at its answer."""
    c = cache()
    session_id = open_session(c, [("t", 0)])
    first = c.new_context(session_id, 1, [], [], 1)
    assert isinstance(c.new_context(session_id, 1, [], [], 1), SessionErrorContext)
    second = c.new_context(session_id, 2, [], [], 2)  # the client moved on before `first` ended
    assert isinstance(first, IncrementalContext) and isinstance(second, IncrementalContext)
    assert first.respond([quiet()], 3).error is ErrorCode.INVALID_FETCH_SESSION_EPOCH
    assert second.respond([quiet()], 3).error is ErrorCode.NONE


def test_the_final_epoch_closes_the_session_and_opens_none() -> None:
    c = cache()
    session_id = open_session(c, [("t", 0)])
    context = c.new_context(session_id, FINAL_EPOCH, wanted(("t", 0)), [], 1)
    assert isinstance(context, SessionlessContext)
    assert context.respond(None, 1) == (ErrorCode.NONE, INVALID_SESSION_ID, None)
    assert len(c) == 0


def test_a_full_fetch_naming_a_session_replaces_it() -> None:
    c = cache()
    old = open_session(c, [("t", 0)])
    context = c.new_context(old, INITIAL_EPOCH, wanted(("t", 1)), [], 1)
    assert isinstance(context, FullContext) and c.get(old) is None
    new = context.respond([quiet()], 1).session_id
    assert new not in (old, INVALID_SESSION_ID) and len(c) == 1


def test_no_slots_means_no_sessions() -> None:
    c = cache(slots=0)
    assert open_session(c, [("t", 0)]) == INVALID_SESSION_ID and len(c) == 0


def test_eviction_takes_a_stale_session_first() -> None:
    c = cache(slots=2)
    stale = open_session(c, [("t", 0), ("t", 1), ("t", 2)], now_ms=0)
    fresh = open_session(c, [("t", 0), ("t", 1), ("t", 2)], now_ms=500)
    small = open_session(c, [("t", 0)], now_ms=EVICTION_MS + 1)  # `stale` unused for > 1 s
    assert small != INVALID_SESSION_ID and c.evictions == 1
    assert c.get(stale) is None and c.get(fresh) is not None


def test_young_sessions_are_not_evicted_for_a_consumer() -> None:
    c = cache(slots=2)
    open_session(c, [("t", 0)], now_ms=0)
    open_session(c, [("t", 0)], now_ms=10)
    assert open_session(c, [("t", n) for n in range(10)], now_ms=20) == INVALID_SESSION_ID
    assert c.evictions == 0


def test_an_old_session_is_evicted_only_for_one_with_more_partitions() -> None:
    c = cache(slots=2)
    one = open_session(c, [("t", 0)], now_ms=0)
    two = open_session(c, [("t", 0), ("t", 1)], now_ms=0)
    now = EVICTION_MS + 1
    for session_id in (one, two):  # used recently, created long ago: evictable by all
        context = c.new_context(session_id, 1, [], [], now)
        assert isinstance(context, IncrementalContext)
        context.respond([quiet()] * len(context.partitions), now)
    assert open_session(c, [("t", 5)], now_ms=now) == INVALID_SESSION_ID  # 1 is not > 1
    three = open_session(c, [("t", 5), ("t", 6)], now_ms=now)  # 2 > 1: the smallest goes
    assert three != INVALID_SESSION_ID
    assert c.get(one) is None and c.get(two) is not None and c.total_partitions == 4


def test_a_privileged_session_evicts_a_young_consumer_session() -> None:
    c = cache(slots=1)
    consumer = open_session(c, [("t", 0), ("t", 1)], now_ms=0)
    context = c.new_context(0, INITIAL_EPOCH, wanted(("t", 0)), [], 10, privileged=True)
    assert isinstance(context, FullContext)
    follower = context.respond([quiet()], 10).session_id
    assert follower != INVALID_SESSION_ID and c.get(consumer) is None
    # and a young privileged session is not evicted for a consumer's
    assert open_session(c, [("t", n) for n in range(10)], now_ms=20) == INVALID_SESSION_ID


def test_the_cache_never_holds_more_than_its_slots() -> None:
    c = cache(slots=3)
    rng = random.Random(3)
    now = 0
    opened: list[int] = []
    for _ in range(200):
        now += rng.randrange(0, 400)
        opened.append(open_session(c, [("t", n) for n in range(rng.randrange(1, 6))], now))
        live = [s for s in map(c.get, opened) if s is not None]
        assert len(c) == len(live) <= 3
        assert c.total_partitions == sum(len(s.partitions) for s in live)
    assert c.evictions > 0
