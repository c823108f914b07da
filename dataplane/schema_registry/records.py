"""The ``_schemas`` topic's records, keyed as Confluent Schema Registry keys them.

A record's key is compact JSON with the fields in Confluent's order, so a key written here and
one written by Confluent's registry for the same thing are the same bytes and compaction keeps
the last of them::

    {"keytype":"SCHEMA","subject":"s","version":1,"magic":1}  -> one version of a subject
    {"keytype":"CONFIG","subject":null,"magic":0}              -> the global compatibility level
    {"keytype":"CONFIG","subject":"s","magic":0}               -> a subject's level
    {"keytype":"MODE","subject":null,"magic":0}                -> READWRITE / READONLY ...
    {"keytype":"DELETE_SUBJECT","subject":"s","magic":0}       -> versions up to N soft-deleted

A value of None (a tombstone) removes the key: a permanently deleted version, a subject's level
that was deleted. A soft-deleted version is its SCHEMA record again with ``"deleted": true``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

AVRO, JSON, PROTOBUF = "AVRO", "JSON", "PROTOBUF"
SCHEMA_TYPES = (JSON, PROTOBUF, AVRO)  # the order Confluent lists them in /schemas/types


@dataclass(frozen=True)
class Reference:
    """A named type another subject's version defines (Confluent's SchemaReference)."""

    name: str
    subject: str
    version: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "subject": self.subject, "version": self.version}


@dataclass(frozen=True)
class SchemaValue:
    """One version of a subject: what a SCHEMA record's value holds."""

    subject: str
    version: int
    id: int
    schema: str
    schema_type: str = AVRO
    references: tuple[Reference, ...] = ()
    deleted: bool = False

    def to_json(self) -> dict[str, Any]:
        value: dict[str, Any] = {"subject": self.subject, "version": self.version, "id": self.id}
        if self.schema_type != AVRO:
            value["schemaType"] = self.schema_type
        if self.references:
            value["references"] = [r.to_json() for r in self.references]
        value["schema"] = self.schema
        value["deleted"] = self.deleted
        return value


def _compact(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def schema_key(subject: str, version: int) -> bytes:
    return _compact({"keytype": "SCHEMA", "subject": subject, "version": version, "magic": 1})


def config_key(subject: str | None) -> bytes:
    return _compact({"keytype": "CONFIG", "subject": subject, "magic": 0})


def mode_key(subject: str | None) -> bytes:
    return _compact({"keytype": "MODE", "subject": subject, "magic": 0})


def encode_schema(value: SchemaValue) -> tuple[bytes, bytes]:
    return schema_key(value.subject, value.version), _compact(value.to_json())


def encode_config(subject: str | None, level: str) -> tuple[bytes, bytes]:
    return config_key(subject), _compact({"compatibilityLevel": level})


def encode_mode(subject: str | None, mode: str) -> tuple[bytes, bytes]:
    return mode_key(subject), _compact({"mode": mode})


def parse_references(raw: Any) -> tuple[Reference, ...]:
    """``[{"name", "subject", "version"}, ...]`` as a request or a record carries it; ValueError
    for anything else."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError("references must be a list")
    references = []
    for item in raw:
        if not isinstance(item, dict):
            raise ValueError("a reference is {name, subject, version}")
        name, subject, version = item.get("name"), item.get("subject"), item.get("version")
        if not isinstance(name, str) or not isinstance(subject, str):
            raise ValueError("a reference names its name and subject")
        if not isinstance(version, int) or isinstance(version, bool) or version < -1:
            raise ValueError(f"reference {name}: version must be a number")
        references.append(Reference(name, subject, version))
    return tuple(references)


def decode_schema_value(value: bytes) -> SchemaValue:
    raw = json.loads(value)
    return SchemaValue(
        subject=str(raw["subject"]),
        version=int(raw["version"]),
        id=int(raw["id"]),
        schema=str(raw["schema"]),
        schema_type=str(raw.get("schemaType") or AVRO),
        references=parse_references(raw.get("references")),
        deleted=bool(raw.get("deleted", False)),
    )
