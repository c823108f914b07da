"""Followers' fetch sessions (KIP-227) between two brokers in one process: the leader's side
(dataplane/broker/follower_sessions.py, through BrokerService.fetch) and the follower's
(dataplane/broker/fetcher.py: the fetcher's own request building and answer handling, its
thread not started), on real replica managers and logs. The leader answers a full fetch with
a session; incremental fetches name only what moved and are answered only with what has
something to say; a partition with nothing new is not even read until it changes (or the
sweep comes); session errors and forgotten partitions work as Kafka's."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dataplane.broker.fetch_sessions import INITIAL_EPOCH, INVALID_SESSION_ID
from dataplane.broker.fetcher import FetcherConfig, FetcherThread, FetchState, FollowerSession
from dataplane.broker.follower_sessions import SWEEP_MS_MIN
from dataplane.broker.metrics import NodeMetrics
from dataplane.broker.partition import IsrChange, Partition
from dataplane.broker.replica_manager import ReplicaManager, ReplicaManagerConfig
from dataplane.broker.service import BrokerServicer, serve
from dataplane.tools.local_cluster import free_port, wait_for
from metadata_quorum.image import MetadataImage, PartitionRegistration, TopicImage
from protos import broker_pb2 as pb
from protos.wire import FetchAnswer, Records
from raftlog.errors import ErrorCode
from raftlog.records import encode_batch
from tests.dataplane.broker.test_replication_core import Clock

TOPIC = "sessions"
TOPIC_ID = uuid.UUID(int=227)
PARTITIONS = 4
LAG_MAX_MS = 10_000
HOST = "127.0.0.235"  # tests/dataplane/cluster_support.py RANGES "follower_sessions"


def image() -> MetadataImage:
    """Broker 1 leads partitions 0-3, broker 2 follows them."""
    partitions = {p: PartitionRegistration((1, 2), (1, 2), 1, 0, 0) for p in range(PARTITIONS)}
    return MetadataImage(
        offset=10, topics={TOPIC_ID: TopicImage(TOPIC, TOPIC_ID, partitions)},
        topic_ids={TOPIC: TOPIC_ID},
    )  # fmt: skip


def manager(tmp_path: Path, broker_id: int, clock: Clock) -> ReplicaManager:
    def alter(change: IsrChange) -> None:
        pass  # ISR changes are not under test here

    def failed(directory: Path, error: OSError) -> None:
        raise AssertionError(f"no log dir failure expected: {directory}: {error}")

    config = ReplicaManagerConfig(replica_lag_time_max_ms=LAG_MAX_MS)
    return ReplicaManager(broker_id, tmp_path / f"b{broker_id}", config, clock, alter, failed)


class Pair:
    """A leader's servicer and a follower's fetcher (not started: `round` is one turn of its
    loop, the fetch made in process instead of over gRPC)."""

    def __init__(self, tmp_path: Path, slots: int = 1000) -> None:
        self.clock = Clock()
        self.leader = manager(tmp_path, 1, self.clock)
        self.follower = manager(tmp_path, 2, self.clock)
        self.leader.apply_image(image(), caught_up=True)
        followed = self.follower.apply_image(image(), caught_up=True)
        self.service = BrokerServicer(
            1, self.leader, NodeMetrics(), "test", [], lambda c: None, lambda: 0,
            fetch_session_cache_slots=slots,
        )  # fmt: skip
        self.fetcher = FetcherThread(
            2, 1, lambda b: None, lambda: 10, FetcherConfig(replica_fetch_wait_max_ms=0),
            self.clock,
        )  # fmt: skip
        self.followed = followed[1]
        self.fetcher.set_partitions(self.followed)
        self.reads: list[int] = []  # the partitions the leader read, in order
        read = self.service.read_partition

        def counted(
            request: pb.FetchRequest, partition: Partition, item: pb.FetchPartition,
            max_bytes: int, first: bool, result: pb.FetchPartitionResponse,
        ) -> Records:  # fmt: skip
            self.reads.append(partition.partition)
            return read(request, partition, item, max_bytes, first, result)

        self.service.read_partition = counted  # type: ignore[method-assign]
        self.lookups: list[int] = []  # the partitions the leader looked up, in order
        lookup = self.service.lookup

        def looked_up(topic: str, partition: int) -> Partition:
            self.lookups.append(partition)
            return lookup(topic, partition)

        self.service.lookup = looked_up  # type: ignore[method-assign]

    def close(self) -> None:
        self.leader.close()
        self.follower.close()

    def round(self, max_wait_ms: int = 0) -> tuple[pb.FetchRequest, FetchAnswer]:
        ready, _, _ = self.fetcher._ready_partitions()
        request, sent = self.fetcher._request(ready)
        request.max_wait_ms = max_wait_ms
        self.reads.clear()
        self.lookups.clear()
        answer = self.service.fetch(request)
        if self.fetcher.session.answered(request, answer.response):
            self.fetcher._handle(answer, sent)
        return request, answer

    def produce(self, partition: int, *values: bytes) -> None:
        records = encode_batch([(None, v, 1_000_000, ()) for v in values], partition_leader_epoch=0)
        request = pb.ProduceRequest(acks=1, timeout_ms=5_000, topics=[pb.ProduceTopic(
            name=TOPIC, partitions=[pb.ProducePartition(partition=partition, records=records)],
        )])  # fmt: skip
        assert self.service.Produce(request, None).topics[0].partitions[0].error_code == 0

    def replica(self, broker: ReplicaManager, partition: int) -> Partition:
        return broker.get(TOPIC, partition)


def named(request: pb.FetchRequest) -> list[int]:
    return sorted(p.partition for t in request.topics for p in t.partitions)


def answered(answer: FetchAnswer) -> list[int]:
    return sorted(p.partition for t in answer.response.topics for p in t.partitions)


def forgotten(request: pb.FetchRequest) -> list[int]:
    return sorted(i for t in request.forgotten_topics for i in t.partitions)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    made = Pair(tmp_path)
    yield made
    made.close()


def settle(pair: Pair) -> None:
    """Rounds until one names nothing and is answered nothing."""
    for _ in range(6):
        request, answer = pair.round()
        if not named(request) and not answered(answer):
            return
    raise AssertionError("the session did not settle")


def test_the_follower_replicates_through_incremental_fetches(pair: Pair) -> None:
    for p in range(PARTITIONS):
        pair.produce(p, b"a%d" % p, b"b%d" % p)
    request, answer = pair.round()
    assert request.session_epoch == INITIAL_EPOCH and named(request) == [0, 1, 2, 3]
    assert answer.response.session_id != INVALID_SESSION_ID
    assert answered(answer) == [0, 1, 2, 3]  # a full fetch is answered in full
    # the follower asks from its new log ends: the leader's high watermarks move
    request, answer = pair.round()
    assert request.session_epoch == 1 and named(request) == [0, 1, 2, 3]
    assert answered(answer) == [0, 1, 2, 3]
    settle(pair)
    pair.produce(2, b"c2")
    request, answer = pair.round()
    assert named(request) == [] and answered(answer) == [2]  # only what has something to say
    settle(pair)
    for p in range(PARTITIONS):
        leader, follower = pair.replica(pair.leader, p), pair.replica(pair.follower, p)
        assert follower.log.log_end_offset == leader.log.log_end_offset == (3 if p == 2 else 2)
        assert follower.high_watermark == leader.high_watermark == leader.log.log_end_offset


def test_a_partition_with_nothing_new_is_not_read_until_it_changes_or_the_sweep(
    pair: Pair,
) -> None:
    pair.produce(0, b"x")
    settle(pair)
    pair.round()
    assert pair.reads == [] and pair.lookups == []  # settled: not even looked at
    pair.produce(1, b"y")
    pair.round()
    assert pair.reads == [1] and pair.lookups == [1]
    settle(pair)
    pair.clock.now_ms += max(SWEEP_MS_MIN, LAG_MAX_MS // 4)
    _, answer = pair.round()
    assert sorted(pair.reads) == [0, 1, 2, 3] and answered(answer) == []
    # the sweep read renews the follower's caught-up time, which the ISR is judged by
    leader = pair.replica(pair.leader, 3)
    assert leader.followers[2].last_caught_up_ms == pair.clock.now_ms


def parked_poll(pair: Pair) -> tuple[threading.Thread, list[FetchAnswer]]:
    """A round with a 20 s long poll on a thread, once the leader has parked it; its answer
    lands in the list."""
    done: list[FetchAnswer] = []
    poll = threading.Thread(target=lambda: done.append(pair.round(max_wait_ms=20_000)[1]))
    poll.start()
    deadline = time.monotonic() + 10
    while pair.service.follower_sessions.parked == 0:  # a condition polled with a deadline
        assert time.monotonic() < deadline, "the fetch did not wait"
        time.sleep(0.01)
    return poll, done


def test_a_long_poll_answers_as_soon_as_a_partition_of_the_session_is_appended(
    pair: Pair,
) -> None:
    settle(pair)
    poll, done = parked_poll(pair)
    started = time.monotonic()
    pair.produce(3, b"z")
    poll.join(15)
    assert done and answered(done[0]) == [3]
    assert time.monotonic() - started < 10  # woken, not at max_wait_ms
    assert pair.replica(pair.follower, 3).log.log_end_offset == 1


def test_a_parked_fetch_waits_on_its_session_not_on_each_partition(pair: Pair) -> None:
    """The long poll registers no waiter on the session's partitions (each change marks its
    partition in the sessions watching it); an append wakes it, and only the appended
    partition is looked up and read."""
    settle(pair)
    leaders = [pair.replica(pair.leader, p) for p in range(PARTITIONS)]
    assert [p.watcher_count for p in leaders] == [1] * PARTITIONS
    poll, done = parked_poll(pair)
    assert [p.waiter_count for p in leaders] == [0] * PARTITIONS
    pair.produce(2, b"w")
    poll.join(15)
    assert done and answered(done[0]) == [2] and pair.reads == [2]
    assert pair.lookups == [2]


def test_a_session_that_ends_stops_watching_its_partitions(pair: Pair) -> None:
    """A new session (the follower's full fetch closes its old one) watches each partition
    once; the old one's watches are gone."""
    settle(pair)
    old = pair.fetcher.session.id
    pair.fetcher.session.failed()  # the next fetch is full and closes the old session
    settle(pair)
    assert pair.fetcher.session.id != old
    leaders = [pair.replica(pair.leader, p) for p in range(PARTITIONS)]
    assert [p.watcher_count for p in leaders] == [1] * PARTITIONS
    pair.service.follower_sessions.cache.drop_stale(pair.clock.now_ms + 10**9)
    assert [p.watcher_count for p in leaders] == [0] * PARTITIONS


def test_the_same_partitions_again_keep_the_request_built_for_them(pair: Pair) -> None:
    """Every metadata update gives each fetcher its partitions again, and most change others'
    (an ISR elsewhere): the same set keeps the version and the request built, where a new
    version made the next request take every partition's state again (at 10,000 partitions a
    tenth of a broker's time under a stream of ISR changes)."""
    settle(pair)
    version, built = pair.fetcher._version, pair.fetcher._built
    assert built is not None
    pair.fetcher.set_partitions([pair.replica(pair.follower, p) for p in range(PARTITIONS)])
    assert (pair.fetcher._version, pair.fetcher._built) == (version, built)
    request, _ = pair.round()
    assert named(request) == [] and forgotten(request) == []
    pair.fetcher.set_partitions([pair.replica(pair.follower, p) for p in (0, 1)])
    assert pair.fetcher._version == version + 1


def test_partitions_the_follower_stops_fetching_are_forgotten(pair: Pair) -> None:
    settle(pair)
    pair.fetcher.set_partitions([pair.replica(pair.follower, p) for p in (0, 1)])
    request, _ = pair.round()
    assert forgotten(request) == [2, 3] and named(request) == []
    session = pair.service.follower_sessions.cache.get(request.session_id)
    assert session is not None and sorted(k[1] for k in session.partitions) == [0, 1]
    watchers = [pair.replica(pair.leader, p).watcher_count for p in range(PARTITIONS)]
    assert watchers == [1, 1, 0, 0]  # the forgotten ones are no longer watched
    pair.fetcher.set_partitions([pair.replica(pair.follower, p) for p in range(PARTITIONS)])
    request, answer = pair.round()
    assert named(request) == [2, 3] and forgotten(request) == []
    assert answered(answer) == [2, 3]  # new to the session: told in full


@pytest.mark.parametrize(
    ("tamper", "error"),
    [
        ("epoch", ErrorCode.INVALID_FETCH_SESSION_EPOCH),
        ("id", ErrorCode.FETCH_SESSION_ID_NOT_FOUND),
    ],
)
def test_a_session_error_is_answered_alone_and_the_follower_starts_a_new_session(
    pair: Pair, tamper: str, error: ErrorCode
) -> None:
    settle(pair)
    session = pair.fetcher.session
    old = session.id
    if tamper == "epoch":
        session.epoch += 5
    else:
        session.id = session.id % 1_000_000 + 1
    request, answer = pair.round()
    assert answer.response.error_code == error.code and answered(answer) == []
    assert pair.reads == []  # nothing read
    request, answer = pair.round()
    assert request.session_epoch == INITIAL_EPOCH and named(request) == [0, 1, 2, 3]
    assert answer.response.session_id not in (INVALID_SESSION_ID, old)


def test_without_session_slots_every_fetch_is_full(tmp_path: Path) -> None:
    pair = Pair(tmp_path, slots=0)
    try:
        pair.produce(0, b"x")
        for _ in range(3):
            request, answer = pair.round()
            assert request.session_epoch == INITIAL_EPOCH and named(request) == [0, 1, 2, 3]
            assert answer.response.session_id == INVALID_SESSION_ID
        assert pair.replica(pair.follower, 0).log.log_end_offset == 1
    finally:
        pair.close()


def test_the_follower_session_names_what_moved_and_starts_over_after_an_error() -> None:
    session = FollowerSession()
    a, b = ("t", 0), ("t", 1)
    states = {a: FetchState(0, -1, 0, 0), b: FetchState(0, -1, 0, 0)}
    full = pb.FetchRequest()
    session.build(full, states, 1024)
    assert named(full) == [0, 1] and full.session_epoch == INITIAL_EPOCH
    assert session.answered(full, pb.FetchResponse(session_id=7))
    moved = {a: FetchState(5, 0, 0, 0), b: states[b]}
    incremental = pb.FetchRequest()
    session.build(incremental, moved, 1024)
    assert (incremental.session_id, incremental.session_epoch) == (7, 1)
    assert named(incremental) == [0] and forgotten(incremental) == []
    # an answer of another session (a leader that did not keep it): the next fetch is full
    assert session.answered(incremental, pb.FetchResponse(session_id=0))
    again = pb.FetchRequest()
    session.build(again, {a: moved[a]}, 1024)
    assert (again.session_id, again.session_epoch) == (7, INITIAL_EPOCH)  # closes 7
    assert named(again) == [0] and forgotten(again) == []
    error = pb.FetchResponse(error_code=ErrorCode.FETCH_SESSION_ID_NOT_FOUND.code)
    assert not session.answered(again, error)
    assert session.epoch == INITIAL_EPOCH


def test_a_truncated_follower_names_the_partition_again_from_its_new_end(pair: Pair) -> None:
    """The fetcher reuses an unchanged partition's fetch state (its change count): a
    truncation, which wakes nobody, must still count as a change."""
    pair.produce(0, b"a", b"b")
    settle(pair)
    follower = pair.replica(pair.follower, 0)
    assert follower.log.log_end_offset == 2
    follower.truncate_to(0, follower.leader_epoch)
    request, answer = pair.round()
    fetched = [p for t in request.topics for p in t.partitions]
    assert [(p.partition, p.fetch_offset) for p in fetched] == [(0, 0)]
    assert answered(answer) == [0]
    settle(pair)
    assert follower.log.log_end_offset == 2


def test_the_fetcher_takes_the_state_of_only_the_partitions_that_changed(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a settled session the follower's request looks at no partition that did not change
    (``Partition.watch``): an append it fetched marks that partition, and only its fetch state
    is taken and named; a new partition set builds from every partition again (the same set
    again keeps what was built: test_the_same_partitions_again_keep_the_request_built_for_them)."""
    settle(pair)
    taken: list[int] = []
    for p in range(PARTITIONS):
        replica = pair.replica(pair.follower, p)
        original = replica.fetch_state

        def counted(original: Any = original, index: int = p) -> Any:
            taken.append(index)
            return original()

        monkeypatch.setattr(replica, "fetch_state", counted)
    request, answer = pair.round()
    assert taken == [] and named(request) == [] and answered(answer) == []
    pair.produce(1, b"m")
    request, answer = pair.round()  # brings the record: nothing of the follower moved yet
    assert taken == [] and answered(answer) == [1]
    request, _ = pair.round()  # the append marked partition 1: its new end is named
    assert taken == [1] and named(request) == [1]
    assert pair.replica(pair.follower, 1).log.log_end_offset == 1
    taken.clear()
    version = pair.fetcher._version
    pair.fetcher.set_partitions([pair.replica(pair.follower, p) for p in range(PARTITIONS - 1)])
    request, _ = pair.round()
    # built from every partition again (for the new set), naming none: nothing moved
    built = pair.fetcher._built
    assert built is not None and built.version == version + 1 == pair.fetcher._version
    assert sorted(built.states) == [(TOPIC, p) for p in range(PARTITIONS - 1)]
    assert named(request) == [] and forgotten(request) == [PARTITIONS - 1]


def test_a_fetch_waits_for_its_answer_as_long_as_replica_socket_timeout_ms() -> None:
    """Kafka's replica.socket.timeout.ms (30 s), never less than the long poll and a margin."""
    assert FetcherConfig().fetch_timeout_s == 30.0
    assert FetcherConfig(replica_socket_timeout_ms=1_000).fetch_timeout_s == 5.5
    assert FetcherConfig(replica_socket_timeout_ms=60_000).fetch_timeout_s == 60.0


def test_a_followers_new_session_replaces_the_ones_whose_answers_it_never_got(pair: Pair) -> None:
    """A full fetch whose answer the follower gave up on left a session on the leader it never
    used (a restarted follower once left 135 of 8,000 partitions each on its leader, each
    marked by every change): a follower's new session replaces its others."""
    settle(pair)
    cache = pair.service.follower_sessions.cache
    assert len(cache) == 1
    pair.fetcher.session.failed()
    ready, _, _ = pair.fetcher._ready_partitions()
    full, _ = pair.fetcher._request(ready)
    full.session_id = 0  # as if the old session's id were lost too: nothing closes it
    for _ in range(3):  # three answers the follower never got
        pair.service.fetch(full)
    assert len(cache) == 1 and cache.total_partitions == PARTITIONS


def test_a_catch_up_larger_than_grpc_s_default_message_limit_comes_over_the_wire(
    pair: Pair,
) -> None:
    """The fetcher's own thread and channel against the leader's servicer served over gRPC.
    Found at 10,000 partitions: a restarted leader's follower, 333 partitions behind, was
    answered 10 MiB (``replica.fetch.response.max.bytes``), over gRPC's default 4 MiB a
    message. The fetcher's channel had that default: RESOURCE_EXHAUSTED, a new session, the
    same answer again, every second, and the partitions stayed out of the ISR."""
    value = b"v" * (700 * 1024)
    for p in range(PARTITIONS):
        pair.produce(p, value)
        pair.produce(p, value)  # 1.4 MiB a partition, 5.6 MiB in all: over 4 MiB
    config = FetcherConfig(replica_fetch_max_bytes=2 * 1024 * 1024, replica_fetch_wait_max_ms=100)
    address = f"{HOST}:{free_port(HOST)}"
    server = serve(pair.service, address)
    fetcher = FetcherThread(2, 1, lambda b: address, lambda: 10, config, pair.clock)
    fetcher.set_partitions(pair.followed)
    fetcher.start()
    try:
        wait_for(
            "the follower to catch up",
            lambda: all(
                pair.replica(pair.follower, p).log.log_end_offset == 2 for p in range(PARTITIONS)
            ),
            timeout_s=20.0,
        )
    finally:
        fetcher.stop()
        fetcher.join(timeout=10)
        server.stop(grace=None)
