"""Share-group state written as deltas (Kafka's ShareUpdate records over ShareSnapshots): a
leader writes only what an acknowledgement changed, the coordinator stores it as an update and a
whole snapshot every ``updates_per_snapshot`` updates, and a coordinator that loads the log
(after a restart, compacted or not) replays snapshot + updates to exactly the leader's state.
An acknowledgement whose write fails is taken back record by record; the records the previous
format wrote (a snapshot key with no update number) still read."""

from __future__ import annotations

import itertools
import random
import uuid
from collections.abc import Iterable

import pytest

from dataplane.coordinator.runtime import CoordinatorRecord
from dataplane.coordinator.share_batches import coalesced, merged, overlay, trim
from dataplane.coordinator.share_coordinator import ShareState, ShareStateShard, key_bytes
from dataplane.coordinator.share_partition import (
    AckBatch,
    AckType,
    RecordState,
    SharePartition,
    StateBatch,
)
from protos import share_pb2 as spb

TOPIC_ID = uuid.UUID("2fd8d9a4-1e2b-4f42-9a36-3b8f0b7c6d11").bytes
KEY = ("queue", TOPIC_ID, 0)
LOCK_MS = 1_000_000


class Coordinator:
    """A share coordinator and its log: every record it wrote, in order."""

    def __init__(self, updates_per_snapshot: int, log: Iterable[CoordinatorRecord] = ()) -> None:
        self.updates_per_snapshot = updates_per_snapshot
        self.shard = ShareStateShard(updates_per_snapshot)
        self.log: list[CoordinatorRecord] = []
        for key, value in log:
            self.shard.replay(key, value)
            self.log.append((key, value))

    def read(self, leader_epoch: int = 0) -> ShareState:
        state = self.shard.read(KEY, leader_epoch)
        self.log += self.shard.take_emitted()
        return state

    def write(self, state: ShareState) -> list[CoordinatorRecord]:
        self.shard.write(KEY, state)
        emitted = self.shard.take_emitted()
        self.log += emitted
        return emitted

    def restarted(self, compacted: bool = False) -> Coordinator:
        """A coordinator loading this log (compacted: the last record of each key, in log
        order, as the cleaner leaves it)."""
        log = self.log
        if compacted:
            last = {key: n for n, (key, _) in enumerate(log)}
            log = [record for n, record in enumerate(log) if last[record[0]] == n]
        return Coordinator(self.updates_per_snapshot, log)

    def state(self) -> ShareState:
        return self.shard.states[KEY]


def leader_state(share: SharePartition) -> tuple[int, tuple[StateBatch, ...]]:
    start, batches = share.snapshot()
    return start, coalesced(batches)


def stored(coordinator: Coordinator) -> tuple[int, tuple[StateBatch, ...]]:
    state = coordinator.state()
    return state.start_offset, state.batches


def write_delta(share: SharePartition, coordinator: Coordinator, epoch: int) -> list[int]:
    """The leader's write of what changed; the update numbers of the records it made (0: a
    snapshot)."""
    start, batches = share.delta()
    emitted = coordinator.write(ShareState(epoch, 0, start, tuple(batches)))
    share.delta_written()
    return [spb.ShareSnapshotKey.FromString(key).update_number for key, _ in emitted]


def acquired(count: int) -> SharePartition:
    share = SharePartition(0, lock_duration_ms=LOCK_MS, delivery_count_limit=3, max_in_flight=500)
    share.restore(0, ())
    share.acquire("a", range(count), 0, count)
    return share


def test_many_acknowledgements_replay_to_the_leaders_state_across_restarts() -> None:
    coordinator = Coordinator(updates_per_snapshot=5)
    epoch = coordinator.read().state_epoch
    share = acquired(120)
    write_delta(share, coordinator, epoch)
    rng = random.Random(29)
    offsets = [o for o in range(120) if o not in (7, 60, 119)]  # these stay in flight
    rng.shuffle(offsets)
    numbers: list[int] = []
    for n, offset in enumerate(offsets):
        kind = rng.choice([AckType.ACCEPT, AckType.ACCEPT, AckType.REJECT, AckType.RELEASE])
        share.acknowledge("a", [AckBatch(offset, offset, (kind,))])
        numbers += write_delta(share, coordinator, epoch)
        if n in (17, 58):  # the coordinator restarts: its successor loads the log
            coordinator = coordinator.restarted()
        assert stored(coordinator) == leader_state(share)
        assert stored(coordinator.restarted()) == leader_state(share)
        assert stored(coordinator.restarted(compacted=True)) == leader_state(share)
    # a snapshot (number 0) after every 5 updates (1..5; the first was the acquisitions'),
    # the numbers used again after each
    assert numbers[:13] == [2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 1, 2]
    assert max(numbers) == 5
    # each update carries what its acknowledgement changed, not the window
    updates = [spb.ShareUpdateValue.FromString(v) for k, v in coordinator.log
               if v is not None and spb.ShareSnapshotKey.FromString(k).update_number]  # fmt: skip
    assert updates and all(len(u.state_batches) <= 1 for u in updates)
    # a new leader loads exactly what the old one held (in flight: available, delivered once)
    successor_state = coordinator.restarted(compacted=True).read(leader_epoch=1)
    successor = SharePartition(0, lock_duration_ms=LOCK_MS, delivery_count_limit=3,
                               max_in_flight=500)  # fmt: skip
    successor.restore(successor_state.start_offset, successor_state.batches)
    assert leader_state(successor) == leader_state(share)
    for offset in (7, 60, 119):
        assert successor.state_of(offset) == (RecordState.AVAILABLE, 1)


def test_a_failed_write_takes_the_acknowledgement_back_and_the_next_write_carries_it() -> None:
    coordinator = Coordinator(updates_per_snapshot=500)
    epoch = coordinator.read().state_epoch
    share = acquired(10)
    write_delta(share, coordinator, epoch)
    before = leader_state(share), [share.state_of(o) for o in range(10)]
    deadline = share.next_lock_deadline_ms()
    undo = share.acknowledge("a", [
        AckBatch(0, 3, (AckType.ACCEPT,)),
        AckBatch(5, 7, (AckType.RELEASE, AckType.ACCEPT, AckType.REJECT)),
    ])  # fmt: skip
    assert share.start_offset == 4 and share.fetch_offset() == 5
    share.undo(undo)  # the write failed
    assert (leader_state(share), [share.state_of(o) for o in range(10)]) == before
    assert share.start_offset == 0 and share.fetch_offset() == 10  # nothing available
    assert share.next_lock_deadline_ms() == deadline
    assert share.expire_locks(LOCK_MS) == 10  # every lock stands, and expires
    share.acquire("a", range(10), LOCK_MS, 10)
    share.acknowledge("a", [AckBatch(0, 3, (AckType.ACCEPT,))])  # still the member's to ack
    write_delta(share, coordinator, epoch)
    assert stored(coordinator.restarted()) == leader_state(share)
    assert stored(coordinator) == (4, (StateBatch(4, 9, RecordState.AVAILABLE, 2),))


def test_every_write_is_a_snapshot_with_no_updates_per_snapshot() -> None:
    coordinator = Coordinator(updates_per_snapshot=0)
    epoch = coordinator.read().state_epoch
    share = acquired(6)
    for offset in (3, 1, 0):
        share.acknowledge("a", [AckBatch(offset, offset, (AckType.ACCEPT,))])
        assert write_delta(share, coordinator, epoch) == [0]
    assert stored(coordinator.restarted(compacted=True)) == leader_state(share)


def test_the_previous_formats_snapshot_still_reads_and_takes_updates() -> None:
    old_key = spb.ShareSnapshotKey(group_id=KEY[0], topic_id=KEY[1], partition=KEY[2])
    assert old_key.SerializeToString() == key_bytes(*KEY)  # the snapshot's key is unchanged
    old_value = spb.ShareSnapshotValue(
        state_epoch=3, leader_epoch=2, start_offset=10,
        state_batches=[spb.StateBatch(first_offset=10, last_offset=12, delivery_state=2,
                                      delivery_count=1)],
    )  # fmt: skip
    coordinator = Coordinator(5, [(old_key.SerializeToString(), old_value.SerializeToString())])
    assert coordinator.state() == ShareState(
        3, 2, 10, (StateBatch(10, 12, RecordState.ACKNOWLEDGED, 1),)
    )
    coordinator.write(ShareState(3, 2, 10, (StateBatch(13, 14, RecordState.ARCHIVED, 3),)))
    expected = (
        10,
        (
            StateBatch(10, 12, RecordState.ACKNOWLEDGED, 1),
            StateBatch(13, 14, RecordState.ARCHIVED, 3),
        ),
    )
    assert stored(coordinator.restarted()) == expected


def test_a_deleted_share_partition_leaves_tombstones_for_its_updates_too() -> None:
    coordinator = Coordinator(updates_per_snapshot=3)
    epoch = coordinator.read().state_epoch
    share = acquired(8)
    for offset in range(7, 2, -1):  # 5 writes: updates 1..3, a snapshot, update 1
        share.acknowledge("a", [AckBatch(offset, offset, (AckType.ACCEPT,))])
        write_delta(share, coordinator, epoch)
    coordinator.shard.delete(KEY)
    tombstones = coordinator.shard.take_emitted()
    coordinator.log += tombstones
    assert all(value is None for _, value in tombstones)
    assert sorted(spb.ShareSnapshotKey.FromString(k).update_number for k, _ in tombstones) == [
        0, 1, 2, 3,
    ]  # fmt: skip
    assert coordinator.shard.states == {}
    compacted = coordinator.restarted(compacted=True)
    assert compacted.shard.states == {} and all(v is None for _, v in compacted.log)


def per_offset(runs: Iterable[StateBatch]) -> dict[int, tuple[RecordState, int]]:
    return {
        o: (run.state, run.delivery_count)
        for run in runs
        for o in range(run.first_offset, run.last_offset + 1)
    }


@pytest.mark.parametrize("seed", range(20))
def test_merging_runs_matches_a_per_offset_model(seed: int) -> None:
    rng = random.Random(seed)
    states = list(RecordState)
    model: dict[int, tuple[RecordState, int]] = {}
    runs: list[StateBatch] = []
    start = 0
    updates = []
    for _ in range(40):
        batches = []
        for _ in range(rng.randint(0, 3)):
            first = rng.randint(start, start + 60)
            batch = StateBatch(
                first, first + rng.randint(0, 12), rng.choice(states), rng.randint(0, 4)
            )
            overlay(runs, batch)
            model.update(per_offset([batch]))
            batches.append(batch)
        start += rng.randint(0, 5)
        trim(runs, start)
        model = {o: s for o, s in model.items() if o >= start}
        updates.append((start, batches))
        assert per_offset(runs) == model
        assert all(a.last_offset < b.first_offset for a, b in itertools.pairwise(runs))
    assert per_offset(merged(0, (), updates)[1]) == model
