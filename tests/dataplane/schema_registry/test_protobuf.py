"""Protobuf schemas in the registry's pure core: protoc's parse (text and base64), references by
import path, and Confluent's compatibility rules (SchemaDiff), each at BACKWARD and FORWARD."""

from __future__ import annotations

import base64

import pytest
from google.protobuf import timestamp_pb2

from dataplane.schema_registry import compatibility, protobuf
from dataplane.schema_registry.errors import RegistryError
from dataplane.schema_registry.records import PROTOBUF, Reference
from dataplane.schema_registry.state import RegistryState
from tests.dataplane.schema_registry.test_state import apply, error_code, register

USER = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message User {
  string name = 1;
  int64 id = 2;
  google.protobuf.Timestamp created = 3;
  map<string, int32> counts = 4;
  message Address { string street = 1; }
  Address address = 5;
}
"""


def proto(body: str, package: str = "shop", syntax: str = "proto3") -> str:
    return f'syntax = "{syntax}";\npackage {package};\n{body}\n'


def incompatible(old: str, new: str, level: str = "BACKWARD") -> list[str]:
    return compatibility.check(PROTOBUF, (new, []), [(old, [])], level)


def test_text_parses_with_the_well_known_types_and_the_references_by_import_path() -> None:
    state = RegistryState()
    register(state, "common.proto", proto("message Money { int64 cents = 1; }", "common"),
             PROTOBUF)  # fmt: skip
    order = proto('import "common.proto";\nmessage Order { common.Money total = 1; }')
    refs = (Reference("common.proto", "common.proto", 1),)
    assert register(state, "orders-value", order, PROTOBUF, refs) == 2
    assert register(state, "users-value", USER, PROTOBUF) == 3
    name, files = protobuf.parse(order, state.resolve(refs))
    assert set(files) == {"common.proto", name}
    assert files[name].message_type[0].field[0].type_name == ".common.Money"


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (proto("message A { int32 x = 1 }"), 'Expected ";"'),
        (proto("message A { Missing x = 1; }"), '"Missing" is not defined'),
        (proto("message A { int32 x = 1; int32 y = 1; }"), "has already been used"),
        (proto('import "nowhere.proto";\nmessage A { int32 x = 1; }'), "nowhere.proto"),
        ("   ", "empty"),
    ],
)
def test_what_protoc_refuses_is_42201_with_its_message(schema: str, message: str) -> None:
    with pytest.raises(RegistryError) as raised:
        compatibility.canonical(PROTOBUF, schema, [])
    assert raised.value.error_code == 42201
    assert message in str(raised.value)


def test_a_base64_file_descriptor_as_the_python_serializer_sends_it() -> None:
    """confluent-kafka's ProtobufSerializer registers the FileDescriptorProto in base64; the
    registry builds it over its imports and serves it back as given (``format=serialized``)."""
    encoded = base64.standard_b64encode(timestamp_pb2.DESCRIPTOR.serialized_pb).decode()
    assert compatibility.canonical(PROTOBUF, encoded, []) == encoded
    assert protobuf.serialized(encoded, []) == encoded
    name, files = protobuf.parse(encoded, [])
    assert files[name].message_type[0].name == "Timestamp"
    text_served = base64.b64decode(protobuf.serialized(USER, []))
    assert b"google/protobuf/timestamp.proto" in text_served
    broken = base64.standard_b64encode(b"\xff\xff\xff").decode()
    assert error_code(lambda: compatibility.canonical(PROTOBUF, broken, [])) == 42201


V1 = "message User { string name = 1; int64 id = 2; optional int32 age = 3; }"


@pytest.mark.parametrize(
    ("new", "found"),
    [
        # compatible as Confluent has it: adds, removals, renames, same encoding group
        ("message User { string name = 1; int64 id = 2; optional int32 age = 3; "
         "bytes photo = 4; }", None),
        ("message User { string name = 1; optional int32 age = 3; }", None),
        ("message User { string full_name = 1; int64 id = 2; optional int32 age = 3; }", None),
        ("message User { bytes name = 1; uint64 id = 2; optional bool age = 3; }", None),
        ("message User { string name = 1; int64 id = 2; optional int32 age = 3; }\n"
         "message Extra { int32 x = 1; }", None),
        ("message User { reserved 2; string name = 1; sint64 id = 4; optional int32 age = 3; }",
         None),
        # incompatible
        ("message User { string name = 1; sint64 id = 2; optional int32 age = 3; }",
         "FIELD_SCALAR_KIND_CHANGED at User.2"),
        ("message User { string name = 1; double id = 2; optional int32 age = 3; }",
         "FIELD_SCALAR_KIND_CHANGED at User.2"),
        ("message User { string name = 1; Id id = 2; optional int32 age = 3; }\n"
         "message Id { int64 v = 1; }", "FIELD_KIND_CHANGED at User.2 (scalar to message)"),
        ("message Person { string name = 1; int64 id = 2; optional int32 age = 3; }",
         "MESSAGE_REMOVED at User"),
        ("message User { oneof who { string name = 1; int64 id = 2; } optional int32 age = 3; }",
         "MULTIPLE_FIELDS_MOVED_TO_ONEOF at User.who"),
    ],
)  # fmt: skip
def test_confluents_protobuf_rules(new: str, found: str | None) -> None:
    messages = incompatible(proto(V1), proto(new))
    assert messages == ([] if found is None else [found])


def test_package_maps_nested_types_required_and_direction() -> None:
    assert incompatible(proto(V1), proto(V1, "other")) == ["PACKAGE_CHANGED: 'shop' to 'other'"]
    maps = "message M { map<string, int32> m = 1; }"
    assert incompatible(proto(maps), proto(maps.replace("int32", "int64"))) == []
    assert incompatible(proto(maps), proto(maps.replace("int32", "string"))) == [
        "FIELD_SCALAR_KIND_CHANGED at M.1.value"
    ]
    nested = "message O { message I { int32 x = 1; } I i = 1; }"
    assert incompatible(proto(nested), proto(nested.replace("int32 x", "float x"))) == [
        "FIELD_SCALAR_KIND_CHANGED at O.I.1"
    ]
    two = "message R { required int32 a = 1; }"
    with_b = "message R { required int32 a = 1; required int32 b = 2; }"
    assert incompatible(proto(two, syntax="proto2"), proto(with_b, syntax="proto2")) == [
        "REQUIRED_FIELD_ADDED at R.2"
    ]
    # FORWARD checks the other way: the old schema reads what the new one writes
    assert incompatible(proto(with_b, syntax="proto2"), proto(two, syntax="proto2"),
                        "FORWARD") == ["REQUIRED_FIELD_ADDED at R.2"]  # fmt: skip
    assert incompatible(proto(with_b, syntax="proto2"), proto(two, syntax="proto2")) == [
        "REQUIRED_FIELD_REMOVED at R.2"
    ]


def test_an_incompatible_protobuf_version_is_409_and_nothing_is_stored() -> None:
    state = RegistryState()
    assert register(state, "users-value", proto(V1), PROTOBUF) == 1
    changed = proto(V1.replace("int64 id", "string id"))
    assert error_code(lambda: register(state, "users-value", changed, PROTOBUF)) == 409
    assert state.versions("users-value") == [1]
    apply(state, state.generate_config("users-value", "NONE"))
    assert register(state, "users-value", changed, PROTOBUF) == 2
