"""The registry's state: the ``_schemas`` topic replayed, and the records a write would add.

Pure: :meth:`RegistryState.replay` is the only mutator, fed each record of the topic in offset
order; the ``generate_*`` methods return the records a request would write (and its answer)
without changing anything, or raise :class:`RegistryError` for a refusal. The IO shell
(:mod:`dataplane.schema_registry.registry`) writes what they return and replays it back, so
every node, the writer included, holds the same state after reading the same records.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace

from dataplane.schema_registry import errors
from dataplane.schema_registry.errors import RegistryError
from dataplane.schema_registry.records import (
    Reference,
    SchemaValue,
    config_key,
    decode_schema_value,
    encode_config,
    encode_mode,
    encode_schema,
    schema_key,
)

LEVELS = (
    "NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL",
    "FULL_TRANSITIVE",
)  # fmt: skip
DEFAULT_LEVEL = "BACKWARD"  # Confluent's default
MODES = ("READWRITE", "READONLY")
DEFAULT_MODE = "READWRITE"
VERSION_MAX = 2**31 - 1

Record = tuple[bytes, bytes | None]
# A schema a reference names, with the reference's name (a Protobuf import's path)
NamedSchema = tuple[str, SchemaValue]
# A schema to check: its text and the schemas its references name, resolved (theirs first)
Candidate = tuple[str, list[NamedSchema]]
# (schema type, the new schema, the previous versions to check against, oldest first, the
# level): the messages of what is incompatible (empty: compatible); raises RegistryError(42201)
# for a new schema that does not parse
Checker = Callable[[str, Candidate, Sequence[Candidate], str], list[str]]


def parse_version(spec: str | int) -> int | None:
    """A version as a URL names it: 1..2^31-1, or ``latest``/-1 (None); else 42202."""
    if isinstance(spec, str) and spec.lower() == "latest":
        return None
    try:
        version = int(spec)
    except ValueError:
        raise errors.invalid_version(str(spec)) from None
    if version == -1:
        return None
    if not 1 <= version <= VERSION_MAX:
        raise errors.invalid_version(str(spec))
    return version


class RegistryState:
    """Subjects, their versions, the compatibility levels and modes, as of the records replayed.

    Invariants: ``max_id`` is at least every id replayed (an id is never handed out twice by a
    writer that has replayed the whole topic); a version number is unique within its subject."""

    def __init__(self) -> None:
        self._subjects: dict[str, dict[int, SchemaValue]] = {}
        self._configs: dict[str | None, str] = {}
        self._modes: dict[str | None, str] = {}
        self.max_id = 0

    # -- replay -----------------------------------------------------------------------------

    def replay(self, key: bytes, value: bytes | None) -> None:
        """Apply one record of ``_schemas``; ValueError for a key that is not the registry's."""
        raw = json.loads(key)
        if not isinstance(raw, dict):
            raise ValueError(f"not a registry key: {key!r}")
        keytype, subject = raw.get("keytype"), raw.get("subject")
        if keytype == "SCHEMA":
            self._replay_schema(str(subject), int(raw["version"]), value)
        elif keytype == "CONFIG":
            self._replay_setting(self._configs, subject, value, "compatibilityLevel")
        elif keytype == "MODE":
            self._replay_setting(self._modes, subject, value, "mode")
        elif keytype == "DELETE_SUBJECT" and value is not None:
            upto = int(json.loads(value)["version"])
            versions = self._subjects.get(str(subject), {})
            for number, schema in versions.items():
                if number <= upto:
                    versions[number] = replace(schema, deleted=True)
        # NOOP and keys of newer registries (CONTEXT, ...) carry nothing this registry keeps

    def _replay_schema(self, subject: str, version: int, value: bytes | None) -> None:
        versions = self._subjects.setdefault(subject, {})
        if value is None:
            versions.pop(version, None)
            if not versions:
                del self._subjects[subject]
            return
        schema = decode_schema_value(value)
        versions[version] = schema
        self.max_id = max(self.max_id, schema.id)

    @staticmethod
    def _replay_setting(
        settings: dict[str | None, str], subject: object, value: bytes | None, field: str
    ) -> None:
        name = None if subject is None else str(subject)
        if value is None:
            settings.pop(name, None)
        else:
            settings[name] = str(json.loads(value)[field])

    # -- reads ------------------------------------------------------------------------------

    def subjects(self, deleted: bool = False) -> list[str]:
        return sorted(s for s in self._subjects if deleted or self._live(s))

    def _live(self, subject: str) -> list[SchemaValue]:
        versions = self._subjects.get(subject, {})
        return [versions[v] for v in sorted(versions) if not versions[v].deleted]

    def _existing(self, subject: str, deleted: bool) -> list[SchemaValue]:
        """The subject's versions in order (soft-deleted ones too if ``deleted``); 40401 if
        none."""
        versions = self._subjects.get(subject, {})
        found = [versions[v] for v in sorted(versions) if deleted or not versions[v].deleted]
        if not found:
            raise errors.subject_not_found(subject)
        return found

    def versions(self, subject: str, deleted: bool = False) -> list[int]:
        return [schema.version for schema in self._existing(subject, deleted)]

    def version(self, subject: str, spec: str | int, deleted: bool = False) -> SchemaValue:
        number = parse_version(spec)
        existing = self._existing(subject, deleted)
        if number is None:
            return existing[-1]
        for schema in existing:
            if schema.version == number:
                return schema
        raise errors.version_not_found(subject, number)

    def schema_by_id(self, schema_id: int) -> SchemaValue:
        """A version holding ``schema_id`` (a live one if any): ids name a schema's content."""
        found = [s for versions in self._subjects.values() for s in versions.values()
                 if s.id == schema_id]  # fmt: skip
        if not found:
            raise errors.schema_not_found()
        return min(found, key=lambda s: (s.deleted, s.subject, s.version))

    def has_id(self, schema_id: int) -> bool:
        return any(s.id == schema_id for versions in self._subjects.values()
                   for s in versions.values())  # fmt: skip

    def subject_versions_of(self, schema_id: int, deleted: bool = False) -> list[tuple[str, int]]:
        self.schema_by_id(schema_id)
        return sorted((s.subject, s.version) for versions in self._subjects.values()
                      for s in versions.values()
                      if s.id == schema_id and (deleted or not s.deleted))  # fmt: skip

    def referenced_by(self, schema: SchemaValue) -> list[int]:
        """The ids of the live versions whose references name ``schema``'s version."""
        return sorted({s.id for subject in self.subjects() for s in self._live(subject)
                       if any((r.subject, r.version) == (schema.subject, schema.version)
                              for r in s.references)})  # fmt: skip

    def lookup(
        self, subject: str, schema_type: str, schema: str, references: Sequence[Reference],
        deleted: bool = False,
    ) -> SchemaValue:  # fmt: skip
        """The version of ``subject`` whose content is this (canonical) schema; 40401/40403."""
        for found in self._existing(subject, deleted):
            if (found.schema_type, found.schema, found.references) == (
                schema_type, schema, tuple(references),
            ):  # fmt: skip
                return found
        raise errors.schema_not_found()

    def resolve(self, references: Sequence[Reference]) -> list[NamedSchema]:
        """The schemas ``references`` name, theirs first (depth-first, each once, with the name
        it was first referenced by); 42201 for one that is not registered."""
        resolved: list[NamedSchema] = []
        seen: set[tuple[str, int]] = set()

        def visit(reference: Reference, depth: int) -> None:
            if depth > 32:
                raise errors.invalid_schema(f"references nest deeper than 32 at {reference.name}")
            try:
                schema = self.version(reference.subject, reference.version)
            except RegistryError:
                raise errors.invalid_schema(
                    f"reference {reference.name}: subject {reference.subject!r} version "
                    f"{reference.version} not found"
                ) from None
            if (schema.subject, schema.version) in seen:
                return
            seen.add((schema.subject, schema.version))
            for inner in schema.references:
                visit(inner, depth + 1)
            resolved.append((reference.name, schema))

        for reference in references:
            visit(reference, 0)
        return resolved

    def compatibility(self, subject: str | None) -> str | None:
        return self._configs.get(subject)

    def effective_compatibility(self, subject: str) -> str:
        return self._configs.get(subject) or self._configs.get(None) or DEFAULT_LEVEL

    def mode(self, subject: str | None) -> str | None:
        return self._modes.get(subject)

    def effective_mode(self, subject: str | None) -> str:
        return (subject and self._modes.get(subject)) or self._modes.get(None) or DEFAULT_MODE

    def _writable(self, subject: str | None) -> None:
        if self.effective_mode(subject) == "READONLY":
            what = f"Subject {subject}" if subject else "The registry"
            raise errors.operation_not_permitted(f"{what} is in read-only mode")

    def _id_for(self, schema_type: str, schema: str, references: tuple[Reference, ...]) -> int:
        """The id this content already has under any subject, else the next one."""
        for versions in self._subjects.values():
            for found in versions.values():
                if (found.schema_type, found.schema, found.references) == (
                    schema_type, schema, references,
                ):  # fmt: skip
                    return found.id
        return self.max_id + 1

    # -- writes -----------------------------------------------------------------------------

    def check(
        self, subject: str, schema_type: str, schema: str, references: Sequence[Reference],
        checker: Checker, against: SchemaValue | None = None,
    ) -> list[str]:  # fmt: skip
        """What makes ``schema`` incompatible with the subject's versions at its level (or
        with ``against`` only): empty if nothing."""
        resolved = self.resolve(references)
        level = self.effective_compatibility(subject)
        previous = self._live(subject)
        if against is not None:
            previous, level = [against], level.removesuffix("_TRANSITIVE")
        elif not level.endswith("_TRANSITIVE"):
            previous = previous[-1:]
        candidates = [(p.schema, self.resolve(p.references)) for p in previous
                      if p.schema_type == schema_type]  # fmt: skip
        return checker(schema_type, (schema, resolved), candidates, level)

    def generate_register(
        self, subject: str, schema_type: str, schema: str, references: Sequence[Reference],
        checker: Checker,
    ) -> tuple[list[Record], int]:  # fmt: skip
        """Register ``schema`` (canonical) under ``subject``: the records and the id. The same
        content again is its existing id and no record; an incompatible one is 409."""
        refs = tuple(references)
        try:
            return [], self.lookup(subject, schema_type, schema, refs).id
        except RegistryError:
            pass  # not registered under this subject yet: a new version
        self._writable(subject)
        messages = self.check(subject, schema_type, schema, refs, checker)
        if messages:
            level = self.effective_compatibility(subject)
            raise errors.incompatible(
                f"Schema being registered is incompatible with an earlier schema for subject "
                f'"{subject}", details: {messages} (compatibility {level})'
            )
        versions = self._subjects.get(subject, {})
        version = max(versions, default=0) + 1
        schema_id = self._id_for(schema_type, schema, refs)
        value = SchemaValue(subject, version, schema_id, schema, schema_type, refs)
        return [encode_schema(value)], schema_id

    def generate_delete_subject(
        self, subject: str, permanent: bool
    ) -> tuple[list[Record], list[int]]:
        """Soft delete (each version marked deleted) or, after that, permanent (tombstones)."""
        self._writable(subject)
        every = self._existing(subject, deleted=True)
        live = [s for s in every if not s.deleted]
        if permanent:
            if live:
                raise errors.subject_not_soft_deleted(subject)
            records: list[Record] = [(schema_key(subject, s.version), None) for s in every]
            if subject in self._configs:
                records.append((config_key(subject), None))
            return records, [s.version for s in every]
        if not live:
            raise errors.subject_soft_deleted(subject)
        return [encode_schema(replace(s, deleted=True)) for s in live], [s.version for s in live]

    def generate_delete_version(
        self, subject: str, spec: str, permanent: bool
    ) -> tuple[list[Record], int]:
        self._writable(subject)
        found = self.version(subject, spec, deleted=permanent)
        if permanent:
            if not found.deleted:
                raise errors.version_not_soft_deleted(subject, found.version)
            return [(schema_key(subject, found.version), None)], found.version
        return [encode_schema(replace(found, deleted=True))], found.version

    def generate_config(self, subject: str | None, level: object) -> list[Record]:
        if not isinstance(level, str) or level.upper() not in LEVELS:
            raise errors.invalid_compatibility_level(level)
        return [encode_config(subject, level.upper())]

    def generate_delete_config(self, subject: str) -> tuple[list[Record], str]:
        level = self._configs.get(subject)
        if level is None:
            raise errors.subject_level_compatibility_not_configured(subject)
        return [(config_key(subject), None)], level

    def generate_mode(self, subject: str | None, mode: object) -> list[Record]:
        if not isinstance(mode, str) or mode.upper() not in MODES:
            raise errors.invalid_mode(mode)
        return [encode_mode(subject, mode.upper())]
