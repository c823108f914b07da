"""``spark.registry``: Avro types to Spark types, decoded values to Spark's, the wire format, and
the registry's HTTP answers (a stand-in server here; the real registry and Spark decode the
reference pipeline's clicks in tests/spark/test_pipeline.py)."""

from __future__ import annotations

import datetime
import io
import json
from collections.abc import Iterator
from decimal import Decimal
from http.server import BaseHTTPRequestHandler
from typing import Any

import fastavro
import pytest
from pyspark.sql import types as T

from spark import registry
from spark.errors import OptionError
from spark.pipeline.events import CLICK_SCHEMA, ClickEvent
from spark.registry import (
    RegistryDecodeError,
    avro_to_spark,
    decoder,
    register,
    wire_header,
)
from tests.http_support import serving

URL = "http://registry.invalid:1"
INNER = {"type": "record", "name": "Inner", "fields": [{"name": "x", "type": "int"}]}
EVERYTHING = {
    "type": "record",
    "name": "Everything",
    "namespace": "t",
    "fields": [
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "s", "type": "string"},
        {"name": "raw", "type": "bytes"},
        {"name": "maybe", "type": ["null", "string"]},
        {"name": "widened", "type": ["int", "long"]},
        {"name": "either", "type": ["null", "string", "long"]},
        {"name": "inner", "type": INNER},
        {"name": "again", "type": ["null", "t.Inner"]},
        {"name": "list", "type": {"type": "array", "items": "long"}},
        {"name": "tags", "type": {"type": "map", "values": ["null", "string"]}},
        {"name": "colour", "type": {"type": "enum", "name": "Colour", "symbols": ["RED", "BLUE"]}},
        {"name": "md5", "type": {"type": "fixed", "name": "Md5", "size": 2}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {
            "name": "price",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
        },
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "tod", "type": {"type": "int", "logicalType": "time-millis"}},
    ],
}
VALUE = {
    "b": True, "i": 7, "l": 2**40, "f": 1.5, "d": 2.25, "s": "text", "raw": b"\x00\x01",
    "maybe": None, "widened": 5, "either": 9, "inner": {"x": 1}, "again": {"x": 2},
    "list": [1, 2], "tags": {"k": "v", "none": None}, "colour": "BLUE", "md5": b"ab",
    "day": datetime.date(2026, 11, 27),
    "at": datetime.datetime(2026, 11, 27, 10, 0, tzinfo=datetime.UTC),
    "local": datetime.datetime(2026, 11, 27, 10, 0, 0, 5),
    "price": Decimal("12.34"), "id": "6f1b6a52-3f4c-4b2b-9a0e-5f7c1d1e2a3b",
    "tod": datetime.time(1, 2, 3, 4000),
}  # fmt: skip


def expanded(schema: dict[str, Any]) -> Any:
    return fastavro.parse_schema(schema, expand=True)


def encoded(schema: dict[str, Any], value: dict[str, Any], schema_id: int) -> bytes:
    out = io.BytesIO(wire_header(schema_id))
    out.seek(5)
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return out.getvalue()


@pytest.fixture(autouse=True)
def writers() -> Iterator[dict[tuple[str, int], Any]]:
    registry._WRITERS.clear()
    yield registry._WRITERS
    registry._WRITERS.clear()


def test_avro_types_become_spark_types_as_spark_converts_them() -> None:
    data_type, nullable = avro_to_spark(expanded(EVERYTHING))
    assert not nullable
    assert isinstance(data_type, T.StructType)
    fields = {f.name: (f.dataType, f.nullable) for f in data_type.fields}
    inner = T.StructType([T.StructField("x", T.IntegerType(), False)])
    assert fields == {
        "b": (T.BooleanType(), False),
        "i": (T.IntegerType(), False),
        "l": (T.LongType(), False),
        "f": (T.FloatType(), False),
        "d": (T.DoubleType(), False),
        "s": (T.StringType(), False),
        "raw": (T.BinaryType(), False),
        "maybe": (T.StringType(), True),
        "widened": (T.LongType(), False),
        "either": (
            T.StructType(
                [
                    T.StructField("member0", T.StringType(), True),
                    T.StructField("member1", T.LongType(), True),
                ]
            ),
            True,
        ),
        "inner": (inner, False),
        "again": (inner, True),
        "list": (T.ArrayType(T.LongType(), False), False),
        "tags": (T.MapType(T.StringType(), T.StringType(), True), False),
        "colour": (T.StringType(), False),
        "md5": (T.BinaryType(), False),
        "day": (T.DateType(), False),
        "at": (T.TimestampType(), False),
        "local": (T.TimestampNTZType(), False),
        "price": (T.DecimalType(9, 2), False),
        "id": (T.StringType(), False),
        "tod": (T.IntegerType(), False),
    }


def test_a_decoded_value_is_what_spark_takes_for_that_type(
    writers: dict[tuple[str, int], Any],
) -> None:
    writers[(URL, 3)] = fastavro.parse_schema(EVERYTHING)
    decode = decoder(URL, fastavro.parse_schema(EVERYTHING), expanded(EVERYTHING), "FAILFAST")
    row = decode(encoded(EVERYTHING, VALUE, 3))
    names = [f["name"] for f in EVERYTHING["fields"]]  # type: ignore[index]
    got = dict(zip(names, row, strict=True))
    assert got["either"] == (None, 9)
    assert (got["inner"], got["again"]) == ((1,), (2,))
    assert got["tags"] == {"k": "v", "none": None}
    assert got["tod"] == 3_723_004  # milliseconds of the day
    assert got["id"] == VALUE["id"] and got["price"] == Decimal("12.34")
    assert got["at"] == VALUE["at"] and got["day"] == VALUE["day"]
    # the whole row is accepted by Spark's own verifier for the converted type
    data_type, _ = avro_to_spark(expanded(EVERYTHING))
    T._make_type_verifier(data_type)(row)


def test_each_value_is_read_with_its_writer_schema_resolved_to_the_reader(
    writers: dict[tuple[str, int], Any],
) -> None:
    v1 = {"type": "record", "name": "E", "fields": [{"name": "a", "type": "string"}]}
    v2 = {
        "type": "record",
        "name": "E",
        "fields": [
            {"name": "a", "type": "string"},
            {"name": "n", "type": "long", "default": 42},
        ],
    }
    writers[(URL, 1)] = fastavro.parse_schema(v1)
    writers[(URL, 2)] = fastavro.parse_schema(v2)
    decode = decoder(URL, fastavro.parse_schema(v2), expanded(v2), "FAILFAST")
    assert decode(encoded(v1, {"a": "old"}, 1)) == ("old", 42)  # the reader's default
    assert decode(encoded(v2, {"a": "new", "n": 1}, 2)) == ("new", 1)
    assert decode(None) is None


def test_a_value_not_in_the_wire_format_fails_the_query_or_is_null_when_permissive(
    writers: dict[tuple[str, int], Any],
) -> None:
    schema = fastavro.parse_schema(CLICK_SCHEMA)
    writers[(URL, 5)] = schema
    good = ClickEvent("u", "/", 1_700_000_000_000).to_avro(5)
    assert good[:5] == wire_header(5)
    failfast = decoder(URL, schema, expanded(CLICK_SCHEMA), "FAILFAST")
    permissive = decoder(URL, schema, expanded(CLICK_SCHEMA), "PERMISSIVE")
    at = datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.UTC)
    assert failfast(good) == ("u", "/", at)
    for bad, why in [
        (b'{"user": "u"}', "magic byte 123"),
        (b"\x00\x00", "no schema registry header"),
        (good[:-3], "from_registry"),
    ]:
        with pytest.raises(RegistryDecodeError, match=why):
            failfast(bad)
        assert permissive(bad) is None
    with pytest.raises(OptionError, match="mode"):
        decoder(URL, schema, expanded(CLICK_SCHEMA), "DROPMALFORMED")


class Registry(BaseHTTPRequestHandler):
    """Answers as the registry does for one subject, ``clicks-value``."""

    subjects: dict[str, list[dict[str, Any]]] = {}

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        subject = self.path.split("/")[2]
        versions = self.subjects.setdefault(subject, [])
        versions.append({"subject": subject, "version": len(versions) + 1, "id": 10,
                         "schema": body["schema"]})  # fmt: skip
        self._answer(200, {"id": 10})

    def do_GET(self) -> None:
        if self.path == "/schemas/ids/10":
            self._answer(200, {"schema": self.subjects["clicks-value"][-1]["schema"]})
        elif self.path == "/subjects/clicks-value/versions/latest" and self.subjects:
            self._answer(200, self.subjects["clicks-value"][-1])
        elif self.path.startswith("/subjects/json-value/"):
            self._answer(200, {"subject": "json-value", "version": 1, "id": 11,
                               "schemaType": "JSON", "schema": "{}"})  # fmt: skip
        else:
            self._answer(404, {"error_code": 40401, "message": "Subject not found"})

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def stand_in() -> Iterator[str]:
    Registry.subjects = {}
    with serving(Registry) as url:
        yield url


def test_register_and_fetch_over_http_trying_each_registry_in_turn(stand_in: str) -> None:
    urls = f"http://127.0.0.1:1,{stand_in}"  # the first refuses connections: the next answers
    assert register(urls, "clicks-value", CLICK_SCHEMA) == 10
    assert registry.reader_schema(urls, "clicks-value")["version"] == 1
    assert registry._writer_schema(urls, 10)["name"] == "raftlog.pipeline.ClickEvent"
    with pytest.raises(OptionError, match="HTTP 404, error code 40401: Subject not found"):
        registry.reader_schema(urls, "missing-value")
    with pytest.raises(OptionError, match="JSON schema: from_registry decodes Avro"):
        registry.reader_schema(urls, "json-value")
    with pytest.raises(OptionError, match="no schema registry answered"):
        registry.reader_schema("http://127.0.0.1:1", "clicks-value")
