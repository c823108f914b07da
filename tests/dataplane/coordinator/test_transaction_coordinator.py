"""The transaction coordinator's shell on one broker: real ``__transaction_state`` partitions in a
real replica manager (RF 1), partition leaders faked at the WriteTxnMarkers boundary (what each
leader answers is scripted), an injected clock. The pure state is tested in
test_transaction_state.py; here: requests reach it through the runtime, markers go to each
partition's leader with the coordinator epoch and are retried until written, the transaction is
then completed, timers abort and expire, a new coordinator finishes what the old one prepared,
and the gRPC servicer and the KIP-890 verifier answer with Kafka's codes."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dataplane.broker.partition import IsrChange
from dataplane.broker.replica_manager import ReplicaManager, ReplicaManagerConfig
from dataplane.coordinator.transaction_coordinator import (
    MARKER_WORKERS,
    TransactionConfig,
    TransactionCoordinator,
    TransactionServicer,
)
from dataplane.coordinator.transaction_markers import (
    TRANSACTION_STATE_TOPIC,
    Channels,
    Outcome,
    TransactionVerifier,
    marker_outcome,
)
from dataplane.coordinator.transaction_state import TxnMetadata
from metadata_quorum.image import (
    BrokerRegistration,
    MetadataImage,
    PartitionRegistration,
    TopicImage,
)
from metadata_quorum.records import Endpoint
from protos import broker_pb2 as pb
from protos import transaction_pb2 as tpb
from raftlog.errors import ErrorCode, KafkaError

STATE_ID, ORDERS_ID = uuid.uuid4(), uuid.uuid4()
ORDERS = "orders"
DEADLINE_S = 20.0
E = ErrorCode


def image(orders: bool = True, state_epoch: int = 1) -> MetadataImage:
    """Broker 1 (this one) leads both ``__transaction_state`` partitions and orders-0; broker 2
    leads orders-1 and orders-2."""
    brokers = {
        b: BrokerRegistration(b, f"i{b}", 1, (Endpoint("BROKER", "127.0.0.1", 9000 + b),), None,
                              fenced=False)
        for b in (1, 2)
    }  # fmt: skip
    state = {p: PartitionRegistration((1,), (1,), 1, state_epoch, state_epoch) for p in range(2)}
    topics = {STATE_ID: TopicImage(TRANSACTION_STATE_TOPIC, STATE_ID, state)}
    topic_ids = {TRANSACTION_STATE_TOPIC: STATE_ID}
    if orders:
        leaders = {0: 1, 1: 2, 2: 2}
        topics[ORDERS_ID] = TopicImage(ORDERS, ORDERS_ID, {
            p: PartitionRegistration((leader,), (leader,), leader, 3, 3)
            for p, leader in leaders.items()
        })  # fmt: skip
        topic_ids[ORDERS] = ORDERS_ID
    return MetadataImage(offset=state_epoch, brokers=brokers, topics=topics, topic_ids=topic_ids)


def no_isr_change(change: IsrChange) -> None:
    raise AssertionError(f"no ISR change expected: {change}")


def no_failure(directory: Path, error: OSError) -> None:
    raise AssertionError(f"no log-dir failure expected: {directory}: {error}")


@dataclass
class Leaders:
    """The partition leaders' WriteTxnMarkers: each answer scripted per partition (``script``:
    in turn, then NONE; ``always``: every time), every request recorded."""

    script: dict[tuple[str, int], list[ErrorCode]] = field(default_factory=dict)
    always: dict[tuple[str, int], ErrorCode] = field(default_factory=dict)
    requests: list[tuple[int, pb.TxnMarker]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(
        self, leader: int, request: pb.WriteTxnMarkersRequest
    ) -> pb.WriteTxnMarkersResponse:
        response = pb.WriteTxnMarkersResponse()
        with self.lock:
            for marker in request.markers:
                self.requests.append((leader, marker))
                out = response.markers.add(producer_id=marker.producer_id)
                for topic in marker.topics:
                    answered = out.topics.add(name=topic.name)
                    for partition in topic.partitions:
                        tp = (topic.name, partition)
                        queued = self.script.get(tp) or [self.always.get(tp, E.NONE)]
                        error = queued.pop(0)
                        answered.partitions.add(partition=partition, error_code=error.code)
        return response

    def written(self) -> list[tuple[int, str, int, bool, int, int]]:
        """(leader, topic, partition, committed, producer epoch, coordinator epoch) asked."""
        with self.lock:
            return [
                (leader, t.name, p, m.committed, m.producer_epoch, m.coordinator_epoch)
                for leader, m in self.requests
                for t in m.topics
                for p in t.partitions
            ]


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


@dataclass
class Node:
    replicas: ReplicaManager
    clock: Clock
    leaders: Leaders
    config: TransactionConfig
    coordinators: list[TransactionCoordinator] = field(default_factory=list)
    producer_ids: Iterator[int] = field(default_factory=lambda: iter(range(5000, 6000)))

    def coordinator(self, leaders: Leaders | None = None) -> TransactionCoordinator:
        coordinator = TransactionCoordinator(
            1, self.config, self.replicas, self._create_topic, lambda: next(self.producer_ids),
            self.clock, self._no_local_call, send_markers=leaders or self.leaders,
        )  # fmt: skip
        coordinator.start()
        coordinator.on_image()
        self.coordinators.append(coordinator)
        return coordinator

    @staticmethod
    def _create_topic(*args: Any) -> None:
        raise AssertionError("the topic exists")

    @staticmethod
    def _no_local_call(request: pb.WriteTxnMarkersRequest) -> pb.WriteTxnMarkersResponse:
        raise AssertionError("markers go through the fake leaders")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    replicas = ReplicaManager(
        1, tmp_path, ReplicaManagerConfig(), lambda: 0, no_isr_change, no_failure
    )
    replicas.apply_image(image(), caught_up=True)
    config = TransactionConfig(abort_timed_out_interval_ms=20, max_timeout_ms=60_000)
    built = Node(replicas, Clock(), Leaders(), config)
    yield built
    for coordinator in built.coordinators:
        coordinator.close()
    replicas.close()


def wait_until(what: str, condition: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            found = condition()
        except KafkaError as error:
            if not error.retriable:
                raise
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_S} s: {what}")
        time.sleep(0.01)


def init(
    coordinator: TransactionCoordinator, tid: str, timeout_ms: int = 30_000
) -> tuple[int, int]:
    result: tuple[int, int] = wait_until(
        f"{tid} initialised", lambda: coordinator.init_producer_id(tid, timeout_ms)
    )
    return result


def state_of(coordinator: TransactionCoordinator, tid: str, state: str) -> TxnMetadata:
    def reached() -> TxnMetadata | None:
        meta = coordinator.describe(tid)
        return meta if meta.state.kafka_name == state else None

    found: TxnMetadata = wait_until(f"{tid} in {state}", reached)
    return found


def test_commit_writes_a_marker_on_every_partition_then_completes(node: Node) -> None:
    coordinator = node.coordinator()
    pid, epoch = init(coordinator, "t1")
    assert (pid, epoch) == (5000, 0)
    added = coordinator.add_partitions("t1", pid, epoch, [(ORDERS, 0), (ORDERS, 1)])
    assert added == {(ORDERS, 0): E.NONE, (ORDERS, 1): E.NONE}
    assert coordinator.describe("t1").state.kafka_name == "Ongoing"
    coordinator.end_transaction("t1", pid, epoch, commit=True)
    done = state_of(coordinator, "t1", "CompleteCommit")
    assert done.partitions == frozenset()
    # one request per leader, the coordinator epoch is the __transaction_state leader epoch
    assert sorted(node.leaders.written()) == [
        (1, ORDERS, 0, True, 0, 1),
        (2, ORDERS, 1, True, 0, 1),
    ]
    # the next transaction of the same producer starts from Empty
    coordinator.add_partitions("t1", pid, epoch, [(ORDERS, 2)])
    coordinator.end_transaction("t1", pid, epoch, commit=False)
    state_of(coordinator, "t1", "CompleteAbort")
    assert (2, ORDERS, 2, False, 0, 1) in node.leaders.written()


def test_retriable_answers_are_retried_until_written(node: Node) -> None:
    node.leaders.script[(ORDERS, 1)] = [E.NOT_LEADER_OR_FOLLOWER, E.REQUEST_TIMED_OUT,
                                        E.NOT_ENOUGH_REPLICAS]  # fmt: skip
    coordinator = node.coordinator()
    pid, epoch = init(coordinator, "t2")
    coordinator.add_partitions("t2", pid, epoch, [(ORDERS, 0), (ORDERS, 1)])
    coordinator.end_transaction("t2", pid, epoch, commit=True)
    with pytest.raises(KafkaError) as busy:  # until complete, the producer waits
        coordinator.add_partitions("t2", pid, epoch, [(ORDERS, 0)])
    assert busy.value.error is E.CONCURRENT_TRANSACTIONS
    state_of(coordinator, "t2", "CompleteCommit")
    asked = [w for w in node.leaders.written() if w[1:3] == (ORDERS, 1)]
    assert len(asked) == 4
    assert len([w for w in node.leaders.written() if w[1:3] == (ORDERS, 0)]) == 1


def test_markers_that_cannot_be_written_hold_no_worker(node: Node) -> None:
    node.leaders.always[(ORDERS, 1)] = E.NOT_LEADER_OR_FOLLOWER  # a leader that never settles
    coordinator = node.coordinator()
    for n in range(MARKER_WORKERS + 2):
        pid, epoch = init(coordinator, f"stuck-{n}")
        coordinator.add_partitions(f"stuck-{n}", pid, epoch, [(ORDERS, 1)])
        coordinator.end_transaction(f"stuck-{n}", pid, epoch, commit=True)
    pid, epoch = init(coordinator, "free")
    coordinator.add_partitions("free", pid, epoch, [(ORDERS, 0)])
    coordinator.end_transaction("free", pid, epoch, commit=True)
    state_of(coordinator, "free", "CompleteCommit")
    assert coordinator.describe("stuck-0").state.kafka_name == "PrepareCommit"


def test_a_fenced_marker_abandons_the_job(node: Node) -> None:
    node.leaders.always[(ORDERS, 1)] = E.INVALID_PRODUCER_EPOCH
    coordinator = node.coordinator()
    pid, epoch = init(coordinator, "t3")
    coordinator.add_partitions("t3", pid, epoch, [(ORDERS, 1)])
    coordinator.end_transaction("t3", pid, epoch, commit=True)
    wait_until("the marker refused", node.leaders.written)

    def stopped() -> bool:
        tasks = list(coordinator._tasks.values())
        return len(tasks) == 1 and tasks[0].finished and not tasks[0].running

    wait_until("the task stopped", stopped)
    coordinator._take_up_prepared()  # a scan: the refused transaction is not taken up again
    assert coordinator._start_due_rounds(time.monotonic()) > 0 and stopped()
    assert len(node.leaders.written()) == 1
    assert coordinator.describe("t3").state.kafka_name == "PrepareCommit"


def test_a_deleted_topic_needs_no_marker(node: Node) -> None:
    coordinator = node.coordinator()
    pid, epoch = init(coordinator, "t4")
    coordinator.add_partitions("t4", pid, epoch, [(ORDERS, 0), (ORDERS, 1)])
    node.replicas.apply_image(image(orders=False), caught_up=True)
    coordinator.on_image()
    coordinator.end_transaction("t4", pid, epoch, commit=False)
    state_of(coordinator, "t4", "CompleteAbort")
    assert node.leaders.written() == []


def test_add_partitions_to_an_unknown_topic_adds_nothing(node: Node) -> None:
    coordinator = node.coordinator()
    pid, epoch = init(coordinator, "t5")
    results = coordinator.add_partitions("t5", pid, epoch, [(ORDERS, 0), (ORDERS, 9), ("nope", 0)])
    assert results == {
        (ORDERS, 0): E.OPERATION_NOT_ATTEMPTED,
        (ORDERS, 9): E.UNKNOWN_TOPIC_OR_PARTITION,
        ("nope", 0): E.UNKNOWN_TOPIC_OR_PARTITION,
    }
    meta = coordinator.describe("t5")
    assert (meta.state.kafka_name, meta.partitions) == ("Empty", frozenset())


def test_a_second_init_fences_the_first_producer(node: Node) -> None:
    coordinator = node.coordinator()
    pid, old = init(coordinator, "t6")
    coordinator.add_partitions("t6", pid, old, [(ORDERS, 0)])
    # the ongoing transaction is aborted with the bumped epoch; the new producer retries
    with pytest.raises(KafkaError) as retry:
        coordinator.init_producer_id("t6", 30_000)
    assert retry.value.error is E.CONCURRENT_TRANSACTIONS
    state_of(coordinator, "t6", "CompleteAbort")
    assert (1, ORDERS, 0, False, old + 1, 1) in node.leaders.written()
    assert init(coordinator, "t6") == (pid, old + 2)
    for call in (
        lambda: coordinator.add_partitions("t6", pid, old, [(ORDERS, 1)]),
        lambda: coordinator.end_transaction("t6", pid, old, commit=True),
        lambda: coordinator.add_offsets("t6", pid, old, "billing"),
    ):
        with pytest.raises(KafkaError) as fenced:
            call()
        assert fenced.value.error is E.PRODUCER_FENCED


def test_bad_input_gets_kafkas_codes(node: Node) -> None:
    coordinator = node.coordinator()
    init(coordinator, "t7")
    cases: list[tuple[Callable[[], Any], ErrorCode]] = [
        (lambda: coordinator.end_transaction("unknown", 1, 0, commit=True),
         E.INVALID_PRODUCER_ID_MAPPING),
        (lambda: coordinator.init_producer_id("t7", 60_001), E.INVALID_TRANSACTION_TIMEOUT),
        (lambda: coordinator.init_producer_id("t8", 0), E.INVALID_TRANSACTION_TIMEOUT),
        (lambda: coordinator.describe("unknown"), E.TRANSACTIONAL_ID_NOT_FOUND),
        (lambda: coordinator.end_transaction("t7", 5000, 0, commit=True), E.INVALID_TXN_STATE),
        (lambda: coordinator.init_producer_id("", 1000), E.INVALID_REQUEST),
    ]  # fmt: skip
    for call, expected in cases:
        with pytest.raises(KafkaError) as refused:
            call()
        assert refused.value.error is expected, refused.value


def test_a_broker_that_leads_nothing_is_not_the_coordinator(node: Node) -> None:
    coordinator = node.coordinator()
    init(coordinator, "t9")
    moved = image(state_epoch=2)
    node.replicas.apply_image(
        MetadataImage(offset=5, brokers=moved.brokers, topics={
            STATE_ID: TopicImage(TRANSACTION_STATE_TOPIC, STATE_ID, {
                p: PartitionRegistration((2,), (2,), 2, 2, 2) for p in range(2)}),
            ORDERS_ID: moved.topics[ORDERS_ID],
        }, topic_ids=moved.topic_ids),
        caught_up=True,
    )  # fmt: skip
    coordinator.on_image()
    with pytest.raises(KafkaError) as refused:
        coordinator.describe("t9")
    assert refused.value.error is E.NOT_COORDINATOR
    assert coordinator.find_coordinator("t9") == (2, "127.0.0.1", 9002)


def test_a_transaction_left_open_past_its_timeout_is_aborted(node: Node) -> None:
    coordinator = node.coordinator()
    pid, epoch = init(coordinator, "slow", timeout_ms=5_000)
    coordinator.add_partitions("slow", pid, epoch, [(ORDERS, 2)])
    node.clock.now_ms += 5_001
    aborted = state_of(coordinator, "slow", "CompleteAbort")
    assert aborted.producer_epoch == epoch + 1  # the producer is fenced
    assert node.leaders.written() == [(2, ORDERS, 2, False, epoch + 1, 1)]
    with pytest.raises(KafkaError) as fenced:
        coordinator.end_transaction("slow", pid, epoch, commit=True)
    assert fenced.value.error is E.PRODUCER_FENCED


def test_idle_ids_expire(node: Node) -> None:
    node.config = TransactionConfig(remove_expired_interval_ms=20, id_expiration_ms=10_000)
    coordinator = node.coordinator()
    init(coordinator, "idle")
    node.clock.now_ms += 10_001
    wait_until("idle expired", lambda: not coordinator.list_transactions().transactions)
    with pytest.raises(KafkaError) as gone:
        coordinator.describe("idle")
    assert gone.value.error is E.TRANSACTIONAL_ID_NOT_FOUND


def test_a_new_coordinator_finishes_the_markers_of_the_old(node: Node) -> None:
    stuck = Leaders(always={(ORDERS, 1): E.NOT_LEADER_OR_FOLLOWER})  # never written
    first = node.coordinator(stuck)
    pid, epoch = init(first, "t10")
    first.add_partitions("t10", pid, epoch, [(ORDERS, 0), (ORDERS, 1)])
    first.end_transaction("t10", pid, epoch, commit=True)
    wait_until("a retry", lambda: len(stuck.written()) >= 3)
    assert first.describe("t10").state.kafka_name == "PrepareCommit"
    first.close()
    node.coordinators.remove(first)
    second = node.coordinator()
    state_of(second, "t10", "CompleteCommit")
    assert sorted(node.leaders.written()) == [
        (1, ORDERS, 0, True, 0, 1),
        (2, ORDERS, 1, True, 0, 1),
    ]


def test_listing_filters_by_state_producer_and_duration(node: Node) -> None:
    coordinator = node.coordinator()
    a, epoch = init(coordinator, "a")
    b, _ = init(coordinator, "b")
    coordinator.add_partitions("a", a, epoch, [(ORDERS, 0)])
    node.clock.now_ms += 1_000
    listed = coordinator.list_transactions()
    assert [(m.transactional_id, m.state.kafka_name) for m in listed.transactions] == [
        ("a", "Ongoing"), ("b", "Empty")]  # fmt: skip
    ongoing = coordinator.list_transactions(["Ongoing", "Bogus"])
    assert [m.transactional_id for m in ongoing.transactions] == ["a"]
    assert ongoing.unknown_state_filters == ["Bogus"]
    assert coordinator.list_transactions(["Bogus"]).transactions == []
    assert [
        m.transactional_id for m in coordinator.list_transactions(producer_ids=[b]).transactions
    ] == ["b"]
    assert [
        m.transactional_id for m in coordinator.list_transactions(duration_ms=999).transactions
    ] == ["a"]
    assert coordinator.list_transactions(duration_ms=1_000).transactions == []


def test_the_servicer_answers_in_kafkas_shape(node: Node) -> None:
    servicer = TransactionServicer(node.coordinator())
    wait_until("loaded", lambda: not servicer.coordinator.runtime.loading()
               and list(servicer.coordinator.runtime.loaded_shards()))  # fmt: skip
    first = servicer.init_producer_id(
        pb.InitProducerIdRequest(transactional_id="s", transaction_timeout_ms=10_000)
    )
    assert (first.error_code, first.producer_epoch) == (0, 0)
    bumped = servicer.init_producer_id(pb.InitProducerIdRequest(
        transactional_id="s", transaction_timeout_ms=10_000, producer_id=first.producer_id,
        producer_epoch=0))  # fmt: skip
    assert (bumped.error_code, bumped.producer_id, bumped.producer_epoch) == (
        0,
        first.producer_id,
        1,
    )
    retried = servicer.init_producer_id(pb.InitProducerIdRequest(  # KIP-360: a retried bump
        transactional_id="s", transaction_timeout_ms=10_000, producer_id=first.producer_id,
        producer_epoch=0))  # fmt: skip
    assert (retried.error_code, retried.producer_epoch) == (0, 1)
    pid = first.producer_id

    def add(
        *tps: tuple[str, int], verify: bool = False, epoch: int = 1
    ) -> tpb.AddPartitionsToTxnResponse:
        return servicer.AddPartitionsToTxn(tpb.AddPartitionsToTxnRequest(
            transactional_id="s", producer_id=pid, producer_epoch=epoch, verify_only=verify,
            topics=[tpb.TopicPartitions(topic=t, partitions=[p]) for t, p in tps],
        ), None)  # fmt: skip

    def codes(response: tpb.AddPartitionsToTxnResponse) -> list[tuple[str, int, str]]:
        return [(r.topic, r.partition, E.from_code(r.error_code).name) for r in response.results]

    assert codes(add((ORDERS, 0), ("gone", 1))) == [
        ("gone", 1, "UNKNOWN_TOPIC_OR_PARTITION"),
        (ORDERS, 0, "OPERATION_NOT_ATTEMPTED"),
    ]
    assert codes(add((ORDERS, 0))) == [(ORDERS, 0, "NONE")]
    assert codes(add((ORDERS, 0), (ORDERS, 1), verify=True)) == [
        (ORDERS, 0, "NONE"), (ORDERS, 1, "INVALID_TXN_STATE")]  # fmt: skip
    fenced = add((ORDERS, 1), epoch=0)
    assert E.from_code(fenced.error_code) is E.PRODUCER_FENCED
    assert codes(fenced) == [(ORDERS, 1, "PRODUCER_FENCED")]
    offsets = servicer.AddOffsetsToTxn(tpb.AddOffsetsToTxnRequest(
        transactional_id="s", producer_id=pid, producer_epoch=1, group_id="billing",
    ), None)  # fmt: skip
    assert offsets.error_code == 0
    described = servicer.DescribeTransactions(
        tpb.DescribeTransactionsRequest(transactional_ids=["s", "nobody"]), None
    )
    s, nobody = described.transactions
    assert (s.state, s.producer_id, s.producer_epoch, s.transaction_timeout_ms) == (
        "Ongoing", pid, 1, 10_000)  # fmt: skip
    assert [(t.topic, list(t.partitions)) for t in s.topics][-1] == (ORDERS, [0])
    assert s.topics[0].topic == "__consumer_offsets"
    assert E.from_code(nobody.error_code) is E.TRANSACTIONAL_ID_NOT_FOUND
    ended = servicer.EndTxn(tpb.EndTxnRequest(transactional_id="s", producer_id=pid,
                                              producer_epoch=1, committed=True), None)  # fmt: skip
    assert ended.error_code == 0
    listed = servicer.ListTransactions(tpb.ListTransactionsRequest(state_filters=["Nope"]), None)
    assert (list(listed.unknown_state_filters), len(listed.transactions)) == (["Nope"], 0)


def test_the_verifier_answers_what_a_produce_response_may_carry(node: Node) -> None:
    coordinator = node.coordinator()
    pid, epoch = init(coordinator, "v")
    coordinator.add_partitions("v", pid, epoch, [(ORDERS, 0)])
    channels = Channels()
    verifier = TransactionVerifier(1, lambda: node.replicas.image, coordinator.verify, channels)
    try:
        assert verifier("v", pid, epoch, ORDERS, 0) is E.NONE
        assert verifier("v", pid, epoch, ORDERS, 1) is E.INVALID_TXN_STATE  # not added
        assert verifier("v", pid, epoch - 1, ORDERS, 0) is E.INVALID_PRODUCER_EPOCH  # fenced
        assert verifier("v", pid + 1, epoch, ORDERS, 0) is E.INVALID_PRODUCER_ID_MAPPING
        no_state = TransactionVerifier(1, MetadataImage, coordinator.verify, channels)
        assert no_state("v", pid, epoch, ORDERS, 0) is E.NOT_ENOUGH_REPLICAS  # retriable
    finally:
        channels.close()


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (E.NONE, Outcome.DONE),
        (E.UNSUPPORTED_FOR_MESSAGE_FORMAT, Outcome.DONE),
        (E.NOT_LEADER_OR_FOLLOWER, Outcome.RETRY),
        (E.UNKNOWN_TOPIC_OR_PARTITION, Outcome.RETRY),
        (E.NOT_ENOUGH_REPLICAS_AFTER_APPEND, Outcome.RETRY),
        (E.REQUEST_TIMED_OUT, Outcome.RETRY),
        (E.KAFKA_STORAGE_ERROR, Outcome.RETRY),
        (E.INVALID_PRODUCER_EPOCH, Outcome.ABANDON),
        (E.PRODUCER_FENCED, Outcome.ABANDON),
        (E.TRANSACTION_COORDINATOR_FENCED, Outcome.ABANDON),
        (E.CORRUPT_MESSAGE, Outcome.FATAL),
        (E.INVALID_REQUIRED_ACKS, Outcome.FATAL),
        (E.INVALID_RECORD, Outcome.FATAL),
        (E.FENCED_LEADER_EPOCH, Outcome.RETRY),
    ],
)
def test_marker_answers_are_classified_as_kafka_does(error: ErrorCode, outcome: Outcome) -> None:
    assert marker_outcome(error) is outcome
