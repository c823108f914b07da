"""Bad input against a real 3-node cluster: every mistake is answered with Kafka's error code
for that partition, the broker stays up, and nothing already stored is lost."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import time
from collections.abc import Iterator

import grpc
import pytest

from dataplane.tools.local_cluster import LocalCluster
from protos import broker_pb2 as pb
from raftlog.batch import CRC_OFFSET
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

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("dataplane-bad-input")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("bad-input"), "bad_input") as running:
        yield running


@pytest.fixture(scope="module")
def topic(cluster: LocalCluster) -> tuple[str, str, int]:
    """A 1-partition topic with small max.message.bytes; (name, leader address, leader id)."""
    leaders = create_topic(cluster, "strict", 1, 3, {"max.message.bytes": "4096"})
    leader = leaders[0].leader_id
    return "strict", cluster.broker_address(leader), leader


def stored_values(address: str, name: str) -> list[bytes | None]:
    end = fetch(address, name, 0, 0).high_watermark
    return [r.value for r in read_all(address, name, 0, end)]


def code(error: ErrorCode) -> int:
    return error.code


def test_each_bad_produce_gets_its_error_and_nothing_stored_is_lost(
    cluster: LocalCluster, topic: tuple[str, str, int]
) -> None:
    name, address, leader = topic
    good = produce(address, name, 0, values_batch([b"kept-1", b"kept-2"]))
    assert good.error_code == 0 and good.base_offset == 0

    corrupt = bytearray(values_batch([b"corrupt"]))
    corrupt[CRC_OFFSET] ^= 0xFF
    assert produce(address, name, 0, bytes(corrupt)).error_code == code(ErrorCode.CORRUPT_MESSAGE)

    oversized = values_batch([os.urandom(8000)])
    answer = produce(address, name, 0, oversized)
    assert answer.error_code == code(ErrorCode.MESSAGE_TOO_LARGE), answer.error_message

    future = values_batch([b"from the future"], timestamp_ms=int(time.time() * 1000) + 86_400_000)
    assert produce(address, name, 0, future).error_code == code(ErrorCode.INVALID_TIMESTAMP)

    garbage = produce(address, name, 0, b"\x00\x01 not a record batch")
    assert garbage.error_code == code(ErrorCode.CORRUPT_MESSAGE), garbage.error_message

    unknown = produce(address, "no-such-topic", 0, values_batch([b"x"]))
    assert unknown.error_code == code(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    no_partition = produce(address, name, 7, values_batch([b"x"]))
    assert no_partition.error_code == code(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)

    acks = produce(address, name, 0, values_batch([b"x"]), acks=2)
    assert acks.error_code == code(ErrorCode.INVALID_REQUIRED_ACKS)

    follower = next(s.node_id for s in cluster.specs if s.node_id != leader)
    misdirected = produce(cluster.broker_address(follower), name, 0, values_batch([b"x"]))
    assert misdirected.error_code == code(ErrorCode.NOT_LEADER_OR_FOLLOWER)
    assert misdirected.leader_id == leader, "the answer names the current leader"

    assert produce(address, name, 0, values_batch([b"kept-3"])).base_offset == 2
    assert stored_values(address, name) == [b"kept-1", b"kept-2", b"kept-3"]


def test_bad_offsets_and_epochs_on_fetch(
    cluster: LocalCluster, topic: tuple[str, str, int]
) -> None:
    name, address, _ = topic
    produce(address, name, 0, values_batch([b"a"]))
    end = fetch(address, name, 0, 0).log_end_offset
    beyond = fetch(address, name, 0, end + 1000)
    assert beyond.error_code == code(ErrorCode.OFFSET_OUT_OF_RANGE)
    assert beyond.log_end_offset == end, "the answer says where the log ends"
    negative = fetch(address, name, 0, -5)
    assert negative.error_code == code(ErrorCode.OFFSET_OUT_OF_RANGE)
    assert fetch(address, name, 0, 0, leader_epoch=999).error_code == code(
        ErrorCode.UNKNOWN_LEADER_EPOCH
    )
    unknown = fetch(address, "no-such-topic", 0, 0)
    assert unknown.error_code == code(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    at_end = fetch(address, name, 0, end, max_wait_ms=200)
    assert at_end.error_code == 0 and at_end.records == b"", (
        "a long poll at the end times out empty"
    )


def test_bad_list_offsets_and_metadata(cluster: LocalCluster, topic: tuple[str, str, int]) -> None:
    name, address, _ = topic
    answer = stub(address).ListOffsets(
        pb.ListOffsetsRequest(
            topics=[pb.ListOffsetsTopic(name=name, partitions=[pb.ListOffsetsPartition(
                partition=0, timestamp=-7, current_leader_epoch=-1)])]
        ),
        timeout=5,
    )  # fmt: skip
    assert answer.topics[0].partitions[0].error_code == code(ErrorCode.INVALID_REQUEST)
    described = stub(address).Metadata(
        pb.MetadataRequest(topics=["bad/name", "missing"]), timeout=5
    )
    errors = {t.name: t.error_code for t in described.topics}
    assert errors == {
        "bad/name": code(ErrorCode.INVALID_TOPIC_EXCEPTION),
        "missing": code(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    }


def test_garbage_bytes_on_the_grpc_port_do_not_hurt_the_broker(
    cluster: LocalCluster, topic: tuple[str, str, int]
) -> None:
    name, address, _ = topic
    before = stored_values(address, name)
    host, port = address.rsplit(":", 1)
    for payload in (
        os.urandom(4096),
        b"GET / HTTP/1.1\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    ):
        with socket.create_connection((host, int(port)), timeout=5) as raw:
            raw.sendall(payload)
            raw.settimeout(2)
            # the server may answer with a GOAWAY, or just drop us
            with contextlib.suppress(TimeoutError, ConnectionResetError):
                raw.recv(1024)
    # A well-framed gRPC call whose body is not a ProduceRequest.
    channel = grpc.insecure_channel(address)
    call = channel.unary_unary("/raftlog.broker.v1.BrokerService/Produce")
    with pytest.raises(grpc.RpcError) as raised:
        call(b"\xff" * 64 + struct.pack(">q", -1), timeout=5)
    assert raised.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)
    channel.close()
    assert produce(address, name, 0, values_batch([b"after garbage"])).error_code == 0
    assert stored_values(address, name) == [*before, b"after garbage"]


def test_min_insync_replicas_larger_than_the_isr_refuses_acks_all(cluster: LocalCluster) -> None:
    leaders = create_topic(cluster, "too-strict", 1, 2, {"min.insync.replicas": "3"})
    address = cluster.broker_address(leaders[0].leader_id)
    refused = produce(address, "too-strict", 0, values_batch([b"x"]))
    assert refused.error_code == code(ErrorCode.NOT_ENOUGH_REPLICAS)
    assert produce(address, "too-strict", 0, values_batch([b"y"]), acks=1).error_code == 0


def test_a_batch_that_overtook_its_predecessor_waits_and_a_real_gap_is_refused(
    cluster: LocalCluster,
) -> None:
    """gRPC serves a producer's concurrent requests in any order: the broker holds a batch
    that arrived ahead of its sequence until the one before it is stored. A gap that nothing
    fills is OUT_OF_ORDER_SEQUENCE_NUMBER, after the wait, and nothing stored is lost."""
    leaders = create_topic(cluster, "reordered", 1)
    address = cluster.broker_address(leaders[0].leader_id)
    ids = {"producer_id": 4242, "producer_epoch": 0}
    request = pb.ProduceRequest(acks=-1, timeout_ms=10_000, topics=[pb.ProduceTopic(
        name="reordered", partitions=[pb.ProducePartition(
            partition=0, records=values_batch([b"third", b"fourth"], base_sequence=2, **ids),
        )],
    )])  # fmt: skip
    ahead = stub(address).Produce.future(request, timeout=15)
    # a round trip on the same channel: the broker has the early batch before the first comes
    stub(address).Metadata(pb.MetadataRequest(topics=["reordered"]), timeout=5)
    assert not ahead.done(), "the early batch was answered before the batch it overtook came"
    first = values_batch([b"first", b"second"], base_sequence=0, **ids)
    assert produce(address, "reordered", 0, first).base_offset == 0
    answer = ahead.result().topics[0].partitions[0]
    assert (answer.error_code, answer.base_offset) == (0, 2), "stored after the one it overtook"
    gap = values_batch([b"lost one before"], base_sequence=9, **ids)
    assert produce(address, "reordered", 0, gap).error_code == code(
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    )
    assert stored_values(address, "reordered") == [b"first", b"second", b"third", b"fourth"]
