"""Share groups' data path (KIP-932) on a real 3-node cluster (127.0.0.174-176), driven with raw
ShareFetch / ShareAcknowledge requests over Kafka's protocol (the project's codec, kio's
schemas): three members share one partition, one dies holding locks and its records go to the
others once the locks expire (``group.share.record.lock.duration.ms`` 3 s here), every record is
acknowledged exactly once and rejected ones never come back, a record released
``group.share.delivery.count.limit`` times (3 here) is archived, a closed session hands its
records on at once and so does a dropped connection, the session errors are Kafka's, a
read_committed group (``share.isolation.level``) never gets aborted transactions' records, and
a failover of the partition's leader keeps what was acknowledged (``__share_group_state``) and
redelivers what was in flight, so does a failover of the share coordinator after many
acknowledgements (each written as an update record, a snapshot every
``share.coordinator.snapshot.update.records.per.snapshot``: 8 here), and ShareFetch answers the
group's ``share.record.lock.duration.ms`` as its acquisition lock timeout. Kafka 4.2's v2
(KIP-1222): a member keeps records past the lock by renewing them (RENEW, in ShareAcknowledge
and in an ``IsRenewAck`` ShareFetch), nobody else gets them meanwhile, and once it stops they go
to another member with their second delivery; RENEW of a record not held, RENEW in v1 and an
``IsRenewAck`` fetch with limits are refused as Kafka refuses them."""

from __future__ import annotations

import io
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, ShareConsumer
from confluent_kafka import Producer as RdProducer
from confluent_kafka.admin import AdminClient as RdAdminClient
from confluent_kafka.admin import ResourceType  # type: ignore[attr-defined]
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from kio.serial import entity_reader, entity_writer

from dataplane.client import AdminClient, Producer
from dataplane.coordinator.share_coordinator import SHARE_STATE_TOPIC, share_key
from dataplane.kafka import codec as kc
from dataplane.tools.local_cluster import LocalCluster, wait_for
from raftlog.batch import iter_batches
from raftlog.coordinator_key import partition_for
from raftlog.errors import ErrorCode
from raftlog.records import decode_batch
from tests.dataplane.cluster_support import create_topic, running_cluster, wait_for_leaders

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("kafka-groups-classic")]
LOCK_MS = 3_000
DELIVERY_LIMIT = 3
SNAPSHOT_EVERY = 8
STATE_PARTITIONS = 3
ACCEPT, RELEASE, REJECT, RENEW = 1, 2, 3, 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    overrides: dict[str, str | int] = {
        "group.share.record.lock.duration.ms": LOCK_MS,
        "group.share.delivery.count.limit": DELIVERY_LIMIT,
        "share.coordinator.state.topic.num.partitions": 3,
        "share.coordinator.snapshot.update.records.per.snapshot": SNAPSHOT_EVERY,
    }
    with running_cluster(
        tmp_path_factory.mktemp("share-groups"), "kafka_groups", overrides
    ) as running:
        yield running


@dataclass
class Delivery:
    offset: int
    value: bytes
    delivery_count: int


@dataclass
class Member:
    """One share consumer's session with a partition leader, in raw requests."""

    address: str
    group: str
    member_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    epoch: int = 0
    correlation_id: int = 0
    connection: socket.socket | None = None

    def call(self, api_key: int, data: dict[str, Any], version: int = 1) -> Any:
        if self.connection is None:
            host, port = self.address.rsplit(":", 1)
            self.connection = socket.create_connection((host, int(port)), timeout=60)
        self.correlation_id += 1
        schema = kc.request_schema(api_key, version)
        header = kc.to_entity(schema.__header_schema__, {
            "request_api_key": api_key, "request_api_version": version,
            "correlation_id": self.correlation_id, "client_id": "share-test",
        })  # fmt: skip
        buffer = io.BytesIO()
        entity_writer(schema.__header_schema__)(buffer, header)
        entity_writer(schema)(buffer, kc.to_entity(schema, data))
        frame = buffer.getvalue()
        self.connection.sendall(kc.SIZE.pack(len(frame)) + frame)
        (size,) = kc.SIZE.unpack(self.connection.recv(kc.SIZE.size, socket.MSG_WAITALL))
        answer = self.connection.recv(size, socket.MSG_WAITALL)
        response = kc.response_schema(api_key, version)
        head, offset = entity_reader(response.__header_schema__)(answer, 0)
        assert head.correlation_id == self.correlation_id
        return entity_reader(response)(answer, offset)[0]

    def fetch(
        self,
        topic_id: uuid.UUID,
        acks: list[tuple[int, int, list[int]]] = (),  # type: ignore[assignment]
        max_records: int = 5,
        wait_ms: int = 500,
        epoch: int | None = None,
        version: int = 1,
        renew: bool = False,  # v2's IsRenewAck, with every limit 0 as Kafka's client sends it
    ) -> Any:
        answer = self.call(kc.API_SHARE_FETCH, {
            "group_id": self.group, "member_id": self.member_id,
            "share_session_epoch": self.epoch if epoch is None else epoch,
            "max_wait": 0 if renew else wait_ms, "min_bytes": 0 if renew else 1,
            "max_bytes": 0 if renew else 1 << 20,
            "max_records": 0 if renew else max_records, "batch_size": max_records,
            "is_renew_ack": renew,
            "topics": [{"topic_id": topic_id, "partitions": [
                {"partition_index": 0, "acknowledgement_batches": _batches(acks)}]}],
            "forgotten_topics_data": [],
        }, version)  # fmt: skip
        if answer.error_code == 0 and epoch is None:
            self.epoch = 1 if self.epoch in (0, -1) else self.epoch + 1
        return answer

    def acknowledge(
        self,
        topic_id: uuid.UUID,
        acks: list[tuple[int, int, list[int]]],
        epoch: int | None = None,
        version: int = 1,
    ) -> Any:
        renew = any(RENEW in types for _, _, types in acks)
        answer = self.call(kc.API_SHARE_ACKNOWLEDGE, {
            "group_id": self.group, "member_id": self.member_id,
            "share_session_epoch": self.epoch if epoch is None else epoch,
            "is_renew_ack": renew,
            "topics": [{"topic_id": topic_id, "partitions": [
                {"partition_index": 0, "acknowledgement_batches": _batches(acks)}]}],
        }, version)  # fmt: skip
        if answer.error_code == 0 and epoch is None:
            self.epoch += 1
        return answer

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def _batches(acks: Any) -> list[dict[str, Any]]:
    return [
        {"first_offset": first, "last_offset": last, "acknowledge_types": types}
        for first, last, types in acks
    ]


def deliveries(answer: Any) -> list[Delivery]:
    """The acquired records of a ShareFetch answer (its batches may hold others too)."""
    assert answer.error_code == 0, answer
    out = []
    for topic in answer.responses:
        for p in topic.partitions:
            assert p.error_code == 0, p
            counts = {
                offset: r.delivery_count
                for r in p.acquired_records
                for offset in range(r.first_offset, r.last_offset + 1)
            }
            data = bytes(p.records or b"")
            for position, _ in iter_batches(data):
                for record in decode_batch(data, position)[1]:
                    if record.offset in counts:
                        out.append(
                            Delivery(record.offset, record.value or b"", counts[record.offset])
                        )
    return out


def ack_errors(answer: Any, field_name: str = "acknowledge_error_code") -> list[int]:
    return [getattr(p, field_name) for t in answer.responses for p in t.partitions]


def queue_topic(cluster: LocalCluster, name: str) -> tuple[uuid.UUID, str]:
    """A one-partition topic: its id and its leader's KAFKA address."""
    leaders = create_topic(cluster, name, 1)
    return topic_id(cluster, name), cluster.kafka_address(leaders[0].leader_id)


def topic_id(cluster: LocalCluster, name: str) -> uuid.UUID:
    admin = AdminClient(cluster.bootstrap_servers)
    try:
        return uuid.UUID(bytes=admin.describe_topics([name])[name].topic_id)
    finally:
        admin.close()


def produce(cluster: LocalCluster, topic: str, values: list[bytes]) -> None:
    with Producer(cluster.bootstrap_servers) as producer:
        for value in values:
            producer.send(topic, value=value, partition=0)
        producer.flush()


def test_three_members_share_a_partition_and_a_dead_members_records_go_to_the_others(
    cluster: LocalCluster,
) -> None:
    tid, leader = queue_topic(cluster, "share-queue")
    members = [Member(leader, "share-queue-group") for _ in range(3)]
    for member in members:  # sessions open (the group starts at the log end: latest)
        assert deliveries(member.fetch(tid, wait_ms=0)) == []
    values = [f"job-{n}".encode() for n in range(30)]
    produce(cluster, "share-queue", values)
    dead, alive = members[0], members[1:]
    held = wait_for(
        "the dead member acquires records", lambda: deliveries(dead.fetch(tid)) or None, 30
    )
    accepted: dict[int, int] = {}  # offset -> acceptances
    rejected: set[int] = set()
    seen: list[Delivery] = []
    pending: dict[int, list[tuple[int, int, list[int]]]] = {0: [], 1: []}

    def round_of_fetches() -> bool:
        for n, member in enumerate(alive):
            answer = member.fetch(tid, pending[n])
            assert set(ack_errors(answer)) <= {0}, answer
            got = deliveries(answer)
            for delivery in pending[n]:
                first, last, types = delivery
                for offset in range(first, last + 1):
                    if types == [ACCEPT]:
                        accepted[offset] = accepted.get(offset, 0) + 1
                    else:
                        rejected.add(offset)
            pending[n] = []
            for d in got:
                assert d.offset not in rejected, f"rejected offset {d.offset} came back"
                seen.append(d)
                kind = REJECT if d.value.endswith(b"7") else ACCEPT
                pending[n].append((d.offset, d.offset, [kind]))
        return len(accepted) + len(rejected) == len(values)

    wait_for("every record acknowledged by the live members", round_of_fetches, 60)
    assert all(count == 1 for count in accepted.values()), accepted
    assert rejected == {n for n in range(30) if values[n].endswith(b"7")}
    redelivered = {d.offset: d.delivery_count for d in seen if d.offset in {h.offset for h in held}}
    assert redelivered and set(redelivered.values()) == {2}  # after the dead member's locks
    late = dead.acknowledge(tid, [(held[0].offset, held[0].offset, [ACCEPT])])
    assert ack_errors(late, "error_code") == [ErrorCode.INVALID_RECORD_STATE.code]
    for member in members:
        member.close()


def test_a_record_released_delivery_count_limit_times_is_archived(cluster: LocalCluster) -> None:
    tid, leader = queue_topic(cluster, "share-poison")
    member = Member(leader, "share-poison-group")
    member.fetch(tid, wait_ms=0)
    produce(cluster, "share-poison", [b"poison", b"fine"])
    got = wait_for(
        "the poison record", lambda: deliveries(member.fetch(tid, max_records=1)) or None, 30
    )
    counts = [got[0].delivery_count]
    for _ in range(DELIVERY_LIMIT - 1):
        (poison,) = got
        got = deliveries(member.fetch(tid, [(poison.offset, poison.offset, [RELEASE])], 1))
        counts.append(got[0].delivery_count)
    assert counts == [1, 2, 3]
    (poison,) = got
    acks = [(poison.offset, poison.offset, [RELEASE])]
    (fine,) = deliveries(member.fetch(tid, acks, 5))
    assert fine.value == b"fine"  # the poison record is archived, never delivered again
    assert deliveries(member.fetch(tid, [(fine.offset, fine.offset, [ACCEPT])], 5, 0)) == []
    member.close()


def test_session_errors_and_a_closed_session_hands_its_records_on(cluster: LocalCluster) -> None:
    tid, leader = queue_topic(cluster, "share-sessions")
    first, second = Member(leader, "share-sessions-group"), Member(leader, "share-sessions-group")
    stranger = Member(leader, "share-sessions-group")
    assert stranger.fetch(tid, epoch=5).error_code == ErrorCode.SHARE_SESSION_NOT_FOUND.code
    opening_ack = stranger.acknowledge(tid, [(0, 0, [ACCEPT])], epoch=0)
    assert opening_ack.error_code == ErrorCode.INVALID_SHARE_SESSION_EPOCH.code
    first.fetch(tid, wait_ms=0)
    second.fetch(tid, wait_ms=0)
    assert first.fetch(tid, epoch=7).error_code == ErrorCode.INVALID_SHARE_SESSION_EPOCH.code
    unknown = stranger.fetch(uuid.uuid4(), wait_ms=0)
    assert ErrorCode.UNKNOWN_TOPIC_ID.code in [
        p.error_code for t in unknown.responses for p in t.partitions
    ]
    produce(cluster, "share-sessions", [b"a", b"b"])
    held = wait_for(
        "records acquired", lambda: deliveries(first.fetch(tid, max_records=10)) or None, 30
    )
    assert [d.delivery_count for d in held] == [1, 1]
    assert first.fetch(tid, epoch=-1).error_code == 0  # closes: its records are released now
    again = wait_for(
        "released records", lambda: deliveries(second.fetch(tid, max_records=10)) or None, 5
    )
    assert [(d.offset, d.delivery_count) for d in again] == [(d.offset, 2) for d in held]
    for member in (first, second, stranger):
        member.close()


def rd_share_consumer(cluster: LocalCluster, group: str, topic: str) -> ShareConsumer:
    consumer = ShareConsumer({
        "bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers), "group.id": group,
        "share.acknowledgement.mode": "explicit",
    })  # fmt: skip
    consumer.subscribe([topic])
    return consumer


def test_librdkafka_share_consumers_share_a_partition_with_explicit_acknowledgements(
    cluster: LocalCluster,
) -> None:
    create_topic(cluster, "share-rd", 1)
    consumers = [rd_share_consumer(cluster, "share-rd-group", "share-rd") for _ in range(3)]
    warm = Producer(cluster.bootstrap_servers)
    try:
        # The group starts at the log end once its share partition is first fetched: produce
        # a warm-up record per round until one arrives, so the records below are all read.
        def warmed_up() -> bool:
            warm.send("share-rd", value=b"warm-up", partition=0)
            warm.flush()
            for consumer in consumers:
                messages = consumer.poll(0.5)
                for message in messages:
                    assert message.error() is None, message.error()
                    consumer.acknowledge(message, AcknowledgeType.ACCEPT)
                if messages:
                    consumer.commit_sync(10)
                    return True
            return False

        wait_for("librdkafka share consumers reading", warmed_up, 60)
        values = {f"rd-{n}".encode() for n in range(20)}
        produce(cluster, "share-rd", sorted(values))
        accepted: list[bytes] = []
        rejected: list[bytes] = []

        def drained() -> bool:
            for consumer in consumers:
                for message in consumer.poll(0.3):
                    assert message.error() is None, message.error()
                    value = message.value() or b""
                    if value in rejected:
                        raise AssertionError(f"rejected {value!r} was delivered again")
                    kind = (
                        AcknowledgeType.REJECT if value.endswith(b"7") else AcknowledgeType.ACCEPT
                    )
                    consumer.acknowledge(message, kind)
                    if value in values:
                        (rejected if kind == AcknowledgeType.REJECT else accepted).append(value)
                consumer.commit_sync(10)
            return set(accepted) | set(rejected) >= values

        wait_for("every record acknowledged through librdkafka", drained, 90)
        assert sorted(accepted) == sorted(v for v in values if not v.endswith(b"7"))
        assert len(accepted) == len(set(accepted))
        assert sorted(rejected) == sorted(v for v in values if v.endswith(b"7"))
    finally:
        warm.close()
        for consumer in consumers:
            consumer.close()


def test_a_leader_failover_keeps_acknowledged_state_and_redelivers_what_was_in_flight(
    cluster: LocalCluster,
) -> None:
    tid, leader_address = queue_topic(cluster, "share-failover")
    member = Member(leader_address, "share-failover-group")
    member.fetch(tid, wait_ms=0)
    produce(cluster, "share-failover", [f"r{n}".encode() for n in range(10)])
    got: list[Delivery] = []

    def acquire_all() -> bool:
        got.extend(deliveries(member.fetch(tid, max_records=10)))
        return len(got) == 10

    wait_for("ten records acquired", acquire_all, 30)
    done = member.acknowledge(tid, [(0, 4, [ACCEPT])])
    assert ack_errors(done, "error_code") == [0]
    member.close()
    old_leader = next(
        s.node_id for s in cluster.specs if cluster.kafka_address(s.node_id) == leader_address
    )
    cluster.stop_node(old_leader, kill=True)
    try:
        leaders = wait_for(
            "a new leader", lambda: _moved(cluster, "share-failover", old_leader), 60
        )
        successor = Member(cluster.kafka_address(leaders), "share-failover-group")
        again: list[Delivery] = []

        def redelivered() -> bool:
            answer = successor.fetch(tid, max_records=10)
            if answer.error_code == 0 and all(
                p.error_code == 0 for t in answer.responses for p in t.partitions
            ):
                again.extend(deliveries(answer))
            else:  # the coordinator of the state is moving too: the next fetch retries
                successor.epoch = 0
            return len(again) == 5

        wait_for("the in-flight records redelivered by the new leader", redelivered, 60)
        assert sorted((d.offset, d.delivery_count) for d in again) == [(n, 2) for n in range(5, 10)]
        successor.close()
    finally:
        cluster.start_node(old_leader)
        cluster.wait_for_brokers([old_leader], timeout_s=60)


def test_a_share_coordinator_failover_after_many_acknowledgements_keeps_every_one(
    cluster: LocalCluster,
) -> None:
    """Forty records acknowledged one request at a time (each write an update record over the
    last snapshot), then the share coordinator of the share partition is killed: its successor
    loads snapshot + updates from ``__share_group_state``, and the share partition loaded again
    from it redelivers exactly the records released or in flight, never one acknowledged or
    rejected."""
    topic, group = "share-coord-failover", "share-coord-failover-group"
    tid, leader_address = queue_topic(cluster, topic)
    member = Member(leader_address, group)
    member.fetch(tid, wait_ms=0)
    produce(cluster, topic, [f"r{n}".encode() for n in range(40)])
    got: list[Delivery] = []

    def acquire_all() -> bool:
        got.extend(deliveries(member.fetch(tid, max_records=40)))
        return len(got) == 40

    wait_for("forty records acquired", acquire_all, 30)
    released, in_flight = {10, 20}, {5, 37, 38, 39}
    for offset in reversed(range(40)):  # the start stays at 5: the window keeps every state
        if offset in in_flight:
            continue
        kind = RELEASE if offset in released else REJECT if offset % 3 == 0 else ACCEPT
        done = member.acknowledge(tid, [(offset, offset, [kind])])
        assert ack_errors(done, "error_code") == [0], done
    key = share_key(group, tid.bytes, 0)
    states = wait_for_leaders(cluster, SHARE_STATE_TOPIC, STATE_PARTITIONS)
    coordinator = states[partition_for(key, STATE_PARTITIONS)].leader_id
    cluster.stop_node(coordinator, kill=True)
    try:
        member.close()  # its session ends: the share partition is loaded again from the state
        wait_for(
            "a new share coordinator",
            lambda: _moved(cluster, SHARE_STATE_TOPIC, coordinator, STATE_PARTITIONS),
            60,
        )
        leader = wait_for("the partition led", lambda: _moved(cluster, topic, coordinator), 60)
        successor = Member(cluster.kafka_address(leader), group)
        again: list[Delivery] = []

        def redelivered() -> bool:
            answer = successor.fetch(tid, max_records=40)
            if answer.error_code == 0 and all(
                p.error_code == 0 for t in answer.responses for p in t.partitions
            ):
                again.extend(deliveries(answer))
            else:  # the state is still loading somewhere: the next fetch retries
                successor.epoch = 0
            return len(again) >= 6

        wait_for("the released and in-flight records redelivered", redelivered, 60)
        expected = sorted(released | in_flight)
        assert sorted((d.offset, d.delivery_count) for d in again) == [(o, 2) for o in expected]
        assert deliveries(successor.fetch(tid, max_records=40, wait_ms=500)) == []
        successor.close()
    finally:
        cluster.start_node(coordinator)
        cluster.wait_for_brokers([coordinator], timeout_s=60)


def test_share_fetch_answers_the_groups_record_lock_duration(cluster: LocalCluster) -> None:
    """ShareFetch's AcquisitionLockTimeoutMs is the group's share.record.lock.duration.ms when
    it has one (Kafka's ``recordLockDurationMsOrDefault``), else the broker's
    group.share.record.lock.duration.ms: the lock the fetch applied (that the group's lock is
    the one applied: test_a_dropped_connection_hands_its_records_on_at_once)."""
    group = "share-lock-answer-group"
    set_group_configs(cluster, group, {"share.record.lock.duration.ms": "45000"})
    tid, leader = queue_topic(cluster, "share-lock-answer")
    plain = Member(leader, "share-lock-plain-group")

    def answered_lock_ms() -> int:
        member = Member(leader, group)  # a new session each time
        try:
            answer = member.fetch(tid, wait_ms=0)
            assert answer.error_code == 0, answer
            return lock_ms(answer)
        finally:
            member.close()

    try:  # the group's config reaches the leader with its metadata
        wait_for("the group's lock duration answered", lambda: answered_lock_ms() == 45_000, 30)
        assert lock_ms(plain.fetch(tid, wait_ms=0)) == LOCK_MS
    finally:
        plain.close()


def lock_ms(answer: Any) -> int:
    """ShareFetch's AcquisitionLockTimeoutMs (kio reads it as a timedelta)."""
    return int(answer.acquisition_lock_timeout // timedelta(milliseconds=1))


def _moved(cluster: LocalCluster, topic: str, old_leader: int, partitions: int = 1) -> int | None:
    """The leader of the topic's partition 0 once no partition is led by ``old_leader``."""
    leaders = wait_for_leaders(cluster, topic, partitions)
    if any(p.leader_id == old_leader for p in leaders.values()):
        return None
    return leaders[0].leader_id


def set_group_configs(cluster: LocalCluster, group: str, values: dict[str, str]) -> None:
    """IncrementalAlterConfigs of a GROUP resource through librdkafka's AdminClient."""
    resource = ConfigResource(
        ResourceType.GROUP, group,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in values.items()
        ],
    )  # fmt: skip
    admin = RdAdminClient({"bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers)})
    admin.incremental_alter_configs([resource])[resource].result(30)


def test_a_dropped_connection_hands_its_records_on_at_once(cluster: LocalCluster) -> None:
    """Kafka's connection-disconnect listener: a member's socket closes without closing its
    share session (the process died), and another member gets its records at once, with their
    delivery counted, long before their locks (60 s for this group) would expire."""
    group = "share-disconnect-group"
    set_group_configs(cluster, group, {"share.record.lock.duration.ms": "60000"})
    tid, leader = queue_topic(cluster, "share-disconnect")
    dying, other = Member(leader, group), Member(leader, group)
    dying.fetch(tid, wait_ms=0)
    other.fetch(tid, wait_ms=0)
    produce(cluster, "share-disconnect", [b"a", b"b", b"c"])
    held = wait_for(
        "records acquired", lambda: deliveries(dying.fetch(tid, max_records=10)) or None, 30
    )
    # a long poll past the broker's 3 s lock: the group's 60 s lock holds them
    assert deliveries(other.fetch(tid, wait_ms=LOCK_MS + 1_000)) == []
    dropped_at = time.monotonic()
    dying.close()  # no ShareFetch with epoch -1: the connection just goes
    again = wait_for(
        "the records handed on",
        lambda: deliveries(other.fetch(tid, max_records=10, wait_ms=1000)) or None,
        30,
    )
    assert time.monotonic() - dropped_at < 30  # well inside the 60 s lock
    assert [(d.offset, d.delivery_count) for d in again] == [(d.offset, 2) for d in held]
    other.close()


def test_read_committed_share_group_skips_aborted_transactions(cluster: LocalCluster) -> None:
    """share.isolation.level=read_committed (Kafka 4.1's group config): librdkafka's share
    consumer gets the committed transaction's records and the plain ones, never the aborted
    ones; a read_uncommitted group (the default) gets them all."""
    topic = "share-isolation"
    create_topic(cluster, topic, 1)
    committed_group, uncommitted_group = "share-committed-group", "share-uncommitted-group"
    for group, level in ((committed_group, "read_committed"), (uncommitted_group, None)):
        configs = {"share.auto.offset.reset": "earliest"}
        if level is not None:
            configs["share.isolation.level"] = level
        set_group_configs(cluster, group, configs)
    bootstrap = ",".join(cluster.kafka_bootstrap_servers)
    producer = RdProducer({"bootstrap.servers": bootstrap, "transactional.id": "share-iso-txn"})
    producer.init_transactions(30)
    for values, commit in (([b"kept-1", b"kept-2"], True), ([b"aborted-1", b"aborted-2"], False)):
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value=value, partition=0)
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
    plain = RdProducer({"bootstrap.servers": bootstrap})
    plain.produce(topic, value=b"plain", partition=0)
    assert plain.flush(30) == 0

    def consumed(group: str, expected: int) -> set[bytes]:
        consumer = rd_share_consumer(cluster, group, topic)
        seen: set[bytes] = set()
        try:
            deadline = time.monotonic() + 45
            while len(seen) < expected and time.monotonic() < deadline:
                for message in consumer.poll(0.5):
                    assert message.error() is None, message.error()
                    seen.add(message.value() or b"")
                    consumer.acknowledge(message, AcknowledgeType.ACCEPT)
                consumer.commit_sync(10)
            for message in consumer.poll(1.0):  # nothing more comes
                seen.add(message.value() or b"")
        finally:
            consumer.close()
        return seen

    assert consumed(committed_group, 3) == {b"kept-1", b"kept-2", b"plain"}
    everything = {b"kept-1", b"kept-2", b"aborted-1", b"aborted-2", b"plain"}
    assert consumed(uncommitted_group, 5) == everything


def test_a_member_keeps_records_past_the_lock_by_renewing_them(cluster: LocalCluster) -> None:
    """KIP-1222 (v2): the holder renews its records (alternately in a ShareAcknowledge and in an
    IsRenewAck ShareFetch) for over twice the 3 s lock; the other member, long-polling all the
    while, gets none of them; once the holder stops they come to the other with delivery
    count 2 (a renewal counts no delivery). Refused as Kafka refuses them: the old holder's
    RENEW (INVALID_RECORD_STATE), RENEW in a v1 request (an unknown type there:
    INVALID_REQUEST) and an IsRenewAck fetch with limits (top-level INVALID_REQUEST)."""
    tid, leader = queue_topic(cluster, "share-renew")
    holder, other = Member(leader, "share-renew-group"), Member(leader, "share-renew-group")
    holder.fetch(tid, wait_ms=0, version=2)
    other.fetch(tid, wait_ms=0, version=2)
    produce(cluster, "share-renew", [b"slow-1", b"slow-2"])
    held = wait_for(
        "the holder acquires both",
        lambda: deliveries(holder.fetch(tid, max_records=10)) or None,
        30,
    )
    acquired_at = time.monotonic()
    assert [(d.offset, d.delivery_count) for d in held] == [(0, 1), (1, 1)]
    renewals = 0
    while time.monotonic() - acquired_at < 2.5 * LOCK_MS / 1000:
        # the other member long-polls ~1 s (the pace of the renewals): nothing for it
        assert deliveries(other.fetch(tid, wait_ms=1_000, version=2)) == []
        acks = [(0, 1, [RENEW])]
        if renewals % 2:
            answer = holder.fetch(tid, acks, version=2, renew=True)
            assert answer.error_code == 0 and ack_errors(answer) == [0], answer
            assert deliveries(answer) == []  # a renewal fetches nothing
        else:
            answer = holder.acknowledge(tid, acks, version=2)
            assert answer.error_code == 0 and ack_errors(answer, "error_code") == [0], answer
            assert lock_ms(answer) == LOCK_MS
        renewals += 1
    assert renewals >= 3
    plain = holder.fetch(tid, [(0, 1, [RENEW])], wait_ms=0, version=2)  # a fetch renewing too
    assert plain.error_code == 0 and ack_errors(plain) == [0], plain
    with_limits = holder.call(kc.API_SHARE_FETCH, {
        "group_id": holder.group, "member_id": holder.member_id,
        "share_session_epoch": holder.epoch, "max_wait": 0, "min_bytes": 0, "max_bytes": 0,
        "max_records": 10, "batch_size": 10, "is_renew_ack": True,
        "topics": [{"topic_id": tid, "partitions": [
            {"partition_index": 0, "acknowledgement_batches": _batches([(0, 1, [RENEW])])}]}],
        "forgotten_topics_data": [],
    }, 2)  # fmt: skip
    assert with_limits.error_code == ErrorCode.INVALID_REQUEST.code  # nothing done, epoch kept
    as_v1 = holder.acknowledge(tid, [(0, 1, [RENEW])], version=1)
    assert ack_errors(as_v1, "error_code") == [ErrorCode.INVALID_REQUEST.code]
    # the holder stops: a lock later the records are the other member's, second delivery
    again = wait_for(
        "the records after the holder stopped renewing",
        lambda: deliveries(other.fetch(tid, max_records=10, version=2)) or None, 30,
    )  # fmt: skip
    assert [(d.offset, d.delivery_count) for d in again] == [(0, 2), (1, 2)]
    late = holder.acknowledge(tid, [(0, 1, [RENEW])], version=2)
    assert ack_errors(late, "error_code") == [ErrorCode.INVALID_RECORD_STATE.code]
    done = other.acknowledge(tid, [(0, 1, [ACCEPT])], version=2)
    assert ack_errors(done, "error_code") == [0]
    for member in (holder, other):
        member.close()
