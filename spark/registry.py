"""Values in the schema registry's wire format, decoded in Spark: ``from_registry``.

A producer that uses confluent-kafka's ``AvroSerializer`` (or the reference pipeline's
generator) writes each value as the magic byte 0, the schema id (4 bytes, big-endian) and the
Avro binary encoding (docs/schema-registry.md). ``from_registry`` turns such a ``value`` column
into a struct column, the way Spark's ``from_avro`` with Confluent's wire format does in
Databricks and ABRiS on the JVM::

    from spark.registry import from_registry
    events = df.select(from_registry("value", "http://127.0.0.11:9098", "clicks-value").alias("e"))
    events.select("e.user", "e.page")

The *reader* schema is the subject's version (``latest`` unless named), fetched once on the
driver when the column is built; it gives the column its Spark type (``avro_to_spark``). Each
value is decoded with its *writer* schema, the one its id names, fetched from the registry on
the executor that meets it first and kept for the executor's life, and resolved to the reader
schema by Avro's rules (fastavro): a field the writer added is dropped, one it lacks takes the
reader's default. A value that is not in the wire format, names an unknown id or does not
decode fails the query (``mode="FAILFAST"``, Spark's default for ``from_avro``) or becomes null
(``mode="PERMISSIVE"``).

Avro only: the registry's JSON Schema and Protobuf subjects are refused here with a message
saying so (``from_json`` reads a JSON value once the magic byte and id are cut off).
"""

from __future__ import annotations

import datetime
import io
import json
import struct
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import fastavro
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark.errors import OptionError

MAGIC = 0
HEADER = struct.Struct(">bI")  # magic byte, schema id
MODES = ("FAILFAST", "PERMISSIVE")
REGISTRY_TIMEOUT_S = 30.0
PRIMITIVES: dict[str, T.DataType] = {
    "boolean": T.BooleanType(),
    "int": T.IntegerType(),
    "long": T.LongType(),
    "float": T.FloatType(),
    "double": T.DoubleType(),
    "bytes": T.BinaryType(),
    "string": T.StringType(),
}
LOGICAL: dict[str, T.DataType] = {
    "date": T.DateType(),
    "timestamp-millis": T.TimestampType(),
    "timestamp-micros": T.TimestampType(),
    "local-timestamp-millis": T.TimestampNTZType(),
    "local-timestamp-micros": T.TimestampNTZType(),
    "time-millis": T.IntegerType(),  # as Spark's SchemaConverters: the number itself
    "time-micros": T.LongType(),
    "uuid": T.StringType(),
}


class RegistryDecodeError(ValueError):
    """A value that is not a registered Avro record in the wire format (FAILFAST)."""


# -- the registry over HTTP ----------------------------------------------------------------------
def _get(url: str, path: str) -> dict[str, Any]:
    """GET ``path`` from the first registry of ``url`` (``schema.registry.url``: one or more,
    comma-separated) that answers; an HTTP error is the registry's answer, not tried again."""
    return _request(url, path, None)


def _request(url: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
    failures = []
    for base in [u.strip().rstrip("/") for u in url.split(",") if u.strip()]:
        address = base + path
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            address, data, {"Content-Type": "application/vnd.schemaregistry.v1+json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=REGISTRY_TIMEOUT_S) as answer:
                found: dict[str, Any] = json.load(answer)
                return found
        except urllib.error.HTTPError as error:
            try:
                detail = json.load(error)
            except ValueError:
                detail = {"message": error.reason}
            raise OptionError(
                f"schema registry {address}: HTTP {error.code}, error code "
                f"{detail.get('error_code', error.code)}: {detail.get('message', '')}"
            ) from None
        except (OSError, ValueError) as error:
            failures.append(f"{address}: {error}")
    raise OptionError(f"no schema registry answered: {'; '.join(failures) or url!r}")


def register(url: str, subject: str, schema: dict[str, Any]) -> int:
    """Register an Avro ``schema`` under ``subject`` (or find it registered): its id."""
    found = _request(url, f"/subjects/{_quote(subject)}/versions", {"schema": json.dumps(schema)})
    return int(found["id"])


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _avro_only(schema_type: str, what: str) -> None:
    if schema_type != "AVRO":
        raise OptionError(
            f"{what} is a {schema_type} schema: from_registry decodes Avro (for JSON, cut the "
            "5-byte header and use from_json)"
        )


def _named_types(url: str, references: list[dict[str, Any]], named: dict[str, Any]) -> None:
    """Parse the referenced subjects' schemas first (depth first), so the schema that refers to
    their named types parses (the registry's references)."""
    for reference in references:
        subject, version = reference["subject"], reference["version"]
        found = _get(url, f"/subjects/{_quote(subject)}/versions/{version}")
        _avro_only(found.get("schemaType", "AVRO"), f"reference {subject} v{version}")
        _named_types(url, found.get("references", []), named)
        fastavro.parse_schema(json.loads(found["schema"]), named_schemas=named)


def _parsed(url: str, found: dict[str, Any], expand: bool = False) -> Any:
    """fastavro's parsed schema (to read with), or with every named type written out where it
    is used (``expand``: only to walk, fastavro reads no expanded schema)."""
    named: dict[str, Any] = {}
    _named_types(url, found.get("references", []), named)
    return fastavro.parse_schema(json.loads(found["schema"]), named_schemas=named, expand=expand)


def reader_schema(url: str, subject: str, version: str | int = "latest") -> dict[str, Any]:
    """The registry's answer for ``subject``'s ``version`` (Avro only)."""
    found = _get(url, f"/subjects/{_quote(subject)}/versions/{version}")
    _avro_only(found.get("schemaType", "AVRO"), f"subject {subject} v{found.get('version')}")
    return found


_WRITERS: dict[tuple[str, int], Any] = {}  # (registry url, id): parsed writer schema


def _writer_schema(url: str, schema_id: int) -> Any:
    key = (url, schema_id)
    if key not in _WRITERS:
        found = _get(url, f"/schemas/ids/{schema_id}")
        _avro_only(found.get("schemaType", "AVRO"), f"schema id {schema_id}")
        _WRITERS[key] = _parsed(url, found)
    return _WRITERS[key]


# -- Avro types to Spark types -------------------------------------------------------------------
def avro_to_spark(schema: Any) -> tuple[T.DataType, bool]:
    """The Spark type of a parsed Avro schema and whether it is nullable, as Spark's
    ``SchemaConverters.toSqlType``: a record is a struct, an enum a string, a fixed bytes, a
    union with null a nullable type, a union of ``int``/``long`` a long, of ``float``/``double`` a
    double, any other union a struct of ``member0``, ``member1``... (one set, the rest null)."""
    if isinstance(schema, str):
        if schema in PRIMITIVES:
            return PRIMITIVES[schema], False
        raise OptionError(f"unsupported Avro type {schema!r}")
    if isinstance(schema, list):
        return _union_type(schema)
    kind, logical = schema["type"], schema.get("logicalType")
    if logical == "decimal":
        return T.DecimalType(int(schema["precision"]), int(schema.get("scale", 0))), False
    if logical in LOGICAL and kind in ("int", "long", "string"):
        return LOGICAL[logical], False
    if kind in {"record", "error"}:
        fields = []
        for field in schema["fields"]:
            data_type, nullable = avro_to_spark(field["type"])
            fields.append(T.StructField(field["name"], data_type, nullable))
        return T.StructType(fields), False
    if kind == "enum":
        return T.StringType(), False
    if kind == "fixed":
        return T.BinaryType(), False
    if kind == "array":
        element, nullable = avro_to_spark(schema["items"])
        return T.ArrayType(element, nullable), False
    if kind == "map":
        value, nullable = avro_to_spark(schema["values"])
        return T.MapType(T.StringType(), value, nullable), False
    return avro_to_spark(kind)


def _union_type(branches: list[Any]) -> tuple[T.DataType, bool]:
    members = [b for b in branches if b != "null"]
    nullable = len(members) < len(branches)
    if not members:
        return T.NullType(), True
    if len(members) == 1:
        return avro_to_spark(members[0])[0], nullable
    if sorted(map(str, members)) == ["int", "long"]:
        return T.LongType(), nullable
    if sorted(map(str, members)) == ["double", "float"]:
        return T.DoubleType(), nullable
    fields = [T.StructField(f"member{n}", avro_to_spark(m)[0], True) for n, m in enumerate(members)]
    return T.StructType(fields), nullable


# -- Avro values (fastavro's) to Spark's ---------------------------------------------------------
def to_spark_value(value: Any, schema: Any) -> Any:
    """fastavro's decoded ``value`` of ``schema`` as Spark takes it for ``avro_to_spark``'s
    type: tuples for structs, ``member`` structs for general unions."""
    if value is None:
        return None
    if isinstance(schema, list):
        return _union_value(value, schema)
    if isinstance(schema, str):
        return value
    kind, logical = schema["type"], schema.get("logicalType")
    if logical == "time-millis" and isinstance(value, datetime.time):
        return _time_of_day_us(value) // 1000
    if logical == "time-micros" and isinstance(value, datetime.time):
        return _time_of_day_us(value)
    if logical == "uuid" and isinstance(value, uuid.UUID):
        return str(value)
    if kind in {"record", "error"}:
        return tuple(to_spark_value(value.get(f["name"]), f["type"]) for f in schema["fields"])
    if kind == "array":
        return [to_spark_value(v, schema["items"]) for v in value]
    if kind == "map":
        return {k: to_spark_value(v, schema["values"]) for k, v in value.items()}
    return value


def _time_of_day_us(value: datetime.time) -> int:
    seconds = (value.hour * 60 + value.minute) * 60 + value.second
    return seconds * 1_000_000 + value.microsecond


def _union_value(value: Any, branches: list[Any]) -> Any:
    members = [b for b in branches if b != "null"]
    if len(members) == 1:
        return to_spark_value(value, members[0])
    if sorted(map(str, members)) in (["int", "long"], ["double", "float"]):
        return value
    chosen = next(n for n, member in enumerate(members) if _is_branch(value, member))
    return tuple(
        to_spark_value(value, member) if n == chosen else None for n, member in enumerate(members)
    )


def _is_branch(value: Any, schema: Any) -> bool:
    """Whether fastavro's ``value`` came from this union branch (the first that fits, as
    fastavro picks the branch when it writes)."""
    if isinstance(schema, str):
        return {
            "boolean": isinstance(value, bool),
            "int": isinstance(value, int) and not isinstance(value, bool),
            "long": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, float),
            "double": isinstance(value, float),
            "bytes": isinstance(value, bytes),
            "string": isinstance(value, str),
        }.get(schema, False)
    if isinstance(schema, list):
        return any(_is_branch(value, b) for b in schema)
    kind = schema["type"]
    if schema.get("logicalType") == "decimal":
        return isinstance(value, Decimal)
    if schema.get("logicalType") in ("date",):
        return isinstance(value, datetime.date) and not isinstance(value, datetime.datetime)
    if schema.get("logicalType") in LOGICAL and "timestamp" in schema["logicalType"]:
        return isinstance(value, datetime.datetime)
    if kind in ("record", "error"):
        names = {f["name"] for f in schema["fields"]}
        return isinstance(value, dict) and set(value) == names
    if kind == "map":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "enum":
        return isinstance(value, str) and value in schema["symbols"]
    if kind == "fixed":
        return isinstance(value, bytes) and len(value) == schema["size"]
    return _is_branch(value, kind)


# -- the decoder and the column ------------------------------------------------------------------
def wire_header(schema_id: int) -> bytes:
    """The 5 bytes before every value in the registry's wire format."""
    return HEADER.pack(MAGIC, schema_id)


class Decoder:
    """One value's bytes to its Spark value, on the executors: read with the parsed ``reader``
    schema, walked with its ``expanded`` form. A module-level class, so Spark pickles it by
    reference (a closure would be pickled by value, with the globals it reads)."""

    def __init__(self, url: str, reader: Any, expanded: Any, mode: str) -> None:
        if mode not in MODES:
            raise OptionError(f"mode {mode!r}: one of {', '.join(MODES)}")
        self.url, self.reader, self.expanded, self.mode = url, reader, expanded, mode

    def __call__(self, value: bytes | None) -> Any:
        if value is None:
            return None
        try:
            if len(value) < HEADER.size:
                raise RegistryDecodeError(f"{len(value)} bytes: no schema registry header")
            magic, schema_id = HEADER.unpack_from(value)
            if magic != MAGIC:
                raise RegistryDecodeError(
                    f"magic byte {magic}, not {MAGIC}: not in the wire format"
                )
            writer = _writer_schema(self.url, schema_id)
            body = io.BytesIO(memoryview(value)[HEADER.size :])
            record = fastavro.schemaless_reader(body, writer, self.reader)
            return to_spark_value(record, self.expanded)
        except (RegistryDecodeError, OptionError, ValueError, EOFError, IndexError) as error:
            if self.mode == "PERMISSIVE":
                return None
            raise RegistryDecodeError(f"from_registry: {error}") from None


def decoder(url: str, reader: Any, expanded: Any, mode: str) -> Callable[[bytes | None], Any]:
    """A function of one value's bytes to its Spark value (:class:`Decoder`)."""
    return Decoder(url, reader, expanded, mode)


def from_registry(
    column: Column | str,
    url: str,
    subject: str,
    version: str | int = "latest",
    mode: str = "FAILFAST",
) -> Column:
    """``column`` (binary values in the registry's wire format) decoded with ``subject``'s
    ``version`` as the reader schema, as a column of its Spark type (``avro_to_spark``)."""
    found = reader_schema(url, subject, version)
    expanded = _parsed(url, found, expand=True)
    data_type, _ = avro_to_spark(expanded)
    decode = decoder(url, _parsed(url, found), expanded, mode)
    target = F.col(column) if isinstance(column, str) else column
    # row by row: Arrow-optimised Python UDFs need pandas, which the spark extra leaves out
    return F.udf(decode, data_type, useArrow=False)(target)
