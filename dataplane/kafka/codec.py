"""Kafka's binary protocol: frames, request and response headers, and messages of any version.

The message schemas are `kio`'s, generated from Kafka's published message definitions
(``clients/src/main/resources/common/message/*.json``): one frozen dataclass per API, version and
direction, with native readers and writers (compact and legacy encodings, tagged fields). Nothing
here is written per version: handlers build a response as plain data with Kafka's field names
(snake_case, as kio names them) and `to_entity` fits it to the negotiated version's class, keeping
the fields that version has (a field a version lacks is dropped, one it has but the data omits takes
its default). Requests are read into the version's class and read back with `field`, which gives a
field's default for versions without it.

Framing: every request and response is an int32 size and that many bytes. A request starts with
api_key and api_version; the header then is v1 (correlation id, client id) or, for a flexible
version, v2 (plus tagged fields). Responses carry the header their schema names (v0 or v1; the
ApiVersions response is always v0, KIP-511).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import logging
import struct
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.protocol import Entity

from dataplane.kafka.length_walker import LengthError, request_walker

log = logging.getLogger(__name__)
SIZE = struct.Struct(">i")
API_KEY_VERSION = struct.Struct(">hh")
MAX_FRAME_BYTES = 100 * 1024 * 1024  # socket.request.max.bytes
Data = Mapping[str, Any]
Buffer = bytes | bytearray | memoryview  # a part of a response frame
# A response value this long (a partition's records) goes to the socket as it is, beside the
# encoded fields, not copied into the frame; shorter ones are cheaper to copy than to send apart.
BY_REFERENCE_MIN_BYTES = 16 * 1024

# The APIs this listener serves, with the versions it advertises (kio holds every version Kafka
# 4.x defines; these are the ones whose fields the handlers fill, topic names not ids).
API_PRODUCE, API_FETCH, API_LIST_OFFSETS, API_METADATA = 0, 1, 2, 3
API_OFFSET_FOR_LEADER_EPOCH = 23
API_OFFSET_COMMIT, API_OFFSET_FETCH, API_FIND_COORDINATOR = 8, 9, 10
API_JOIN_GROUP, API_HEARTBEAT, API_LEAVE_GROUP, API_SYNC_GROUP = 11, 12, 13, 14
API_DESCRIBE_GROUPS, API_LIST_GROUPS, API_DELETE_GROUPS = 15, 16, 42
API_CREATE_TOPICS, API_DELETE_TOPICS, API_DESCRIBE_CONFIGS = 19, 20, 32
API_CREATE_PARTITIONS, API_DESCRIBE_CLUSTER = 37, 60
API_ALTER_PARTITION_REASSIGNMENTS, API_LIST_PARTITION_REASSIGNMENTS = 45, 46
API_VERSIONS, API_INIT_PRODUCER_ID, API_CONSUMER_GROUP_HEARTBEAT = 18, 22, 68
API_CONSUMER_GROUP_DESCRIBE = 69
API_SHARE_FETCH, API_SHARE_ACKNOWLEDGE = 78, 79  # KIP-932 (dataplane/kafka/share.py)
API_SHARE_GROUP_HEARTBEAT, API_SHARE_GROUP_DESCRIBE = 76, 77  # KIP-932 (kafka/groups.py)
API_UNREGISTER_BROKER = 64
API_ALTER_CONFIGS, API_INCREMENTAL_ALTER_CONFIGS = 33, 44
API_ADD_RAFT_VOTER, API_REMOVE_RAFT_VOTER = 80, 81  # KIP-853
API_ADD_PARTITIONS_TO_TXN, API_ADD_OFFSETS_TO_TXN, API_END_TXN = 24, 25, 26
API_WRITE_TXN_MARKERS, API_TXN_OFFSET_COMMIT = 27, 28
API_DESCRIBE_PRODUCERS, API_DESCRIBE_TRANSACTIONS, API_LIST_TRANSACTIONS = 61, 65, 66
API_DESCRIBE_ACLS, API_CREATE_ACLS, API_DELETE_ACLS = 29, 30, 31
API_DESCRIBE_USER_SCRAM_CREDENTIALS, API_ALTER_USER_SCRAM_CREDENTIALS = 50, 51  # KIP-554
API_SASL_HANDSHAKE, API_SASL_AUTHENTICATE = 17, 36
API_ALTER_REPLICA_LOG_DIRS, API_DESCRIBE_LOG_DIRS = 34, 35
API_ELECT_LEADERS, API_UPDATE_FEATURES = 43, 57
API_DELETE_RECORDS, API_OFFSET_DELETE = 21, 47
API_DESCRIBE_TOPIC_PARTITIONS = 75  # KIP-966
API_DESCRIBE_QUORUM = 55  # dataplane/kafka/describe_quorum.py
API_LIST_CONFIG_RESOURCES = 74  # Kafka 4.1 (dataplane/kafka/config_resources.py)
SUPPORTED: dict[int, tuple[int, int]] = {
    API_PRODUCE: (3, 11),
    API_FETCH: (4, 12),
    API_LIST_OFFSETS: (1, 10),  # v9: KIP-1005's sentinel; v10: KIP-1075's timeout (unused)
    API_OFFSET_FOR_LEADER_EPOCH: (2, 4),  # KIP-320; Kafka 4 removed v0-1 (KIP-896)
    API_METADATA: (0, 12),
    API_DESCRIBE_TOPIC_PARTITIONS: (0, 0),  # dataplane/kafka/describe_topic_partitions.py
    API_OFFSET_COMMIT: (2, 9),
    API_OFFSET_FETCH: (1, 9),
    API_FIND_COORDINATOR: (0, 4),
    API_JOIN_GROUP: (0, 9),
    API_HEARTBEAT: (0, 4),
    API_LEAVE_GROUP: (0, 5),
    API_SYNC_GROUP: (0, 5),
    API_DESCRIBE_GROUPS: (0, 5),
    API_LIST_GROUPS: (0, 5),
    API_DELETE_GROUPS: (0, 2),
    API_OFFSET_DELETE: (0, 0),  # Kafka 4 serves v0 only
    API_DELETE_RECORDS: (0, 2),
    API_VERSIONS: (0, 4),  # v3: the feature levels (KIP-584); v4: those at level 0 listed too
    API_DESCRIBE_QUORUM: (0, 2),
    API_LIST_CONFIG_RESOURCES: (0, 1),  # v0 was ListClientMetricsResources (KIP-714)
    API_INIT_PRODUCER_ID: (0, 4),
    API_CREATE_TOPICS: (2, 7),  # Kafka 4 removed v0-1 (KIP-896), as it did the ones below
    API_DELETE_TOPICS: (1, 6),
    API_DESCRIBE_CONFIGS: (1, 4),
    API_ALTER_CONFIGS: (0, 2),
    API_INCREMENTAL_ALTER_CONFIGS: (0, 1),
    API_CREATE_PARTITIONS: (0, 3),
    API_DESCRIBE_CLUSTER: (0, 1),
    API_ALTER_PARTITION_REASSIGNMENTS: (0, 1),
    API_LIST_PARTITION_REASSIGNMENTS: (0, 0),
    API_UNREGISTER_BROKER: (0, 0),
    API_ADD_RAFT_VOTER: (0, 0),
    API_REMOVE_RAFT_VOTER: (0, 0),
    API_CONSUMER_GROUP_HEARTBEAT: (0, 1),
    API_CONSUMER_GROUP_DESCRIBE: (0, 1),
    # share groups' membership: v1 is Kafka 4.1's (v0 was 4.0's early access, never served)
    API_SHARE_GROUP_HEARTBEAT: (1, 1),
    API_SHARE_GROUP_DESCRIBE: (1, 1),
    # KIP-932's data path (v0 was 4.0's early access); v2 is Kafka 4.2's: KIP-1222's RENEW
    # acknowledgements (IsRenewAck; ShareAcknowledge answers the lock duration) and, in
    # ShareFetch, KIP-1206's ShareAcquireMode (either is served: raftlog never acquires more
    # than MaxRecords, record_limit's rule, which batch_optimized allows too)
    API_SHARE_FETCH: (1, 2),
    API_SHARE_ACKNOWLEDGE: (1, 2),
    # Transactions as of KIP-98/447 and KIP-890 part 1 (transaction.version 1): the versions that
    # go with part 2 (an epoch bump per transaction: EndTxn v5, TxnOffsetCommit v5, ...) are not
    # advertised, so clients stay on the part-1 protocol.
    API_ADD_PARTITIONS_TO_TXN: (0, 4),
    API_ADD_OFFSETS_TO_TXN: (0, 3),
    API_END_TXN: (0, 3),
    API_WRITE_TXN_MARKERS: (1, 1),  # Kafka 4 removed v0
    API_TXN_OFFSET_COMMIT: (0, 3),
    API_DESCRIBE_PRODUCERS: (0, 0),
    API_DESCRIBE_TRANSACTIONS: (0, 0),
    API_LIST_TRANSACTIONS: (0, 1),
    # ACLs and SCRAM credentials (dataplane/kafka/security_admin.py); Kafka 4 removed v0 of
    # the ACL APIs (KIP-896)
    API_DESCRIBE_ACLS: (1, 3),
    API_CREATE_ACLS: (1, 3),
    API_DELETE_ACLS: (1, 3),
    API_DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    API_ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
    # SASL (dataplane/kafka/sasl.py): after SaslHandshake v0 (legacy) the tokens come as bare
    # frames; librdkafka < 2.1 needs v0 advertised to use SASL at all (it then takes v1 and
    # SaslAuthenticate). SaslAuthenticate v1+ carries KIP-368's session lifetime.
    API_SASL_HANDSHAKE: (0, 1),
    API_SASL_AUTHENTICATE: (0, 2),
    # the broker's one log directory (dataplane/kafka/log_dirs.py); Kafka 4 removed v0
    API_DESCRIBE_LOG_DIRS: (1, 4),
    API_ALTER_REPLICA_LOG_DIRS: (1, 2),
    API_ELECT_LEADERS: (0, 2),
    # v2 drops the per-feature results; clients use v1 where both sides have it
    API_UPDATE_FEATURES: (0, 1),
}


class FrameError(ValueError):
    """A frame that cannot be a Kafka request: the connection is closed."""


class UnsupportedVersion(FrameError):
    """An API key or version this listener does not serve."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(f"api key {api_key} version {api_version} is not supported")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


@dataclass(frozen=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any  # the version's kio request entity
    client_host: str = ""  # "/address" of the peer, as Kafka names it (set by the listener)
    # the connection it came on (Kafka's RequestContext.connectionId, set by the listener): a
    # share session ends with the connection that opened it
    connection_id: str = ""


def parse_request(frame: bytes, client_host: str = "", connection_id: str = "") -> Request:
    """A request frame (without its size) into its header and body (``client_host``: the
    peer, ``connection_id``: its connection, as the listener names them); raises
    UnsupportedVersion for an API or version not served (the header is still read, for the
    correlation id), and FrameError for bytes that do not parse."""
    if len(frame) < 8:
        raise FrameError(f"a request frame of {len(frame)} bytes has no header")
    api_key, api_version = API_KEY_VERSION.unpack_from(frame)
    (correlation_id,) = SIZE.unpack_from(frame, 4)
    versions = SUPPORTED.get(api_key)
    if versions is None or not versions[0] <= api_version <= versions[1]:
        raise UnsupportedVersion(api_key, api_version, correlation_id)
    schema = request_schema(api_key, api_version)
    try:
        # kio's native reader reserves whatever an array claims before reading it (an abort,
        # not an exception, when that is 264 GB): every length is checked against the frame
        # first (dataplane/kafka/length_walker.py, issue 30)
        request_walker(schema)(frame)
    except LengthError as error:
        raise FrameError(f"api key {api_key} v{api_version}: {error}") from error
    try:
        header, offset = entity_reader(schema.__header_schema__)(frame, 0)
        body, size = entity_reader(schema)(frame, offset)
    except Exception as error:  # kio's native readers raise several kinds on bad bytes
        raise FrameError(f"api key {api_key} v{api_version}: {error}") from error
    _check_nulls(schema, body, f"api key {api_key} v{api_version}")
    if offset + size != len(frame):
        # Kafka reads a request's fields and ignores what follows; librdkafka 2.x sends three
        # such bytes after an all-topics Metadata v12 (its admin client's list_topics).
        log.debug(
            "api key %d v%d: %d bytes after the request body ignored", api_key, api_version,
            len(frame) - offset - size,
        )  # fmt: skip
    return Request(
        api_key, api_version, correlation_id, header.client_id, body, client_host, connection_id
    )


@functools.cache
def _nested(schema: type) -> tuple[tuple[str, bool, bool, Any], ...]:
    """The fields of `schema` that are arrays or structs: (name, nullable, is an array, the
    struct class of it or of its elements, None for an array of primitives)."""
    nested: list[tuple[str, bool, bool, Any]] = []
    for name, hint, _ in _fields(schema):
        args = typing.get_args(hint)
        nullable = type(None) in args
        kind = next(a for a in args if a is not type(None)) if nullable else hint
        is_array = typing.get_origin(kind) is tuple
        element = typing.get_args(kind)[0] if is_array else kind
        inner = element if dataclasses.is_dataclass(element) else None
        if is_array or inner is not None:
            nested.append((name, nullable, is_array, inner))
    return tuple(nested)


def _check_nulls(schema: type, entity: Any, where: str) -> None:
    """Refuse a null array where the version's schema has a non-nullable one, as Kafka's
    generated readers do ("non-nullable field ... was serialized as null"): kio reads a -1
    length as None whatever the field, and a handler iterating it would fail (issue 30,
    found by tests/fuzz/fuzz_kafka_request.py)."""
    for name, nullable, is_array, inner in _nested(schema):
        value = getattr(entity, name)
        if value is None:
            if is_array and not nullable:
                raise FrameError(f"{where}: non-nullable field {name} was serialized as null")
            continue
        if inner is not None:
            for item in value if is_array else (value,):
                _check_nulls(inner, item, where)


@functools.cache
def request_schema(api_key: int, api_version: int) -> Any:
    return load_request_schema(api_key, api_version)


@functools.cache
def response_schema(api_key: int, api_version: int) -> Any:
    return load_response_schema(api_key, api_version)


def encode_response(api_key: int, api_version: int, correlation_id: int, data: Data) -> bytes:
    """The whole response frame (size included) of `data` in the version's schema."""
    return b"".join(encode_response_parts(api_key, api_version, correlation_id, data))


def encode_response_parts(
    api_key: int, api_version: int, correlation_id: int, data: Data
) -> list[Buffer]:
    """The response frame of `encode_response` as the buffers it is made of, in order: the
    encoded fields, and between them by reference (not copied) every value of at least
    `BY_REFERENCE_MIN_BYTES`, such as the records of a Fetch answer (the stored batches as the
    log read them). The connection writes them with one ``sendmsg``."""
    schema = response_schema(api_key, api_version)
    header_schema = schema.__header_schema__
    frame = _Gather()
    frame.write(b"\0\0\0\0")
    header = to_entity(header_schema, {"correlation_id": correlation_id})
    target = typing.cast(typing.IO[bytes], frame)  # kio's writers call only ``write``
    entity_writer(header_schema)(target, header)
    entity_writer(schema)(target, to_entity(schema, data))
    parts = frame.parts()
    assert isinstance(parts[0], bytearray), "the frame starts with its encoded size"
    SIZE.pack_into(parts[0], 0, frame.size_bytes - SIZE.size)
    return parts


class _Gather:
    """What kio's writers write to (they only call ``write``): small writes are copied into
    one growing buffer, large ones kept as given, so a megabyte of records is not copied into
    the frame (and copied again out of it) before it reaches the socket."""

    def __init__(self) -> None:
        self._parts: list[Buffer] = []
        self._small = bytearray()
        self.size_bytes = 0

    def write(self, data: Buffer) -> int:
        size = len(data)
        if size >= BY_REFERENCE_MIN_BYTES:
            if self._small:
                self._parts.append(self._small)
                self._small = bytearray()
            self._parts.append(data)
        else:
            self._small += data
        self.size_bytes += size
        return size

    def parts(self) -> list[Buffer]:
        if self._small:
            self._parts.append(self._small)
            self._small = bytearray()
        return self._parts


def field(entity: Any, name: str, default: Any = None) -> Any:
    """A request field, or `default` in a version that lacks it."""
    return getattr(entity, name, default)


def millis(value: datetime.timedelta | int) -> int:
    """A kio timedelta field (timeout, max wait) in milliseconds."""
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)


# -- plain data -> a version's entity -----------------------------------------------------------
@functools.cache
def _fields(schema: type) -> tuple[tuple[str, Any, str | None], ...]:
    hints = typing.get_type_hints(schema)
    return tuple(
        (f.name, hints[f.name], f.metadata.get("kafka_type")) for f in dataclasses.fields(schema)
    )


def to_entity(schema: type[Entity] | Any, data: Data) -> Any:
    """`data` (Kafka's field names, plain values, nested mappings and lists) as an instance of
    `schema`: fields the schema lacks are dropped, fields the data lacks take their defaults."""
    kwargs = {
        name: _convert(hint, data[name], kind)
        for name, hint, kind in _fields(schema)
        if name in data
    }
    return schema(**kwargs)


def _convert(hint: Any, value: Any, kind: str | None) -> Any:
    if value is None:
        return None
    if kind == "error_code":
        return KioErrorCode(value)
    if kind in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(milliseconds=value)
    if kind == "datetime_i64":
        if isinstance(value, datetime.datetime):
            return value
        return None if value < 0 else datetime.datetime.fromtimestamp(value / 1000, datetime.UTC)
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _convert(inner, value, kind)
    if origin is tuple:
        item = typing.get_args(hint)[0]
        return tuple(_convert(item, v, kind) for v in value)
    if dataclasses.is_dataclass(hint):
        return to_entity(hint, value)
    return value
