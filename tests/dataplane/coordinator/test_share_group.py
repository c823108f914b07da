"""Share-group membership (KIP-932) in a ``__consumer_offsets`` shard: join, heartbeat, leave,
session expiry, epochs, fencing, the other group types, deletion, and replay."""

from __future__ import annotations

import pytest

from dataplane.coordinator import classic_group as cg
from dataplane.coordinator import group_state as gs
from dataplane.coordinator import share_group as sg
from protos import group_pb2 as gpb
from raftlog.errors import ErrorCode, KafkaError

TOPICS = gs.TopicsView({"t": 1, "u": 4})
G = "sg"
T0 = frozenset({("t", 0)})


def _shard(max_size: int = 200) -> gs.GroupShard:
    return gs.GroupShard(
        session_timeout_ms=1000,
        max_group_size=100,
        offset_metadata_max_bytes=10,
        share_limits=sg.ShareLimits(session_timeout_ms=1000, max_size=max_size),
    )


def _hb(
    shard: gs.GroupShard,
    member_id: str,
    epoch: int = 0,
    *,
    topics: list[str] | None = None,
    now_ms: int = 0,
    view: gs.TopicsView = TOPICS,
    group_id: str = G,
) -> sg.ShareHeartbeatResult:
    request = gpb.ShareGroupHeartbeatRequest(
        group_id=group_id, member_id=member_id, member_epoch=epoch, client_id="c"
    )
    if topics is not None:
        request.subscribed_topic_names.names.extend(topics)
    elif epoch == 0:
        request.subscribed_topic_names.names.append("t")
    return shard.share_heartbeat(request, view, now_ms)


def _error(call: object) -> ErrorCode:
    assert callable(call)
    with pytest.raises(KafkaError) as raised:
        call()
    return raised.value.error


def test_three_members_one_partition_all_hold_it() -> None:
    shard = _shard()
    a = _hb(shard, "a")
    assert (a.member_epoch, a.assignment) == (1, T0)
    b = _hb(shard, "b")
    c = _hb(shard, "c")
    assert b.assignment == T0 and c.assignment == T0
    group = shard.share.groups[G]
    assert group.epoch == 3 and group.state == "Stable"
    # a catches up with the group epoch, keeps the partition: no assignment sent (unchanged)
    again = _hb(shard, "a", 1)
    assert (again.member_epoch, again.assignment) == (3, None)
    assert {m.assigned for m in group.members.values()} == {T0}


def test_leave_and_rebalance() -> None:
    shard = _shard()
    view = gs.TopicsView({"u": 4})
    results = {m: _hb(shard, m, topics=["u"], view=view) for m in ("a", "b")}
    epoch_a = _hb(shard, "a", results["a"].member_epoch, view=view)
    assert epoch_a.assignment is not None and len(epoch_a.assignment) == 2
    left = _hb(shard, "b", -1, view=view)
    assert (left.member_epoch, left.assignment) == (-1, None)
    after = _hb(shard, "a", epoch_a.member_epoch, view=view)
    assert after.assignment == frozenset(("u", p) for p in range(4))  # b's partitions came to a
    assert set(shard.share.groups[G].members) == {"a"}
    assert shard.share.groups[G].epoch == after.member_epoch


def test_epochs_fence_stale_heartbeats_but_accept_the_previous_one() -> None:
    shard = _shard()
    _hb(shard, "a")
    _hb(shard, "b")
    moved = _hb(shard, "a", 1)  # to epoch 2; its previous epoch is 1
    assert moved.member_epoch == 2
    assert _hb(shard, "a", 1).member_epoch == 2  # the answer got lost: accepted
    assert _error(lambda: _hb(shard, "a", 5)) is ErrorCode.FENCED_MEMBER_EPOCH
    _hb(shard, "c")
    _hb(shard, "a", 2)  # to 3 (previous 2)
    assert _error(lambda: _hb(shard, "a", 1)) is ErrorCode.FENCED_MEMBER_EPOCH
    # back with epoch 0 under the same id: let in, told its assignment
    again = _hb(shard, "a", 0)
    assert again.assignment == T0 and again.member_epoch == 3


@pytest.mark.parametrize(
    ("member_id", "group_id", "epoch", "topics", "code"),
    [
        ("", G, 0, ["t"], ErrorCode.INVALID_REQUEST),  # v1: the client names itself
        ("m", "", 0, ["t"], ErrorCode.INVALID_GROUP_ID),
        ("m", G, 0, [], ErrorCode.INVALID_REQUEST),  # first heartbeat needs topics
        ("m", G, -2, None, ErrorCode.INVALID_REQUEST),
        ("m", G, 3, None, ErrorCode.UNKNOWN_MEMBER_ID),
        ("m", G, -1, None, ErrorCode.GROUP_ID_NOT_FOUND),
    ],
)
def test_invalid_heartbeats(
    member_id: str, group_id: str, epoch: int, topics: list[str] | None, code: ErrorCode
) -> None:
    shard = _shard()
    call = lambda: _hb(shard, member_id, epoch, topics=topics, group_id=group_id)  # noqa: E731
    assert _error(call) is code
    assert shard.take_emitted() == []


def test_unknown_member_leaving_and_a_full_group() -> None:
    shard = _shard(max_size=2)
    _hb(shard, "a")
    _hb(shard, "b")
    assert _error(lambda: _hb(shard, "c")) is ErrorCode.GROUP_MAX_SIZE_REACHED
    assert _hb(shard, "a", 0).member_epoch == 2  # a known member may still rejoin
    assert _error(lambda: _hb(shard, "zz", -1)) is ErrorCode.UNKNOWN_MEMBER_ID


def test_session_expiry_fences_the_member() -> None:
    shard = _shard()
    _hb(shard, "a", now_ms=0)
    _hb(shard, "b", now_ms=500)
    assert shard.share.expire(999, TOPICS.partition_counts) == []
    assert shard.share.expire(1000, TOPICS.partition_counts) == [(G, "a")]
    group = shard.share.groups[G]
    assert set(group.members) == {"b"} and group.epoch == 3
    assert _error(lambda: _hb(shard, "a", 1)) is ErrorCode.UNKNOWN_MEMBER_ID


def test_a_new_topic_partition_count_moves_the_group_epoch() -> None:
    shard = _shard()
    _hb(shard, "a", topics=["later"], view=gs.TopicsView({}))
    assert shard.share.groups[G].members["a"].assigned == frozenset()
    got = _hb(shard, "a", 1, view=gs.TopicsView({"later": 2}))
    assert got.assignment == frozenset({("later", 0), ("later", 1)}) and got.member_epoch == 2


def test_group_types_do_not_mix() -> None:
    shard = _shard()
    _hb(shard, "a")
    consumer = gpb.ConsumerGroupHeartbeatRequest(
        group_id=G, member_epoch=0, rebalance_timeout_ms=5000
    )
    consumer.subscribed_topic_names.names.append("t")
    assert _error(lambda: shard.heartbeat(consumer, TOPICS, 0)) is ErrorCode.GROUP_ID_NOT_FOUND
    join = cg.JoinRequest(
        group_id=G, member_id="", group_instance_id=None, client_id="c", client_host="h",
        session_timeout_ms=10_000, rebalance_timeout_ms=10_000, protocol_type="consumer",
        protocols=(("range", b""),), require_known_member_id=False,
    )  # fmt: skip
    assert _error(lambda: shard.join_group(join, 0)) is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert _error(lambda: shard.validate_commit(G, "a", 1)) is ErrorCode.GROUP_ID_NOT_FOUND
    assert _error(lambda: shard.delete_offsets(G, [], [])) is ErrorCode.GROUP_ID_NOT_FOUND
    # and a consumer group's id is not a share group
    consumer.group_id = "cg"
    shard.heartbeat(consumer, TOPICS, 0)
    assert _error(lambda: _hb(shard, "m", group_id="cg")) is ErrorCode.GROUP_ID_NOT_FOUND
    assert dict((g, shard.group_type(g)) for g in shard.group_ids()) == {
        "cg": "consumer",
        G: "share",
    }
    assert shard.group_state(G) == "Stable"


def test_delete_only_an_empty_group() -> None:
    shard = _shard()
    _hb(shard, "a")
    assert _error(lambda: shard.delete_group(G, 0)) is ErrorCode.NON_EMPTY_GROUP
    _hb(shard, "a", -1)
    assert shard.group_state(G) == "Empty"
    shard.delete_group(G, 0)
    assert G not in shard.share.groups and list(shard.group_ids()) == []


def test_replay_rebuilds_the_same_groups() -> None:
    shard = _shard()
    for member in ("a", "b", "c"):
        _hb(shard, member, topics=["t", "u"])
    _hb(shard, "b", -1)
    _hb(shard, "a", 1)
    records = shard.take_emitted()
    copy = _shard()
    for key, value in records:
        copy.replay(key, value)
    assert copy.share.groups == shard.share.groups
    copy.on_loaded(100)
    assert set(copy.share.session_deadlines) == {(G, "a"), (G, "c")}
    # a leaving member's records are gone once compacted: tombstones for every key it had
    keys = {key for key, value in records if value is None}
    assert gs.record_key(gpb.GroupRecordType.SHARE_MEMBER_METADATA, G, "b") in keys


def test_the_partitions_ever_assigned_are_recorded_and_go_with_the_group() -> None:
    """Kafka's ShareGroupStatePartitionMetadata: where the group may have share state, so
    DeleteGroups can delete it (DeleteShareGroupState) before the group's records."""
    shard = _shard()
    _hb(shard, "a", topics=["t"])
    assert shard.share.groups[G].state_partitions == T0
    _hb(shard, "a", 1, topics=["u"])  # t no longer assigned: its state stays recorded
    u = frozenset(("u", p) for p in range(4))
    assert shard.share.groups[G].state_partitions == T0 | u
    assert _error(lambda: shard.share.deletable(G)) is ErrorCode.NON_EMPTY_GROUP
    _hb(shard, "a", -1)
    assert shard.share.deletable(G) == T0 | u
    copy = _shard()
    for key, value in shard.take_emitted():
        copy.replay(key, value)
    assert copy.share.groups[G].state_partitions == T0 | u
    shard.delete_group(G, 0)
    key = gs.record_key(gpb.GroupRecordType.SHARE_GROUP_STATE_PARTITION_METADATA, G)
    assert (key, None) in shard.take_emitted()
    assert G not in shard.share.groups


def test_empty_groups_without_share_state_expire_after_the_retention() -> None:
    shard = _shard()
    _hb(shard, "a", topics=["missing"], view=gs.TopicsView({}), group_id="bare")  # nothing
    _hb(shard, "a", group_id=G)  # assigned t-0: share state may exist
    _hb(shard, "a", -1, now_ms=1_000, group_id="bare")
    _hb(shard, "a", -1, now_ms=1_000, group_id=G)
    assert shard.share.groups["bare"].empty_since_ms == 1_000
    shard.expire_offsets(1_500, 1_000, TOPICS)
    assert set(shard.share.groups) == {"bare", G}  # not yet
    shard.expire_offsets(2_000, 1_000, TOPICS)
    assert set(shard.share.groups) == {G}  # G stays for DeleteGroups to delete its state
    copy = _shard()
    for key, value in shard.take_emitted():
        copy.replay(key, value)
    assert set(copy.share.groups) == {G} and copy.share.groups[G].empty_since_ms == 1_000
