"""The coordinators' shared machinery with transactions: a group shard's TxnOffsetCommit records go
to a real ``__consumer_offsets`` partition as the producer's transactional batches, markers as
control batches, and a new runtime replays both in log order to the same state. Also: a refusal
of the partition (fenced producer, a transaction a marker ended while it was verified) stores
and applies nothing. One broker, RF 1, real logs, no network."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from dataplane.broker.partition import IsrChange
from dataplane.broker.producer_state import SENTINEL
from dataplane.broker.replica_manager import ReplicaManager, ReplicaManagerConfig
from dataplane.coordinator import group_state as gs
from dataplane.coordinator.runtime import CoordinatorRuntime, InternalTopic, Shard
from metadata_quorum.image import (
    BrokerRegistration,
    MetadataImage,
    PartitionRegistration,
    TopicImage,
)
from metadata_quorum.records import Endpoint
from raftlog.batch import iter_batches
from raftlog.errors import ErrorCode, KafkaError

TOPIC = "__consumer_offsets"
TOPIC_ID = uuid.uuid4()
G = "g"
T0, T1 = ("t", 0), ("t", 1)
PID = 42
DEADLINE_S = 10.0


def _image() -> MetadataImage:
    endpoint = (Endpoint("BROKER", "127.0.0.1", 9092),)
    brokers = {1: BrokerRegistration(1, "i1", 1, endpoint, None, fenced=False)}
    partitions = {0: PartitionRegistration((1,), (1,), 1, 1, 1)}
    return MetadataImage(
        offset=1,
        brokers=brokers,
        topics={TOPIC_ID: TopicImage(TOPIC, TOPIC_ID, partitions)},
        topic_ids={TOPIC: TOPIC_ID},
    )


def _no_isr_change(change: IsrChange) -> None:
    raise AssertionError(f"no ISR change expected: {change}")


def _no_failure(directory: Path, error: OSError) -> None:
    raise AssertionError(f"no log-dir failure expected: {directory}: {error}")


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[ReplicaManager]:
    manager = ReplicaManager(
        1, tmp_path, ReplicaManagerConfig(), lambda: 0, _no_isr_change, _no_failure
    )
    manager.apply_image(_image(), caught_up=True)
    yield manager
    manager.close()


def _runtime(replicas: ReplicaManager) -> CoordinatorRuntime[gs.GroupShard]:
    def create_topic(name: str, partitions: int, rf: int, configs: Mapping[str, str]) -> None:
        raise AssertionError("the topic exists")

    def new_state() -> gs.GroupShard:
        return gs.GroupShard(
            session_timeout_ms=1000, max_group_size=100, offset_metadata_max_bytes=100
        )

    topic = InternalTopic(TOPIC, 1, 1, {"cleanup.policy": "compact"}, "offsets.topic")
    runtime = CoordinatorRuntime(
        1, topic, replicas, new_state, create_topic, lambda: 1_000, commit_timeout_ms=5_000
    )
    runtime.start()
    runtime.on_image()
    return runtime


def _shard(runtime: CoordinatorRuntime[gs.GroupShard]) -> Shard[gs.GroupShard]:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            return runtime.shard(lambda count: 0, "partition 0")
        except KafkaError as error:
            if error.error is not ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                raise
            if time.monotonic() > deadline:
                raise AssertionError(f"not loaded in {DEADLINE_S} s") from error
            time.sleep(0.01)


def _txn_commit(
    runtime: CoordinatorRuntime[gs.GroupShard],
    shard: Shard[gs.GroupShard],
    offsets: dict[tuple[str, int], int],
    epoch: int = 0,
    verification: object = None,
) -> None:
    items = [gs.OffsetCommitItem(t, p, o, -1, "") for (t, p), o in offsets.items()]
    results = runtime.run_transactional(
        shard, PID, epoch, verification,  # type: ignore[arg-type]
        lambda state: state.txn_commit_records(G, items, 1_000),
    )  # fmt: skip
    assert all(error is None for error in results.values())


def _commit(
    runtime: CoordinatorRuntime[gs.GroupShard],
    shard: Shard[gs.GroupShard],
    offsets: dict[tuple[str, int], int],
) -> None:
    items = [gs.OffsetCommitItem(t, p, o, -1, "") for (t, p), o in offsets.items()]
    runtime.run(shard, lambda state: state.commit(G, items, 1_000))


def _offsets(state: gs.GroupShard) -> dict[tuple[str, int], int]:
    return {tp: c.offset for tp, c in state.committed(G, None).items() if c is not None}


def test_transactional_batches_and_markers_replay_in_log_order(
    replicas: ReplicaManager,
) -> None:
    first = _runtime(replicas)
    try:
        shard = _shard(first)
        _commit(first, shard, {T0: 1})
        _txn_commit(first, shard, {T0: 5, T1: 6})  # committed below
        _commit(first, shard, {T1: 7})  # a plain commit later in the log: it stays
        first.write_marker(shard, PID, 0, True, 0)
        _txn_commit(first, shard, {T0: 9})  # the next transaction, aborted
        first.write_marker(shard, PID, 0, False, 0)
        _txn_commit(first, shard, {T1: 11})  # still open at the failover
        assert _offsets(shard.state) == {T0: 5, T1: 7}
        assert shard.state.unstable(G) == {T1}
        plog = shard.partition.log
        data = plog.read(0, 1 << 20, min_one_batch=True)
        kinds = [
            (h.is_transactional, h.is_control, h.producer_id if h.is_transactional else -1)
            for _, h in iter_batches(data)
        ]
        assert kinds == [
            (False, False, -1),
            (True, False, PID),
            (False, False, -1),
            (True, True, PID),
            (True, False, PID),
            (True, True, PID),
            (True, False, PID),
        ]
        assert shard.partition.high_watermark == shard.written_end == plog.log_end_offset
    finally:
        first.close()
    second = _runtime(replicas)
    try:
        shard = _shard(second)
        assert _offsets(shard.state) == {T0: 5, T1: 7}
        assert shard.state.unstable(G) == {T1}  # pending survives, until its marker
        second.write_marker(shard, PID, 0, True, 0)
        assert _offsets(shard.state) == {T0: 5, T1: 11}
    finally:
        second.close()


def test_a_fenced_producer_stores_and_applies_nothing(replicas: ReplicaManager) -> None:
    runtime = _runtime(replicas)
    try:
        shard = _shard(runtime)
        runtime.write_marker(shard, PID, 1, False, 0)  # the producer's epoch is bumped to 1
        end = shard.partition.log.log_end_offset
        with pytest.raises(KafkaError) as refused:
            _txn_commit(runtime, shard, {T0: 5}, epoch=0)
        assert refused.value.error is ErrorCode.INVALID_PRODUCER_EPOCH
        assert shard.partition.log.log_end_offset == end
        assert shard.state.unstable(G) == set()
        assert runtime.shard(lambda count: 0, "partition 0") is shard  # not reloaded
        with pytest.raises(KafkaError) as refused:
            runtime.write_marker(shard, PID, 0, True, 0)  # a marker of the old epoch
        assert refused.value.error is ErrorCode.INVALID_PRODUCER_EPOCH
        _txn_commit(runtime, shard, {T0: 5}, epoch=1)
        assert shard.state.unstable(G) == {T0}
    finally:
        runtime.close()


def test_a_marker_during_verification_voids_it(replicas: ReplicaManager) -> None:
    """KIP-890's guard on the group's partition: verified, then the transaction ended (a
    timeout abort's marker) before the offsets were appended: refused, nothing pending."""
    runtime = _runtime(replicas)
    try:
        shard = _shard(runtime)
        guard = shard.partition.start_verification(PID, 0)
        assert guard is not SENTINEL
        runtime.write_marker(shard, PID, 0, False, 0)
        with pytest.raises(KafkaError) as refused:
            _txn_commit(runtime, shard, {T0: 5}, verification=guard)
        assert refused.value.error is ErrorCode.INVALID_TXN_STATE
        assert shard.state.unstable(G) == set()
        guard = shard.partition.start_verification(PID, 0)
        _txn_commit(runtime, shard, {T0: 5}, verification=guard)
        assert shard.partition.start_verification(PID, 0) is SENTINEL  # its transaction is open
        _txn_commit(runtime, shard, {T1: 6}, verification=SENTINEL)
        assert shard.state.unstable(G) == {T0, T1}
    finally:
        runtime.close()
