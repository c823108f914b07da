"""Records through the KAFKA listener without copies. A response frame as the buffers it is
made of (kc.encode_response_parts) and their gather write (listener.send_frame): the records of
a Fetch answer go to the socket by reference, and the bytes on the wire are exactly those of the
frame encoded whole into one buffer, as kio writes it (every Fetch version served, legacy and
flexible, null and empty records, aborted transactions). A Produce's records go to the broker
beside a skeleton request, each to its own partition. In process; the Fetch test at the end
reads its answer over a socket pair from the listener's own connection loop.
"""

from __future__ import annotations

import io
import os
import socket
import threading
from typing import Any

import pytest
from kio.serial import entity_reader, entity_writer

from dataplane.kafka import codec as kc
from dataplane.kafka.listener import IOV_MAX, send_frame
from protos import broker_pb2 as pb
from raftlog.records import encode_batch
from tests.dataplane.kafka.test_listener_failures import DEADLINE_S, request, served
from tests.fuzz.inprocess import TOPIC, InProcessBroker

FETCH_VERSIONS = range(kc.SUPPORTED[kc.API_FETCH][0], kc.SUPPORTED[kc.API_FETCH][1] + 1)
LARGE = os.urandom(kc.BY_REFERENCE_MIN_BYTES + 3)


def whole_frame(api_key: int, version: int, correlation_id: int, data: kc.Data) -> bytes:
    """The frame written into one buffer by kio, as the listener encoded every answer before."""
    schema = kc.response_schema(api_key, version)
    header_schema = schema.__header_schema__
    buffer = io.BytesIO()
    entity_writer(header_schema)(buffer, kc.to_entity(header_schema, {"correlation_id": 7}))
    entity_writer(schema)(buffer, kc.to_entity(schema, data))
    return kc.SIZE.pack(len(buffer.getvalue())) + buffer.getvalue()


def fetch_answer(records: list[Any]) -> kc.Data:
    return {
        "throttle_time": 3, "error_code": 0, "session_id": 12,
        "responses": [{"topic": "t", "partitions": [
            {"partition_index": index, "error_code": 0, "high_watermark": 90,
             "last_stable_offset": 80, "log_start_offset": 1,
             "aborted_transactions": [{"producer_id": 5, "first_offset": 60}] if index else [],
             "preferred_read_replica": -1, "records": value}
            for index, value in enumerate(records)
        ]}],
    }  # fmt: skip


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_a_fetch_answer_in_parts_is_the_whole_frame_with_the_records_by_reference(
    version: int,
) -> None:
    view = memoryview(LARGE)[1:]
    records = [LARGE, b"", None, b"small batch", view, LARGE]
    data = fetch_answer(records)
    parts = kc.encode_response_parts(kc.API_FETCH, version, 7, data)
    assert b"".join(parts) == whole_frame(kc.API_FETCH, version, 7, data)
    by_reference = [part for part in parts if len(part) >= kc.BY_REFERENCE_MIN_BYTES]
    assert [id(part) for part in by_reference] == [id(LARGE), id(view), id(LARGE)]
    assert kc.encode_response(kc.API_FETCH, version, 7, data) == b"".join(parts)


def test_an_answer_without_large_values_is_one_buffer() -> None:
    parts = kc.encode_response_parts(kc.API_FETCH, 12, 7, fetch_answer([b"x" * 100]))
    assert len(parts) == 1 and isinstance(parts[0], bytearray)
    assert kc.SIZE.unpack_from(parts[0])[0] == len(parts[0]) - kc.SIZE.size


def received(parts: list[kc.Buffer], send_buffer_bytes: int) -> bytes:
    """What the other end of a socket pair reads of ``send_frame(parts)``: a small send buffer
    makes the socket take each sendmsg only in part."""
    writer, reader = socket.socketpair()
    writer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_bytes)
    writer.settimeout(DEADLINE_S)
    reader.settimeout(DEADLINE_S)
    expected = sum(len(part) for part in parts)
    chunks: list[bytes] = []

    def read() -> None:
        got = 0
        while got < expected:
            chunk = reader.recv(1 << 16)
            if not chunk:
                return
            chunks.append(chunk)
            got += len(chunk)

    thread = threading.Thread(target=read)
    thread.start()
    try:
        send_frame(writer, parts)
        thread.join(DEADLINE_S)
        assert not thread.is_alive()
    finally:
        writer.close()
        reader.close()
    return b"".join(chunks)


def test_a_gather_write_taken_in_part_is_finished_in_order() -> None:
    parts: list[kc.Buffer] = [bytearray(b"head"), LARGE, b"", memoryview(LARGE)[5:], b"tail"]
    assert received(parts, 4096) == b"".join(parts)


def test_more_buffers_than_one_sendmsg_takes_all_go_out() -> None:
    parts: list[kc.Buffer] = [bytes([n % 251]) * (1 + n % 7) for n in range(IOV_MAX * 2 + 5)]
    assert received(parts, 1 << 20) == b"".join(parts)


@pytest.fixture(scope="module")
def broker() -> Any:
    broker = InProcessBroker()
    yield broker
    broker.close()


def test_a_fetch_over_the_connection_loop_reads_the_stored_batches_unchanged(
    broker: InProcessBroker,
) -> None:
    """Fetch v12 of a partition holding a 40 KiB batch, served by the listener's connection
    loop: the frame read off the socket is the one `handle` gives, and its records are the
    batch as produced (offsets assigned)."""
    value = os.urandom(1024)
    batch = encode_batch([(None, value, 1_700_000_000_000, ()) for _ in range(40)])
    produced = broker.servicer.Produce(pb.ProduceRequest(acks=1, timeout_ms=1000, topics=[
        pb.ProduceTopic(name=TOPIC, partitions=[pb.ProducePartition(partition=0, records=batch)]),
    ]), None)  # fmt: skip
    base_offset = produced.topics[0].partitions[0].base_offset
    body = {
        "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
        "topics": [{"topic": TOPIC, "partitions": [{
            "partition": 0, "fetch_offset": base_offset, "partition_max_bytes": 1 << 20,
            "current_leader_epoch": -1, "last_fetched_epoch": -1, "log_start_offset": -1,
        }]}],
    }  # fmt: skip
    frame = request(kc.API_FETCH, 12, body, correlation_id=31)
    client, thread = served(broker.listener)
    try:
        client.sendall(frame)
        size = kc.SIZE.unpack(_recv(client, kc.SIZE.size))[0]
        answer = kc.SIZE.pack(size) + _recv(client, size)
    finally:
        client.close()
        thread.join(DEADLINE_S)
    assert answer == broker.listener.handle(frame[kc.SIZE.size :])
    # the batch from its attributes on (the leader sets its offset and leader epoch), unchanged
    assert batch[21:] in answer


def _recv(client: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = client.recv(size - len(data))
        assert chunk, "the listener closed the connection"
        data += chunk
    return bytes(data)


def test_a_produce_appends_each_partitions_batch_as_sent(broker: InProcessBroker) -> None:
    """Produce v9 naming a partition this broker leads and one it does not, in that order and
    the reverse: each answer is its own partition's, and the batch read back is the one sent."""
    batches = [
        encode_batch([(None, os.urandom(1024), 1_700_000_000_000, ()) for _ in range(30)])
        for _ in range(2)
    ]
    for order in ((0, 1), (1, 0)):
        body = {"transactional_id": None, "acks": 1, "timeout": 1000, "topic_data": [
            {"name": TOPIC, "partition_data": [
                {"index": i, "records": batches[i]} for i in order
            ]},
        ]}  # fmt: skip
        frame = request(kc.API_PRODUCE, 9, body)[kc.SIZE.size :]
        answer = broker.listener.respond(frame)
        assert answer is not None
        parsed = _response(kc.API_PRODUCE, 9, b"".join(answer))
        results = {p.index: p for p in parsed.responses[0].partition_responses}
        assert [p.index for p in parsed.responses[0].partition_responses] == list(order)
        assert results[1].error_code.value == 6  # NOT_LEADER_OR_FOLLOWER: broker 2 leads it
        assert results[0].error_code.value == 0
        read = broker.servicer.fetch(pb.FetchRequest(replica_id=-1, max_bytes=1 << 20, topics=[
            pb.FetchTopic(name=TOPIC, partitions=[pb.FetchPartition(
                partition=0, fetch_offset=results[0].base_offset, partition_max_bytes=1 << 20,
            )]),
        ]))  # fmt: skip
        assert bytes(read.records[0][21 : len(batches[0])]) == batches[0][21:]


def _response(api_key: int, version: int, frame: bytes) -> Any:
    schema = kc.response_schema(api_key, version)
    _, offset = entity_reader(schema.__header_schema__)(frame, kc.SIZE.size)
    return entity_reader(schema)(frame, kc.SIZE.size + offset)[0]
