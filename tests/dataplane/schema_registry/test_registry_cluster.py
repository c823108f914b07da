"""The schema registry on a real three-node cluster: confluent-kafka's SchemaRegistryClient and
serializers unchanged against it, Confluent's error codes over HTTP, and the writer's node
killed (another node writes next, ids stay unique)."""

from __future__ import annotations

import importlib.util
import json
import signal
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf.message import Message
from grpc_tools import protoc

from dataplane import client
from dataplane.tools.local_cluster import LocalCluster, free_port, wait_for
from raftlog.errors import ErrorCode
from raftlog.errors import KafkaError as RaftlogError
from tests.dataplane.cluster_support import RANGES, running_cluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(180),
    pytest.mark.xdist_group("schema-registry"),
]
TIMEOUT_S = 30.0
USER = {
    "type": "record", "name": "User", "namespace": "example",
    "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int"}],
}  # fmt: skip
ORDER = {
    "$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
    "properties": {"id": {"type": "integer"}, "item": {"type": "string"}}, "required": ["id"],
}  # fmt: skip


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalCluster, dict[int, str]]]:
    first = RANGES["schema_registry"]
    urls = {}
    overrides: dict[int, dict[str, str | int]] = {}
    for node_id in (1, 2, 3):
        host = f"127.0.0.{first + node_id - 1}"
        port = free_port(host)
        urls[node_id] = f"http://{host}:{port}"
        overrides[node_id] = {"schema.registry.listener": f"HTTP://{host}:{port}"}
    root: Path = tmp_path_factory.mktemp("registry")
    with running_cluster(root, "schema_registry", node_overrides=overrides) as running:
        for url in urls.values():
            wait_for(f"the registry on {url}", partial(_answers, url), TIMEOUT_S)
        yield running, urls


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/schemas/types", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _consume_one(cluster: LocalCluster, topic: str) -> bytes:
    consumer = Consumer({
        "bootstrap.servers": cluster.kafka_address(1), "group.id": f"read-{topic}",
        "enable.auto.commit": False,
    })  # fmt: skip
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        message = None
        for _ in range(60):
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                break
        assert message is not None and message.error() is None, message
        value = message.value()
        assert isinstance(value, bytes)
        return value
    finally:
        consumer.close()


def _produce(cluster: LocalCluster, topic: str, value: bytes) -> None:
    producer = Producer({"bootstrap.servers": cluster.kafka_address(1)})
    producer.produce(topic, value)
    assert producer.flush(TIMEOUT_S) == 0


def test_avro_and_json_serializers_round_trip(cluster: tuple[LocalCluster, dict[int, str]]) -> None:
    """Serialized through node 1's registry, deserialized through node 2's: the wire format is
    magic byte 0 and the id both registries give."""
    running, urls = cluster
    writer = SchemaRegistryClient({"url": urls[1]})
    reader = SchemaRegistryClient({"url": urls[2]})
    avro_text, json_text = json.dumps(USER), json.dumps(ORDER)
    # confluent-kafka's classic positional forms (they differ between the formats)
    for topic, serialize, deserialize, value in [
        ("users", AvroSerializer(writer, avro_text), AvroDeserializer(reader),
         {"name": "ada", "age": 36}),
        ("orders", JSONSerializer(json_text, writer), JSONDeserializer(json_text, None, reader),
         {"id": 7, "item": "tea"}),
    ]:  # fmt: skip
        context = SerializationContext(topic, MessageField.VALUE)
        payload = serialize(value, context)
        assert payload[0] == 0  # magic byte
        schema_id = int.from_bytes(payload[1:5], "big")
        _produce(running, topic, payload)
        read = _consume_one(running, topic)
        assert read == payload
        assert deserialize(read, context) == value
        found = reader.get_latest_version(f"{topic}-value")
        assert (found.schema_id, found.version) == (schema_id, 1)


def _example_message(out: Path) -> type[Message]:
    """registry_example.proto compiled by grpc_tools' protoc into ``out``, its Reading class."""
    here = Path(__file__).parent
    proto_include = Path(protoc.__file__).parent / "_proto"
    arguments = ["protoc", f"-I{here}", f"-I{proto_include}", f"--python_out={out}",
                 "registry_example.proto"]  # fmt: skip
    assert protoc.main(arguments) == 0
    spec = importlib.util.spec_from_file_location("registry_example_pb2",
                                                  out / "registry_example_pb2.py")  # fmt: skip
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    reading: type[Message] = module.Reading
    return reading


def test_protobuf_serializer_round_trip(
    cluster: tuple[LocalCluster, dict[int, str]], tmp_path: Path
) -> None:
    """confluent-kafka's ProtobufSerializer registers the file (a base64 FileDescriptorProto)
    through node 1; its deserializer reads the writer's schema (``format=serialized``) through
    node 2. A field's type changed incompatibly is then refused (409) and a new field is not."""
    running, urls = cluster
    reading_type = _example_message(tmp_path)
    writer = SchemaRegistryClient({"url": urls[1]})
    reader = SchemaRegistryClient({"url": urls[2]})
    serialize = ProtobufSerializer(reading_type, writer, {"use.deprecated.format": False})
    deserialize = ProtobufDeserializer(reading_type, {"use.deprecated.format": False}, reader)
    value = reading_type(sensor="t1", value=21.5, labels={"unit": "C"})
    value.at.FromSeconds(1_700_000_000)  # type: ignore[attr-defined]
    value.place.site = "lab"  # type: ignore[attr-defined]
    context = SerializationContext("readings", MessageField.VALUE)
    payload = serialize(value, context)
    assert payload is not None and payload[0] == 0
    _produce(running, "readings", payload)
    read = _consume_one(running, "readings")
    assert deserialize(read, context) == value
    latest = reader.get_latest_version("readings-value")
    assert latest.schema.schema_type == "PROTOBUF"
    assert latest.schema_id == int.from_bytes(payload[1:5], "big")
    text = (Path(__file__).parent / "registry_example.proto").read_text()
    changed = text.replace("double value = 2;", "string value = 2;")
    with pytest.raises(SchemaRegistryError) as refused:
        writer.register_schema("readings-value", Schema(changed, "PROTOBUF"))
    assert refused.value.error_code == 409
    assert "FIELD_SCALAR_KIND_CHANGED" in str(refused.value)
    added = text.replace("  Place place = 5;", "  Place place = 5;\n  int64 seq = 6;")
    assert writer.register_schema("readings-value", Schema(added, "PROTOBUF")) > 0
    with pytest.raises(SchemaRegistryError) as invalid:
        writer.register_schema("broken-value", Schema("syntax = 'proto3'; message {", "PROTOBUF"))
    assert invalid.value.error_code == 42201


def test_value_schema_validation_refuses_unframed_records(
    cluster: tuple[LocalCluster, dict[int, str]],
) -> None:
    """A topic with value.schema.validation=true: a serialized record (magic byte and an id
    the registry knows) is stored; a plain one, or one with an unknown id, is refused with
    INVALID_RECORD, over the KAFKA listener (librdkafka reports the code) and over gRPC."""
    running, urls = cluster
    admin = client.AdminClient(bootstrap_servers=[running.broker_address(1)])
    try:
        topic = client.NewTopic("validated", 1, 3, {"value.schema.validation": "true"})
        assert admin.create_topics([topic])["validated"] is None
    finally:
        admin.close()
    registry = SchemaRegistryClient({"url": urls[3]})
    serialize = AvroSerializer(registry, json.dumps(USER))
    good = serialize(
        {"name": "bo", "age": 5}, SerializationContext("validated", MessageField.VALUE)
    )
    assert good is not None
    unknown_id = b"\x00" + (10**6).to_bytes(4, "big") + good[5:]
    outcomes: list[Any] = []
    producer = Producer({"bootstrap.servers": running.kafka_address(2), "linger.ms": 0})
    for value in (good, b"plain text", unknown_id):
        producer.produce("validated", value, on_delivery=lambda e, m: outcomes.append(e))
        assert producer.flush(TIMEOUT_S) == 0  # one record per request: each judged alone
    assert outcomes[0] is None
    for error in outcomes[1:]:
        assert error is not None and error.code() == KafkaError.INVALID_RECORD, error
    grpc_producer = client.Producer([running.broker_address(3)], linger_ms=0)
    try:
        assert grpc_producer.send("validated", good).result(TIMEOUT_S).offset == 1
        refused = grpc_producer.send("validated", b"plain text").exception(TIMEOUT_S)
        assert isinstance(refused, RaftlogError) and refused.error is ErrorCode.INVALID_RECORD
        assert "starts with byte 112, not the magic byte 0" in refused.message
    finally:
        grpc_producer.close()
    assert _consume_one(running, "validated") == good


def test_evolution_per_level(cluster: tuple[LocalCluster, dict[int, str]]) -> None:
    _, urls = cluster
    client = SchemaRegistryClient({"url": urls[3]})
    subject = "evolve-value"
    assert client.register_schema(subject, Schema(json.dumps(USER), "AVRO")) > 0
    with_default = {
        **USER,
        "fields": [*USER["fields"], {"name": "email", "type": "string", "default": ""}],
    }
    without_default = {**USER, "fields": [*USER["fields"], {"name": "email", "type": "string"}]}
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, Schema(json.dumps(without_default), "AVRO"))
    assert (refused.value.http_status_code, refused.value.error_code) == (409, 409)
    assert client.get_versions(subject) == [1]  # nothing stored
    assert not client.test_compatibility(subject, Schema(json.dumps(without_default), "AVRO"))
    client.register_schema(subject, Schema(json.dumps(with_default), "AVRO"))
    assert client.get_versions(subject) == [1, 2]
    client.set_compatibility(subject, "NONE")
    assert client.get_compatibility(subject) == "NONE"
    client.register_schema(subject, Schema(json.dumps(without_default), "AVRO"))
    assert client.get_versions(subject) == [1, 2, 3]


def _error(response: httpx.Response) -> tuple[int, int]:
    body: dict[str, Any] = response.json()
    return response.status_code, body["error_code"]


def test_bad_input_answers_confluents_errors(cluster: tuple[LocalCluster, dict[int, str]]) -> None:
    _, urls = cluster
    url = urls[2]
    http = httpx.Client(base_url=url, timeout=TIMEOUT_S)
    post = {"schema": json.dumps(USER)}
    assert _error(http.post("/subjects/bad/versions", json={"schema": "{no"})) == (422, 42201)
    assert _error(http.get("/subjects/nobody/versions")) == (404, 40401)
    assert http.post("/subjects/bad/versions", json=post).json()["id"] > 0
    assert _error(http.get("/subjects/bad/versions/9")) == (404, 40402)
    assert _error(http.get("/subjects/bad/versions/zero")) == (422, 42202)
    assert _error(http.get("/schemas/ids/100000")) == (404, 40403)
    later = {**USER, "fields": [*USER["fields"], {"name": "x", "type": "int", "default": 0}]}
    assert http.post("/subjects/bad/versions", json={"schema": json.dumps(later)}).is_success
    assert _error(http.delete("/subjects/bad/versions/1?permanent=true")) == (404, 40407)
    assert http.delete("/subjects/bad/versions/1").json() == 1
    assert _error(http.get("/subjects/bad/versions/1")) == (404, 40402)
    assert http.get("/subjects/bad/versions/1?deleted=true").json()["version"] == 1
    assert http.get("/subjects/bad/versions").json() == [2]
    assert http.delete("/subjects/bad").json() == [2]
    assert _error(http.get("/subjects/bad/versions")) == (404, 40401)
    assert _error(http.delete("/subjects/bad")) == (404, 40404)
    assert http.delete("/subjects/bad?permanent=true").json() == [1, 2]
    huge = b'{"schema": "' + b"x" * (5 * 1024 * 1024) + b'"}'
    big = http.post("/subjects/big/versions", content=huge,
                    headers={"Content-Type": "application/json"})  # fmt: skip
    assert _error(big) == (413, 413)


def test_writer_killed_another_takes_over(cluster: tuple[LocalCluster, dict[int, str]]) -> None:
    """Node 1 writes (it holds the writer's producer epoch), is SIGKILLed; node 2 and node 3
    write next: every id distinct, every node's answers the same."""
    running, urls = cluster

    def schema(n: int) -> str:
        return json.dumps({"type": "record", "name": f"R{n}", "fields": []})

    def register(node_id: int, n: int) -> int:
        answer = httpx.post(f"{urls[node_id]}/subjects/failover-{n}/versions",
                            json={"schema": schema(n)}, timeout=60)  # fmt: skip
        assert answer.status_code == 200, answer.text
        return int(answer.json()["id"])

    ids = [register(1, 1), register(1, 2)]
    running.signal_node(1, signal.SIGKILL)
    ids += [register(2, 3), register(3, 4), register(2, 5)]
    assert len(set(ids)) == len(ids), ids
    for node_id in (2, 3):
        for n, schema_id in enumerate(ids, start=1):
            found = httpx.get(f"{urls[node_id]}/schemas/ids/{schema_id}", timeout=TIMEOUT_S)
            assert json.loads(found.json()["schema"])["name"] == f"R{n}"
