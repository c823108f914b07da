"""Parsing and compatibility of the three schema types (pure).

Avro: Apache Avro's own checker (``avro.compatibility.ReaderWriterCompatibilityChecker``, the
port of Java's ``SchemaCompatibility`` that Confluent's registry uses). BACKWARD: the new schema
reads what the previous one wrote; FORWARD: the previous one reads what the new one writes;
FULL: both. The _TRANSITIVE forms check every live version, the others the latest only
(:meth:`RegistryState.check` picks them).

JSON Schema: a schema must be a valid schema of its draft (``jsonschema``'s ``check_schema``);
compatibility checks a sound subset of the rules, recursively through ``properties``: a property
the reader requires that the writer did not, a property whose ``type`` the reader narrows, and
a property a closed reader (``additionalProperties: false``) does not allow. What else differs
(enum, ranges, formats, combinators) is not checked: such a change is accepted.

Protobuf: parsed by protoc (:mod:`dataplane.schema_registry.protobuf`), stored as given (text
or a base64 FileDescriptorProto); compatibility is Confluent's ``SchemaDiff``, old to new for
BACKWARD, new to old for FORWARD.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import avro.compatibility
import avro.errors
import avro.name
import avro.schema
import jsonschema
import jsonschema.exceptions

from dataplane.schema_registry import errors, protobuf
from dataplane.schema_registry.records import AVRO, JSON, PROTOBUF
from dataplane.schema_registry.state import Candidate, NamedSchema

SCHEMA_CHARS_MAX = 1024 * 1024


def canonical(schema_type: str, schema: str, resolved: Sequence[NamedSchema]) -> str:
    """The form the registry stores and compares: compact JSON for Avro and JSON Schema (field
    order kept: it matters to Avro), the text for Protobuf; 42201 for one that does not parse."""
    if schema_type not in (AVRO, JSON, PROTOBUF):
        raise errors.RegistryError(42201, f"Invalid schema type {schema_type}")
    if len(schema) > SCHEMA_CHARS_MAX:
        raise errors.invalid_schema(f"of {len(schema)} characters (at most {SCHEMA_CHARS_MAX})")
    if schema_type == PROTOBUF:
        if not schema.strip():
            raise errors.invalid_schema("(empty)")
        protobuf.parse(schema, resolved)
        return schema
    try:
        parsed = json.loads(schema)
    except ValueError as error:
        raise errors.invalid_schema(f"{schema[:200]!r}: not JSON: {error}") from None
    if schema_type == AVRO:
        parse_avro(schema, resolved)
    else:
        _check_json_schema(parsed)
    return json.dumps(parsed, separators=(",", ":"))


def parse_avro(schema: str, resolved: Sequence[NamedSchema]) -> avro.schema.Schema:
    """The Avro schema, its references' named types defined first; 42201 if it does not parse."""
    names = avro.name.Names()
    try:
        for _, reference in resolved:
            avro.schema.make_avsc_object(json.loads(reference.schema), names)
        return avro.schema.make_avsc_object(json.loads(schema), names)
    except (avro.errors.AvroException, ValueError, TypeError, KeyError) as error:
        raise errors.invalid_schema(f"{schema[:200]!r}: {error}") from None


def _check_json_schema(parsed: Any) -> None:
    if not isinstance(parsed, (dict, bool)):
        raise errors.invalid_schema("a JSON schema is an object or a boolean")
    try:
        jsonschema.validators.validator_for(parsed).check_schema(parsed)
    except jsonschema.exceptions.SchemaError as error:
        raise errors.invalid_schema(f"{error.message}") from None


def check(schema_type: str, new: Candidate, previous: Sequence[Candidate], level: str) -> list[str]:
    """The messages of what makes ``new`` incompatible with ``previous`` at ``level``."""
    if level == "NONE" or not previous:
        return []
    base = level.removesuffix("_TRANSITIVE")
    messages: list[str] = []
    for old in reversed(previous):  # the latest first: its message is the one a user wants
        if base in ("BACKWARD", "FULL"):
            messages += _reader_writer(schema_type, reader=new, writer=old)
        if base in ("FORWARD", "FULL"):
            messages += _reader_writer(schema_type, reader=old, writer=new)
    return messages


def _reader_writer(schema_type: str, reader: Candidate, writer: Candidate) -> list[str]:
    if schema_type == AVRO:
        checker = avro.compatibility.ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]
        result = checker.get_compatibility(parse_avro(*reader), parse_avro(*writer))
        if result.compatibility is avro.compatibility.SchemaCompatibilityType.compatible:
            return []
        return [
            f"{kind.value} at {location}: {message}"
            for kind, location, message in zip(
                result.incompatibilities, sorted(result.locations), sorted(result.messages),
                strict=False,
            )
        ] or ["incompatible"]  # fmt: skip
    if schema_type == PROTOBUF:
        return protobuf.compare(protobuf.parse(*writer), protobuf.parse(*reader))
    return json_reader_writer(json.loads(reader[0]), json.loads(writer[0]), "#")


def _types(schema: dict[str, Any]) -> set[str] | None:
    declared = schema.get("type")
    if declared is None:
        return None
    types = {declared} if isinstance(declared, str) else set(declared)
    if "number" in types:
        types.add("integer")  # every integer is a number
    return types


def json_reader_writer(reader: Any, writer: Any, path: str) -> list[str]:
    """Can every document valid under ``writer`` be valid under ``reader``? The rules the
    module docstring lists, as messages (empty: none broken)."""
    if not isinstance(reader, dict) or not isinstance(writer, dict):
        return [] if reader is True or reader == writer else [f"{path}: schema changed"]
    messages = []
    reader_types, writer_types = _types(reader), _types(writer)
    if reader_types is not None and (writer_types is None or not writer_types <= reader_types):
        messages.append(f"{path}: type narrowed from {writer_types or 'any'} to {reader_types}")
    added = set(reader.get("required", [])) - set(writer.get("required", []))
    messages += [f"{path}/required: property {name!r} became required" for name in sorted(added)]
    reader_properties = reader.get("properties", {})
    writer_properties = writer.get("properties", {})
    if reader.get("additionalProperties") is False:
        if writer.get("additionalProperties") is not False:
            messages.append(f"{path}: additional properties no longer allowed")
        for name in sorted(set(writer_properties) - set(reader_properties)):
            messages.append(f"{path}/properties/{name}: removed from a closed schema")
    for name in sorted(set(reader_properties) & set(writer_properties)):
        messages += json_reader_writer(
            reader_properties[name], writer_properties[name], f"{path}/properties/{name}"
        )
    return messages
