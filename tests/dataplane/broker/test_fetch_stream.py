"""BrokerService.FetchStream over a real gRPC server, in process (an `InProcessBroker` that
leads ``fuzz``-0 alone, served on 127.0.0.238): records pushed as they are appended, in order,
once; a cancelled stream leaves its partition at once; a leader change ends the stream with
NOT_LEADER_OR_FOLLOWER's rich status; a client that stops reading stops the broker's reads; the
streams per broker are bounded; a bad request and a refused topic end it as documented."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from dataplane.broker.fetch_stream import StreamSlots
from dataplane.broker.service import serve
from dataplane.tools.local_cluster import free_port, wait_for
from metadata_quorum.grpc_errors import kafka_error_of
from metadata_quorum.image import PartitionRegistration, TopicImage
from metadata_quorum.security.acl import AclOperation, ResourceType
from metadata_quorum.security.principal import KafkaPrincipal, Session, acting_as
from protos import broker_pb2 as pb
from protos.wire import FetchStreamAnswer, fetch_stream_method
from raftlog.errors import ErrorCode
from raftlog.records import encode_batch, iter_records
from tests.dataplane.broker.test_authorization import Images, acl, with_acls
from tests.fuzz.inprocess import TOPIC, TOPIC_ID, Aborted, FakeContext, InProcessBroker

pytestmark = [pytest.mark.timeout(120), pytest.mark.xdist_group("grpc-stream")]
READ = AclOperation.READ
HOST = "127.0.0.238"  # tests/dataplane/cluster_support.py RANGES "grpc_stream": 236-238


@pytest.fixture
def served() -> Iterator[tuple[InProcessBroker, str]]:
    broker = InProcessBroker()
    address = f"{HOST}:{free_port(HOST)}"
    server = serve(broker.servicer, address)
    try:
        yield broker, address
    finally:
        server.stop(grace=None)
        broker.close()


def produce(broker: InProcessBroker, *values: bytes) -> None:
    batch = encode_batch([(None, v, 1_700_000_000_000, ()) for v in values])
    answer = broker.servicer.Produce(
        pb.ProduceRequest(acks=1, timeout_ms=5_000, topics=[pb.ProduceTopic(
            name=TOPIC, partitions=[pb.ProducePartition(partition=0, records=batch)])]),
        None,
    )  # fmt: skip
    assert answer.topics[0].partitions[0].error_code == 0, answer


def request(offset: int = 0, max_bytes: int = 1 << 20) -> pb.FetchStreamRequest:
    return pb.FetchStreamRequest(
        max_bytes=max_bytes,
        topics=[pb.FetchStreamTopic(name=TOPIC, partitions=[
            pb.FetchStreamPartition(partition=0, fetch_offset=offset, current_leader_epoch=-1)
        ])],
    )  # fmt: skip


def values(answer: FetchStreamAnswer) -> list[tuple[int, bytes]]:
    records = answer.message().topics[0].partitions[0].records
    return [(r.offset, bytes(r.value or b"")) for r in iter_records(records)]


def waiting(broker: InProcessBroker, count: int) -> None:
    partition = broker.replicas.get(TOPIC, 0)
    wait_for(f"{count} waiters", lambda: partition.waiter_count == count or None, 10)


def test_records_are_pushed_in_order_once_and_a_cancel_frees_the_waiter(
    served: tuple[InProcessBroker, str],
) -> None:
    broker, address = served
    produce(broker, b"a0", b"a1")
    with grpc.insecure_channel(address) as channel:
        stream: Any = fetch_stream_method(channel)(request(), timeout=60)
        got = values(next(stream))
        waiting(broker, 1)  # read it all: it waits for more
        for n in range(2, 6):
            produce(broker, b"a%d" % n)
            got += values(next(stream))
        assert got == [(n, b"a%d" % n) for n in range(6)]
        cancelled = time.monotonic()
        stream.cancel()
        waiting(broker, 0)
        freed_s = time.monotonic() - cancelled
    print(f"the cancelled stream left its partition after {freed_s * 1000:.0f} ms")
    assert freed_s < 2.0, "no deadline for 60 s: it left because of the cancel"


def test_a_leader_change_ends_the_stream_with_not_leader_or_follower(
    served: tuple[InProcessBroker, str],
) -> None:
    broker, address = served
    with grpc.insecure_channel(address) as channel:
        stream: Any = fetch_stream_method(channel)(request(), timeout=60)
        waiting(broker, 1)
        image = broker.replicas.image
        topic = image.topics[TOPIC_ID]
        moved = {**topic.partitions, 0: PartitionRegistration((2, 1), (2, 1), 2, 1, 1)}
        broker.replicas.apply_image(
            dataclasses.replace(
                image, offset=image.offset + 1,
                topics={**image.topics, TOPIC_ID: TopicImage(TOPIC, TOPIC_ID, moved)},
            ),
            caught_up=True,
        )  # fmt: skip
        with pytest.raises(grpc.RpcError) as ended:
            next(stream)
    assert ended.value.code() is grpc.StatusCode.UNAVAILABLE, ended.value
    assert kafka_error_of(ended.value) is ErrorCode.NOT_LEADER_OR_FOLLOWER
    print(f"the stream ended {ended.value.code()}: {ended.value.details()}")
    waiting(broker, 0)


def test_a_client_that_stops_reading_stops_the_broker_reading(
    served: tuple[InProcessBroker, str],
) -> None:
    """64 MiB stored, messages of 256 KiB: the broker reads (bytes_out) what the client's
    HTTP/2 window (grown by gRPC's BDP probing: 4.5-17 MiB measured on loopback) and the sockets
    take, and then waits; once read on, everything comes, once."""
    broker, address = served
    value = b"v" * (64 * 1024)
    batches = 1024
    for n in range(batches):
        produce(broker, value + b"%05d" % n)
    total = broker.replicas.get(TOPIC, 0).log.log_end_offset
    assert total == batches

    def read_bytes() -> float:
        return float(broker.servicer.metrics.bytes_out.labels(TOPIC)._value.get())

    with grpc.insecure_channel(address) as channel:
        stream: Any = fetch_stream_method(channel)(request(max_bytes=256 * 1024), timeout=60)
        seen = values(next(stream))
        since = [time.monotonic(), read_bytes()]  # when the reading last moved, and to what

        def settled() -> bool:  # unchanged for 1 s: the broker is blocked sending
            now, reading = time.monotonic(), read_bytes()
            if reading != since[1]:
                since[:] = [now, reading]
            return now - since[0] >= 1.0

        wait_for("the broker to stop reading", settled, 30)
        held = since[1]
        stored = total * len(value)
        print(f"a client not reading: the broker read {held / 2**20:.1f} MiB of "
              f"{stored / 2**20:.0f} MiB")  # fmt: skip
        assert held < stored / 2, "the broker kept reading for a client that did not"
        for answer in stream:
            seen += values(answer)
            if seen[-1][0] == total - 1:
                break
    assert [offset for offset, _ in seen] == list(range(total))


def test_streams_per_broker_are_bounded(served: tuple[InProcessBroker, str]) -> None:
    broker, address = served
    broker.servicer.fetch_streams = StreamSlots(1)
    produce(broker, b"x")
    with grpc.insecure_channel(address) as channel:
        first: Any = fetch_stream_method(channel)(request(), timeout=60)
        next(first)
        with pytest.raises(grpc.RpcError) as refused:
            next(fetch_stream_method(channel)(request(), timeout=60))
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
        assert kafka_error_of(refused.value) is ErrorCode.NETWORK_EXCEPTION
        first.cancel()
        waiting(broker, 0)
        wait_for("its slot back", lambda: broker.servicer.fetch_streams.running == 0 or None, 10)
        again: Any = fetch_stream_method(channel)(request(), timeout=60)
        assert values(next(again)) == [(0, b"x")]
        again.cancel()


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (pb.FetchStreamRequest(), "names no partition"),
        (pb.FetchStreamRequest(isolation_level=7, topics=request().topics), "isolation_level"),
        (pb.FetchStreamRequest(topics=[*request().topics, *request().topics]), "named twice"),
    ],
)
def test_a_request_that_cannot_be_served_is_invalid_argument(
    served: tuple[InProcessBroker, str], bad: pb.FetchStreamRequest, why: str
) -> None:
    _, address = served
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as refused:
        next(fetch_stream_method(channel)(bad, timeout=10))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert kafka_error_of(refused.value) is ErrorCode.INVALID_REQUEST
    assert why in str(refused.value.details())


def test_a_topic_without_read_is_refused_as_fetch_refuses_it() -> None:
    """bob without READ on the topic: Fetch answers TOPIC_AUTHORIZATION_FAILED for the
    partition, FetchStream ends with it (PERMISSION_DENIED); with READ both serve."""
    broker = InProcessBroker()
    try:
        images = Images(broker.replicas.image)
        broker.servicer.access = images.access()
        produce(broker, b"secret")
        bob = Session(KafkaPrincipal.user("bob"), "127.0.0.1", "BROKER")
        fetch = pb.FetchRequest(
            replica_id=-1,
            max_bytes=1 << 20,
            topics=[
                pb.FetchTopic(
                    name=TOPIC,
                    partitions=[pb.FetchPartition(partition=0, partition_max_bytes=1 << 20)],
                )
            ],
        )
        with acting_as(bob):  # fmt: skip
            refused = broker.servicer.Fetch(fetch, None).topics[0].partitions[0]
            with pytest.raises(Aborted, match="PERMISSION_DENIED"):
                next(broker.servicer.fetch_stream(request(), FakeContext()))
            images.current = with_acls(images.current, acl(ResourceType.TOPIC, TOPIC, READ))
            served = broker.servicer.Fetch(fetch, None).topics[0].partitions[0]
            answer = next(broker.servicer.fetch_stream(request(), FakeContext()))
        assert refused.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED.code
        assert served.error_code == 0 and served.records
        assert values(answer) == [(0, b"secret")]
    finally:
        broker.close()
