"""Raw Kafka requests for tests: one connection to one broker, requests in order, encoded with
the listener's own schemas (dataplane/kafka/codec.py), so a test can send exactly the request a
client would and read every field of the answer."""

from __future__ import annotations

import io
import socket
from typing import Any

from kio.serial import entity_reader, entity_writer

from dataplane.kafka import codec as kc


class RawKafkaConnection:
    """Kafka requests in order on one connection, encoded with the listener's own schemas."""

    def __init__(self, address: str, client_id: str = "raftlog-test") -> None:
        host, port = address.rsplit(":", 1)
        self.socket = socket.create_connection((host, int(port)), timeout=30)
        self.correlation_id = 0
        self.client_id = client_id

    def close(self) -> None:
        self.socket.close()

    def call(self, api_key: int, version: int, data: dict[str, Any]) -> Any:
        self.correlation_id += 1
        schema = kc.request_schema(api_key, version)
        header = kc.to_entity(schema.__header_schema__, {
            "request_api_key": api_key, "request_api_version": version,
            "correlation_id": self.correlation_id, "client_id": self.client_id,
        })  # fmt: skip
        buffer = io.BytesIO()
        entity_writer(schema.__header_schema__)(buffer, header)
        entity_writer(schema)(buffer, kc.to_entity(schema, data))
        frame = buffer.getvalue()
        self.socket.sendall(kc.SIZE.pack(len(frame)) + frame)
        head = self.socket.recv(kc.SIZE.size, socket.MSG_WAITALL)
        if len(head) < kc.SIZE.size:
            raise ConnectionError("the broker closed the connection")
        (size,) = kc.SIZE.unpack(head)
        answer = self.socket.recv(size, socket.MSG_WAITALL)
        response = kc.response_schema(api_key, version)
        head, offset = entity_reader(response.__header_schema__)(answer, 0)
        assert head.correlation_id == self.correlation_id
        body, _ = entity_reader(response)(answer, offset)
        return body
