"""The pure group state: KIP-848 reconciliation, fencing, commits, expiry, and replay."""

from __future__ import annotations

import itertools

import pytest

from dataplane.coordinator import group_state as gs
from dataplane.coordinator.topic_partitions import to_topic_partitions
from protos import group_pb2 as gpb
from raftlog.coordinator_key import java_string_hash, partition_for
from raftlog.errors import ErrorCode, KafkaError

TOPICS = gs.TopicsView({"t": 6, "u": 2, "other": 1})
G = "g"


def _shard(**kwargs: int) -> gs.GroupShard:
    ids = (f"m{i}" for i in itertools.count(1))
    params = {"session_timeout_ms": 1000, "max_group_size": 100, "offset_metadata_max_bytes": 10}
    params.update(kwargs)
    return gs.GroupShard(
        session_timeout_ms=params["session_timeout_ms"],
        max_group_size=params["max_group_size"],
        offset_metadata_max_bytes=params["offset_metadata_max_bytes"],
        new_member_id=lambda: next(ids),
    )


def _hb(
    shard: gs.GroupShard,
    member_id: str = "",
    epoch: int = 0,
    *,
    topics: list[str] | None = None,
    regex: str | None = None,
    owned: set[tuple[str, int]] | None = None,
    now_ms: int = 0,
    view: gs.TopicsView = TOPICS,
) -> gs.HeartbeatResult:
    request = gpb.ConsumerGroupHeartbeatRequest(
        group_id=G, member_id=member_id, member_epoch=epoch, rebalance_timeout_ms=5000
    )
    if topics is not None:
        request.subscribed_topic_names.names.extend(topics)
    if regex is not None:
        request.subscribed_topic_regex = regex
    if owned is not None:
        request.owned.topics.extend(to_topic_partitions(owned))
    return shard.heartbeat(request, view, now_ms)


def _join(shard: gs.GroupShard, topics: list[str] | None = None) -> gs.HeartbeatResult:
    return _hb(shard, topics=topics or ["t"], owned=set())


def _settle(shard: gs.GroupShard, members: dict[str, gs.HeartbeatResult]) -> None:
    """Heartbeat every member (reporting what it was given) until nothing changes."""
    for _ in range(20):
        changed = False
        for member_id, last in list(members.items()):
            result = _hb(shard, member_id, last.member_epoch, owned=set(last.assignment))
            changed |= result != last
            members[member_id] = result
        if not changed:
            return
    raise AssertionError("the group did not settle")


def test_three_members_share_six_partitions_exclusively() -> None:
    shard = _shard()
    members = {r.member_id: r for r in (_join(shard) for _ in range(3))}
    _settle(shard, members)
    owned = [tp for r in members.values() for tp in r.assignment]
    assert sorted(owned) == [("t", p) for p in range(6)]
    assert all(len(r.assignment) == 2 for r in members.values())
    group = shard.groups[G]
    assert group.state == "Stable"
    assert {r.member_epoch for r in members.values()} == {group.epoch}


def test_partitions_move_only_after_their_owner_released_them() -> None:
    shard = _shard()
    first = _join(shard)
    first = _hb(shard, first.member_id, first.member_epoch, owned=set())
    assert len(first.assignment) == 6
    second = _join(shard)
    assert second.assignment == frozenset()  # all six still belong to the first member
    # The first member is asked to give three up and keeps its epoch until it did.
    revoking = _hb(shard, first.member_id, first.member_epoch, owned=set(first.assignment))
    assert len(revoking.assignment) == 3 and revoking.member_epoch == first.member_epoch
    assert shard.groups[G].members[first.member_id].state is gs.MemberState.UNREVOKED_PARTITIONS
    waiting = _hb(shard, second.member_id, second.member_epoch, owned=set())
    assert waiting.assignment == frozenset()
    assert shard.groups[G].members[second.member_id].state is gs.MemberState.UNRELEASED_PARTITIONS
    released = _hb(shard, first.member_id, revoking.member_epoch, owned=set(revoking.assignment))
    assert released.member_epoch == shard.groups[G].epoch
    taken = _hb(shard, second.member_id, waiting.member_epoch, owned=set())
    assert len(taken.assignment) == 3
    assert taken.assignment.isdisjoint(released.assignment)


def test_member_epochs_fence_stale_heartbeats_and_commits() -> None:
    shard = _shard()
    member = _join(shard)
    member = _hb(shard, member.member_id, member.member_epoch, owned=set())
    with pytest.raises(KafkaError) as ahead:
        _hb(shard, member.member_id, member.member_epoch + 1, owned=set(member.assignment))
    assert ahead.value.error is ErrorCode.FENCED_MEMBER_EPOCH
    other = _join(shard)  # bumps the group epoch; the first member moves on at its next beat
    _hb(shard, member.member_id, member.member_epoch, owned=set(member.assignment))
    moved = _hb(shard, member.member_id, member.member_epoch, owned=set())
    assert moved.member_epoch > member.member_epoch
    # A lost response: the previous epoch with a subset of the assignment is accepted.
    _hb(shard, member.member_id, member.member_epoch, owned=set(moved.assignment))
    with pytest.raises(KafkaError) as stale:
        shard.validate_commit(G, member.member_id, member.member_epoch - 1)
    assert stale.value.error is ErrorCode.STALE_MEMBER_EPOCH
    with pytest.raises(KafkaError) as unknown:
        _hb(shard, "nobody", 3, owned=set())
    assert unknown.value.error is ErrorCode.UNKNOWN_MEMBER_ID
    assert other.member_id in shard.groups[G].members


def test_commit_rules() -> None:
    shard = _shard()
    with pytest.raises(KafkaError) as missing:
        shard.validate_commit("nope", "m1", 1)
    assert missing.value.error is ErrorCode.GROUP_ID_NOT_FOUND
    shard.validate_commit("simple", "", -1)  # administrative commit to an empty group
    member = _join(shard)
    with pytest.raises(KafkaError) as busy:
        shard.validate_commit(G, "", -1)
    assert busy.value.error is ErrorCode.UNKNOWN_MEMBER_ID
    shard.validate_commit(G, member.member_id, member.member_epoch)
    results = shard.commit(
        G,
        [gs.OffsetCommitItem("t", 0, 5, 1, "ok"), gs.OffsetCommitItem("t", 1, 7, 1, "x" * 11)],
        now_ms=42,
    )
    assert results[("t", 0)] is None
    error = results[("t", 1)]
    assert error is not None and error.error is ErrorCode.OFFSET_METADATA_TOO_LARGE
    assert shard.committed(G, [("t", 0), ("t", 1)]) == {
        ("t", 0): gs.CommittedOffset(5, 1, "ok", 42),
        ("t", 1): None,
    }


def test_session_timeout_removes_a_member_and_frees_its_partitions() -> None:
    shard = _shard(session_timeout_ms=1000)
    members = {r.member_id: r for r in (_join(shard) for _ in range(2))}
    _settle(shard, members)
    dead, alive = sorted(members)
    epoch = shard.groups[G].epoch
    # only the live member keeps beating
    result = _hb(shard, alive, members[alive].member_epoch, owned=set(members[alive].assignment),
                 now_ms=900)  # fmt: skip
    assert shard.expire_members(now_ms=1001) == [(G, dead, "session timeout")]
    assert dead not in shard.groups[G].members and shard.groups[G].epoch == epoch + 1
    result = _hb(shard, alive, result.member_epoch, owned=set(result.assignment), now_ms=1100)
    assert len(result.assignment) == 6


def test_leave_and_regex_and_new_partitions_bump_the_epoch() -> None:
    shard = _shard()
    member = _hb(shard, regex="t|u", owned=set())
    assert {t for t, _ in member.assignment} == {"t", "u"}
    epoch = shard.groups[G].epoch
    grown = gs.TopicsView({"t": 8, "u": 2})
    member = _hb(shard, member.member_id, member.member_epoch, owned=set(member.assignment),
                 view=grown)  # fmt: skip
    assert shard.groups[G].epoch == epoch + 1
    assert len(member.assignment) == 10
    left = _hb(shard, member.member_id, gs.LEAVE_EPOCH)
    assert left.member_epoch == gs.LEAVE_EPOCH
    assert shard.groups[G].state == "Empty"


def test_bad_heartbeats() -> None:
    shard = _shard(max_group_size=1)
    cases = [
        ({"group_id": ""}, ErrorCode.INVALID_GROUP_ID),
        ({"group_id": G, "member_epoch": 0}, ErrorCode.INVALID_REQUEST),
        ({"group_id": G, "member_epoch": 0, "rebalance_timeout_ms": 1,
          "subscribed_topic_regex": "("}, ErrorCode.INVALID_REGULAR_EXPRESSION),
        ({"group_id": G, "member_epoch": 0, "rebalance_timeout_ms": 1, "server_assignor": "x",
          "subscribed_topic_names": {"names": ["t"]}}, ErrorCode.UNSUPPORTED_ASSIGNOR),
    ]  # fmt: skip
    for fields, code in cases:
        with pytest.raises(KafkaError) as refused:
            request = gpb.ConsumerGroupHeartbeatRequest(**fields)  # type: ignore[arg-type]
            shard.heartbeat(request, TOPICS, 0)
        assert refused.value.error is code, fields
    _join(shard)
    with pytest.raises(KafkaError) as full:
        _join(shard)
    assert full.value.error is ErrorCode.GROUP_MAX_SIZE_REACHED


def test_delete_and_expiry() -> None:
    shard = _shard()
    member = _join(shard)
    shard.commit(G, [gs.OffsetCommitItem("t", 0, 1, -1, "")], now_ms=0)
    with pytest.raises(KafkaError) as busy:
        shard.delete_group(G, 0)
    assert busy.value.error is ErrorCode.NON_EMPTY_GROUP
    _hb(shard, member.member_id, gs.LEAVE_EPOCH, now_ms=10)
    # a deleted topic's offsets go at once; the others after the retention since emptying
    shard.commit(G, [gs.OffsetCommitItem("gone", 0, 1, -1, "")], now_ms=10)
    expired = shard.expire_offsets(now_ms=20, retention_ms=100, topics=TOPICS)
    assert expired == [(G, ("gone", 0), "topic deleted")]
    assert shard.expire_offsets(now_ms=109, retention_ms=100, topics=TOPICS) == []
    assert shard.expire_offsets(now_ms=110, retention_ms=100, topics=TOPICS) == [
        (G, ("t", 0), "retention")
    ]
    assert G not in shard.groups  # empty, no offsets, idle past retention: deleted
    with pytest.raises(KafkaError) as gone:
        shard.delete_group(G, 200)
    assert gone.value.error is ErrorCode.GROUP_ID_NOT_FOUND


def _snapshot(shard: gs.GroupShard) -> tuple[object, object]:
    return (
        {g: (x.epoch, x.assignment_epoch, x.partition_counts, x.target, x.members)
         for g, x in shard.groups.items()},
        shard.offsets,
    )  # fmt: skip


def test_replaying_the_log_or_its_compaction_rebuilds_the_same_state() -> None:
    shard = _shard()
    members = {r.member_id: r for r in (_join(shard) for _ in range(3))}
    _settle(shard, members)
    for offset in range(3):
        shard.commit(G, [gs.OffsetCommitItem("t", p, offset, 0, "") for p in range(6)], now_ms=1)
    gone = sorted(members)[0]
    _hb(shard, gone, gs.LEAVE_EPOCH)
    _settle(shard, {m: r for m, r in members.items() if m != gone})
    log = shard.take_emitted()
    replayed = _shard()
    for key, value in log:
        replayed.replay(key, value)
    assert _snapshot(replayed) == _snapshot(shard)
    # compaction keeps each key's last record, in log order, and drops old tombstones
    last = {key: (i, value) for i, (key, value) in enumerate(log)}
    compacted = _shard()
    for key, (_, value) in sorted(last.items(), key=lambda item: item[1][0]):
        if value is not None:
            compacted.replay(key, value)
    assert _snapshot(compacted) == _snapshot(shard)


def test_partition_for_matches_kafka() -> None:
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(2**31)  # Integer.MIN_VALUE
    assert partition_for("polygenelubricants", 50) == 0
    assert all(0 <= partition_for(f"group-{i}", 50) < 50 for i in range(200))


def test_partitions_not_reported_are_not_released() -> None:
    """A member that got partitions but has not reported taking them (owned not sent) still
    holds them: the coordinator must not hand them on (Kafka's null owned partitions)."""
    shard = _shard()
    first = _join(shard)
    first = _hb(shard, first.member_id, first.member_epoch, owned=set())
    assert len(first.assignment) == 6
    second = _join(shard)
    unchanged = _hb(shard, first.member_id, first.member_epoch)  # owned not reported
    assert len(unchanged.assignment) == 3
    assert shard.groups[G].members[first.member_id].state is gs.MemberState.UNREVOKED_PARTITIONS
    assert _hb(shard, second.member_id, second.member_epoch).assignment == frozenset()
