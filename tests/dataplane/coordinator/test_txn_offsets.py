"""Transactional offset commits in the pure group state (KIP-98, KIP-447): pending until the
marker, Kafka's rule between transactional and plain commits, require_stable, deletion and
expiry while pending, the TxnOffsetCommit group checks, and replay of the log they write."""

from __future__ import annotations

import pytest

from dataplane.coordinator import classic_group as cg
from dataplane.coordinator import group_state as gs
from protos import group_pb2 as gpb
from raftlog.errors import ErrorCode, KafkaError

TOPICS = gs.TopicsView({"t": 2, "u": 1})
G = "g"
T0, T1 = ("t", 0), ("t", 1)
PID, OTHER_PID = 7, 8
Entry = tuple[bytes, bytes | None, int]  # key, value, producer id (-1: plain); markers apart
Marker = tuple[int, bool]


class Log:
    """What the coordinator would append, in order: plain records, transactional records (with
    their producer id) and markers, so a fresh shard can replay it."""

    def __init__(self, shard: gs.GroupShard) -> None:
        self.shard = shard
        self.entries: list[Entry | Marker] = []

    def plain(self) -> None:
        for key, value in self.shard.take_emitted():
            self.entries.append((key, value, -1))

    def txn_commit(
        self, producer_id: int, offsets: dict[tuple[str, int], int], now_ms: int = 0
    ) -> dict[tuple[str, int], KafkaError | None]:
        items = [gs.OffsetCommitItem(t, p, o, -1, "") for (t, p), o in offsets.items()]
        records, results = self.shard.txn_commit_records(G, items, now_ms)
        assert self.shard.take_emitted() == []  # appended first, applied after
        for key, value in records:
            self.shard.replay_transactional(key, value, producer_id)
            self.entries.append((key, value, producer_id))
        return results

    def commit(self, offsets: dict[tuple[str, int], int], now_ms: int = 0) -> None:
        items = [gs.OffsetCommitItem(t, p, o, -1, "") for (t, p), o in offsets.items()]
        self.shard.commit(G, items, now_ms)
        self.plain()

    def marker(self, producer_id: int, commit: bool) -> None:
        self.shard.replay_marker(producer_id, commit)
        self.entries.append((producer_id, commit))

    def replayed(self) -> gs.GroupShard:
        fresh = _shard()
        for entry in self.entries:
            if len(entry) == 2:
                producer_id, commit = entry
                fresh.replay_marker(producer_id, commit)
            else:
                key, value, producer_id = entry
                if producer_id == -1:
                    fresh.replay(key, value)
                else:
                    fresh.replay_transactional(key, value, producer_id)
        return fresh


def _shard() -> gs.GroupShard:
    return gs.GroupShard(session_timeout_ms=1000, max_group_size=100, offset_metadata_max_bytes=10)


def _offsets(shard: gs.GroupShard) -> dict[tuple[str, int], int]:
    return {tp: c.offset for tp, c in shard.committed(G, None).items() if c is not None}


def test_pending_until_the_commit_marker() -> None:
    log = Log(_shard())
    assert log.txn_commit(PID, {T0: 5, T1: 9}) == {T0: None, T1: None}
    assert _offsets(log.shard) == {}
    assert log.shard.unstable(G) == {T0, T1}
    assert list(log.shard.group_ids()) == [G]  # a group made of pending offsets exists
    log.marker(PID, commit=True)
    assert _offsets(log.shard) == {T0: 5, T1: 9}
    assert log.shard.unstable(G) == set()
    assert _offsets(log.replayed()) == {T0: 5, T1: 9}


def test_abort_marker_drops_the_pending_offsets() -> None:
    log = Log(_shard())
    log.commit({T0: 3})
    log.txn_commit(PID, {T0: 5, T1: 9})
    log.marker(PID, commit=False)
    assert _offsets(log.shard) == {T0: 3}
    assert log.shard.unstable(G) == set()
    assert _offsets(log.replayed()) == {T0: 3}


def test_producers_are_apart_and_a_marker_ends_only_its_own() -> None:
    log = Log(_shard())
    log.txn_commit(PID, {T0: 5})
    log.txn_commit(OTHER_PID, {T1: 9})
    log.marker(OTHER_PID, commit=True)
    assert _offsets(log.shard) == {T1: 9}
    assert log.shard.unstable(G) == {T0}
    log.marker(PID, commit=False)
    assert _offsets(log.shard) == {T1: 9}
    assert not log.shard.pending.has_open(G)


@pytest.mark.parametrize(
    "plain_after, expected",
    [(False, 5), (True, 4)],
    ids=["transactional-record-later-wins", "plain-record-later-wins"],
)
def test_the_later_record_in_the_log_wins_at_commit(plain_after: bool, expected: int) -> None:
    """Kafka keeps the most recent record when plain and transactional commits mix: a plain
    commit written after the transactional one is not overwritten by its marker."""
    log = Log(_shard())
    if not plain_after:
        log.commit({T0: 4})
    log.txn_commit(PID, {T0: 5})
    if plain_after:
        log.commit({T0: 4})
    log.marker(PID, commit=True)
    assert _offsets(log.shard) == {T0: expected}
    assert _offsets(log.replayed()) == {T0: expected}


def test_a_second_commit_in_one_transaction_replaces_the_first() -> None:
    log = Log(_shard())
    log.txn_commit(PID, {T0: 5})
    log.txn_commit(PID, {T0: 8})
    log.marker(PID, commit=True)
    assert _offsets(log.shard) == {T0: 8}


def test_metadata_too_large_is_refused_per_partition() -> None:
    shard = _shard()
    items = [gs.OffsetCommitItem("t", 0, 1, -1, "x" * 11), gs.OffsetCommitItem("t", 1, 1, -1, "")]
    records, results = shard.txn_commit_records(G, items, 0)
    assert len(records) == 1
    error = results[T0]
    assert error is not None and error.error is ErrorCode.OFFSET_METADATA_TOO_LARGE
    assert results[T1] is None


def test_delete_group_removes_pending_offsets_and_the_marker_finds_none() -> None:
    """Kafka's deleteAllOffsets: tombstones for committed and pending offsets alike."""
    log = Log(_shard())
    log.commit({T0: 3})
    log.txn_commit(PID, {T0: 5, T1: 9})
    log.shard.delete_group(G, 0)
    log.plain()
    assert log.shard.unstable(G) == set()
    assert list(log.shard.group_ids()) == [G]  # its transaction stays open until the marker
    log.marker(PID, commit=True)
    assert _offsets(log.shard) == {}
    assert list(log.shard.group_ids()) == []
    assert _offsets(log.replayed()) == {}


def test_delete_group_of_only_pending_offsets() -> None:
    log = Log(_shard())
    log.txn_commit(PID, {T1: 9})
    log.shard.delete_group(G, 0)  # the group exists through its transaction
    log.plain()
    log.marker(PID, commit=True)
    assert _offsets(log.shard) == {}


def test_expiry_spares_pending_offsets_and_groups_with_open_transactions() -> None:
    log = Log(_shard())
    log.commit({T0: 3, T1: 4}, now_ms=0)
    log.txn_commit(PID, {T0: 5}, now_ms=0)
    expired = log.shard.expire_offsets(10_000, 1_000, TOPICS)
    log.plain()
    assert expired == [(G, T1, "retention")]  # t-0 waits for its marker
    assert _offsets(log.shard) == {T0: 3}
    log.marker(PID, commit=False)
    expired = log.shard.expire_offsets(20_000, 1_000, TOPICS)
    assert expired == [(G, T0, "retention")]


def test_a_group_with_an_open_transaction_is_not_deleted_by_expiry() -> None:
    shard = _shard()
    shard.classic.groups[G] = cg.ClassicGroup(G, empty_since_ms=0)
    shard.replay_transactional(_offset_key(T0), _offset_value(5), PID)
    shard.replay(_offset_key(T0), None)  # a tombstone took the offset, not the transaction
    assert shard.expire_offsets(10_000, 1_000, TOPICS) == []
    assert shard.take_emitted() == []
    shard.replay_marker(PID, commit=True)
    shard.expire_offsets(10_000, 1_000, TOPICS)
    assert shard.take_emitted() == [(gs.record_key(gs.RT.CLASSIC_GROUP_METADATA, G), None)]


def test_pending_offsets_of_a_deleted_topic_are_removed() -> None:
    log = Log(_shard())
    log.txn_commit(PID, {T0: 5, ("gone", 0): 1})
    expired = log.shard.expire_offsets(0, 1_000_000, TOPICS)
    log.plain()
    assert expired == [(G, ("gone", 0), "topic deleted")]
    assert log.shard.unstable(G) == {T0}
    log.marker(PID, commit=True)
    assert _offsets(log.shard) == {T0: 5}


def test_only_offset_commits_may_be_transactional() -> None:
    shard = _shard()
    key = gs.record_key(gs.RT.GROUP_METADATA, G)
    with pytest.raises(AssertionError):
        shard.replay_transactional(key, gpb.GroupMetadataValue(epoch=1).SerializeToString(), PID)


# -- the group checks of a TxnOffsetCommit ---------------------------------------------------------
def _member_group(shard: gs.GroupShard) -> str:
    request = gpb.ConsumerGroupHeartbeatRequest(
        group_id=G, member_epoch=0, rebalance_timeout_ms=5000
    )
    request.subscribed_topic_names.names.append("t")
    result = shard.heartbeat(request, TOPICS, 0)
    return result.member_id


def _classic_group(shard: gs.GroupShard) -> cg.ClassicGroup:
    group = cg.ClassicGroup(G, state=cg.ClassicState.STABLE, generation=3)
    group.members["m1"] = cg.ClassicMember(
        "m1", "inst", "client", "host", 10_000, 10_000, (("range", b""),)
    )
    shard.classic.groups[G] = group
    return group


def _refusal(shard: gs.GroupShard, generation: int, member: str, instance: str | None) -> object:
    try:
        shard.validate_txn_commit(G, generation, member, instance)
    except KafkaError as error:
        return error.error
    return None


def test_txn_commit_checks_without_a_group() -> None:
    shard = _shard()
    assert _refusal(shard, -1, "", None) is None  # a simple group, created by the commit
    assert _refusal(shard, 2, "m", None) is ErrorCode.ILLEGAL_GENERATION
    with pytest.raises(KafkaError) as refused:
        shard.validate_txn_commit("", -1, "", None)
    assert refused.value.error is ErrorCode.INVALID_GROUP_ID


def test_txn_commit_checks_of_a_group_known_by_its_offsets() -> None:
    shard = _shard()
    shard.replay(_offset_key(T0), _offset_value(1))
    assert _refusal(shard, -1, "", None) is None
    assert _refusal(shard, 0, "m", None) is ErrorCode.UNKNOWN_MEMBER_ID


def test_txn_commit_checks_of_a_consumer_group() -> None:
    shard = _shard()
    member = _member_group(shard)
    epoch = shard.groups[G].members[member].member_epoch
    assert _refusal(shard, epoch, member, None) is None
    assert _refusal(shard, epoch + 1, member, None) is ErrorCode.ILLEGAL_GENERATION
    assert _refusal(shard, epoch, "stranger", None) is ErrorCode.UNKNOWN_MEMBER_ID
    assert _refusal(shard, -1, "", None) is ErrorCode.UNKNOWN_MEMBER_ID  # it has members


def test_txn_commit_checks_of_a_classic_group() -> None:
    shard = _shard()
    _classic_group(shard)
    assert _refusal(shard, 3, "m1", "inst") is None
    assert _refusal(shard, 3, "m1", None) is None
    assert _refusal(shard, 2, "m1", None) is ErrorCode.ILLEGAL_GENERATION
    assert _refusal(shard, 3, "m2", None) is ErrorCode.UNKNOWN_MEMBER_ID
    assert _refusal(shard, 3, "m2", "inst") is ErrorCode.FENCED_INSTANCE_ID
    assert _refusal(shard, 3, "m1", "other") is ErrorCode.UNKNOWN_MEMBER_ID
    # No group metadata (KIP-447 absent): a transactional commit needs no empty group.
    assert _refusal(shard, -1, "", None) is None


def _offset_key(tp: tuple[str, int]) -> bytes:
    return gs.record_key(gs.RT.OFFSET_COMMIT, G, topic=tp[0], partition=tp[1])


def _offset_value(offset: int) -> bytes:
    return gpb.OffsetCommitValue(offset=offset, leader_epoch=-1).SerializeToString()
