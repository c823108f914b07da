"""The coordinators' shared machinery with a state that is not a group: a key-value table, the
shape of a transaction coordinator's ``transactional.id`` -> state. Real partitions on disk in a
real replica manager (one broker, RF 1), no network: a shard loads by replaying its partition,
writes answer once the high watermark covers them, a new runtime replays what the old one wrote,
and losing leadership drops the shard and abandons what it held back."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from dataplane.broker.partition import IsrChange
from dataplane.broker.replica_manager import ReplicaManager, ReplicaManagerConfig
from dataplane.coordinator.runtime import (
    Answers,
    CoordinatorRecord,
    CoordinatorRuntime,
    InternalTopic,
    Shard,
)
from metadata_quorum.image import (
    BrokerRegistration,
    MetadataImage,
    PartitionRegistration,
    TopicImage,
)
from metadata_quorum.records import Endpoint
from raftlog.errors import ErrorCode, KafkaError

TOPIC = "__consumer_offsets"  # an internal topic: producers can't write it
TOPIC_ID = uuid.uuid4()
PARTITIONS = 2
DEADLINE_S = 10.0


class Table:
    """A pure state: records in (replay), records out (take_emitted)."""

    def __init__(self) -> None:
        self.rows: dict[bytes, bytes] = {}
        self.emitted: list[CoordinatorRecord] = []
        self.held: Answers = []
        self.loaded_at_ms: int | None = None
        self.abandoned: list[ErrorCode] = []

    def put(self, key: bytes, value: bytes | None) -> None:
        self.replay(key, value)
        self.emitted.append((key, value))

    def hold(self, answer: str) -> Future[Any]:
        """A request answered only once what decided it is replicated."""
        future: Future[Any] = Future()
        self.held.append((future, answer))
        return future

    def replay(self, key: bytes, value: bytes | None) -> None:
        if value is None:
            self.rows.pop(key, None)
        else:
            self.rows[key] = value

    def take_emitted(self) -> list[CoordinatorRecord]:
        emitted, self.emitted = self.emitted, []
        return emitted

    def take_answers(self) -> Answers:
        held, self.held = self.held, []
        return held

    def fail_answers(self, answers: Answers, error: KafkaError) -> None:
        for future, _ in answers:
            future.set_exception(error)

    def on_loaded(self, now_ms: int) -> None:
        self.loaded_at_ms = now_ms

    def abandon(self, error: ErrorCode, message: str) -> None:
        self.abandoned.append(error)


def image(leader: int, created: bool = True) -> MetadataImage:
    endpoint = (Endpoint("BROKER", "127.0.0.1", 9092),)
    brokers = {b: BrokerRegistration(b, f"i{b}", 1, endpoint, None, fenced=False) for b in (1, 2)}
    if not created:
        return MetadataImage(offset=1, brokers=brokers)
    replicas = (1, 2) if leader == 2 else (1,)
    partitions = {
        p: PartitionRegistration(replicas, (leader,), leader, leader, leader)
        for p in range(PARTITIONS)
    }
    return MetadataImage(
        offset=leader,
        brokers=brokers,
        topics={TOPIC_ID: TopicImage(TOPIC, TOPIC_ID, partitions)},
        topic_ids={TOPIC: TOPIC_ID},
    )


def no_isr_change(change: IsrChange) -> None:
    raise AssertionError(f"no ISR change expected: {change}")


def no_failure(directory: Path, error: OSError) -> None:
    raise AssertionError(f"no log-dir failure expected: {directory}: {error}")


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[ReplicaManager]:
    manager = ReplicaManager(
        1, tmp_path, ReplicaManagerConfig(), lambda: 0, no_isr_change, no_failure
    )
    manager.apply_image(image(leader=1), caught_up=True)
    yield manager
    manager.close()


def runtime_for(
    replicas: ReplicaManager,
    created: list[tuple[str, int, int, Mapping[str, str]]] | None = None,
) -> CoordinatorRuntime[Table]:
    def create_topic(name: str, partitions: int, rf: int, configs: Mapping[str, str]) -> None:
        assert created is not None
        created.append((name, partitions, rf, configs))

    topic = InternalTopic(TOPIC, PARTITIONS, 1, {"cleanup.policy": "compact"}, "table.topic")
    runtime = CoordinatorRuntime(
        1, topic, replicas, Table, create_topic, lambda: 1_000, commit_timeout_ms=5_000
    )
    runtime.start()
    return runtime


def key_partition(key: bytes) -> Callable[[int], int]:
    return lambda count: key[0] % count


def loaded_shard(runtime: CoordinatorRuntime[Table], key: bytes) -> Shard[Table]:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            return runtime.shard(key_partition(key), f"key {key!r}")
        except KafkaError as error:
            if error.error is not ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                raise
            if time.monotonic() > deadline:
                raise AssertionError(f"{key!r}: shard not loaded in {DEADLINE_S} s") from error
            time.sleep(0.01)


def test_writes_are_replayed_by_the_next_runtime(replicas: ReplicaManager) -> None:
    first = runtime_for(replicas)
    try:
        first.on_image()
        shard = loaded_shard(first, b"a")
        assert shard.state.loaded_at_ms == 1_000
        first.run(shard, lambda t: t.put(b"a", b"1"))
        first.run(shard, lambda t: t.put(b"c", b"3"))  # b"c"[0] % 2 == b"a"[0] % 2
        first.run(shard, lambda t: t.put(b"c", None))  # a tombstone
        assert shard.partition.high_watermark >= shard.written_end == 3
        other = loaded_shard(first, b"b")
        first.run(other, lambda t: t.put(b"b", b"2"))
    finally:
        first.close()
    second = runtime_for(replicas)
    try:
        second.on_image()
        assert loaded_shard(second, b"a").state.rows == {b"a": b"1"}
        assert loaded_shard(second, b"b").state.rows == {b"b": b"2"}
    finally:
        second.close()


def test_held_back_answers_go_out_once_replicated(replicas: ReplicaManager) -> None:
    runtime = runtime_for(replicas)
    try:
        runtime.on_image()
        shard = loaded_shard(runtime, b"a")

        def decide(table: Table) -> Future[Any]:
            table.put(b"a", b"decided")
            return table.hold("the answer")

        future = runtime.run(shard, decide)
        assert future.result(timeout=0) == "the answer"
    finally:
        runtime.close()


def test_losing_leadership_drops_the_shard_and_abandons_its_requests(
    replicas: ReplicaManager,
) -> None:
    runtime = runtime_for(replicas)
    try:
        runtime.on_image()
        shard = loaded_shard(runtime, b"a")
        replicas.apply_image(image(leader=2), caught_up=True)
        runtime.on_image()
        assert shard.state.abandoned == [ErrorCode.NOT_COORDINATOR]
        with pytest.raises(KafkaError) as refused:
            runtime.shard(key_partition(b"a"), "key 'a'")
        assert refused.value.error is ErrorCode.NOT_COORDINATOR
        with pytest.raises(KafkaError) as moved:
            runtime.run(shard, lambda t: t.put(b"a", b"late"))
        assert moved.value.error is ErrorCode.NOT_COORDINATOR
    finally:
        runtime.close()


def test_the_first_lookup_creates_the_topic(tmp_path: Path) -> None:
    manager = ReplicaManager(
        1, tmp_path, ReplicaManagerConfig(), lambda: 0, no_isr_change, no_failure
    )
    manager.apply_image(image(leader=1, created=False), caught_up=True)
    created: list[tuple[str, int, int, Mapping[str, str]]] = []
    runtime = runtime_for(manager, created)
    try:
        with pytest.raises(KafkaError) as creating:
            runtime.coordinator(key_partition(b"a"))
        assert creating.value.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert created == [(TOPIC, PARTITIONS, 1, {"cleanup.policy": "compact"})]
        manager.apply_image(image(leader=1), caught_up=True)
        assert runtime.coordinator(key_partition(b"a")) == (1, "127.0.0.1", 9092)
    finally:
        runtime.close()
        manager.close()
