"""The share partitions a broker leads (KIP-932's data path): a real partition on disk in a real
replica manager (one broker, RF 1), the share coordinator replaced by an in-memory persister.
Members acquire records from the log under locks, acknowledgements are written before they are
answered (and undone if the write fails), an expired lock hands the records to the next fetch,
a long poll wakes on an append, and a new leader loads what the last one wrote."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dataplane.broker.partition import IsrChange
from dataplane.broker.replica_manager import ReplicaManager, ReplicaManagerConfig
from dataplane.coordinator.share_coordinator import (
    NO_START_OFFSET,
    ShareKey,
    ShareState,
    ShareStateShard,
)
from dataplane.coordinator.share_manager import (
    EARLIEST,
    Fetched,
    SharePartitionManager,
    ShareSettings,
    ShareTarget,
)
from dataplane.coordinator.share_partition import (
    AckBatch,
    AckType,
    AcquiredRange,
    RecordState,
)
from dataplane.coordinator.share_requests import FetchLimits, Named, ShareItem, ShareRequests
from metadata_quorum.image import (
    BrokerRegistration,
    MetadataImage,
    PartitionRegistration,
    TopicImage,
)
from metadata_quorum.records import ConfigResourceType, Endpoint
from metadata_quorum.security.authorization import ALLOW_ALL
from raftlog.errors import ErrorCode, KafkaError
from raftlog.records import Record, encode_batch

TOPIC = "orders"
TOPIC_ID = uuid.uuid4()
TARGET = ShareTarget(TOPIC, TOPIC_ID.bytes, 0)
GROUP = "queue"
LOCK_MS = 5_000


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


class MemoryPersister:
    """The share coordinator's pure state, called in process; ``failing`` makes writes fail."""

    def __init__(self) -> None:
        self.shard = ShareStateShard()
        self.writes = 0
        self.failing: KafkaError | None = None

    def read(self, share: ShareKey, leader_epoch: int) -> ShareState:
        return self.shard.read(share, leader_epoch)

    def write(self, share: ShareKey, state: ShareState) -> None:
        if self.failing is not None:
            raise self.failing
        self.shard.write(share, state)
        self.writes += 1

    def stored(self) -> ShareState:
        return self.shard.states[(GROUP, TOPIC_ID.bytes, 0)]


def image(leader_epoch: int = 1) -> MetadataImage:
    endpoint = (Endpoint("BROKER", "127.0.0.1", 9092),)
    brokers = {1: BrokerRegistration(1, "i1", 1, endpoint, None, fenced=False)}
    partitions = {0: PartitionRegistration((1,), (1,), 1, leader_epoch, leader_epoch)}
    return MetadataImage(
        offset=leader_epoch, brokers=brokers,
        topics={TOPIC_ID: TopicImage(TOPIC, TOPIC_ID, partitions)}, topic_ids={TOPIC: TOPIC_ID},
    )  # fmt: skip


def no_isr_change(change: IsrChange) -> None:
    raise AssertionError(f"no ISR change expected: {change}")


def no_failure(directory: Path, error: OSError) -> None:
    raise AssertionError(f"no log-dir failure expected: {directory}: {error}")


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[ReplicaManager]:
    manager = ReplicaManager(
        1, tmp_path, ReplicaManagerConfig(), lambda: 0, no_isr_change, no_failure
    )
    manager.apply_image(image(), caught_up=True)
    yield manager
    manager.close()


def produce(replicas: ReplicaManager, *values: bytes) -> None:
    """One batch of ``values``."""
    batch = encode_batch([Record(-1, 0, None, v) for v in values])
    replicas.get(TOPIC, 0).append_as_leader(batch, -1, 1)


def manager_for(
    replicas: ReplicaManager, persister: MemoryPersister, clock: Clock, reset: str = EARLIEST
) -> SharePartitionManager:
    settings = ShareSettings(
        record_lock_duration_ms=LOCK_MS, delivery_count_limit=3, auto_offset_reset=reset
    )
    return SharePartitionManager(replicas, persister, settings, clock)


def fetch(
    manager: SharePartitionManager, member: str, max_records: int = 100, wait_ms: int = 0
) -> Fetched:
    (answer,) = manager.fetch(GROUP, member, [TARGET], max_records, 1 << 20, wait_ms)
    assert answer.error is None, answer.error
    return answer


def ack(
    manager: SharePartitionManager, member: str, first: int, last: int, kind: AckType
) -> KafkaError | None:
    (error,) = manager.acknowledge(GROUP, member, [(TARGET, [AckBatch(first, last, (kind,))])])
    return error


def test_members_share_a_partition_and_acknowledgements_are_written(
    replicas: ReplicaManager,
) -> None:
    persister, clock = MemoryPersister(), Clock()
    manager = manager_for(replicas, persister, clock)
    produce(replicas, b"a", b"b", b"c")
    produce(replicas, b"d", b"e")
    first = fetch(manager, "m1", max_records=2)
    # the whole first batch comes back; only 0-1 are acquired (2 stays for the next member)
    assert first.acquired == [AcquiredRange(0, 1, 1)]
    second = fetch(manager, "m2")
    assert second.acquired == [AcquiredRange(2, 4, 1)]
    assert len(second.records) > len(first.records)  # both batches hold an acquired record
    assert fetch(manager, "m3").acquired == []  # everything is held
    assert ack(manager, "m2", 2, 4, AckType.ACCEPT) is None
    assert persister.stored().start_offset == 0  # 0-1 still held by m1
    assert ack(manager, "m1", 0, 1, AckType.ACCEPT) is None
    assert persister.stored().start_offset == 5
    error = ack(manager, "m1", 0, 1, AckType.ACCEPT)  # acknowledged already
    assert error is not None and error.error is ErrorCode.INVALID_RECORD_STATE


def test_latest_starts_at_the_high_watermark_of_the_first_fetch(replicas: ReplicaManager) -> None:
    persister = MemoryPersister()
    manager = manager_for(replicas, persister, Clock(), reset="latest")
    produce(replicas, b"old")
    assert fetch(manager, "m1").acquired == []
    assert persister.stored().start_offset == 1  # written at once: a failover keeps it
    produce(replicas, b"new")
    assert fetch(manager, "m1").acquired == [AcquiredRange(1, 1, 1)]


def test_an_expired_lock_gives_the_records_to_the_next_fetch(replicas: ReplicaManager) -> None:
    persister, clock = MemoryPersister(), Clock()
    manager = manager_for(replicas, persister, clock)
    produce(replicas, b"a", b"b")
    assert fetch(manager, "dead").acquired == [AcquiredRange(0, 1, 1)]
    assert fetch(manager, "alive").acquired == []
    clock.now_ms += LOCK_MS
    assert fetch(manager, "alive").acquired == [AcquiredRange(0, 1, 2)]
    error = ack(manager, "dead", 0, 1, AckType.ACCEPT)
    assert error is not None and error.error is ErrorCode.INVALID_RECORD_STATE


def test_released_records_return_and_rejected_ones_never_do(replicas: ReplicaManager) -> None:
    manager = manager_for(replicas, MemoryPersister(), Clock())
    produce(replicas, b"a", b"b", b"c")
    fetch(manager, "m1")
    batches = [AckBatch(0, 2, (AckType.ACCEPT, AckType.RELEASE, AckType.REJECT))]
    assert manager.acknowledge(GROUP, "m1", [(TARGET, batches)]) == [None]
    assert fetch(manager, "m2").acquired == [AcquiredRange(1, 1, 2)]


def test_a_failed_write_undoes_the_acknowledgement(replicas: ReplicaManager) -> None:
    persister = MemoryPersister()
    manager = manager_for(replicas, persister, Clock())
    produce(replicas, b"a")
    fetch(manager, "m1")
    persister.failing = KafkaError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "down")
    error = ack(manager, "m1", 0, 0, AckType.ACCEPT)
    assert error is not None and error.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    persister.failing = None
    assert ack(manager, "m1", 0, 0, AckType.ACCEPT) is None  # still held by m1: it may retry


def test_a_new_leader_loads_the_state_and_redelivers_what_was_in_flight(
    replicas: ReplicaManager,
) -> None:
    persister, clock = MemoryPersister(), Clock()
    old = manager_for(replicas, persister, clock)
    produce(replicas, b"a", b"b", b"c", b"d")
    fetch(old, "m1", max_records=2)
    fetch(old, "m2", max_records=2)
    assert ack(old, "m2", 2, 3, AckType.ACCEPT) is None  # written with 0-1 in flight
    replicas.apply_image(image(leader_epoch=2), caught_up=True)
    old.on_image()
    assert old.loaded() == []  # the locks died with the old leadership
    new = manager_for(replicas, persister, clock)
    assert fetch(new, "m3").acquired == [AcquiredRange(0, 1, 2)]  # delivered once before
    assert persister.stored().state_epoch == 2
    error = ack(old, "m1", 0, 1, AckType.ACCEPT)  # the old manager reloads: m1 holds nothing
    assert error is not None and error.error is ErrorCode.INVALID_RECORD_STATE
    stale = ShareState(1, 2, 0, ())
    with pytest.raises(KafkaError) as fenced:
        persister.write((GROUP, TOPIC_ID.bytes, 0), stale)
    assert fenced.value.error is ErrorCode.FENCED_STATE_EPOCH


def test_the_delivery_limit_archives_a_record_released_too_often(replicas: ReplicaManager) -> None:
    persister, clock = MemoryPersister(), Clock()
    manager = manager_for(replicas, persister, clock)  # delivery.count.limit 3
    produce(replicas, b"poison")
    for attempt in range(1, 4):
        assert fetch(manager, f"m{attempt}").acquired == [AcquiredRange(0, 0, attempt)]
        assert ack(manager, f"m{attempt}", 0, 0, AckType.RELEASE) is None
    assert fetch(manager, "m4").acquired == []
    assert persister.stored().start_offset == 1  # archived


def test_a_long_poll_wakes_on_an_append_and_on_a_release(replicas: ReplicaManager) -> None:
    manager = manager_for(replicas, MemoryPersister(), Clock())
    fetch(manager, "m1")  # loads the share partition
    appender = threading.Timer(0.2, produce, (replicas, b"late"))
    appender.start()
    started = time.monotonic()
    assert fetch(manager, "m1", wait_ms=10_000).acquired == [AcquiredRange(0, 0, 1)]
    assert time.monotonic() - started < 5
    releaser = threading.Timer(0.2, ack, (manager, "m1", 0, 0, AckType.RELEASE))
    releaser.start()
    assert fetch(manager, "m2", wait_ms=10_000).acquired == [AcquiredRange(0, 0, 2)]
    appender.join()
    releaser.join()


def test_a_closed_session_releases_its_members_records(replicas: ReplicaManager) -> None:
    persister = MemoryPersister()
    manager = manager_for(replicas, persister, Clock())
    produce(replicas, b"a", b"b")
    fetch(manager, "m1")
    manager.release_member(GROUP, "m1", [TARGET])
    assert fetch(manager, "m2").acquired == [AcquiredRange(0, 1, 2)]
    assert [b.state for b in persister.stored().batches] == [RecordState.AVAILABLE]


def test_a_share_partition_not_led_here_is_refused(replicas: ReplicaManager) -> None:
    manager = manager_for(replicas, MemoryPersister(), Clock())
    (answer,) = manager.fetch(GROUP, "m1", [ShareTarget("nope", bytes(16), 0)], 10, 1 << 20, 0)
    assert answer.error is not None
    assert answer.error.error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert NO_START_OFFSET == -1


def test_a_closed_connection_releases_its_sessions_records_at_once(
    replicas: ReplicaManager,
) -> None:
    """Kafka's connection-disconnect listener: the member's socket closes, its share session
    ends and the records it held go to the next fetch, long before their locks expire."""
    manager = manager_for(replicas, MemoryPersister(), Clock())
    requests = ShareRequests(manager, lambda: replicas.image, ALLOW_ALL, Clock())
    limits = FetchLimits(max_records=10)
    pid = (TOPIC_ID.bytes, 0)
    produce(replicas, b"a", b"b")
    named: Named = {pid: ShareItem(*pid)}
    assert requests.fetch(GROUP, "m1", 0, named, [], limits, connection_id="conn-1") is None
    fetched = named[pid].fetched
    assert fetched is not None and fetched.acquired == [AcquiredRange(0, 1, 1)]
    assert requests.connection_closed("conn-2") == 0  # another connection: nothing ends
    assert fetch(manager, "m2").acquired == []
    assert requests.connection_closed("conn-1") == 1
    assert manager.sessions.get(GROUP, "m1") is None
    assert fetch(manager, "m2").acquired == [AcquiredRange(0, 1, 2)]  # the clock never moved


def set_group_configs(replicas: ReplicaManager, group: str, values: dict[str, str]) -> None:
    """The group's overrides (IncrementalAlterConfigs' ConfigRecords) in the broker's image."""
    configs = {**replicas.image.configs, (ConfigResourceType.GROUP, group): values}
    replicas.apply_image(dataclasses.replace(replicas.image, configs=configs), caught_up=True)


def txn_batch(producer_id: int, *values: bytes) -> bytes:
    return encode_batch(
        [Record(-1, 0, None, v) for v in values], producer_id=producer_id, producer_epoch=0,
        base_sequence=0, is_transactional=True,
    )  # fmt: skip


def test_the_start_is_resolved_when_the_share_partition_first_loads(
    replicas: ReplicaManager,
) -> None:
    """Kafka 4.1: the group coordinator initializes a share partition at start offset -1 when it
    first assigns it; the leader resolves share.auto.offset.reset when it first loads it (its
    first ShareFetch), with the group's config of that moment; later changes do not move it."""
    persister = MemoryPersister()
    manager = manager_for(replicas, persister, Clock(), reset="latest")
    produce(replicas, b"before-the-group")
    set_group_configs(replicas, GROUP, {"share.auto.offset.reset": "earliest"})
    assert fetch(manager, "m1").acquired == [AcquiredRange(0, 0, 1)]  # changed before the load
    set_group_configs(replicas, GROUP, {"share.auto.offset.reset": "latest"})
    produce(replicas, b"after")
    assert fetch(manager, "m1").acquired == [AcquiredRange(1, 1, 1)]  # loaded: it stays
    assert persister.stored().start_offset == 0


def test_read_committed_never_delivers_aborted_records_nor_open_transactions(
    replicas: ReplicaManager,
) -> None:
    """share.isolation.level=read_committed: reads stop at the last stable offset, aborted
    transactions' records are archived (the start moves past them), committed ones and plain
    ones are delivered; read_uncommitted (another group, the default) gets every record."""
    manager = manager_for(replicas, MemoryPersister(), Clock())
    partition = replicas.get(TOPIC, 0)
    produce(replicas, b"plain")  # 0
    partition.append_as_leader(txn_batch(7, b"aborted-1", b"aborted-2"), -1, 1)  # 1-2
    partition.append_as_leader(txn_batch(8, b"committed"), -1, 1)  # 3
    partition.append_marker(7, 0, commit=False, coordinator_epoch=1)  # 4
    partition.append_marker(8, 0, commit=True, coordinator_epoch=1)  # 5
    partition.append_as_leader(txn_batch(9, b"open"), -1, 1)  # 6, its transaction open
    produce(replicas, b"after-the-open-one")  # 7
    set_group_configs(replicas, GROUP, {"share.isolation.level": "read_committed"})
    got = fetch(manager, "m1")
    assert got.acquired == [AcquiredRange(0, 0, 1), AcquiredRange(3, 3, 1)]
    assert fetch(manager, "m1", wait_ms=200).acquired == []  # 6 waits for its transaction
    assert ack(manager, "m1", 0, 0, AckType.ACCEPT) is None
    assert ack(manager, "m1", 3, 3, AckType.ACCEPT) is None
    share = manager._entries[(GROUP, TOPIC_ID.bytes, 0)].share
    assert share.start_offset == 6  # aborted 1-2 and the markers 4-5 archived
    partition.append_marker(9, 0, commit=True, coordinator_epoch=1)  # 8
    assert fetch(manager, "m1").acquired == [AcquiredRange(6, 7, 1)]
    (everything,) = manager.fetch("uncommitted", "m2", [TARGET], 100, 1 << 20, 0)
    assert everything.acquired == [AcquiredRange(0, 3, 1), AcquiredRange(6, 7, 1)]


def test_renew_keeps_records_past_the_groups_lock_and_writes_nothing(
    replicas: ReplicaManager,
) -> None:
    """KIP-1222: a RENEW restarts the lock for the group's share.record.lock.duration.ms as it
    is at the renewal (its override here); nothing stored changes, so nothing is written; the
    records go to the next member a lock after the last renewal, their delivery counted once."""
    persister, clock = MemoryPersister(), Clock()
    manager = manager_for(replicas, persister, clock)
    produce(replicas, b"slow")
    assert fetch(manager, "holder").acquired == [AcquiredRange(0, 0, 1)]
    set_group_configs(replicas, GROUP, {"share.record.lock.duration.ms": "20000"})
    writes = persister.writes
    clock.now_ms += LOCK_MS - 1
    assert ack(manager, "holder", 0, 0, AckType.RENEW) is None
    assert persister.writes == writes
    clock.now_ms += 20_000 - 1
    assert fetch(manager, "other").acquired == []  # the renewed lock still holds
    clock.now_ms += 1
    assert fetch(manager, "other").acquired == [AcquiredRange(0, 0, 2)]
    error = ack(manager, "holder", 0, 0, AckType.RENEW)  # not the holder's any more
    assert error is not None and error.error is ErrorCode.INVALID_RECORD_STATE


def test_a_renewal_fetch_only_acknowledges_and_wants_no_limits(replicas: ReplicaManager) -> None:
    """ShareFetch v2's IsRenewAck: every limit must be 0 (else INVALID_REQUEST, nothing done,
    the session's epoch not taken); a valid one renews and fetches nothing."""
    clock = Clock()
    manager = manager_for(replicas, MemoryPersister(), clock)
    requests = ShareRequests(manager, lambda: replicas.image, ALLOW_ALL, clock)
    pid = (TOPIC_ID.bytes, 0)
    produce(replicas, b"a")
    named: Named = {pid: ShareItem(*pid)}
    assert requests.fetch(GROUP, "m1", 0, named, [], FetchLimits(max_records=10)) is None
    produce(replicas, b"b")  # there would be something to fetch
    renewal = [AckBatch(0, 0, (AckType.RENEW,))]
    for limits in (FetchLimits(max_records=10, max_bytes=0), FetchLimits(0, 0, 0, min_bytes=1)):
        named = {pid: ShareItem(*pid, acks=list(renewal))}
        error = requests.fetch(GROUP, "m1", 1, named, [], limits, renew_ack=True)
        assert error is not None and error.error is ErrorCode.INVALID_REQUEST
    named = {pid: ShareItem(*pid, acks=list(renewal))}
    assert requests.fetch(GROUP, "m1", 1, named, [], FetchLimits(0, 0, 0), renew_ack=True) is None
    assert named[pid].acknowledged and named[pid].ack_error is None
    assert named[pid].fetched is None  # nothing fetched
    assert fetch(manager, "m2").acquired == [AcquiredRange(1, 1, 1)]
