"""Our ShareConsumer (KIP-932, over BrokerService's ShareFetch / ShareAcknowledge) against a real
3-node cluster on the "client" range (in turn with test_cluster.py and test_client_long_tail.py):
three consumers share one partition and each record is acknowledged once, rejected records never
come back, a consumer that closes holding records hands them on (delivery count 2), implicit
mode accepts on the next poll, our consumer and librdkafka's share one group, and DeleteGroups
of the emptied group removes its ``__share_group_state`` entries (a new group of the same name
starts at the log end again)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import pytest
from confluent_kafka import AcknowledgeType as RdAcknowledgeType
from confluent_kafka import ShareConsumer as RdShareConsumer

from dataplane.client import (
    AcknowledgeType,
    AdminClient,
    IllegalStateError,
    Producer,
    ShareConsumer,
    ShareConsumerRecord,
)
from dataplane.tools.local_cluster import LocalCluster, wait_for
from protos import broker_pb2 as pb
from protos import broker_pb2_grpc as pb_grpc
from raftlog.errors import ErrorCode
from tests.dataplane.cluster_support import create_topic, running_cluster

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("dataplane-client")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    overrides: dict[str, str | int] = {
        "group.share.heartbeat.interval.ms": 500,
        "share.coordinator.state.topic.num.partitions": 3,
    }
    with running_cluster(tmp_path_factory.mktemp("share-consumer"), "client", overrides) as up:
        yield up


def produce(cluster: LocalCluster, topic: str, values: list[bytes]) -> None:
    with Producer(cluster.bootstrap_servers) as producer:
        for value in values:
            producer.send(topic, value=value, partition=0)
        producer.flush()


def consumers(
    cluster: LocalCluster, group: str, topic: str, count: int, mode: str = "explicit"
) -> list[ShareConsumer]:
    out = []
    for _ in range(count):
        consumer = ShareConsumer(
            cluster.bootstrap_servers, group, acknowledgement_mode=mode,  # type: ignore[arg-type]
            max_poll_records=5, fetch_max_wait_ms=200,
        )  # fmt: skip
        consumer.subscribe([topic])
        out.append(consumer)
    return out


def warm_up(
    cluster: LocalCluster,
    topic: str,
    polls: list[Callable[[], int]],
) -> None:
    """A share partition starts at the log end when first fetched: produce a warm-up record
    per round until some consumer receives one (each ``poll`` settles what it received)."""
    with Producer(cluster.bootstrap_servers) as producer:

        def received() -> bool:
            producer.send(topic, value=b"warm-up", partition=0)
            producer.flush()
            return any(poll() for poll in polls)

        wait_for(f"share consumers reading {topic}", received, 60)


def accept_all(consumer: ShareConsumer) -> Callable[[], int]:
    def poll() -> int:
        records = consumer.poll(300)
        if consumer.config.acknowledgement_mode == "explicit":
            for record in records:
                consumer.acknowledge(record)
        if records:
            assert set(consumer.commit_sync().values()) == {None}
        return len(records)

    return poll


def test_three_share_consumers_share_a_partition_each_record_acknowledged_once(
    cluster: LocalCluster,
) -> None:
    create_topic(cluster, "sc-three", 1)
    members = consumers(cluster, "sc-three-group", "sc-three", 3)
    try:
        warm_up(cluster, "sc-three", [accept_all(c) for c in members])
        values = {f"three-{n}".encode() for n in range(30)}
        produce(cluster, "sc-three", sorted(values))
        accepted: list[bytes] = []
        rejected: list[bytes] = []
        by_member = [0, 0, 0]

        def drained() -> bool:
            for index, consumer in enumerate(members):
                for record in consumer.poll(200):
                    value = record.value or b""
                    assert value not in rejected, f"rejected {value!r} was delivered again"
                    if value not in values:
                        consumer.acknowledge(record)
                        continue
                    kind = (
                        AcknowledgeType.REJECT if value.endswith(b"7") else AcknowledgeType.ACCEPT
                    )
                    consumer.acknowledge(record, kind)
                    (rejected if kind is AcknowledgeType.REJECT else accepted).append(value)
                    by_member[index] += 1
                assert set(consumer.commit_sync().values()) <= {None}
            return set(accepted) | set(rejected) >= values

        wait_for("every record acknowledged", drained, 60)
        assert sorted(accepted) == sorted(v for v in values if not v.endswith(b"7"))
        assert len(accepted) == len(set(accepted)) and len(rejected) == len(set(rejected))
        for consumer in members:  # nothing comes back: accepted and rejected are done
            assert [r for r in consumer.poll(300) if r.value in values] == []
    finally:
        for consumer in members:
            consumer.close()


def test_a_consumer_closing_with_records_hands_them_to_the_others(cluster: LocalCluster) -> None:
    create_topic(cluster, "sc-close", 1)
    holder, other = consumers(cluster, "sc-close-group", "sc-close", 2)
    try:
        warm_up(cluster, "sc-close", [accept_all(holder)])
        produce(cluster, "sc-close", [f"close-{n}".encode() for n in range(5)])
        held: list[ShareConsumerRecord] = []

        def holding() -> bool:
            held.extend(holder.poll(300))
            return bool(held)

        wait_for("the holder acquiring records", holding, 30)
        assert all(r.delivery_count == 1 for r in held)
        holder.close()  # unacknowledged: its session's close releases them
        again: list[ShareConsumerRecord] = []

        def redelivered() -> bool:
            for record in other.poll(300):
                other.acknowledge(record)
                again.append(record)
            other.commit_sync()
            return {r.offset for r in again} >= {r.offset for r in held}

        wait_for("the held records redelivered to the other member", redelivered, 30)
        counts = {r.offset: r.delivery_count for r in again}
        assert all(counts[r.offset] == 2 for r in held), (held, again)
    finally:
        holder.close()
        other.close()


def test_implicit_mode_accepts_on_the_next_poll(cluster: LocalCluster) -> None:
    create_topic(cluster, "sc-implicit", 1)
    (consumer,) = consumers(cluster, "sc-implicit-group", "sc-implicit", 1, mode="implicit")
    try:
        warm_up(cluster, "sc-implicit", [accept_all(consumer)])
        values = [f"implicit-{n}".encode() for n in range(12)]
        produce(cluster, "sc-implicit", values)
        seen: list[bytes] = []

        def all_seen() -> bool:
            records = consumer.poll(300)
            if records:
                with pytest.raises(IllegalStateError):
                    consumer.acknowledge(records[0])
            seen.extend(r.value or b"" for r in records)
            return set(seen) >= set(values)

        wait_for("every record polled", all_seen, 30)
        assert set(consumer.commit_sync().values()) <= {None}
        assert [r for r in consumer.poll(500) if r.value in values] == []  # accepted: gone
    finally:
        consumer.close()
    assert sorted(v for v in seen if v in values) == sorted(values)


def test_our_share_consumer_and_librdkafkas_share_one_group(cluster: LocalCluster) -> None:
    create_topic(cluster, "sc-mixed", 1)
    (ours,) = consumers(cluster, "sc-mixed-group", "sc-mixed", 1)
    theirs = RdShareConsumer({
        "bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers),
        "group.id": "sc-mixed-group", "share.acknowledgement.mode": "explicit",
    })  # fmt: skip
    theirs.subscribe(["sc-mixed"])
    got: dict[str, list[bytes]] = {"ours": [], "theirs": []}

    def rd_poll() -> int:
        messages = theirs.poll(0.3)
        for message in messages:
            assert message.error() is None, message.error()
            theirs.acknowledge(message, RdAcknowledgeType.ACCEPT)
            got["theirs"].append(message.value() or b"")
        if messages:
            theirs.commit_sync(10)
        return len(messages)

    def our_poll() -> int:
        records = ours.poll(300)
        for record in records:
            ours.acknowledge(record)
            got["ours"].append(record.value or b"")
        if records:
            assert set(ours.commit_sync().values()) <= {None}
        return len(records)

    try:
        warm_up(cluster, "sc-mixed", [our_poll, rd_poll])
        values = [f"mixed-{n}".encode() for n in range(40)]
        produce(cluster, "sc-mixed", values)

        def drained() -> bool:
            our_poll()
            rd_poll()
            return set(got["ours"]) | set(got["theirs"]) >= set(values)

        wait_for("both consumers draining the partition", drained, 60)
        delivered = [v for v in got["ours"] + got["theirs"] if v in values]
        assert sorted(delivered) == sorted(values)  # each record accepted once, by one of them
        with AdminClient(cluster.bootstrap_servers) as admin:
            described = admin.describe_groups(["sc-mixed-group"])["sc-mixed-group"]
        assert len(described.members) == 2
    finally:
        ours.close()
        theirs.close()


def test_delete_groups_removes_the_share_state(cluster: LocalCluster) -> None:
    create_topic(cluster, "sc-delete", 1)
    group = "sc-delete-group"
    (first,) = consumers(cluster, group, "sc-delete", 1)
    with AdminClient(cluster.bootstrap_servers) as admin:
        try:
            warm_up(cluster, "sc-delete", [accept_all(first)])
            refused = admin.delete_groups([group])[group]
            assert refused is not None and refused.error is ErrorCode.NON_EMPTY_GROUP
        finally:
            first.close()  # leaves: the group is empty
        assert admin.delete_groups([group]) == {group: None}
    # Kept, the group's share partition would start after the warm-up record it accepted and
    # deliver these; deleted, a new group of the same name starts at the log end again.
    produce(cluster, "sc-delete", [f"stale-{n}".encode() for n in range(5)])
    (second,) = consumers(cluster, group, "sc-delete", 1)
    seen: list[bytes] = []

    def poll() -> int:
        records = second.poll(300)
        for record in records:
            second.acknowledge(record)
            seen.append(record.value or b"")
        return len(records)

    try:
        warm_up(cluster, "sc-delete", [poll])
    finally:
        second.close()
    assert seen and not [v for v in seen if v.startswith(b"stale")], seen


def test_the_grpc_door_answers_session_and_topic_errors(cluster: LocalCluster) -> None:
    """BrokerService's ShareFetch / ShareAcknowledge keep the Kafka listener's session rules."""
    leaders = create_topic(cluster, "sc-door", 1)
    ours = pb.ShareRequestTopic(name="sc-door", partitions=[pb.ShareRequestPartition()])
    unknown = pb.ShareRequestTopic(name="nope", partitions=[pb.ShareRequestPartition()])
    g, m = "door", "m"
    with grpc.insecure_channel(cluster.broker_address(leaders[0].leader_id)) as channel:
        stub = pb_grpc.BrokerServiceStub(channel)
        lost = stub.ShareFetch(
            pb.ShareFetchRequest(group_id=g, member_id=m, share_session_epoch=3, topics=[ours]),
            timeout=30,
        )
        assert lost.error_code == ErrorCode.SHARE_SESSION_NOT_FOUND.code
        opened = stub.ShareFetch(
            pb.ShareFetchRequest(
                group_id=g, member_id=m, share_session_epoch=0, topics=[ours, unknown]
            ),
            timeout=30,
        )
        assert opened.error_code == 0, opened
        answered = {
            (t.name, p.partition): p.error_code for t in opened.topics for p in t.partitions
        }
        assert answered == {("nope", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code}
        wrong = stub.ShareAcknowledge(
            pb.ShareAcknowledgeRequest(group_id=g, member_id=m, share_session_epoch=7), timeout=30
        )
        assert wrong.error_code == ErrorCode.INVALID_SHARE_SESSION_EPOCH.code
        closed = stub.ShareAcknowledge(
            pb.ShareAcknowledgeRequest(group_id=g, member_id=m, share_session_epoch=-1), timeout=30
        )
        assert closed.error_code == 0


def test_renew_keeps_a_record_owed_and_the_leader_renews_its_lock(cluster: LocalCluster) -> None:
    """KIP-1222 through our consumer (``acknowledge(record, AcknowledgeType.RENEW)``): the
    leader accepts the renewal (commit_sync's outcome None), the record stays the consumer's to
    acknowledge across the next poll and is then accepted; over the gRPC door a ShareAcknowledge
    answers the group's lock duration, and a RENEW of a record not held is INVALID_RECORD_STATE.
    (That a renewal holds records past the lock is test_share_groups.py's, with a 3 s lock.)"""
    leaders = create_topic(cluster, "sc-renew", 1)
    (consumer,) = consumers(cluster, "sc-renew-group", "sc-renew", 1)
    try:
        warm_up(cluster, "sc-renew", [accept_all(consumer)])
        produce(cluster, "sc-renew", [b"slow"])
        slow = wait_for(
            "the record", lambda: [r for r in consumer.poll(300) if r.value == b"slow"] or None, 30
        )[0]
        consumer.acknowledge(slow, AcknowledgeType.RENEW)
        assert set(consumer.commit_sync().values()) == {None}
        assert [r.value for r in consumer.poll(300)] == []  # allowed: the record was renewed
        consumer.acknowledge(slow, AcknowledgeType.RENEW)  # still owed: renewed again
        consumer.acknowledge(slow, AcknowledgeType.ACCEPT)  # done at last
        assert set(consumer.commit_sync().values()) == {None}
        with pytest.raises(IllegalStateError):
            consumer.poll(0)
            consumer.acknowledge(slow, AcknowledgeType.RENEW)  # settled: no longer owed
    finally:
        consumer.close()
    topic = pb.ShareRequestTopic(name="sc-renew", partitions=[pb.ShareRequestPartition()])
    g, m = "sc-renew-door", "m"
    with grpc.insecure_channel(cluster.broker_address(leaders[0].leader_id)) as channel:
        stub = pb_grpc.BrokerServiceStub(channel)
        opened = stub.ShareFetch(
            pb.ShareFetchRequest(group_id=g, member_id=m, share_session_epoch=0, topics=[topic]),
            timeout=30,
        )
        assert opened.error_code == 0, opened
        renew = pb.ShareRequestTopic(name="sc-renew", partitions=[pb.ShareRequestPartition(
            acknowledgement_batches=[pb.ShareAcknowledgementBatch(
                first_offset=0, last_offset=0, acknowledge_types=[4],
            )],
        )])  # fmt: skip
        answer = stub.ShareAcknowledge(
            pb.ShareAcknowledgeRequest(
                group_id=g, member_id=m, share_session_epoch=1, topics=[renew]
            ),
            timeout=30,
        )
        assert answer.error_code == 0 and answer.acquisition_lock_timeout_ms == 30_000, answer
        (p,) = answer.topics[0].partitions
        assert p.error_code == ErrorCode.INVALID_RECORD_STATE.code
