"""The share coordinator's pure state (``__share_group_state``): a read bumps the state epoch
(written, so the last leader's writes are fenced), writes keep the last value, tombstones
delete, and a reload replays to the same state; plus Kafka's share key."""

from __future__ import annotations

import uuid

import pytest

from dataplane.coordinator.share_coordinator import (
    NO_START_OFFSET,
    ShareState,
    ShareStateShard,
    share_key,
)
from dataplane.coordinator.share_partition import RecordState, StateBatch
from raftlog.errors import ErrorCode, KafkaError

TOPIC_ID = uuid.UUID("2fd8d9a4-1e2b-4f42-9a36-3b8f0b7c6d11").bytes
KEY = ("queue", TOPIC_ID, 3)


def replayed(shard: ShareStateShard) -> ShareStateShard:
    """A new coordinator's state after loading what ``shard`` wrote."""
    copy = ShareStateShard()
    for key, value in shard.take_emitted():
        copy.replay(key, value)
    return copy


def test_reads_bump_the_state_epoch_and_fence_the_last_leader() -> None:
    shard = ShareStateShard()
    first = shard.read(KEY, leader_epoch=4)
    assert (first.state_epoch, first.start_offset) == (1, NO_START_OFFSET)
    batches = (
        StateBatch(10, 12, RecordState.ARCHIVED, 5),
        StateBatch(13, 13, RecordState.AVAILABLE, 1),
    )
    shard.write(KEY, ShareState(1, 4, 10, batches))
    second = shard.read(KEY, leader_epoch=5)  # a new leader
    assert (second.state_epoch, second.start_offset, second.batches) == (2, 10, batches)
    with pytest.raises(KafkaError) as fenced:
        shard.write(KEY, ShareState(1, 4, 14, ()))
    assert fenced.value.error is ErrorCode.FENCED_STATE_EPOCH
    with pytest.raises(KafkaError) as stale:
        shard.read(KEY, leader_epoch=4)
    assert stale.value.error is ErrorCode.FENCED_LEADER_EPOCH
    shard.write(KEY, ShareState(2, 5, 14, ()))
    assert replayed(shard).states == {KEY: ShareState(2, 5, 14, ())}


def test_a_deleted_group_leaves_tombstones() -> None:
    shard = ShareStateShard()
    shard.read(KEY, 1)
    shard.delete(KEY)
    shard.delete(("never", TOPIC_ID, 0))  # nothing stored: nothing written
    emitted = shard.take_emitted()
    assert [value is None for _, value in emitted] == [False, True]
    assert shard.states == {}


def test_the_share_key_is_kafkas() -> None:
    # Kafka prints a Uuid as URL-safe base64 without padding
    assert share_key(*KEY) == "queue:L9jZpB4rT0KaNjuPC3xtEQ:3"


def test_a_write_after_the_state_was_deleted_is_fenced() -> None:
    """A leader still holding a deleted group's share partition cannot bring its state back."""
    shard = ShareStateShard()
    first = shard.read(KEY, 1)
    shard.delete(KEY)
    with pytest.raises(KafkaError) as fenced:
        shard.write(KEY, ShareState(first.state_epoch, 1, 10, ()))
    assert fenced.value.error is ErrorCode.FENCED_STATE_EPOCH
    assert shard.states == {}
    again = shard.read(KEY, 1)  # its next load starts afresh
    assert again.start_offset == NO_START_OFFSET
