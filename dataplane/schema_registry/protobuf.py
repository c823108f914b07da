"""Protobuf schemas: parsed into descriptors by protoc, and compared as Confluent compares them.

A client registers a ``.proto`` file either as its text (the Java serializer, curl) or as its
``FileDescriptorProto`` serialized and base64-encoded (confluent-kafka's Python
``ProtobufSerializer``), with one reference per import, named by the import's path. Confluent's
registry takes both; so does this one. Text is compiled by the protoc bundled with grpcio-tools,
in process, over files written to a temporary directory: the schema, its references beside it
(a base64 one through ``--descriptor_set_in``), and grpcio-tools' copy of the well-known types
(``google/protobuf/*.proto``) on the include path. A base64 one is built into a fresh
``DescriptorPool``, which checks it as protoc would. What either refuses is 42201 with its
message.

Compatibility follows Confluent's ``SchemaDiff`` (the protobuf provider's ``diff`` package): the
previous file and the new one are compared message by message (by name, nested ones within
theirs) and field by field (by number); the differences Confluent counts as compatible are
ignored, any other makes the new schema incompatible. The same comparison answers BACKWARD (old
to new) and FORWARD (new to old), as Confluent's ``ProtobufSchema.isBackwardCompatible`` does.
"""

from __future__ import annotations

import base64
import binascii
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

import grpc_tools
from google.protobuf import (  # noqa: F401  (each adds its file to the default pool)
    any_pb2,
    api_pb2,
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    empty_pb2,
    field_mask_pb2,
    source_context_pb2,
    struct_pb2,
    timestamp_pb2,
    type_pb2,
    wrappers_pb2,
)
from google.protobuf.message import DecodeError
from grpc_tools import _protoc_compiler

from dataplane.schema_registry import errors
from dataplane.schema_registry.records import SchemaValue

# An imported file's name (as the import names it) and its schema
NamedSchema = tuple[str, SchemaValue]
FileSet = dict[str, descriptor_pb2.FileDescriptorProto]
MAIN_FILE = "__schema__.proto"
WELL_KNOWN_TYPES = str(Path(grpc_tools.__file__).parent / "_proto")
_PROTOC_LOCK = threading.Lock()  # protoc's command line is not documented as reentrant

Field = descriptor_pb2.FieldDescriptorProto
# Confluent's FieldSchemaDiff.ScalarKind: scalars that read each other's encoding
_SCALAR_KINDS = {
    Field.TYPE_INT32: "number", Field.TYPE_INT64: "number", Field.TYPE_UINT32: "number",
    Field.TYPE_UINT64: "number", Field.TYPE_BOOL: "number", Field.TYPE_ENUM: "number",
    Field.TYPE_SINT32: "signed", Field.TYPE_SINT64: "signed",
    Field.TYPE_STRING: "string or bytes", Field.TYPE_BYTES: "string or bytes",
    Field.TYPE_FIXED32: "fixed32", Field.TYPE_SFIXED32: "fixed32",
    Field.TYPE_FIXED64: "fixed64", Field.TYPE_SFIXED64: "fixed64",
    Field.TYPE_FLOAT: "float", Field.TYPE_DOUBLE: "double",
}  # fmt: skip


def _serialized(schema: str) -> descriptor_pb2.FileDescriptorProto | None:
    """The FileDescriptorProto a base64 schema holds; None for one that is not base64 (text:
    a ``.proto`` file's text always has characters base64 does not)."""
    try:
        data = base64.b64decode(schema.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    proto = descriptor_pb2.FileDescriptorProto()
    try:
        proto.ParseFromString(data)
    except DecodeError as error:
        raise errors.invalid_schema(f"base64, but not a FileDescriptorProto: {error}") from None
    return proto


def _check_name(name: str) -> None:
    parts = name.split("/")
    if not name.endswith(".proto") or name.startswith("/") or ".." in parts or "" in parts:
        raise errors.invalid_schema(f"reference name {name!r} is not a relative .proto path")


def parse(schema: str, resolved: Sequence[NamedSchema]) -> tuple[str, FileSet]:
    """The schema's file name and every file it needs, by name (its own, its references',
    the well-known types it imports); 42201 with protoc's (or the pool's) message."""
    serialized = _serialized(schema)
    if serialized is not None and not resolved:
        return _built(serialized, {})
    references = _references(resolved)
    if serialized is not None:
        return _built(serialized, references)
    return MAIN_FILE, _compiled(MAIN_FILE, schema, resolved, references)


def _references(resolved: Sequence[NamedSchema]) -> FileSet:
    """The referenced files as descriptors, theirs first (``resolve`` orders them so)."""
    files: FileSet = {}
    for index, (name, value) in enumerate(resolved):
        _check_name(name)
        serialized = _serialized(value.schema)
        if serialized is None:
            files.update(_compiled(name, value.schema, resolved[:index], files))
        else:
            serialized.name = name
            files[name] = serialized
    return files


def _compiled(name: str, text: str, resolved: Sequence[NamedSchema], known: FileSet) -> FileSet:
    """protoc over ``text`` saved as ``name``: the text references beside it, the others (and
    any already compiled) as a descriptor set; 42201 with protoc's message."""
    with tempfile.TemporaryDirectory(prefix="schema-registry-") as directory:
        root = Path(directory)
        for path, content in [(n, v.schema) for n, v in resolved] + [(name, text)]:
            if path in known and path != name:
                continue
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(content)
        arguments = [f"-I{root}", f"-I{WELL_KNOWN_TYPES}"]
        if known:
            known_set = descriptor_pb2.FileDescriptorSet(file=list(known.values()))
            (root / "__known__.pb").write_bytes(known_set.SerializeToString())
            arguments = [f"--descriptor_set_in={root / '__known__.pb'}", *arguments]
        out = root / "__out__.pb"
        with _PROTOC_LOCK:
            status = _protoc_compiler.run_main(
                [b"protoc", *(a.encode() for a in arguments), b"--include_imports",
                 f"--descriptor_set_out={out}".encode(), name.encode()]
            )  # fmt: skip
            if status != 0:
                raise errors.invalid_schema(_protoc_message(root, name, arguments))
        result = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return {file.name: file for file in result.file}


def _protoc_message(root: Path, name: str, arguments: list[str]) -> str:
    """protoc's own words for a file it refused (``get_protos`` returns them; ``run_main`` only
    prints them), when it can say them without a descriptor set input."""
    if any(a.startswith("--descriptor_set_in") for a in arguments):
        return f"protoc refused {name} (see the node's log)"
    try:
        _protoc_compiler.get_protos(name.encode(), [str(root).encode(), WELL_KNOWN_TYPES.encode()])
    except _protoc_compiler.ProtocErrors as error:
        return str(error).replace(str(root) + "/", "")
    return f"protoc refused {name}"


def _well_known(name: str) -> descriptor_pb2.FileDescriptorProto | None:
    """A ``google/protobuf/*.proto`` file as the protobuf runtime ships it."""
    try:
        found = descriptor_pool.Default().FindFileByName(name)
    except KeyError:
        return None
    proto = descriptor_pb2.FileDescriptorProto()
    found.CopyToProto(proto)
    return proto


def _built(main: descriptor_pb2.FileDescriptorProto, known: FileSet) -> tuple[str, FileSet]:
    """A serialized file built into a fresh pool over its imports (which checks its names and
    types as protoc does); 42201 with the pool's message."""
    name = main.name or MAIN_FILE
    if name in known:  # the serializer names it by its own path; a reference may too
        name = MAIN_FILE
    main.name = name
    files: FileSet = {}
    pool = descriptor_pool.DescriptorPool()

    def add(proto: descriptor_pb2.FileDescriptorProto, depth: int) -> None:
        if proto.name in files:
            return
        for dependency in proto.dependency:
            found = known.get(dependency) or _well_known(dependency)
            if found is None or depth > 32:
                raise errors.invalid_schema(f"{proto.name}: import {dependency!r} not found")
            add(found, depth + 1)
        try:
            pool.AddSerializedFile(proto.SerializeToString())
        except (TypeError, ValueError) as error:
            raise errors.invalid_schema(f"{proto.name}: {error}") from None
        files[proto.name] = proto

    add(main, 0)
    return name, files


def serialized(schema: str, resolved: Sequence[NamedSchema]) -> str:
    """The schema as confluent-kafka's deserializer asks it (``?format=serialized``): its
    FileDescriptorProto, base64."""
    name, files = parse(schema, resolved)
    return base64.standard_b64encode(files[name].SerializeToString()).decode("ascii")


# -- compatibility (Confluent's SchemaDiff) ------------------------------------------------------


class _Types:
    """Every message and enum the files define, by full name (``.pkg.Outer.Inner``)."""

    def __init__(self, files: FileSet) -> None:
        self.messages: dict[str, descriptor_pb2.DescriptorProto] = {}
        self.local: dict[str, str] = {}  # full name: the name within its package
        self.file_of: dict[str, str] = {}
        for file in files.values():
            self._add(file, f".{file.package}" if file.package else "", "", file.message_type)

    def _add(
        self, file: descriptor_pb2.FileDescriptorProto, prefix: str, local: str,
        messages: Sequence[descriptor_pb2.DescriptorProto],
    ) -> None:  # fmt: skip
        for message in messages:
            name, local_name = f"{prefix}.{message.name}", f"{local}{message.name}"
            self.messages[name], self.local[name], self.file_of[name] = (
                message,
                local_name,
                file.name,
            )
            self._add(file, name, f"{local_name}.", message.nested_type)

    def kind(self, field: descriptor_pb2.FieldDescriptorProto) -> str:
        if field.type in (Field.TYPE_MESSAGE, Field.TYPE_GROUP):
            found = self.messages.get(field.type_name)
            return "map" if found is not None and found.options.map_entry else "message"
        return "scalar"


def compare(old: tuple[str, FileSet], new: tuple[str, FileSet]) -> list[str]:
    """The incompatible differences from ``old`` to ``new`` (empty: ``new`` reads what ``old``
    wrote, as Confluent judges it)."""
    old_file, new_file = old[1][old[0]], new[1][new[0]]
    differences: list[str] = []
    if old_file.package != new_file.package:
        differences.append(f"PACKAGE_CHANGED: {old_file.package!r} to {new_file.package!r}")
    context = _Diff(_Types(old[1]), _Types(new[1]), (old[0], new[0]), differences)
    context.messages("", old_file.message_type, new_file.message_type)
    return differences


class _Diff:
    def __init__(
        self, old: _Types, new: _Types, mains: tuple[str, str], differences: list[str]
    ) -> None:
        self.old, self.new, self.mains, self.differences = old, new, mains, differences
        self.compared: set[tuple[str, str]] = set()  # imported message types, once each

    def add(self, kind: str, path: str) -> None:
        self.differences.append(f"{kind} at {path}")

    def messages(
        self, path: str, old: Sequence[descriptor_pb2.DescriptorProto],
        new: Sequence[descriptor_pb2.DescriptorProto],
    ) -> None:  # fmt: skip
        """By name: a message removed is incompatible (a map's entry type is not a message of
        its own), one added or moved is not."""
        new_by_name = {m.name: m for m in new}
        for message in old:
            name = f"{path}.{message.name}" if path else message.name
            if message.options.map_entry:
                continue  # compared as its map field's key and value
            if message.name not in new_by_name:
                self.add("MESSAGE_REMOVED", name)
                continue
            self.message(name, message, new_by_name[message.name])

    def message(
        self, path: str, old: descriptor_pb2.DescriptorProto, new: descriptor_pb2.DescriptorProto
    ) -> None:
        old_fields, new_fields = {f.number: f for f in old.field}, {f.number: f for f in new.field}
        self._oneofs(path, old, new)
        for number, field in old_fields.items():
            found = new_fields.get(number)
            if found is None:
                if field.label == Field.LABEL_REQUIRED:
                    self.add("REQUIRED_FIELD_REMOVED", f"{path}.{number}")
                elif _in_oneof(field):
                    self.add("ONEOF_FIELD_REMOVED", f"{path}.{number}")
                continue  # FIELD_REMOVED: compatible (Confluent asks no reservation)
            self.field(f"{path}.{number}", field, found)
        for number, field in new_fields.items():
            if number not in old_fields and field.label == Field.LABEL_REQUIRED:
                self.add("REQUIRED_FIELD_ADDED", f"{path}.{number}")
        self.messages(path, old.nested_type, new.nested_type)

    def _oneofs(
        self, path: str, old: descriptor_pb2.DescriptorProto, new: descriptor_pb2.DescriptorProto
    ) -> None:
        """A oneof of ``new`` may take in one field that was outside every oneof, and then no
        field that was in an old oneof (Confluent's MULTIPLE_FIELDS_MOVED_TO_ONEOF and
        FIELD_MOVED_TO_EXISTING_ONEOF): otherwise values set together would now clear each
        other. Proto3 ``optional`` fields (synthetic oneofs) count as outside."""
        old_fields = {f.number: f for f in old.field}
        for index, oneof in enumerate(new.oneof_decl):
            members = [f for f in new.field if _oneof_index(f) == index]
            if not members or members[0].proto3_optional:
                continue
            moved = [f for f in members if f.number in old_fields
                     and not _in_oneof(old_fields[f.number])]  # fmt: skip
            existing = [f for f in members if f.number in old_fields
                        and _in_oneof(old_fields[f.number])]  # fmt: skip
            if len(moved) > 1:
                self.add("MULTIPLE_FIELDS_MOVED_TO_ONEOF", f"{path}.{oneof.name}")
            elif moved and existing:
                self.add("FIELD_MOVED_TO_EXISTING_ONEOF", f"{path}.{oneof.name}")

    def field(
        self, path: str, old: descriptor_pb2.FieldDescriptorProto,
        new: descriptor_pb2.FieldDescriptorProto,
    ) -> None:  # fmt: skip
        """A rename is compatible (numbers are what the wire carries); a change of kind (scalar,
        message, map), of scalar encoding group, or of the message type's name is not."""
        old_kind, new_kind = self.old.kind(old), self.new.kind(new)
        if old_kind != new_kind:
            self.add("FIELD_KIND_CHANGED", f"{path} ({old_kind} to {new_kind})")
        elif old_kind == "scalar":
            if _SCALAR_KINDS.get(old.type) != _SCALAR_KINDS.get(new.type):
                self.add("FIELD_SCALAR_KIND_CHANGED", path)
        elif old_kind == "message":
            self._named(path, old.type_name, new.type_name)
        else:
            old_entry, new_entry = (
                self.old.messages[old.type_name],
                self.new.messages[new.type_name],
            )
            for old_part, new_part in zip(old_entry.field, new_entry.field, strict=True):
                self.field(f"{path}.{old_part.name}", old_part, new_part)

    def _named(self, path: str, old: str, new: str) -> None:
        """Types by their name within their package; one imported (not of the main file,
        whose messages are compared by name anyway) is compared too, once."""
        old_local, new_local = self.old.local.get(old, old), self.new.local.get(new, new)
        if old_local != new_local:
            self.add("FIELD_NAMED_TYPE_CHANGED", path)
            return
        imported = (self.old.file_of.get(old) != self.mains[0]
                    or self.new.file_of.get(new) != self.mains[1])  # fmt: skip
        if imported and (old, new) not in self.compared and old in self.old.messages \
                and new in self.new.messages:  # fmt: skip
            self.compared.add((old, new))
            self.message(old_local, self.old.messages[old], self.new.messages[new])


def _oneof_index(field: descriptor_pb2.FieldDescriptorProto) -> int | None:
    return field.oneof_index if field.HasField("oneof_index") else None


def _in_oneof(field: descriptor_pb2.FieldDescriptorProto) -> bool:
    return _oneof_index(field) is not None and not field.proto3_optional
