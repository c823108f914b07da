"""The gRPC API as gRPC tools and other languages meet it (issue 31, docs/api.md), against a real
cluster: node 1 is the controller and a broker, node 2 a broker only.

Reflection lists every service and method (what ``grpcurl list`` shows); the health service
follows a broker that is stopped, restarted and catches up (Check and Watch); a cancelled long
poll leaves its partition at once; a produce whose deadline passes is DEADLINE_EXCEEDED and its
idempotent retry is stored once; a client pinging too often is sent away (GOAWAY
too_many_pings) while a calm one keeps working; bad input gets clear status codes."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from dataplane.broker.service import serve
from dataplane.tools.local_cluster import LocalCluster, free_port, wait_for
from metadata_quorum.grpc_errors import kafka_error_of
from metadata_quorum.grpc_standard import STANDARD_SERVICES
from protos import broker_pb2 as pb
from protos import controller_pb2 as cpb
from protos import group_pb2 as gpb
from protos import share_pb2 as spb
from protos import transaction_pb2 as tpb
from raftlog.errors import ErrorCode
from tests.dataplane.cluster_support import (
    create_topic,
    fetch,
    produce,
    read_all,
    running_cluster,
    stub,
    values_batch,
)
from tests.fuzz.inprocess import TOPIC, InProcessBroker

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("grpc-product")]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
REQUEST_MAX_BYTES = 4 * 1024 * 1024  # socket.request.max.bytes: "beyond the limit" stays small
BROKER_SERVICES = [
    pb.DESCRIPTOR.services_by_name["BrokerService"],
    gpb.DESCRIPTOR.services_by_name["GroupCoordinatorService"],
    tpb.DESCRIPTOR.services_by_name["TransactionCoordinatorService"],
    spb.DESCRIPTOR.services_by_name["ShareCoordinatorService"],
]
EAGER_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 20),
    ("grpc.min_reconnect_backoff_ms", 20),
    ("grpc.max_reconnect_backoff_ms", 20),
]
CONTROLLER_SERVICES = [cpb.DESCRIPTOR.services_by_name["ControllerService"]]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(
        tmp_path_factory.mktemp("grpc-product"),
        "grpc_product",
        {"socket.request.max.bytes": REQUEST_MAX_BYTES},
        nodes=2,
        controllers=1,
    ) as running:
        running.wait_for_brokers()
        yield running


def _listed(address: str) -> dict[str, list[str]]:
    """Every service and its methods, as a reflection client (grpcurl) reads them."""
    with grpc.insecure_channel(address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        pool = descriptor_pool.DescriptorPool(database)
        return {
            name: [method.name for method in pool.FindServiceByName(name).methods]
            for name in database.get_services()
        }


def test_reflection_lists_every_service_and_method(cluster: LocalCluster) -> None:
    for address, services in (
        (cluster.broker_address(2), BROKER_SERVICES),
        (cluster.controller_addresses[0], CONTROLLER_SERVICES),
    ):
        listed = _listed(address)
        for name, methods in sorted(listed.items()):
            print(f"{address} {name}: {', '.join(methods)}")
        expected = {s.full_name: [m.name for m in s.methods] for s in services}
        assert {n: m for n, m in listed.items() if n not in STANDARD_SERVICES} == expected
        assert set(STANDARD_SERVICES) <= listed.keys()


def _check(address: str, service: str = "") -> int:
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        status: int = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
        return status


class Watcher:
    """A Watch of the whole server's health, read on its own thread; it waits for the server
    (wait_for_ready, trying to connect every 20 ms), so it sees the first status a starting
    server gives."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address, options=EAGER_RECONNECT)
        self.statuses: list[int] = []
        self.ended: grpc.RpcError | None = None
        self.call = health_pb2_grpc.HealthStub(self.channel).Watch(
            health_pb2.HealthCheckRequest(service=""), timeout=120, wait_for_ready=True
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for answer in self.call:
                self.statuses.append(answer.status)
        except grpc.RpcError as error:
            self.ended = error

    def close(self) -> None:
        self.call.cancel()
        self.thread.join(timeout=10)
        self.channel.close()


def test_health_follows_a_broker_stopped_restarted_and_caught_up(cluster: LocalCluster) -> None:
    broker = cluster.broker_address(2)
    controller = cluster.controller_addresses[0]
    for service in ["", *(s.full_name for s in BROKER_SERVICES)]:
        assert _check(broker, service) == SERVING, service
    assert _check(controller) == SERVING
    assert _check(controller, CONTROLLER_SERVICES[0].full_name) == SERVING
    with pytest.raises(grpc.RpcError) as unknown:
        _check(broker, "no.such.Service")
    assert unknown.value.code() is grpc.StatusCode.NOT_FOUND

    stopping = Watcher(broker)
    try:
        wait_for("the first status", lambda: stopping.statuses or None, 10)
        cluster.stop_node(2)  # SIGTERM: controlled shutdown, then the server stops
        wait_for("the watch to end", lambda: stopping.ended is not None or None, 30)
    finally:
        stopping.close()
    print("stopping broker 2:", [health_pb2.HealthCheckResponse.ServingStatus.Name(s)
                                 for s in stopping.statuses])  # fmt: skip
    assert stopping.statuses == [SERVING, NOT_SERVING], "NOT_SERVING before the server goes"

    starting = Watcher(broker)  # connects once the restarted server listens
    try:
        cluster.start_node(2)
        wait_for("SERVING again", lambda: SERVING in starting.statuses or None, 60)
    finally:
        starting.close()
    print("restarted broker 2:", [health_pb2.HealthCheckResponse.ServingStatus.Name(s)
                                  for s in starting.statuses])  # fmt: skip
    assert starting.statuses == [NOT_SERVING, SERVING], "registering and catching up first"
    assert _check(broker) == SERVING
    cluster.wait_for_brokers()


def test_a_cancelled_long_poll_leaves_its_partition_at_once() -> None:
    broker = InProcessBroker()
    address = f"127.0.0.173:{free_port('127.0.0.173')}"
    server = serve(broker.servicer, address)
    partition = broker.replicas.get(TOPIC, 0)
    try:
        with grpc.insecure_channel(address) as channel:
            poll = channel.unary_unary(
                "/" + pb.DESCRIPTOR.services_by_name["BrokerService"].full_name + "/Fetch",
                request_serializer=pb.FetchRequest.SerializeToString,
                response_deserializer=pb.FetchResponse.FromString,
            ).future(
                pb.FetchRequest(
                    replica_id=-1, max_wait_ms=30_000, min_bytes=1 << 20, max_bytes=1 << 20,
                    topics=[pb.FetchTopic(name=TOPIC, partitions=[
                        pb.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)
                    ])],
                ),
                timeout=60,
            )  # fmt: skip
            wait_for("the long poll to wait", lambda: partition.waiter_count == 1 or None, 10)
            cancelled = time.monotonic()
            poll.cancel()
            wait_for("its waiter to go", lambda: partition.waiter_count == 0 or None, 10)
            freed_s = time.monotonic() - cancelled
    finally:
        server.stop(grace=None)
        broker.close()
    print(f"the cancelled long poll left its partition after {freed_s * 1000:.0f} ms")
    assert freed_s < 2.0, "30 s max_wait_ms: it left because of the cancel"


def _init_producer(address: str) -> tuple[int, int]:
    answer = stub(address).InitProducerId(pb.InitProducerIdRequest(), timeout=10)
    assert answer.error_code == 0, answer.error_message
    return answer.producer_id, answer.producer_epoch


def test_a_produce_past_its_deadline_is_deadline_exceeded_and_its_retry_is_stored_once(
    cluster: LocalCluster,
) -> None:
    leaders = create_topic(cluster, "deadlines", 1, rf=2)
    leader = leaders[0].leader_id
    follower = 2 if leader == 1 else 1
    address = cluster.broker_address(leader)
    producer_id, epoch = _init_producer(address)
    batch = values_batch([b"once"], producer_id=producer_id, producer_epoch=epoch, base_sequence=0)
    request = pb.ProduceRequest(
        acks=-1, timeout_ms=30_000,
        topics=[pb.ProduceTopic(name="deadlines", partitions=[
            pb.ProducePartition(partition=0, records=batch)
        ])],
    )  # fmt: skip
    cluster.signal_node(follower, signal.SIGSTOP)  # the ISR cannot replicate it meanwhile
    try:
        with pytest.raises(grpc.RpcError) as late:
            stub(address).Produce(request, timeout=1.0)
    finally:
        cluster.signal_node(follower, signal.SIGCONT)
    assert late.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    retried = stub(address).Produce(request, timeout=30).topics[0].partitions[0]
    assert retried.error_code == 0, retried.error_message
    assert retried.base_offset == 0, "the retry got the first append's offset"
    values = [r.value for r in read_all(address, "deadlines", 0, 1)]
    assert fetch(address, "deadlines", 0, 0).high_watermark == 1
    assert values == [b"once"]


def test_a_client_pinging_too_often_is_sent_away_and_a_calm_one_is_served(
    cluster: LocalCluster,
) -> None:
    broker = cluster.broker_address(2)
    pinging = grpc.insecure_channel(
        broker,
        options=[
            ("grpc.keepalive_time_ms", 200),  # the server allows one ping per 10 s
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ],
    )
    try:
        started = time.monotonic()
        watch = health_pb2_grpc.HealthStub(pinging).Watch(
            health_pb2.HealthCheckRequest(service=""), timeout=30
        )
        with pytest.raises(grpc.RpcError) as sent_away:
            for _status in watch:
                pass
        after_s = time.monotonic() - started
    finally:
        pinging.close()
    error = sent_away.value
    print(f"after {after_s:.1f} s: {error.code()} {error.details()}")
    assert error.code() is grpc.StatusCode.UNAVAILABLE
    assert "too many pings" in error.details().lower()
    assert after_s < 25, "closed by the server, not ended by the call's deadline"
    assert _check(broker) == SERVING, "a calm client is served"


def test_bad_input_gets_clear_status_codes_and_nothing_is_stored_twice(
    cluster: LocalCluster,
) -> None:
    create_topic(cluster, "bad-grpc", 1, rf=1)
    address = cluster.broker_address(wait_for_leader_of(cluster, "bad-grpc"))
    method = "/" + pb.DESCRIPTOR.services_by_name["BrokerService"].full_name + "/Produce"
    raw = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)])
    try:
        call = raw.unary_unary(method, response_deserializer=pb.ProduceResponse.FromString)
        # unknown fields (a newer client's): ignored, as protobuf promises; stored once
        request = pb.ProduceRequest(
            acks=-1, timeout_ms=10_000,
            topics=[pb.ProduceTopic(name="bad-grpc", partitions=[
                pb.ProducePartition(partition=0, records=values_batch([b"unknown-fields"]))
            ])],
        )  # fmt: skip
        extra = b"\xb8\x3e\x07" + b"\xc2\x3e\x03abc"  # field 999 = 7, field 1000 = "abc"
        answer = call(request.SerializeToString() + extra, timeout=10)
        assert answer.topics[0].partitions[0].error_code == 0
        # bytes that are no ProduceRequest: INVALID_ARGUMENT, INVALID_REQUEST
        with pytest.raises(grpc.RpcError) as garbled:
            call(b"\x0a\xff\xff\xff\x0f", timeout=10)
        assert garbled.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert kafka_error_of(garbled.value) is ErrorCode.INVALID_REQUEST
        # no topic, no partition, no records, no acks: nothing to do, an empty answer
        empty = stub(address).Produce(pb.ProduceRequest(acks=-1, timeout_ms=1000), timeout=10)
        assert list(empty.topics) == []
        unnamed = stub(address).Produce(
            pb.ProduceRequest(acks=-1, timeout_ms=1000, topics=[
                pb.ProduceTopic(partitions=[pb.ProducePartition(partition=0)])
            ]), timeout=10,
        ).topics[0].partitions[0]  # fmt: skip
        print("a partition of no topic:", ErrorCode.from_code(unnamed.error_code).name)
        assert unnamed.error_code != 0
        # a huge repeated field within the size limit: one answer per entry
        many = pb.MetadataRequest(topics=[f"absent-{n}" for n in range(20_000)])
        described = stub(address).Metadata(many, timeout=60)
        assert len(described.topics) == 20_000
        assert {t.error_code for t in described.topics} == {
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code
        }
        # beyond socket.request.max.bytes: refused by gRPC before any handler runs
        huge = pb.MetadataRequest(topics=["x" * 1000] * (REQUEST_MAX_BYTES // 1000 + 10))
        with pytest.raises(grpc.RpcError) as too_big:
            stub(address).Metadata(huge, timeout=30)
        assert too_big.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        # a deadline of 1 ms on a call that cannot be answered that fast (20,000 topics
        # described): DEADLINE_EXCEEDED, and the node serves on. (A small produce on loopback
        # can be answered within 1 ms; the deadline of a produce in flight has its own test.)
        with pytest.raises(grpc.RpcError) as hurried:
            stub(address).Metadata(many, timeout=0.001)
        assert hurried.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        raw.close()
    after = produce(address, "bad-grpc", 0, values_batch([b"still-serving"]))
    assert after.error_code == 0, "the node keeps serving"
    values = [r.value for r in read_all(address, "bad-grpc", 0, after.base_offset + 1)]
    print("stored:", values)
    assert values[0] == b"unknown-fields" and values[-1] == b"still-serving"
    assert values.count(b"unknown-fields") == 1


def wait_for_leader_of(cluster: LocalCluster, topic: str) -> int:
    def probe() -> int | None:
        described = stub(cluster.broker_address(1)).Metadata(
            pb.MetadataRequest(topics=[topic]), timeout=5
        )
        leader = described.topics[0].partitions[0].leader_id if described.topics else -1
        return leader if leader > 0 else None

    return wait_for(f"a leader of {topic}", probe, 30)
