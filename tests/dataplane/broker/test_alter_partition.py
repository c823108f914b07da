"""The leader's ISR changes on their way to the controller, without processes: which refusals
wait for the metadata, the one-change-per-partition queue, and a real partition replica (a log
on disk) that must not propose against a partition epoch it already heard is stale."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from dataplane.broker.alter_partition import PendingChanges, Refusal, refusal
from dataplane.broker.partition import ISR_RETRY_BACKOFF_MS, IsrChange, Partition
from metadata_quorum.image import PartitionRegistration
from raftlog.errors import ErrorCode
from raftlog.log import Log

TOPIC_ID = uuid.UUID(int=32)


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (ErrorCode.INVALID_UPDATE_VERSION, Refusal.AWAIT_METADATA),
        (ErrorCode.FENCED_LEADER_EPOCH, Refusal.AWAIT_METADATA),
        (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, Refusal.AWAIT_METADATA),
        (ErrorCode.UNKNOWN_TOPIC_ID, Refusal.AWAIT_METADATA),
        (ErrorCode.INVALID_REQUEST, Refusal.AWAIT_METADATA),
        (ErrorCode.NEW_LEADER_ELECTED, Refusal.AWAIT_METADATA),
        (ErrorCode.NOT_LEADER_OR_FOLLOWER, Refusal.AWAIT_METADATA),
        (ErrorCode.OPERATION_NOT_ATTEMPTED, Refusal.RESET),
        (ErrorCode.INELIGIBLE_REPLICA, Refusal.RESET),
        (ErrorCode.STALE_BROKER_EPOCH, Refusal.RESET),
    ],
)
def test_what_a_refusal_means_to_the_leader(error: ErrorCode, outcome: Refusal) -> None:
    assert refusal(error) is outcome


def test_one_change_per_partition_is_on_its_way_until_answered() -> None:
    changes: PendingChanges[str, object] = PendingChanges()
    first, second, other = object(), object(), object()
    assert changes.submit("t-0", first)
    assert not changes.submit("t-0", second), "a duplicate while one is unsent"
    assert changes.submit("t-1", other)
    assert changes.take(10, timeout_s=0) == [("t-0", first), ("t-1", other)]
    assert changes.take(1, timeout_s=0) == [("t-0", first)], "batches are bounded"
    assert not changes.submit("t-0", second), "a duplicate while one is in flight"
    changes.done("t-0", second)  # not the queued one: nothing leaves
    assert len(changes) == 2
    changes.done("t-0", first)
    assert changes.take(10, timeout_s=0) == [("t-1", other)]
    assert changes.submit("t-0", second)
    changes.done("t-0", second)
    changes.done("t-1", other)
    assert changes.take(10, timeout_s=0.01) == []


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


def leader_of_1_and_2(tmp_path: Path, clock: Clock, partition_epoch: int) -> Partition:
    log = Log(tmp_path / "t-0", topic_id=TOPIC_ID, clock=clock)
    leader = Partition("t", 0, TOPIC_ID, log, 1, clock)
    leader.make_leader(PartitionRegistration((1, 2), (1,), 1, 0, partition_epoch))
    return leader


def fetch_by_2(leader: Partition) -> IsrChange | None:
    """Broker 2 fetches the (empty) log's end: caught up, it may join the ISR."""
    _, change = leader.read_for_follower(2, 0, -1, 0, 1 << 20)
    return change


def test_a_stale_partition_epoch_waits_for_the_metadata_not_for_a_timer(tmp_path: Path) -> None:
    """The controller moved the partition epoch (3 -> 4) and refused the expansion proposed at
    3: proposing again at 3 can only be refused again, however long the leader waits. Only the
    metadata that brings epoch 4 lets it propose, at 4."""
    clock = Clock()
    leader = leader_of_1_and_2(tmp_path, clock, partition_epoch=3)
    stale = fetch_by_2(leader)
    assert stale is not None and (stale.new_isr, stale.partition_epoch) == ((1, 2), 3)
    leader.isr_change_done(stale, None, ErrorCode.INVALID_UPDATE_VERSION)
    clock.now_ms += 100 * ISR_RETRY_BACKOFF_MS
    assert fetch_by_2(leader) is None
    assert leader.isr_shrink(clock.now_ms, lag_max_ms=1) is None
    assert leader.proposes(stale), "still pending: the high watermark waits on the larger set"
    leader.make_leader(PartitionRegistration((1, 2), (1,), 1, 0, 3))  # the same epoch: no news
    assert fetch_by_2(leader) is None
    leader.make_leader(PartitionRegistration((1, 2), (1,), 1, 0, 4))
    assert not leader.proposes(stale)
    fresh = fetch_by_2(leader)
    assert fresh is not None and (fresh.new_isr, fresh.partition_epoch) == ((1, 2), 4)
    # the stale proposal's refusal arriving late must not be taken for the fresh one's
    leader.isr_change_done(stale, None, ErrorCode.INVALID_UPDATE_VERSION)
    leader.isr_change_done(stale, PartitionRegistration((1, 2), (1, 2), 1, 0, 4))
    assert leader.isr == (1,) and leader.proposes(fresh)
    leader.isr_change_done(fresh, PartitionRegistration((1, 2), (1, 2), 1, 0, 5))
    assert (list(leader.isr), leader.partition_epoch) == ([1, 2], 5)
    assert not leader.proposes(fresh)


def test_a_refusal_at_the_right_epoch_proposes_again_after_the_backoff(tmp_path: Path) -> None:
    """INELIGIBLE_REPLICA, OPERATION_NOT_ATTEMPTED: the epoch was right and nothing applied;
    the pending state is dropped and the next fetch after the backoff proposes again."""
    clock = Clock()
    leader = leader_of_1_and_2(tmp_path, clock, partition_epoch=3)
    for error in (ErrorCode.INELIGIBLE_REPLICA, ErrorCode.OPERATION_NOT_ATTEMPTED):
        change = fetch_by_2(leader)
        assert change is not None and change.partition_epoch == 3
        leader.isr_change_done(change, None, error)
        assert not leader.proposes(change)
        assert fetch_by_2(leader) is None, "within the backoff"
        clock.now_ms += ISR_RETRY_BACKOFF_MS
    assert fetch_by_2(leader) is not None
