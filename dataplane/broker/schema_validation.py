"""Server-side schema id validation: ``key.schema.validation`` / ``value.schema.validation``.

Redpanda's idea (``redpanda.value.schema.id.validation``), raftlog's own topic configs: the
partition leader refuses a produce whose records' keys (values) are not framed as Confluent's
serializers frame them, magic byte 0 and a 4-byte big-endian schema id, or carry an id the
node's schema registry does not know. The refusal is INVALID_RECORD (Kafka's 87, not
retriable), whose message names the batch, the record's offset delta in it and the reason, and
nothing of the partition's records is appended (the check runs before the append).

A null key or value (no bytes: a tombstone, a round-robin record) carries nothing to check and
passes. The check is the framing and the id only: the bytes after it are not decoded against
the schema (as Redpanda's id validation). Pure: whether an id is known is asked of ``known``,
which the node wires to its registry's view (``Registry.knows_id``); without one (the node runs
no registry) a produce to a validating topic is refused with a message that says so.
"""

from __future__ import annotations

from collections.abc import Callable

from raftlog.batch import CONTROL_MASK, iter_batches
from raftlog.errors import InvalidRecordError
from raftlog.records import decode_batch

MAGIC_BYTE = 0
FRAME_BYTES = 5  # the magic byte and the schema id
# Whether the registry knows a schema id; raises KafkaError when it cannot tell (retriable)
SchemaIdKnown = Callable[[int], bool]
NO_REGISTRY = (
    "{config}=true but this broker runs no schema registry (schema.registry.listener is unset "
    "on node {node}): it cannot check schema ids"
)


def check_schema_ids(
    records: bytes | bytearray | memoryview, keys: bool, values: bool,
    known: SchemaIdKnown | None, node_id: int,
) -> None:  # fmt: skip
    """INVALID_RECORD for the first record whose key (``keys``) or value (``values``) is not
    framed with a schema id ``known`` knows; nothing when neither is asked."""
    if not (keys or values):
        return
    if known is None:
        config = "value.schema.validation" if values else "key.schema.validation"
        raise InvalidRecordError(NO_REGISTRY.format(config=config, node=node_id))
    view = memoryview(records)
    for index, (position, header) in enumerate(iter_batches(view)):
        if header.attributes & CONTROL_MASK:
            continue  # a marker: refused elsewhere when a client sends one
        _, decoded = decode_batch(view, position)
        for delta, record in enumerate(decoded):
            for field, data, asked in (("key", record.key, keys), ("value", record.value, values)):
                if not asked or data is None:
                    continue
                reason = frame_error(data, known)
                if reason is not None:
                    raise InvalidRecordError(
                        f"{field}.schema.validation: batch {index}, record at offset delta "
                        f"{delta}: its {field} {reason}"
                    )


def frame_error(data: bytes, known: SchemaIdKnown) -> str | None:
    """Why ``data`` is not a registered schema's framing (None: it is)."""
    if len(data) < FRAME_BYTES:
        return f"has {len(data)} bytes, fewer than the magic byte and a 4-byte schema id"
    if data[0] != MAGIC_BYTE:
        return f"starts with byte {data[0]}, not the magic byte {MAGIC_BYTE}"
    schema_id = int.from_bytes(data[1:FRAME_BYTES], "big")
    if not known(schema_id):
        return f"carries schema id {schema_id}, which the schema registry does not know"
    return None
