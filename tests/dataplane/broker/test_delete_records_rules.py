"""DeleteRecords' rules without processes: the log start offset on a real log (never back,
never past the high watermark, checkpointed, the segments below deleted), the low watermark
over the replicas, and a leader and a follower replica passing it on through the same
functions the fetcher and BrokerService use."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from dataplane.broker import replica_state as rs
from dataplane.broker.fetcher import apply_fetched
from dataplane.broker.partition import Partition
from metadata_quorum.image import PartitionRegistration
from protos import broker_pb2 as pb
from raftlog.config import LogConfig
from raftlog.errors import ErrorCode, KafkaError
from raftlog.log import Log
from raftlog.records import encode_batch

TOPIC_ID = uuid.UUID(int=21)


def _log(path: Path, **config: str) -> Log:
    settings = LogConfig.model_validate({"segment.bytes": 1024, **config})
    return Log(path, settings, topic_id=TOPIC_ID, clock=lambda: 1_000_000)


def _batch(timestamp_ms: int) -> bytes:
    """Two records of ~200 bytes: a 1 KiB segment holds two such batches."""
    return encode_batch([(b"k", b"v" * 200, timestamp_ms, ())] * 2)


def _fill(log: Log, batches: int) -> None:
    for n in range(batches):
        log.append(_batch(n), leader_epoch=0)


def test_the_log_start_offset_moves_up_only_and_not_past_the_high_watermark(
    tmp_path: Path,
) -> None:
    log = _log(tmp_path / "t-0")
    _fill(log, 20)  # 40 records, several segments
    segments = log.segment_count
    with pytest.raises(KafkaError) as beyond:
        log.maybe_increment_log_start_offset(31, high_watermark=30)
    assert beyond.value.error is ErrorCode.OFFSET_OUT_OF_RANGE
    assert log.log_start_offset == 0  # nothing changed
    assert log.maybe_increment_log_start_offset(17, high_watermark=30)
    assert not log.maybe_increment_log_start_offset(5, high_watermark=30)  # never back
    assert log.log_start_offset == 17
    with pytest.raises(KafkaError) as below:
        log.read(16, 1 << 20)
    assert below.value.error is ErrorCode.OFFSET_OUT_OF_RANGE
    assert log.read(17, 1 << 20)  # the batch holding 17 (it starts at 16)
    assert log.delete_old_segments(30, retention=False) > 0
    assert log.segment_count < segments
    assert all(s.base_offset <= 17 for s in log.segments()[:1])
    assert log.log_start_offset == 17
    log.close()
    reopened = _log(tmp_path / "t-0")
    assert reopened.log_start_offset == 17  # the checkpoint kept it
    reopened.close()


def test_retention_false_keeps_expired_segments(tmp_path: Path) -> None:
    log = _log(tmp_path / "t-0", **{"retention.ms": "0"})  # everything expired
    _fill(log, 20)
    assert log.delete_old_segments(log.log_end_offset, retention=False) == 0
    assert log.log_start_offset == 0
    log.close()


@pytest.mark.parametrize(
    ("leader_start", "followers", "alive", "expected"),
    [
        (10, {2: 10, 3: 10}, {1, 2, 3}, 10),
        (10, {2: 4, 3: 10}, {1, 2, 3}, 4),  # broker 2 has not followed yet
        (10, {2: 4, 3: 10}, {1, 3}, 10),  # broker 2 is down: it does not hold the answer
        (10, {2: -1}, {1, 2}, -1),  # broker 2 has not fetched from this leader yet
        (10, {}, {1}, 10),
    ],
)
def test_the_low_watermark_is_the_lowest_live_log_start(
    leader_start: int, followers: dict[int, int], alive: set[int], expected: int
) -> None:
    states = {b: rs.FollowerState(b, log_start_offset=s) for b, s in followers.items()}
    replicas = (1, *followers)
    assert rs.low_watermark(leader_start, states, replicas, alive) == expected


# -- a leader and a follower on disk -----------------------------------------------------------
def _replica(tmp_path: Path, broker_id: int, **config: str) -> Partition:
    log = _log(tmp_path / f"broker-{broker_id}" / "t-0", **config)
    return Partition("t", 0, TOPIC_ID, log, broker_id, lambda: 1_000_000)


def _fetch(follower: Partition, leader: Partition) -> None:
    state = follower.fetch_state()
    assert state is not None
    fetch_offset, last_epoch, leader_epoch, log_start = state
    read, _ = leader.read_for_follower(
        follower.broker_id, fetch_offset, last_epoch, leader_epoch, 1 << 20,
        log_start_offset=log_start,
    )  # fmt: skip
    item = pb.FetchPartitionResponse(
        high_watermark=read.high_watermark, log_start_offset=read.log_start_offset
    )
    assert apply_fetched(follower, fetch_offset, leader_epoch, item, read.records) is (
        ErrorCode.NONE
    )


def test_delete_records_on_the_leader_and_the_follower_follows(tmp_path: Path) -> None:
    leader, follower = _replica(tmp_path, 1), _replica(tmp_path, 2)
    reg = PartitionRegistration((1, 2), (1, 2), 1, 1, 1)
    leader.make_leader(reg)
    follower.make_follower(reg)
    for n in range(20):
        leader.append_as_leader(_batch(n), 1, 1)
    for _ in range(4):
        _fetch(follower, leader)
    assert leader.high_watermark == 40 and follower.log.log_end_offset == 40
    with pytest.raises(KafkaError) as beyond:
        leader.delete_records(41)
    assert beyond.value.error is ErrorCode.OFFSET_OUT_OF_RANGE
    with pytest.raises(KafkaError) as negative:
        leader.delete_records(-2)
    assert negative.value.error is ErrorCode.OFFSET_OUT_OF_RANGE
    with pytest.raises(KafkaError) as not_leader:
        follower.delete_records(10)
    assert not_leader.value.error is ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert leader.log.log_start_offset == 0  # nothing changed
    assert leader.delete_records(25) == 25
    assert leader.log.log_start_offset == 25
    assert leader.low_watermark({1, 2}) == 0  # the follower has not heard of it
    assert leader.low_watermark({1}) == 25
    _fetch(follower, leader)  # the follower takes the leader's log start offset
    assert follower.log.log_start_offset == 25
    _fetch(follower, leader)  # and reports its own
    assert leader.low_watermark({1, 2}) == 25
    assert leader.delete_records(-1) == 40  # -1: up to the high watermark
    assert leader.log.log_start_offset == 40


def test_a_compacted_topic_refuses_delete_records(tmp_path: Path) -> None:
    leader = _replica(tmp_path, 1, **{"cleanup.policy": "compact"})
    leader.make_leader(PartitionRegistration((1,), (1,), 1, 1, 1))
    with pytest.raises(KafkaError) as refused:
        leader.delete_records(0)
    assert refused.value.error is ErrorCode.POLICY_VIOLATION
