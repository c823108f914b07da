"""The classic group protocol (JoinGroup/SyncGroup/Heartbeat/LeaveGroup) as a pure state machine
inside a GroupShard: rebalances, generations, timeouts, what is stored and what a reload
restores. Answers to waiting requests are delivered here as the coordinator does, after the
records emitted with them."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from dataplane.coordinator import classic_group as cg
from dataplane.coordinator import consumer_protocol as cp
from dataplane.coordinator import group_state as gs
from protos import group_pb2 as gpb
from raftlog.errors import ErrorCode, KafkaError

GROUP = "g"
SESSION_MS = 10_000
REBALANCE_MS = 30_000


def shard(delay_ms: int = 0) -> gs.GroupShard:
    ids = iter(f"m{n}" for n in range(1, 100))
    state = gs.GroupShard(
        session_timeout_ms=45_000,
        max_group_size=10,
        offset_metadata_max_bytes=4096,
        classic_limits=cg.ClassicLimits(initial_rebalance_delay_ms=delay_ms),
    )
    state.classic.new_member_id = lambda client_id: next(ids)
    return state


def deliver(state: gs.GroupShard) -> None:
    for future, answer in state.take_answers():
        future.set_result(answer)


def join(
    state: gs.GroupShard,
    member_id: str,
    now_ms: int,
    protocols: tuple[tuple[str, bytes], ...] = (("range", cp.encode_subscription(["t"])),),
    instance: str | None = None,
) -> Future[cg.Answer]:
    request = cg.JoinRequest(
        GROUP, member_id, instance, "client", "/127.0.0.1", SESSION_MS, REBALANCE_MS,
        "consumer", protocols, require_known_member_id=True,
    )  # fmt: skip
    future = state.join_group(request, now_ms)
    deliver(state)
    return future


def joined(future: Future[cg.Answer]) -> cg.JoinAnswer:
    assert future.done(), "the JoinGroup is still waiting"
    answer = future.result()
    assert isinstance(answer, cg.JoinAnswer)
    return answer


def new_member(state: gs.GroupShard, now_ms: int) -> str:
    first = joined(join(state, "", now_ms))
    assert first.error is ErrorCode.MEMBER_ID_REQUIRED
    return first.member_id


def sync(
    state: gs.GroupShard, member_id: str, generation: int, assignments: dict[str, bytes], now: int
) -> Future[cg.Answer]:
    request = cg.SyncRequest(GROUP, generation, member_id, None, None, None, assignments)
    future = state.classic.sync(request, now)
    deliver(state)
    return future


def heartbeat_error(state: gs.GroupShard, member_id: str, generation: int, now: int) -> ErrorCode:
    try:
        state.classic.heartbeat(GROUP, generation, member_id, None, now)
    except KafkaError as error:
        return error.error
    return ErrorCode.NONE


def test_two_members_join_sync_and_a_generation_is_stored() -> None:
    state = shard()
    m1 = new_member(state, 0)
    first = joined(join(state, m1, 0))
    assert (first.error, first.generation_id, first.leader) == (ErrorCode.NONE, 1, m1)
    assert [m for m, _, _ in first.members] == [m1]
    m2 = new_member(state, 10)
    waiting = join(state, m2, 10)
    assert not waiting.done(), "m2 waits for m1 to rejoin"
    assert heartbeat_error(state, m1, 1, 20) is ErrorCode.REBALANCE_IN_PROGRESS
    leader = joined(join(state, m1, 30))
    follower = joined(waiting)
    assert leader.generation_id == follower.generation_id == 2
    assert leader.protocol_name == "range" and leader.leader == m1
    assert {m for m, _, _ in leader.members} == {m1, m2} and follower.members == ()
    state.take_emitted()
    follower_sync = sync(state, m2, 2, {}, 40)
    assert not follower_sync.done(), "the follower waits for the leader's assignment"
    plan = {m1: cp.encode_assignment([("t", 0)]), m2: cp.encode_assignment([("t", 1)])}
    leader_sync = sync(state, m1, 2, plan, 50)
    assert leader_sync.result() == cg.SyncAnswer(ErrorCode.NONE, "consumer", "range", plan[m1])
    assert cp.assigned_partitions(follower_sync.result().assignment) == [("t", 1)]  # type: ignore[union-attr]
    assert state.group_state(GROUP) == "Stable"
    (key, value), *_ = state.take_emitted()
    assert gpb.GroupRecordKey.FromString(key).type == gpb.CLASSIC_GROUP_METADATA
    assert value is not None
    stored = gpb.ClassicGroupValue.FromString(value)
    assert (stored.generation, stored.leader, len(stored.members)) == (2, m1, 2)
    assert heartbeat_error(state, m2, 2, 60) is ErrorCode.NONE
    assert heartbeat_error(state, m2, 1, 60) is ErrorCode.ILLEGAL_GENERATION
    assert heartbeat_error(state, "nobody", 2, 60) is ErrorCode.UNKNOWN_MEMBER_ID

    # A new coordinator replays the record: the same generation goes on, commits are checked.
    reloaded = shard()
    reloaded.replay(key, value)
    reloaded.start_sessions(1_000)
    assert reloaded.group_state(GROUP) == "Stable"
    assert heartbeat_error(reloaded, m1, 2, 1_000) is ErrorCode.NONE
    reloaded.validate_commit(GROUP, m2, 2)
    with pytest.raises(KafkaError) as stale:
        reloaded.validate_commit(GROUP, m2, 1)
    assert stale.value.error is ErrorCode.ILLEGAL_GENERATION
    answer = sync(reloaded, m2, 2, {}, 1_000).result()
    assert cp.assigned_partitions(answer.assignment) == [("t", 1)]  # type: ignore[union-attr]


def test_a_silent_member_is_expired_and_the_group_rebalances_without_it() -> None:
    state = shard()
    m1 = new_member(state, 0)
    joined(join(state, m1, 0))
    m2 = new_member(state, 0)
    waiting = join(state, m2, 0)
    joined(join(state, m1, 0))
    joined(waiting)
    sync(state, m1, 2, {}, 0)
    # m1 heartbeats, m2 goes silent: its session ends, m1 is told to rejoin.
    assert heartbeat_error(state, m1, 2, SESSION_MS - 1) is ErrorCode.NONE
    assert state.expire_members(SESSION_MS + 1) == [(GROUP, m2, "session timeout")]
    deliver(state)
    assert heartbeat_error(state, m1, 2, SESSION_MS + 2) is ErrorCode.REBALANCE_IN_PROGRESS
    alone = joined(join(state, m1, SESSION_MS + 3))
    assert alone.generation_id == 3 and [m for m, _, _ in alone.members] == [m1]
    # Then m1 leaves: the group is empty, a new generation, and that is stored.
    state.take_emitted()
    assert state.classic.leave(GROUP, [(m1, None)], SESSION_MS + 4) == [None]
    assert state.group_state(GROUP) == "Empty"
    (_, value), *_ = state.take_emitted()
    assert value is not None and gpb.ClassicGroupValue.FromString(value).generation == 4


def test_a_member_that_does_not_rejoin_in_time_is_dropped_from_the_rebalance() -> None:
    state = shard()
    m1 = new_member(state, 0)
    joined(join(state, m1, 0))
    sync(state, m1, 1, {m1: b""}, 0)
    m2 = new_member(state, 100)
    waiting = join(state, m2, 100)
    for now in range(9_000, REBALANCE_MS, 9_000):  # m1 stays alive but never rejoins
        assert heartbeat_error(state, m1, 1, now) is ErrorCode.REBALANCE_IN_PROGRESS
        assert state.expire_members(now) == []
    state.expire_members(100 + REBALANCE_MS - 1)
    assert not waiting.done()
    removed = state.expire_members(100 + REBALANCE_MS)
    deliver(state)
    assert (GROUP, m1, "rebalance timeout: did not rejoin") in removed
    answer = joined(waiting)
    assert answer.generation_id == 2 and answer.leader == m2


def test_the_initial_rebalance_delay_gathers_a_starting_fleet() -> None:
    state = shard(delay_ms=3_000)
    m1 = new_member(state, 0)
    first = join(state, m1, 0)
    m2 = new_member(state, 1_000)
    second = join(state, m2, 1_000)
    state.expire_members(3_999)
    assert not first.done() and not second.done(), "still inside the delay (extended by m2)"
    state.expire_members(4_000)
    deliver(state)
    assert joined(first).generation_id == joined(second).generation_id == 1


def test_protocols_are_chosen_by_vote_and_must_overlap() -> None:
    state = shard()
    a, b = new_member(state, 0), new_member(state, 0)
    first = join(state, a, 0, (("roundrobin", b""), ("range", b"")))
    second = join(state, b, 0, (("range", b""), ("roundrobin", b"")))
    joined(first)  # a alone completed the first join; b's join starts a rebalance
    again = join(state, a, 0, (("roundrobin", b""), ("range", b"")))
    assert joined(again).protocol_name in {"range", "roundrobin"}
    assert joined(second).protocol_name == joined(again).protocol_name
    c = new_member(state, 0)
    refused = joined(join(state, c, 0, (("sticky", b""),)))
    assert refused.error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL


def test_classic_and_consumer_groups_do_not_share_an_id() -> None:
    state = shard()
    m1 = new_member(state, 0)
    joined(join(state, m1, 0))
    heartbeat = gpb.ConsumerGroupHeartbeatRequest(
        group_id=GROUP, member_epoch=0, rebalance_timeout_ms=1000,
        subscribed_topic_names=gpb.TopicNames(names=["t"]),
    )  # fmt: skip
    with pytest.raises(KafkaError) as refused:
        state.heartbeat(heartbeat, gs.TopicsView({"t": 1}), 0)
    assert refused.value.error is ErrorCode.GROUP_ID_NOT_FOUND
    with pytest.raises(KafkaError) as busy:
        state.delete_group(GROUP, 0)
    assert busy.value.error is ErrorCode.NON_EMPTY_GROUP
    state.classic.leave(GROUP, [(m1, None)], 1)
    state.delete_group(GROUP, 2)
    assert GROUP not in set(state.group_ids())


def test_a_static_member_back_under_a_new_id_fences_its_old_self() -> None:
    state = shard()
    old = joined(join(state, "", 0, instance="i-1"))
    assert old.error is ErrorCode.NONE, "static members need no second join"
    new = joined(join(state, "", 10, instance="i-1"))
    assert new.error is ErrorCode.NONE and new.member_id != old.member_id
    assert heartbeat_error(state, old.member_id, new.generation_id, 20) in {
        ErrorCode.UNKNOWN_MEMBER_ID,
        ErrorCode.FENCED_INSTANCE_ID,
    }


def test_leaving_an_unknown_group_or_by_instance_id() -> None:
    state = shard()
    (refused,) = state.classic.leave("nobody-here", [("m9", None)], 0)
    assert refused is not None and refused.error is ErrorCode.UNKNOWN_MEMBER_ID
    static = joined(join(state, "", 0, instance="i-7"))
    pending = new_member(state, 1)  # MEMBER_ID_REQUIRED: pending, not yet a member
    outcomes = state.classic.leave(GROUP, [("", "i-7"), (pending, None)], 2)
    assert outcomes == [None, None]
    assert static.member_id not in state.classic.groups[GROUP].members
    assert state.group_state(GROUP) == "Empty"
