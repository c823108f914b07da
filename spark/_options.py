"""The data source's options, parsed and checked up front: pure, no IO.

Names are those of Spark's Kafka connector (matched case-insensitively, as Spark does);
``raftlog.bootstrap.servers`` is also accepted as ``kafka.bootstrap.servers``. As Spark passes
``kafka.``-prefixed options to its Kafka clients, the security ones (``kafka.security.protocol``,
``kafka.sasl.mechanism``, ``kafka.sasl.jaas.config``, ``kafka.ssl.truststore.location``, ...)
become the clients' `ClientSecurity` (``ClientSecurity.from_properties``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from dataplane.client import TopicPartition
from metadata_quorum.security.channels import ClientSecurity
from spark._offsets import OffsetSpec, parse_assign, parse_offset_spec
from spark.errors import OptionError

POLL_TIMEOUT_MS_DEFAULT = 120_000  # Kafka's kafkaConsumer.pollTimeoutMs
TRANSACTION_TIMEOUT_MS_DEFAULT = 900_000  # Kafka's transaction.max.timeout.ms, Flink's sink's
TRANSACTION_TIMEOUT_MS_MAX = 2**31 - 1
PREFIX_DEFAULT = "raftlog-spark"
# Test hooks of the exactly-once writer (spark/_writer.py), not for applications:
FAIL_TASK_ONCE_OPTION = "raftlog.test.failTaskOnceMarker"  # a path; see _writer
KILL_DRIVER_OPTION = "raftlog.test.killDriverAfterCommits"  # "<commits>:<process group>"
POLL_TIMEOUT_MS_MAX = 3_600_000
MAX_MIN_PARTITIONS = 100_000
IsolationLevel = Literal["read_uncommitted", "read_committed"]
ISOLATION_OPTIONS = ("isolationlevel", "kafka.isolation.level", "raftlog.isolation.level")
# a transactional id is <prefix>-<partition id> (-<job uuid> too for batch jobs): well within
# the 249 characters Kafka allows a topic, and any id length the coordinator keys by
MAX_PREFIX_CHARS = 200


@dataclass(frozen=True)
class Subscription:
    """Exactly one of: topic names, a topic-name pattern, explicit topic-partitions."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[TopicPartition, ...] = ()


@dataclass(frozen=True)
class ReadOptions:
    bootstrap_servers: tuple[str, ...]
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec  # batch only
    starting_timestamp_ms: int | None
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    fail_on_data_loss: bool
    include_headers: bool
    poll_timeout_ms: int
    # Kafka's Spark source reads read_uncommitted unless kafka.isolation.level says otherwise;
    # read_committed skips aborted transactions and stops at the last stable offset
    isolation_level: IsolationLevel = "read_uncommitted"
    security: ClientSecurity | None = None  # the kafka.security/ssl/sasl options; None: plaintext


@dataclass(frozen=True)
class WriteOptions:
    """``exactly_once``: write each task's rows in a transaction the driver commits (see
    ``_writer``); ``transactional_id_prefix``: the tasks' transactional ids are
    ``<prefix>-<partition id>`` (one prefix per query); the two ``test_*`` fields are test
    hooks."""

    bootstrap_servers: tuple[str, ...]
    topic: str | None
    exactly_once: bool = False
    transactional_id_prefix: str = PREFIX_DEFAULT
    transaction_timeout_ms: int = TRANSACTION_TIMEOUT_MS_DEFAULT
    test_fail_task_once_marker: str | None = None
    test_kill_driver_after_commits: tuple[int, int] | None = None
    security: ClientSecurity | None = None  # the kafka.security/ssl/sasl options; None: plaintext


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def bootstrap_servers(options: Mapping[str, str]) -> tuple[str, ...]:
    given = _lower(options)
    text = given.get("raftlog.bootstrap.servers") or given.get("kafka.bootstrap.servers")
    if not text:
        raise OptionError("option 'raftlog.bootstrap.servers' (host:port,...) is required")
    servers = tuple(s.strip() for s in text.split(",") if s.strip())
    for server in servers:
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit():
            raise OptionError(f"option 'raftlog.bootstrap.servers': {server!r} is not host:port")
    return servers


SECURITY_PREFIXES = ("kafka.security.", "kafka.ssl.", "kafka.sasl.")


def client_security(options: Mapping[str, str]) -> ClientSecurity | None:
    """The ``kafka.security.protocol`` / ``kafka.ssl.*`` / ``kafka.sasl.*`` options, without
    their ``kafka.`` prefix, as the clients' `ClientSecurity`; None when none is given."""
    properties = {
        key.removeprefix("kafka."): value
        for key, value in _lower(options).items()
        if key.startswith(SECURITY_PREFIXES)
    }
    if not properties:
        return None
    try:
        return ClientSecurity.from_properties(properties)
    except ValueError as error:
        raise OptionError(f"the kafka. security options: {error}") from None


def _subscription(given: Mapping[str, str]) -> Subscription:
    named = [k for k in ("subscribe", "subscribepattern", "assign") if given.get(k)]
    if len(named) != 1:
        raise OptionError(
            "exactly one of the options 'subscribe', 'subscribePattern', 'assign' is required, "
            f"got {len(named)}"
        )
    text = given[named[0]]
    if named[0] == "subscribe":
        topics = tuple(t.strip() for t in text.split(",") if t.strip())
        if not topics:
            raise OptionError(f"option 'subscribe' names no topic: {text!r}")
        return Subscription(topics=topics)
    if named[0] == "subscribepattern":
        try:
            re.compile(text)
        except re.error as error:
            raise OptionError(f"option 'subscribePattern' is not a regex: {error}") from error
        return Subscription(pattern=text)
    return Subscription(assigned=tuple(parse_assign(text)))


def _int(given: Mapping[str, str], name: str, low: int, high: int) -> int | None:
    text = given.get(name.lower())
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError as error:
        raise OptionError(f"option {name!r} must be an integer, got {text!r}") from error
    if not low <= value <= high:
        raise OptionError(f"option {name!r} must be in [{low}, {high}], got {value}")
    return value


def _bool(given: Mapping[str, str], name: str, default: bool) -> bool:
    text = given.get(name.lower())
    if text is None:
        return default
    if text.strip().lower() not in ("true", "false"):
        raise OptionError(f"option {name!r} must be true or false, got {text!r}")
    return text.strip().lower() == "true"


def _starting(given: Mapping[str, str], streaming: bool) -> OffsetSpec:
    text = given.get("startingoffsets")
    spec = parse_offset_spec("startingOffsets", text) if text else None
    if spec is None:
        return "latest" if streaming else "earliest"
    if not streaming and (spec == "latest" or (not isinstance(spec, str) and -1 in spec.values())):
        raise OptionError("startingOffsets 'latest' (or -1) is not allowed for batch queries")
    return spec


def _ending(given: Mapping[str, str], streaming: bool) -> OffsetSpec:
    text = given.get("endingoffsets")
    if text and streaming:
        raise OptionError("option 'endingOffsets' is for batch queries only")
    spec = parse_offset_spec("endingOffsets", text) if text else "latest"
    if spec == "earliest" or (not isinstance(spec, str) and -2 in spec.values()):
        raise OptionError("endingOffsets 'earliest' (or -2) is not allowed")
    return spec


def _isolation(given: Mapping[str, str]) -> IsolationLevel:
    named = [name for name in ISOLATION_OPTIONS if name in given]
    if not named:
        return "read_uncommitted"
    text = given[named[0]].strip().lower()
    if len({given[name].strip().lower() for name in named}) > 1:
        raise OptionError(f"options {', '.join(named)} disagree on the isolation level")
    if text == "read_committed":
        return "read_committed"
    if text == "read_uncommitted":
        return "read_uncommitted"
    raise OptionError(
        f"option 'isolationLevel' must be read_committed or read_uncommitted, got {text!r}"
    )


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    given = _lower(options)
    max_offsets = _int(given, "maxOffsetsPerTrigger", 1, 2**62)
    if max_offsets is not None and not streaming:
        raise OptionError("option 'maxOffsetsPerTrigger' is for streaming queries only")
    return ReadOptions(
        bootstrap_servers=bootstrap_servers(given),
        subscription=_subscription(given),
        starting=_starting(given, streaming),
        ending=_ending(given, streaming),
        starting_timestamp_ms=_int(given, "startingTimestamp", 0, 2**62),
        max_offsets_per_trigger=max_offsets,
        min_partitions=_int(given, "minPartitions", 1, MAX_MIN_PARTITIONS),
        fail_on_data_loss=_bool(given, "failOnDataLoss", True),
        include_headers=_bool(given, "includeHeaders", False),
        poll_timeout_ms=_int(given, "kafkaConsumer.pollTimeoutMs", 1, POLL_TIMEOUT_MS_MAX)
        or POLL_TIMEOUT_MS_DEFAULT,
        isolation_level=_isolation(given),
        security=client_security(given),
    )


def _prefix(given: Mapping[str, str], topic: str | None) -> str:
    text = given.get("transactionalidprefix")
    if text is None:
        return f"{PREFIX_DEFAULT}-{topic if topic is not None else 'multi'}"
    if not text.strip() or len(text) > MAX_PREFIX_CHARS:
        raise OptionError(
            f"option 'transactionalIdPrefix' must have 1 to {MAX_PREFIX_CHARS} characters, "
            f"got {text!r}"
        )
    return text


def _kill_driver_hook(given: Mapping[str, str]) -> tuple[int, int] | None:
    text = given.get(KILL_DRIVER_OPTION.lower())
    if text is None:
        return None
    commits, _, group = text.partition(":")
    if not (commits.isdigit() and group.isdigit()):
        raise OptionError(f"option {KILL_DRIVER_OPTION!r} is <commits>:<process group>: {text!r}")
    return int(commits), int(group)


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    given = _lower(options)
    topic = given.get("topic")
    if topic is not None and not topic.strip():
        raise OptionError("option 'topic' is empty")
    return WriteOptions(
        bootstrap_servers=bootstrap_servers(given),
        topic=topic,
        exactly_once=_bool(given, "exactlyOnce", True),
        transactional_id_prefix=_prefix(given, topic),
        transaction_timeout_ms=_int(given, "transactionTimeoutMs", 1, TRANSACTION_TIMEOUT_MS_MAX)
        or TRANSACTION_TIMEOUT_MS_DEFAULT,
        test_fail_task_once_marker=given.get(FAIL_TASK_ONCE_OPTION.lower()),
        test_kill_driver_after_commits=_kill_driver_hook(given),
        security=client_security(given),
    )
