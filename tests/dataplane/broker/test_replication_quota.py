"""Replication throttles without processes: the quota's token bucket on a fake clock (table and
property), then the real shell around it: a replica manager that takes the rates and the
throttled replicas from a metadata image, a leader's Fetch that answers a throttled replica
empty while its quota is in debt, and a follower's fetcher that leaves throttled partitions out
of its request. A follower in the ISR is never throttled."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dataplane.broker.fetcher import FetcherConfig, FetcherThread
from dataplane.broker.metrics import NodeMetrics
from dataplane.broker.partition import IsrChange
from dataplane.broker.replica_manager import ReplicaManager, ReplicaManagerConfig
from dataplane.broker.replication_quota import (
    DELAY_MS_MAX,
    UNTHROTTLED_BYTES_PER_S,
    QuotaBucket,
    ReplicationQuota,
)
from dataplane.broker.service import BrokerServicer
from metadata_quorum.image import MetadataImage, PartitionRegistration, TopicImage
from metadata_quorum.records import ConfigResourceType
from protos import broker_pb2 as pb
from raftlog.records import encode_batch

KIB = 1024
MIB = 1024 * 1024


# -- the bucket --------------------------------------------------------------------------------
def test_a_full_bucket_lets_a_burst_through_then_holds_until_the_debt_is_paid() -> None:
    bucket = QuotaBucket(MIB, now_ms=0)  # 1 MiB/s, a burst of one second
    assert not bucket.exceeded(0)
    bucket.record(MIB, 0)  # the burst: spent, not in debt
    assert not bucket.exceeded(0)
    bucket.record(MIB, 0)  # a whole read on top: 1 MiB in debt
    assert bucket.exceeded(0)
    assert bucket.delay_ms(0) == DELAY_MS_MAX  # a second to pay, capped at the look-again time
    assert bucket.exceeded(500) and bucket.delay_ms(500) == 500
    assert not bucket.exceeded(1000) and bucket.delay_ms(1000) == 0
    assert bucket.tokens == 0


def test_the_credit_never_exceeds_the_burst() -> None:
    bucket = QuotaBucket(100 * KIB, now_ms=0, burst_ms=1000)
    assert not bucket.exceeded(3_600_000)  # an hour idle earns one second, not an hour
    bucket.record(100 * KIB + 1, 3_600_000)
    assert bucket.exceeded(3_600_000)


@pytest.mark.parametrize(
    ("rate", "recorded", "now_ms", "exceeded"),
    [
        (UNTHROTTLED_BYTES_PER_S, 10**15, 0, False),  # Kafka's default: never throttled
        (0, 1, 0, True),  # rate 0: the first read passes, then nothing
        (0, 0, 10**9, False),
        (KIB, 2 * KIB, 999, True),
        (KIB, 2 * KIB, 1000, False),
    ],
)
def test_when_a_quota_is_exceeded(rate: int, recorded: int, now_ms: int, exceeded: bool) -> None:
    bucket = QuotaBucket(rate, now_ms=0)
    bucket.record(recorded, 0)
    assert bucket.exceeded(now_ms) is exceeded


def test_a_new_rate_keeps_the_debt_and_cuts_the_credit() -> None:
    bucket = QuotaBucket(UNTHROTTLED_BYTES_PER_S, now_ms=0)
    bucket.set_rate(KIB, 10)  # throttled from now: a full bucket of the new rate
    assert bucket.tokens == KIB
    bucket.record(3 * KIB, 10)
    bucket.set_rate(2 * KIB, 10)  # faster: the debt (2 KiB) is paid in one second
    assert bucket.delay_ms(10) == 1000 and not bucket.exceeded(1010)
    bucket.set_rate(UNTHROTTLED_BYTES_PER_S, 1010)
    bucket.record(10**12, 1010)
    assert not bucket.exceeded(1010)


def test_a_clock_that_steps_back_earns_nothing() -> None:
    bucket = QuotaBucket(KIB, now_ms=5000)
    bucket.record(2 * KIB, 5000)
    assert bucket.exceeded(4000) and bucket.exceeded(5999) and not bucket.exceeded(6000)


@given(
    rate=st.integers(1, 10 * MIB),
    steps=st.lists(st.tuples(st.integers(0, 300), st.integers(1, MIB)), max_size=200),
)
def test_a_reader_moves_at_most_a_burst_plus_the_rate_plus_one_read(
    rate: int, steps: list[tuple[int, int]]
) -> None:
    """Whoever reads whenever the quota allows, however often and however much: by any time T
    at most one burst + rate x T + one read has moved."""
    bucket = QuotaBucket(rate, now_ms=0)
    now_ms = moved = read_max = 0
    for elapsed_ms, size in steps:
        now_ms += elapsed_ms
        if not bucket.exceeded(now_ms):
            bucket.record(size, now_ms)
            moved += size
            read_max = max(read_max, size)
        assert moved * 1000 <= rate * 1000 + rate * now_ms + read_max * 1000


def test_a_reader_that_always_asks_gets_the_rate() -> None:
    """The bound is reached: reading 64 KiB whenever allowed, every 10 ms for a minute."""
    bucket = QuotaBucket(MIB, now_ms=0)
    moved = 0
    for now_ms in range(0, 60_000, 10):
        if not bucket.exceeded(now_ms):
            bucket.record(64 * KIB, now_ms)
            moved += 64 * KIB
    assert 60 * MIB <= moved <= 62 * MIB


# -- the shell on a broker -------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


TOPIC = "moving"
TOPIC_ID = uuid.UUID(int=26)


def image(
    isr: tuple[int, ...],
    leader: int = 1,
    broker_configs: dict[str, dict[str, str]] | None = None,
    topic_configs: dict[str, str] | None = None,
) -> MetadataImage:
    """Partition 0 on brokers 1, 2 and 3 (3 being added), partition 1 on 1 and 2 only."""
    partitions = {
        0: PartitionRegistration((1, 2, 3), isr, leader, 0, 0, adding_replicas=(3,)),
        1: PartitionRegistration((1, 2), (1, 2), leader, 0, 0),
    }
    configs = {(ConfigResourceType.BROKER, k): v for k, v in (broker_configs or {}).items()}
    configs[(ConfigResourceType.TOPIC, TOPIC)] = topic_configs or {}
    return MetadataImage(
        offset=10,
        topics={TOPIC_ID: TopicImage(TOPIC, TOPIC_ID, partitions)},
        topic_ids={TOPIC: TOPIC_ID},
        configs=configs,
    )


def manager(tmp_path: Path, broker_id: int, clock: Clock) -> ReplicaManager:
    def alter(change: IsrChange) -> None:
        pass  # the ISR changes a leader proposes are not under test here

    def failed(directory: Path, error: OSError) -> None:
        raise AssertionError(f"no log dir failure expected: {directory}: {error}")

    return ReplicaManager(
        broker_id, tmp_path / f"broker-{broker_id}", ReplicaManagerConfig(), clock, alter, failed
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def leader(tmp_path: Path, clock: Clock) -> Iterator[ReplicaManager]:
    replicas = manager(tmp_path, 1, clock)
    yield replicas
    replicas.close()


THROTTLED = {
    "leader.replication.throttled.replicas": "0:1,0:2",
    "follower.replication.throttled.replicas": "0:3",
}
RATES = {"leader.replication.throttled.rate": str(64 * KIB)}


def test_the_image_sets_the_rates_and_which_replicas_are_throttled(
    leader: ReplicaManager, tmp_path: Path, clock: Clock
) -> None:
    assert leader.leader_quota.rate_bytes_per_s == UNTHROTTLED_BYTES_PER_S
    leader.apply_image(
        image((1, 2), broker_configs={"": {**RATES, "follower.replication.throttled.rate": "9"},
                                      "1": {"follower.replication.throttled.rate": "7"}},
              topic_configs=THROTTLED),
        caught_up=True,
    )  # fmt: skip
    assert leader.leader_quota.rate_bytes_per_s == 64 * KIB  # the cluster-wide default
    assert leader.follower_quota.rate_bytes_per_s == 7  # its own over the default
    moving, staying = leader.get(TOPIC, 0), leader.get(TOPIC, 1)
    assert (moving.leader_throttled, moving.follower_throttled) == (True, False)
    assert (staying.leader_throttled, staying.follower_throttled) == (False, False)
    assert moving.leader_throttles(3) and not moving.leader_throttles(2), "2 is in the ISR"
    assert not staying.leader_throttles(2)
    leader.apply_image(image((1, 2, 3)), caught_up=True)  # throttles removed, 3 caught up
    assert leader.leader_quota.rate_bytes_per_s == UNTHROTTLED_BYTES_PER_S
    assert not moving.leader_throttled

    follower = manager(tmp_path, 3, clock)
    try:
        followed = follower.apply_image(image((1, 2), topic_configs=THROTTLED), caught_up=True)
        [partition] = followed[1]
        assert partition.follower_throttled and partition.follower_throttles()
        follower.apply_image(image((1, 2, 3), topic_configs=THROTTLED), caught_up=True)
        assert partition.follower_throttled and not partition.follower_throttles(), "in the ISR"
    finally:
        follower.close()


def fetch_request(replica_id: int, max_wait_ms: int = 0) -> pb.FetchRequest:
    return pb.FetchRequest(
        replica_id=replica_id, max_wait_ms=max_wait_ms, max_bytes=10 * MIB,
        topics=[pb.FetchTopic(name=TOPIC, partitions=[
            pb.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=MIB,
                              last_fetched_epoch=-1, current_leader_epoch=0),
        ])],
    )  # fmt: skip


def test_the_leader_answers_a_throttled_replica_empty_while_its_quota_is_in_debt(
    leader: ReplicaManager, clock: Clock
) -> None:
    leader.apply_image(image((1, 2), broker_configs={"1": RATES}, topic_configs=THROTTLED), True)
    partition = leader.get(TOPIC, 0)
    for n in range(4):  # 4 batches of 40 KiB
        partition.append_as_leader(encode_batch([(None, bytes([n]) * 40 * KIB, 0, ())]), 1, 1)
    servicer = BrokerServicer(1, leader, NodeMetrics(), "test", [], lambda c: None, lambda: 0)

    def fetched(replica_id: int) -> int:
        answer = servicer.fetch(fetch_request(replica_id))
        [[item]] = [t.partitions for t in answer.response.topics]
        assert item.error_code == 0 and item.log_end_offset == 4
        return len(answer.records[0])

    assert fetched(3) > 160 * KIB, "a full bucket (64 KiB): the whole read goes"
    assert fetched(3) == 0, "in debt (about 100 KiB): nothing"
    started = time.monotonic()
    long_poll = servicer.fetch(fetch_request(3, max_wait_ms=30_000))
    assert len(long_poll.records[0]) == 0
    assert time.monotonic() - started < 15, "answered when the quota allows (1 s), not at 30 s"
    assert fetched(2) > 160 * KIB, "the ISR follower is never throttled"
    clock.now_ms += 1000  # 64 KiB paid back: still in debt
    assert fetched(3) == 0
    clock.now_ms += 1000
    assert fetched(3) > 160 * KIB
    gauge = leader.leader_quota.gauge()
    assert gauge.held_back >= 3 and gauge.throttled_bytes > 320 * KIB


def test_the_follower_leaves_throttled_partitions_out_while_its_quota_is_in_debt(
    tmp_path: Path, clock: Clock
) -> None:
    follower = manager(tmp_path, 3, clock)
    topic_configs = {**THROTTLED, "follower.replication.throttled.replicas": "*"}
    partitions = dict(image((1, 2), topic_configs=topic_configs).topics[TOPIC_ID].partitions)
    partitions[1] = PartitionRegistration((1, 3), (1,), 1, 0, 0)  # another one 3 catches up on
    partitions[2] = PartitionRegistration((1, 3), (1, 3), 1, 0, 0)  # and one it is in sync on
    throttled = image((1, 2), topic_configs=topic_configs)
    throttled = MetadataImage(
        offset=10, topics={TOPIC_ID: TopicImage(TOPIC, TOPIC_ID, partitions)},
        topic_ids=throttled.topic_ids, configs=throttled.configs,
    )  # fmt: skip
    quota = ReplicationQuota("follower", clock)
    quota.set_rate(64 * KIB)
    fetcher = FetcherThread(
        3, 1, lambda broker_id: None, lambda: 0, FetcherConfig(), clock, quota
    )  # never started: its choice of partitions is under test
    try:
        fetcher.set_partitions(follower.apply_image(throttled, caught_up=True)[1])

        def fetched() -> list[int]:
            ready, _wait_ms, _quota_wait_ms = fetcher._ready_partitions()
            return sorted(p.partition for p in ready)

        assert fetched() == [0, 1, 2]
        quota.record(200 * KIB)  # what the last fetch brought of throttled partitions
        assert fetched() == [2], "only the in-sync replica is fetched while in debt"
        _ready, wait_ms, quota_wait_ms = fetcher._ready_partitions()
        assert quota_wait_ms == wait_ms == DELAY_MS_MAX
        clock.now_ms += 3000  # the debt of 136 KiB is paid in 2.1 s
        assert fetched() == [0, 1, 2]
    finally:
        follower.close()
