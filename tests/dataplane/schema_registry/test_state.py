"""The registry's pure core: Confluent's keys, the state replayed from them, the records a
write generates, Avro and JSON Schema compatibility."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dataplane.schema_registry import compatibility
from dataplane.schema_registry.errors import RegistryError
from dataplane.schema_registry.records import (
    AVRO,
    JSON,
    Reference,
    SchemaValue,
    config_key,
    encode_schema,
    schema_key,
)
from dataplane.schema_registry.state import Record, RegistryState


def avro_record(*fields: tuple[str, str, object]) -> str:
    """A record schema with (name, type, default or ...) fields."""
    out = []
    for name, kind, default in fields:
        field: dict[str, object] = {"name": name, "type": kind}
        if default is not ...:
            field["default"] = default
        out.append(field)
    return json.dumps({"type": "record", "name": "User", "fields": out})


def apply(state: RegistryState, records: list[Record]) -> None:
    for key, value in records:
        state.replay(key, value)


def register(state: RegistryState, subject: str, schema: str, schema_type: str = AVRO,
             references: tuple[Reference, ...] = ()) -> int:  # fmt: skip
    text = compatibility.canonical(schema_type, schema, state.resolve(references))
    records, schema_id = state.generate_register(
        subject, schema_type, text, references, compatibility.check
    )
    apply(state, records)
    return schema_id


def error_code(call: object) -> int:
    assert callable(call)
    with pytest.raises(RegistryError) as raised:
        call()
    return raised.value.error_code


def test_keys_are_confluents_bytes() -> None:
    assert schema_key("orders-value", 3) == (
        b'{"keytype":"SCHEMA","subject":"orders-value","version":3,"magic":1}'
    )
    assert config_key(None) == b'{"keytype":"CONFIG","subject":null,"magic":0}'
    key, value = encode_schema(SchemaValue("s", 1, 7, '"string"', JSON))
    assert key == schema_key("s", 1)
    assert json.loads(value) == {
        "subject": "s", "version": 1, "id": 7, "schemaType": "JSON", "schema": '"string"',
        "deleted": False,
    }  # fmt: skip


def test_a_value_written_by_confluent_replays() -> None:
    state = RegistryState()
    state.replay(
        b'{"keytype":"SCHEMA","subject":"t-value","version":1,"magic":1}',
        b'{"subject":"t-value","version":1,"id":21,"schema":"\\"string\\"","deleted":false}',
    )
    state.replay(b'{"keytype":"NOOP","magic":0}', None)
    assert state.version("t-value", "latest").id == 21
    assert state.max_id == 21
    state.replay(
        b'{"keytype":"DELETE_SUBJECT","subject":"t-value","magic":0}',
        b'{"subject":"t-value","version":1}',
    )
    assert state.subjects() == [] and state.subjects(deleted=True) == ["t-value"]


def test_ids_name_content_versions_count_per_subject() -> None:
    state = RegistryState()
    first = register(state, "a", avro_record(("x", "int", ...)))
    again = register(state, "a", avro_record(("x", "int", ...)))
    other_subject = register(state, "b", avro_record(("x", "int", ...)))
    second = register(state, "a", avro_record(("x", "int", ...), ("y", "string", "")))
    assert (first, again, other_subject, second) == (1, 1, 1, 2)
    assert state.versions("a") == [1, 2] and state.versions("b") == [1]
    assert state.subject_versions_of(1) == [("a", 1), ("b", 1)]


def test_soft_then_permanent_delete() -> None:
    state = RegistryState()
    register(state, "a", avro_record(("x", "int", ...)))
    register(state, "a", avro_record(("x", "int", ...), ("y", "int", 0)))
    assert error_code(lambda: state.generate_delete_version("a", "1", permanent=True)) == 40407
    records, version = state.generate_delete_version("a", "1", permanent=False)
    apply(state, records)
    assert version == 1 and state.versions("a") == [2]
    assert error_code(lambda: state.version("a", "1")) == 40402
    assert state.version("a", "1", deleted=True).deleted
    assert error_code(lambda: state.generate_delete_subject("a", permanent=True)) == 40405
    records, versions = state.generate_delete_subject("a", permanent=False)
    apply(state, records)
    assert versions == [2]
    assert error_code(lambda: state.versions("a")) == 40401
    assert error_code(lambda: state.generate_delete_subject("a", permanent=False)) == 40404
    records, versions = state.generate_delete_subject("a", permanent=True)
    apply(state, records)
    assert versions == [1, 2] and state.subjects(deleted=True) == []
    # the next id is still above every id handed out
    assert register(state, "a", avro_record(("z", "int", ...))) == 3


@pytest.mark.parametrize(
    ("level", "new", "accepted"),
    [
        # a field added with a default: a new reader fills it in, an old reader skips it
        ("BACKWARD", avro_record(("x", "int", ...), ("y", "string", "")), True),
        ("FULL", avro_record(("x", "int", ...), ("y", "string", "")), True),
        # added without a default: the new reader cannot read old data
        ("BACKWARD", avro_record(("x", "int", ...), ("y", "string", ...)), False),
        ("FORWARD", avro_record(("x", "int", ...), ("y", "string", ...)), True),
        ("FULL", avro_record(("x", "int", ...), ("y", "string", ...)), False),
        # the field without a default removed: old readers cannot read new data
        ("FORWARD", avro_record(("y", "string", "")), False),
        ("BACKWARD", avro_record(("y", "string", "")), True),
        # int -> long is a promotion for a reader, not back
        ("BACKWARD", avro_record(("x", "long", ...)), True),
        ("FORWARD", avro_record(("x", "long", ...)), False),
        ("NONE", avro_record(("x", "string", ...)), True),
    ],
)
def test_avro_levels(level: str, new: str, accepted: bool) -> None:
    state = RegistryState()
    register(state, "s", avro_record(("x", "int", ...)))
    apply(state, state.generate_config("s", level))
    if accepted:
        assert register(state, "s", new) == 2
    else:
        assert error_code(lambda: register(state, "s", new)) == 409
        assert state.versions("s") == [1]  # nothing stored


def test_transitive_checks_every_version() -> None:
    state = RegistryState()
    register(state, "s", avro_record(("x", "int", ...)))
    register(state, "s", avro_record(("x", "int", ...), ("y", "int", 0)))
    # v3 (y without a default) reads v2's data (y written); v1's data has no y: only the
    # transitive level, which checks v1 too, refuses it
    v3 = avro_record(("y", "int", ...))
    apply(state, state.generate_config(None, "BACKWARD_TRANSITIVE"))
    assert error_code(lambda: register(state, "s", v3)) == 409
    apply(state, state.generate_config(None, "BACKWARD"))
    assert register(state, "s", v3) == 3


def test_json_schema_rules() -> None:
    old: dict[str, Any] = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
    }
    wider = {"type": "object", "properties": {"a": {"type": "number"}}, "required": ["a"]}
    required = {**old, "properties": {**old["properties"], "b": {"type": "string"}},
                "required": ["a", "b"]}  # fmt: skip
    closed = {**old, "additionalProperties": False}
    assert compatibility.json_reader_writer(wider, old, "#") == []
    assert compatibility.json_reader_writer(old, wider, "#") != []
    assert compatibility.json_reader_writer(required, old, "#") == [
        "#/required: property 'b' became required"
    ]
    assert compatibility.json_reader_writer(closed, old, "#") == [
        "#: additional properties no longer allowed"
    ]
    state = RegistryState()
    assert register(state, "j", json.dumps(old), JSON) == 1
    assert error_code(lambda: register(state, "j", json.dumps(required), JSON)) == 409
    assert register(state, "j", json.dumps(wider), JSON) == 2


def test_malformed_schemas_are_42201() -> None:
    state = RegistryState()
    assert error_code(lambda: register(state, "s", "{not json")) == 42201
    assert error_code(lambda: register(state, "s", '{"type": "record", "name": "r"}')) == 42201
    assert error_code(lambda: register(state, "s", '{"type": 12}', JSON)) == 42201
    missing = (Reference("Other", "nobody", 1),)
    assert error_code(lambda: register(state, "s", '"Other"', AVRO, missing)) == 42201
    assert state.subjects(deleted=True) == []


def test_avro_references() -> None:
    state = RegistryState()
    address = json.dumps({"type": "record", "name": "Address", "namespace": "x",
                          "fields": [{"name": "city", "type": "string"}]})  # fmt: skip
    register(state, "address", address)
    user = json.dumps({"type": "record", "name": "User", "namespace": "x",
                       "fields": [{"name": "home", "type": "x.Address"}]})  # fmt: skip
    refs = (Reference("x.Address", "address", 1),)
    assert register(state, "user", user, AVRO, refs) == 2
    assert state.version("user", "latest").references == refs
    assert state.referenced_by(state.version("address", "1")) == [2]


def test_versions_as_urls_name_them() -> None:
    state = RegistryState()
    register(state, "s", avro_record(("x", "int", ...)))
    assert state.version("s", "latest").version == 1
    assert state.version("s", "-1").version == 1
    assert error_code(lambda: state.version("s", "0")) == 42202
    assert error_code(lambda: state.version("s", "abc")) == 42202
    assert error_code(lambda: state.version("s", "2")) == 40402
    assert error_code(lambda: state.version("t", "1")) == 40401


def test_readonly_mode_refuses_writes() -> None:
    state = RegistryState()
    apply(state, state.generate_mode(None, "READONLY"))
    assert error_code(lambda: register(state, "s", '"string"')) == 42205
    assert error_code(lambda: state.generate_mode(None, "SOMETIMES")) == 42204
    assert error_code(lambda: state.generate_config(None, "SIDEWAYS")) == 42203
