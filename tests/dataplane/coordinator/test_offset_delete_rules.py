"""OffsetDelete's rules on a group shard (Kafka's ``OffsetMetadataManager.deleteOffsets`` and
the groups' ``validateOffsetDelete``), and commits stored whatever their offset."""

from __future__ import annotations

import pytest

from dataplane.coordinator import classic_group as cg
from dataplane.coordinator import group_state as gs
from protos import group_pb2 as gpb
from raftlog.errors import ErrorCode, KafkaError

TOPICS = ["t", "u"]


def _shard() -> gs.GroupShard:
    return gs.GroupShard(session_timeout_ms=10_000, max_group_size=10, offset_metadata_max_bytes=10)


def _commit(shard: gs.GroupShard, group_id: str, *offsets: tuple[str, int, int]) -> None:
    items = [gs.OffsetCommitItem(t, p, o, -1, "") for t, p, o in offsets]
    assert set(shard.commit(group_id, items, now_ms=1).values()) == {None}


def _codes(results: dict[tuple[str, int], KafkaError | None]) -> dict[tuple[str, int], str]:
    return {tp: "NONE" if e is None else e.error.name for tp, e in results.items()}


def test_offsets_of_any_value_are_stored() -> None:
    shard = _shard()
    _commit(shard, "g", ("t", 0, 10_000_000), ("t", 1, -1))  # past any end; Kafka's -1
    committed = shard.committed("g", [("t", 0), ("t", 1)])
    assert {tp: c.offset for tp, c in committed.items() if c} == {("t", 0): 10_000_000,
                                                                 ("t", 1): -1}  # fmt: skip


def test_an_unknown_group_is_not_found() -> None:
    with pytest.raises(KafkaError) as missing:
        _shard().delete_offsets("nobody", [("t", 0)], TOPICS)
    assert missing.value.error is ErrorCode.GROUP_ID_NOT_FOUND


def test_an_empty_group_loses_the_offsets_named_only() -> None:
    shard = _shard()
    _commit(shard, "g", ("t", 0, 5), ("t", 1, 6), ("u", 0, 7))
    results = shard.delete_offsets("g", [("t", 0), ("u", 1)], TOPICS)
    assert _codes(results) == {("t", 0): "NONE", ("u", 1): "NONE"}  # none stored: no error
    assert set(shard.committed("g", None)) == {("t", 1), ("u", 0)}
    emitted = shard.take_emitted()
    assert [value for _, value in emitted][-1] is None  # one tombstone, replicated as such
    assert len([v for _, v in emitted if v is None]) == 1


def test_a_consumer_group_keeps_the_offsets_of_subscribed_topics() -> None:
    shard = _shard()
    heartbeat = gpb.ConsumerGroupHeartbeatRequest(
        group_id="g", member_id="", member_epoch=0, rebalance_timeout_ms=5000
    )
    heartbeat.subscribed_topic_names.names.append("t")
    shard.heartbeat(heartbeat, gs.TopicsView({"t": 2, "u": 1}), 0)
    _commit(shard, "g", ("t", 0, 5), ("u", 0, 7))
    results = shard.delete_offsets("g", [("t", 0), ("u", 0)], TOPICS)
    assert _codes(results) == {("t", 0): "GROUP_SUBSCRIBED_TO_TOPIC", ("u", 0): "NONE"}
    assert set(shard.committed("g", None)) == {("t", 0)}


def _join(shard: gs.GroupShard, protocol_type: str, metadata: bytes) -> None:
    request = cg.JoinRequest(
        group_id="c", member_id="", group_instance_id=None, client_id="x", client_host="/h",
        session_timeout_ms=10_000, rebalance_timeout_ms=10_000, protocol_type=protocol_type,
        protocols=(("range", metadata),), require_known_member_id=False,
    )  # fmt: skip
    shard.join_group(request, 0)


def test_a_classic_group_of_another_protocol_with_members_is_not_empty() -> None:
    shard = _shard()
    _join(shard, "connect", b"\x00")
    _commit(shard, "c", ("t", 0, 5))
    with pytest.raises(KafkaError) as busy:
        shard.delete_offsets("c", [("t", 0)], TOPICS)
    assert busy.value.error is ErrorCode.NON_EMPTY_GROUP
    assert set(shard.committed("c", None)) == {("t", 0)}
