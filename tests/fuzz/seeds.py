"""The seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/), written from real valid
inputs: ``python -m tests.fuzz.seeds`` rewrites them.

Kafka requests: one per served (api key, version), every field filled (a topic ``fuzz``, one
element per array, a real RecordBatch in a Produce) and encoded with kio's writers, the encoder
Kafka's own message definitions generate. Record batches: encode_batch with each codec. gRPC:
each method's request message, empty and filled. SASL: complete PLAIN and SCRAM exchanges.
Connect: the REST calls of docs/connect.md.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import hashlib
import io
import json
import types
import typing
import uuid
from collections.abc import Iterable
from typing import Any

from kio.schema.errors import ErrorCode as KioErrorCode
from kio.serial import entity_writer

from dataplane.kafka import codec as kc
from raftlog.batch import Compression
from raftlog.records import encode_batch
from tests.fuzz.runner import CORPUS_DIR

TOPIC = "fuzz"


def sample_batch(compression: int = Compression.NONE, **kwargs: Any) -> bytes:
    records = [(b"key-%d" % i, b"value-%d" % i, 1_700_000_000_000 + i, (("h", b"v"),))
               for i in range(3)]  # fmt: skip
    return encode_batch(records, compression=compression, **kwargs)


def _sample(hint: Any, kind: str | None, name: str) -> Any:
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _sample(inner, kind, name)
    if origin is tuple:
        return (_sample(typing.get_args(hint)[0], kind, name),)
    if dataclasses.is_dataclass(hint):
        return _entity(hint)
    if kind in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(milliseconds=0)
    if kind == "datetime_i64":
        return datetime.datetime.fromtimestamp(1_700_000_000, datetime.UTC)
    if kind == "error_code":
        return KioErrorCode(0)
    if hint is bool:
        return False
    if isinstance(hint, type) and issubclass(hint, uuid.UUID):
        return uuid.UUID(int=0xF022)
    if (isinstance(hint, type) and issubclass(hint, bytes)) or kind in ("bytes", "records"):
        return sample_batch() if name == "records" else b"fuzz"
    if (isinstance(hint, type) and issubclass(hint, str)) or kind == "string":
        return {"protocol_type": "consumer", "mechanism": "PLAIN"}.get(name, TOPIC)
    if isinstance(hint, type) and issubclass(hint, float):
        return hint(0.0)
    if isinstance(hint, type) and issubclass(hint, int):
        return hint(1) if name in ("acks", "record_count") else hint(0)
    raise TypeError(f"no sample for {name}: {hint!r} ({kind})")


def _entity(schema: Any) -> Any:
    hints = typing.get_type_hints(schema)
    values = {}
    for f in dataclasses.fields(schema):
        if not f.init:
            continue
        values[f.name] = _sample(hints[f.name], f.metadata.get("kafka_type"), f.name)
    return schema(**values)


def kafka_request(api_key: int, api_version: int, correlation_id: int = 7) -> bytes:
    """A request frame (without its size) of ``api_key`` v``api_version``, every field set."""
    schema = kc.request_schema(api_key, api_version)
    header_schema = schema.__header_schema__
    buffer = io.BytesIO()
    entity_writer(header_schema)(buffer, _entity(header_schema))
    frame = bytearray(buffer.getvalue())
    kc.API_KEY_VERSION.pack_into(frame, 0, api_key, api_version)
    kc.SIZE.pack_into(frame, 4, correlation_id)
    body = io.BytesIO()
    entity_writer(schema)(body, _entity(schema))
    return bytes(frame) + body.getvalue()


def kafka_request_seeds() -> Iterable[bytes]:
    from tests.fuzz.fuzz_kafka_request import PAIRS  # noqa: PLC0415

    for index, (key, version) in enumerate(PAIRS):
        frame = kafka_request(key, version)
        yield index.to_bytes(2, "big") + frame[4:]


def _filled(message: Any, depth: int = 0) -> Any:
    """``message`` with every field set (topic ``fuzz``, partition 0, one element per repeated
    field, a real batch in a bytes field named records)."""
    from google.protobuf.descriptor import FieldDescriptor as F  # noqa: PLC0415

    for field in message.DESCRIPTOR.fields:
        if field.type == F.TYPE_MESSAGE:
            if depth >= 4 or field.message_type.GetOptions().map_entry:
                continue
            child = message.__getattribute__(field.name)
            if field.is_repeated:
                _filled(child.add(), depth + 1)
            else:
                _filled(child, depth + 1)
            continue
        if field.type == F.TYPE_STRING:
            value: Any = TOPIC
        elif field.type == F.TYPE_BYTES:
            value = sample_batch() if field.name == "records" else uuid.UUID(int=0xF022).bytes
        elif field.type == F.TYPE_BOOL:
            value = False
        elif field.type == F.TYPE_ENUM:
            value = field.enum_type.values[-1].number
        elif field.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
            value = 0.0
        else:
            value = 1 if field.name in ("acks", "broker_id", "max_bytes") else 0
        if field.is_repeated:
            getattr(message, field.name).append(value)
        else:
            setattr(message, field.name, value)
    return message


def grpc_seeds(target: str) -> Iterable[bytes]:
    module = __import__(f"tests.fuzz.fuzz_{target}", fromlist=["fuzz_one"])
    module.fuzz_one(b"")  # builds the door
    door = (
        next(iter(module._doors.values()))
        if hasattr(module, "_doors")
        else (module._door_and_inputs[0])
    )
    for index, method in enumerate(door.methods):
        request_type = _request_type(door.service, method)
        yield bytes([index])
        yield bytes([index]) + _filled(request_type()).SerializeToString()


def _request_type(service: str, method: str) -> Any:
    from google.protobuf import descriptor_pool, message_factory  # noqa: PLC0415

    descriptor = descriptor_pool.Default().FindServiceByName(service)
    return message_factory.GetMessageClass(descriptor.methods_by_name[method].input_type)


def record_batch_seeds() -> Iterable[bytes]:
    from raftlog.batch import TimestampType  # noqa: PLC0415

    for codec in Compression:
        for selector in range(4):
            yield bytes([selector | (0x80 if codec else 0)]) + sample_batch(codec)
    yield b"\0" + sample_batch(producer_id=5, producer_epoch=0, base_sequence=0)
    yield b"\1" + sample_batch(timestamp_type=TimestampType.LOG_APPEND_TIME) * 2
    yield b"\2" + encode_batch([(None, b"v", 0, ())])


def _frames(*frames: bytes) -> bytes:
    return b"".join(len(f).to_bytes(2, "big") + f for f in frames)


def _sasl_request(api_key: int, version: int, **fields: Any) -> bytes:
    schema = kc.request_schema(api_key, version)
    header = io.BytesIO()
    header_schema = schema.__header_schema__
    entity_writer(header_schema)(header, kc.to_entity(header_schema, {
        "request_api_key": api_key, "request_api_version": version, "correlation_id": 1,
        "client_id": "fuzz"}))  # fmt: skip
    entity_writer(schema)(header, kc.to_entity(schema, fields))
    return header.getvalue()


def sasl_seeds() -> Iterable[bytes]:
    from metadata_quorum.security.scram import (  # noqa: PLC0415
        ScramClient,
        ScramMechanism,
        plain_message,
    )
    from tests.fuzz.fuzz_sasl import NONCE  # noqa: PLC0415
    from tests.fuzz.inprocess import CREDENTIALS, PASSWORD, USER  # noqa: PLC0415

    versions = _sasl_request(kc.API_VERSIONS, 3, client_software_name="fuzz",
                             client_software_version="1")  # fmt: skip
    metadata = _sasl_request(kc.API_METADATA, 12, topics=None, allow_auto_topic_creation=False,
                             include_topic_authorized_operations=False)  # fmt: skip
    for handshake_version in (0, 1):
        handshake = _sasl_request(kc.API_SASL_HANDSHAKE, handshake_version, mechanism="PLAIN")
        token = plain_message(USER, PASSWORD)
        authenticate = (
            token if handshake_version == 0
            else _sasl_request(kc.API_SASL_AUTHENTICATE, 2, auth_bytes=token)
        )  # fmt: skip
        yield _frames(versions, handshake, authenticate, metadata)
        yield _frames(handshake, authenticate, metadata, handshake, authenticate)
    for mechanism in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512):
        client = ScramClient(mechanism, USER, PASSWORD, "client")
        server_first = (
            f"r=client{NONCE},s={base64.b64encode(CREDENTIALS[mechanism].salt).decode()},"
            f"i={CREDENTIALS[mechanism].iterations}"
        ).encode()
        first, final = client.first(), client.final(server_first)
        handshake = _sasl_request(kc.API_SASL_HANDSHAKE, 1, mechanism=mechanism.mechanism_name)
        yield _frames(
            versions, handshake,
            _sasl_request(kc.API_SASL_AUTHENTICATE, 2, auth_bytes=first),
            _sasl_request(kc.API_SASL_AUTHENTICATE, 2, auth_bytes=final), metadata,
        )  # fmt: skip
        raw = _sasl_request(kc.API_SASL_HANDSHAKE, 0, mechanism=mechanism.mechanism_name)
        yield _frames(raw, first, final, metadata)


def connect_rest_seeds() -> Iterable[bytes]:
    from tests.fuzz.fuzz_connect_rest import METHODS, ROUTES  # noqa: PLC0415

    source = {"name": "src", "config": {"connector.class": "FileStreamSource",
              "topic": TOPIC, "file": "/dev/null", "tasks.max": "1"}}  # fmt: skip
    for method_index, _ in enumerate(METHODS):
        for route_index, _ in enumerate(ROUTES):
            yield bytes([method_index, route_index]) + b"src\0"
    post, put = METHODS.index("POST"), METHODS.index("PUT")
    yield bytes([post, 1]) + b"\0" + json.dumps(source).encode()
    yield bytes([put, 3]) + b"src\0" + json.dumps(source["config"]).encode()


def write(target: str, seeds: Iterable[bytes]) -> int:
    directory = CORPUS_DIR / target
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.iterdir():
        old.unlink()
    count = 0
    for seed in seeds:
        (directory / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
        count += 1
    return count


SEEDS = {
    "kafka_request": kafka_request_seeds,
    "record_batch": record_batch_seeds,
    "broker_grpc": lambda: grpc_seeds("broker_grpc"),
    "controller_grpc": lambda: grpc_seeds("controller_grpc"),
    "group_grpc": lambda: grpc_seeds("group_grpc"),
    "sasl": sasl_seeds,
    "connect_rest": connect_rest_seeds,
}


def main() -> None:
    for target, seeds in SEEDS.items():
        print(f"{target}: {write(target, seeds())} seeds")


if __name__ == "__main__":
    main()
