"""What the KAFKA listener does when a request goes wrong inside the broker (issue 30 §2): a
handler's unexpected exception closes that connection only (logged once, with the request's API
and the traceback; its connection slot and request permit given back) and the broker serves on;
an API the listener was built without is neither advertised nor served (Kafka's "not enabled").

In process: one broker's serving objects (tests/fuzz/inprocess.py), each connection a socket
pair served by the listener's own connection loop on a thread; no address is bound.
"""

from __future__ import annotations

import io
import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kio.serial import entity_reader, entity_writer

from dataplane.kafka import codec as kc
from dataplane.kafka.listener import KafkaListener
from tests.fuzz.inprocess import InProcessBroker

PEER = ("10.0.0.9", 40001)
DEADLINE_S = 60.0
METADATA = {
    "topics": None, "allow_auto_topic_creation": False,
    "include_cluster_authorized_operations": False, "include_topic_authorized_operations": False,
}  # fmt: skip


@pytest.fixture(scope="module")
def broker() -> Iterator[InProcessBroker]:
    broker = InProcessBroker()
    yield broker
    broker.close()


def request(api_key: int, version: int, body: dict[str, Any], correlation_id: int = 5) -> bytes:
    """A whole request frame, size first."""
    schema = kc.request_schema(api_key, version)
    header_schema = schema.__header_schema__
    header = kc.to_entity(header_schema, {
        "request_api_key": api_key, "request_api_version": version,
        "correlation_id": correlation_id, "client_id": "failures",
    })  # fmt: skip
    buffer = io.BytesIO()
    entity_writer(header_schema)(buffer, header)
    entity_writer(schema)(buffer, kc.to_entity(schema, body))
    return kc.SIZE.pack(len(buffer.getvalue())) + buffer.getvalue()


def served(listener: KafkaListener) -> tuple[socket.socket, threading.Thread]:
    """A client socket whose other end the listener serves (admitted as a real connection)."""
    client, server = socket.socketpair()
    client.settimeout(DEADLINE_S)
    assert listener._admit(server, PEER[0])
    thread = threading.Thread(target=listener._serve, args=(server, PEER), daemon=True)
    thread.start()
    return client, thread


def answer(client: socket.socket, api_key: int, version: int) -> Any:
    size = kc.SIZE.unpack(recv_exactly(client, kc.SIZE.size))[0]
    frame = recv_exactly(client, size)
    schema = kc.response_schema(api_key, version)
    _, offset = entity_reader(schema.__header_schema__)(frame, 0)
    return entity_reader(schema)(frame, offset)[0]


def recv_exactly(client: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = client.recv(size - len(data))
        assert chunk, "the listener closed the connection"
        data += chunk
    return data


def test_a_handlers_unexpected_exception_closes_only_its_connection(
    broker: InProcessBroker, caplog: pytest.LogCaptureFixture
) -> None:
    listener = broker.listener

    def broken(request: kc.Request) -> kc.Data:
        raise RuntimeError("a bug in a handler")

    original = listener._handlers[kc.API_METADATA]
    listener._handlers[kc.API_METADATA] = broken
    try:
        client, thread = served(listener)
        with caplog.at_level(logging.INFO, logger="dataplane.kafka.listener"):
            client.sendall(request(kc.API_METADATA, 9, METADATA, correlation_id=77))
            assert client.recv(1) == b""  # closed, no answer
            thread.join(DEADLINE_S)
        assert not thread.is_alive()
    finally:
        listener._handlers[kc.API_METADATA] = original
        client.close()
    failures = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failures) == 1
    message = failures[0].getMessage()
    assert "api key 3 v9 (correlation id 77)" in message and "a bug in a handler" in message
    assert failures[0].exc_info is not None  # the traceback, once
    assert listener.quotas.count(PEER[0]) == 0  # the connection slot is back
    assert listener.requests.in_flight == 0
    # the broker serves on: the next connection's Metadata is answered
    client, thread = served(listener)
    try:
        client.sendall(request(kc.API_METADATA, 9, METADATA))
        assert "fuzz" in [t.name for t in answer(client, kc.API_METADATA, 9).topics]
    finally:
        client.close()
        thread.join(DEADLINE_S)


def test_an_api_the_listener_was_built_without_is_not_advertised_nor_served(
    broker: InProcessBroker,
) -> None:
    """Built without a controller, the listener has no CreateTopics: ApiVersions leaves it out
    (it keeps SASL's, which the authenticator serves) and a request for it closes the
    connection, as Kafka's broker does for an API it has not enabled."""
    listener = broker.listener
    assert kc.API_CREATE_TOPICS in kc.SUPPORTED
    client, thread = served(listener)
    try:
        client.sendall(request(kc.API_VERSIONS, 3, {
            "client_software_name": "failures", "client_software_version": "1",
        }))  # fmt: skip
        advertised = {k.api_key for k in answer(client, kc.API_VERSIONS, 3).api_keys}
        assert kc.API_CREATE_TOPICS not in advertised
        assert {kc.API_PRODUCE, kc.API_FETCH, kc.API_SASL_HANDSHAKE} <= advertised
        client.sendall(request(kc.API_CREATE_TOPICS, 7, {"topics": [], "timeout": 1000}))
        assert client.recv(1) == b""
        thread.join(DEADLINE_S)
        assert not thread.is_alive()
    finally:
        client.close()
    frame = request(kc.API_CREATE_TOPICS, 7, {"topics": [], "timeout": 1000})[kc.SIZE.size :]
    with pytest.raises(kc.FrameError, match="api key 19 with version 7 which is not enabled"):
        listener.handle(frame)
