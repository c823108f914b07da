"""Static membership (KIP-345, ``group.instance.id``) as pure state-machine rules, classic
(JoinGroup/SyncGroup) and KIP-848 (ConsumerGroupHeartbeat) alike: a known instance back under a
new member id takes its old place without a rebalance, its old self is fenced, it keeps its
partitions while away until its session ends, and a reload restores the instance ids."""

from __future__ import annotations

import itertools
from concurrent.futures import Future

import pytest

from dataplane.coordinator import classic_group as cg
from dataplane.coordinator import consumer_protocol as cp
from dataplane.coordinator import group_state as gs
from dataplane.coordinator.topic_partitions import to_topic_partitions
from protos import group_pb2 as gpb
from raftlog.errors import ErrorCode, KafkaError

G = "g"
SESSION_MS = 10_000
REBALANCE_MS = 5_000  # below the session: an absent member outlives a rebalance
SUBSCRIPTION = (("range", cp.encode_subscription(["t"])),)
TOPICS = gs.TopicsView({"t": 4})


def shard() -> gs.GroupShard:
    ids = (f"m{n}" for n in itertools.count(1))
    state = gs.GroupShard(
        session_timeout_ms=SESSION_MS,
        max_group_size=10,
        offset_metadata_max_bytes=4096,
        new_member_id=lambda: next(ids),
        classic_limits=cg.ClassicLimits(initial_rebalance_delay_ms=0),
    )
    state.classic.new_member_id = lambda prefix: f"{prefix}-{next(ids)}"
    return state


def deliver(state: gs.GroupShard) -> None:
    for future, answer in state.take_answers():
        future.set_result(answer)


def reloaded(state: gs.GroupShard) -> gs.GroupShard:
    """A new coordinator's shard: the records replayed (the emitted ones are the log)."""
    fresh = shard()
    for key, value in state.take_emitted():
        fresh.replay(key, value)
    return fresh


# -- classic groups --------------------------------------------------------------------------------
def join(
    state: gs.GroupShard,
    instance: str | None,
    now_ms: int,
    member_id: str = "",
    protocols: tuple[tuple[str, bytes], ...] = SUBSCRIPTION,
    version: int = 5,
) -> Future[cg.Answer]:
    request = cg.JoinRequest(
        G, member_id, instance, "client", "/127.0.0.1", SESSION_MS, REBALANCE_MS, "consumer",
        protocols, require_known_member_id=version >= 4, skip_assignment_allowed=version >= 9,
    )  # fmt: skip
    future = state.join_group(request, now_ms)
    deliver(state)
    return future


def joined(future: Future[cg.Answer]) -> cg.JoinAnswer:
    assert future.done(), "the JoinGroup is still waiting"
    answer = future.result()
    assert isinstance(answer, cg.JoinAnswer)
    return answer


def synced(future: Future[cg.Answer]) -> cg.SyncAnswer:
    assert future.done(), "the SyncGroup is still waiting"
    answer = future.result()
    assert isinstance(answer, cg.SyncAnswer)
    return answer


def sync(
    state: gs.GroupShard,
    member_id: str,
    instance: str | None,
    generation: int,
    now_ms: int,
    assignments: dict[str, bytes] | None = None,
) -> Future[cg.Answer]:
    request = cg.SyncRequest(G, generation, member_id, instance, None, None, assignments or {})
    future = state.classic.sync(request, now_ms)
    deliver(state)
    return future


def error_of(call: object) -> ErrorCode:
    assert callable(call)
    try:
        call()
    except KafkaError as error:
        return error.error
    return ErrorCode.NONE


def stable_pair(
    state: gs.GroupShard, protocols: tuple[tuple[str, bytes], ...] = SUBSCRIPTION
) -> tuple[cg.JoinAnswer, cg.JoinAnswer]:
    """Two static members, i-1 (the leader) and i-2, Stable at generation 2."""
    f1 = join(state, "i-1", 0, protocols=protocols)
    f2 = join(state, "i-2", 0, protocols=protocols)
    # i-1 alone completed generation 1; i-2's join started generation 2 for both
    a1 = joined(join(state, "i-1", 1, member_id=joined(f1).member_id, protocols=protocols))
    a2 = joined(f2)
    assert a1.generation_id == a2.generation_id and a1.leader == a1.member_id
    plan = {a1.member_id: b"p0p1", a2.member_id: b"p2p3"}
    sync(state, a2.member_id, "i-2", a2.generation_id, 2)
    sync(state, a1.member_id, "i-1", a1.generation_id, 2, plan)
    assert state.group_state(G) == "Stable"
    return a1, a2


def test_a_restarted_static_follower_takes_its_place_without_a_rebalance() -> None:
    state = shard()
    leader, follower = stable_pair(state)
    generation = follower.generation_id
    back = joined(join(state, "i-2", 100))
    assert back.error is ErrorCode.NONE
    assert back.member_id != follower.member_id and back.member_id.startswith("i-2-")
    assert back.generation_id == generation and back.leader == leader.member_id
    assert back.members == () and state.group_state(G) == "Stable"
    assert synced(sync(state, back.member_id, "i-2", generation, 101)).assignment == b"p2p3"
    # the other member notices nothing; the old member id is fenced everywhere
    hb = state.classic.heartbeat
    assert error_of(lambda: hb(G, generation, leader.member_id, "i-1", 102)) is ErrorCode.NONE
    old = follower.member_id
    assert error_of(lambda: hb(G, generation, old, "i-2", 102)) is ErrorCode.FENCED_INSTANCE_ID
    assert synced(sync(state, old, "i-2", generation, 103)).error is ErrorCode.FENCED_INSTANCE_ID
    commit = state.validate_commit
    assert error_of(lambda: commit(G, old, generation, "i-2")) is ErrorCode.FENCED_INSTANCE_ID
    assert error_of(lambda: commit(G, back.member_id, generation, "i-2")) is ErrorCode.NONE
    assert error_of(lambda: commit(G, back.member_id, generation, "i-9")) is (
        ErrorCode.UNKNOWN_MEMBER_ID
    )
    # what a new coordinator loads: the new member id, the instance ids, the same generation
    group = reloaded(state).classic.groups[G]
    assert group.generation == generation and group.state is cg.ClassicState.STABLE
    assert {m.member_id: m.group_instance_id for m in group.members.values()} == {
        leader.member_id: "i-1",
        back.member_id: "i-2",
    }
    assert group.members[back.member_id].assignment == b"p2p3"


def test_a_restarted_static_leader_skips_assigning_from_join_group_v9() -> None:
    state = shard()
    leader, _ = stable_pair(state)
    old_style = joined(join(state, "i-1", 100, version=5))
    # before v9: told the previous leader id, so it syncs as a follower
    assert old_style.leader == leader.member_id != old_style.member_id
    assert not old_style.skip_assignment and old_style.members == ()
    group = state.classic.groups[G]
    assert group.leader == old_style.member_id, "the leadership moved to the new member id"
    new_style = joined(join(state, "i-1", 200, version=9))
    assert new_style.skip_assignment
    assert new_style.leader == new_style.member_id
    assert {m for m, _, _ in new_style.members} == set(group.members)
    assert new_style.generation_id == leader.generation_id
    assert state.group_state(G) == "Stable"


def test_a_static_rejoin_that_changes_the_protocol_or_lands_mid_rebalance_rebalances() -> None:
    state = shard()
    both = (("range", b"x"), ("roundrobin", b"y"))
    leader, _ = stable_pair(state, both)
    changed = join(state, "i-2", 100, protocols=(("roundrobin", b"y"),))
    assert not changed.done() and state.group_state(G) == "PreparingRebalance"
    rejoined = joined(join(state, "i-1", 101, member_id=leader.member_id, protocols=both))
    new = joined(changed)
    assert rejoined.generation_id == new.generation_id == leader.generation_id + 1
    assert state.classic.groups[G].protocol_name == "roundrobin"
    # CompletingRebalance: another restart of i-2 means assigning again; the member it
    # replaces, waiting for its assignment, is fenced
    waiting = sync(state, new.member_id, "i-2", new.generation_id, 102)
    assert not waiting.done()
    again = join(state, "i-2", 103, protocols=(("roundrobin", b"y"),))
    assert not again.done() and state.group_state(G) == "PreparingRebalance"
    assert synced(waiting).error is ErrorCode.FENCED_INSTANCE_ID


def test_an_absent_static_member_keeps_its_place_until_its_session_ends() -> None:
    state = shard()
    leader, follower = stable_pair(state)
    # the follower closed (static members send no LeaveGroup); the leader rejoins alone
    rejoin = join(state, "i-1", 100, member_id=leader.member_id)
    assert not rejoin.done(), "the join waits for every member, the absent one too"
    state.expire_members(100 + REBALANCE_MS)
    deliver(state)
    first = joined(rejoin)
    assert {m for m, _, _ in first.members} == {leader.member_id, follower.member_id}
    gen = first.generation_id
    plan = {leader.member_id: b"p0p1", follower.member_id: b"p2p3"}
    sync(state, leader.member_id, "i-1", gen, 100 + REBALANCE_MS, plan)
    assert state.group_state(G) == "Stable"
    assert follower.member_id in state.classic.groups[G].members
    # the follower's session ends: it is removed and the group rebalances without it
    removed = state.expire_members(2 + SESSION_MS)
    deliver(state)
    assert (G, follower.member_id, "session timeout") in removed
    assert state.group_state(G) == "PreparingRebalance"
    beat = state.classic.heartbeat
    code = error_of(lambda: beat(G, gen, leader.member_id, "i-1", 3 + SESSION_MS))
    assert code is ErrorCode.REBALANCE_IN_PROGRESS


def test_leave_group_by_instance_id_removes_a_static_member_at_once() -> None:
    state = shard()
    leader, follower = stable_pair(state)
    outcomes = state.classic.leave(G, [("", "i-2"), ("", "i-9"), ("wrong", "i-1")], 100)
    errors = [None if o is None else o.error for o in outcomes]
    assert errors == [None, ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID]
    assert set(state.classic.groups[G].members) == {leader.member_id}
    assert state.group_state(G) == "PreparingRebalance"
    del follower


# -- KIP-848 groups --------------------------------------------------------------------------------
def hb(
    state: gs.GroupShard,
    member_id: str,
    epoch: int,
    instance: str = "",
    now_ms: int = 0,
    owned: set[tuple[str, int]] | None = None,
) -> gs.HeartbeatResult:
    request = gpb.ConsumerGroupHeartbeatRequest(
        group_id=G, member_id=member_id, member_epoch=epoch, instance_id=instance
    )
    if epoch == 0:
        request.rebalance_timeout_ms = REBALANCE_MS
        request.subscribed_topic_names.names.append("t")
    if owned is not None or epoch == 0:
        request.owned.topics.extend(to_topic_partitions(owned or set()))
    return state.heartbeat(request, TOPICS, now_ms)


def settled(state: gs.GroupShard) -> dict[str, gs.HeartbeatResult]:
    """Static members "a" and "b" sharing topic t's four partitions, Stable."""
    members = {r.member_id: r for r in (hb(state, "", 0, "a"), hb(state, "", 0, "b"))}
    for _ in range(10):
        for member_id, last in list(members.items()):
            members[member_id] = hb(state, member_id, last.member_epoch, owned=set(last.assignment))
    assert state.groups[G].state == "Stable"
    return members


def test_a_static_consumer_away_keeps_its_partitions_and_takes_them_back_unmoved() -> None:
    state = shard()
    members = settled(state)
    a_id, b_id = sorted(members)
    a, b = members[a_id], members[b_id]
    epoch = state.groups[G].epoch
    away = hb(state, a_id, gs.LEAVE_STATIC_EPOCH, "a", now_ms=10)
    assert away == gs.HeartbeatResult(a_id, gs.LEAVE_STATIC_EPOCH, frozenset())
    assert state.groups[G].members[a_id].assigned == a.assignment, "kept while away"
    # b is told nothing new: same epoch, same partitions
    assert hb(state, b_id, b.member_epoch, now_ms=20) == b
    # a duplicate of b (b still live) is refused; a stale heartbeat of a is fenced
    with pytest.raises(KafkaError) as duplicate:
        hb(state, "", 0, "b", now_ms=30)
    assert duplicate.value.error is ErrorCode.UNRELEASED_INSTANCE_ID
    with pytest.raises(KafkaError) as stale:
        hb(state, a_id, a.member_epoch, now_ms=30)
    assert stale.value.error is ErrorCode.FENCED_MEMBER_EPOCH
    # a restarts: a new member id, the same partitions at once, no new group epoch
    back = hb(state, "", 0, "a", now_ms=40)
    assert back.member_id != a_id and back.assignment == a.assignment
    assert back.member_epoch == epoch == state.groups[G].epoch
    assert a_id not in state.groups[G].members
    assert hb(state, b_id, b.member_epoch, now_ms=50) == b
    with pytest.raises(KafkaError) as fenced:
        hb(state, a_id, gs.LEAVE_EPOCH, "a", now_ms=60)
    assert fenced.value.error is ErrorCode.FENCED_INSTANCE_ID
    with pytest.raises(KafkaError) as fenced_beat:
        hb(state, a_id, a.member_epoch, "a", now_ms=60)
    assert fenced_beat.value.error is ErrorCode.FENCED_INSTANCE_ID
    # a new coordinator knows the instance ids
    group = reloaded(state).groups[G]
    assert {m.member_id: m.instance_id for m in group.members.values()} == {
        back.member_id: "a",
        b_id: "b",
    }
    assert group.members[back.member_id].assigned == a.assignment


def test_a_static_consumer_away_past_its_session_is_removed_and_its_partitions_move() -> None:
    state = shard()
    members = settled(state)
    a_id, b_id = sorted(members)
    hb(state, a_id, gs.LEAVE_STATIC_EPOCH, "a", now_ms=10)
    b = hb(state, b_id, members[b_id].member_epoch, now_ms=SESSION_MS)  # b keeps its session
    removed = state.expire_members(10 + SESSION_MS)
    assert removed == [(G, a_id, "session timeout")]
    moved = hb(state, b_id, b.member_epoch, owned=set(b.assignment), now_ms=SESSION_MS + 20)
    assert moved.assignment == {("t", p) for p in range(4)}
    # a comes back later: a new member, dealt partitions by a new assignment
    late = hb(state, "", 0, "a", now_ms=SESSION_MS + 30)
    assert late.member_epoch == state.groups[G].epoch


def test_a_permanent_leave_by_a_static_consumer_and_bad_static_requests() -> None:
    state = shard()
    members = settled(state)
    a_id, b_id = sorted(members)
    epoch = state.groups[G].epoch
    left = hb(state, a_id, gs.LEAVE_EPOCH, "a")
    assert left.member_epoch == gs.LEAVE_EPOCH and a_id not in state.groups[G].members
    assert state.groups[G].epoch == epoch + 1
    with pytest.raises(KafkaError) as unknown:
        hb(state, "x", gs.LEAVE_STATIC_EPOCH, "nobody")
    assert unknown.value.error is ErrorCode.UNKNOWN_MEMBER_ID
    with pytest.raises(KafkaError) as no_instance:
        hb(state, b_id, gs.LEAVE_STATIC_EPOCH)
    assert no_instance.value.error is ErrorCode.INVALID_REQUEST
    with pytest.raises(KafkaError) as too_low:
        hb(state, b_id, -3, "b")
    assert too_low.value.error is ErrorCode.INVALID_REQUEST
