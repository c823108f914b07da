"""The client commands of the ``raftlog`` CLI: ``topic``, ``produce``, ``consume``, ``perf``.

Like Kafka's kafka-topics, kafka-console-producer/-consumer and the perf-test tools, over
:mod:`dataplane.client`. Human output is rich tables; ``--json`` is for scripts. A Kafka error
prints ``error: NAME (code): message`` on stderr and exits 1, without a traceback.
Record values are written to stdout as they are (never through rich, which reads markup).
"""

from __future__ import annotations

import enum
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Literal, NoReturn

import typer
from rich.console import Console
from rich.progress import Progress as RichProgress
from rich.table import Table

from dataplane.client import (
    AdminClient,
    Consumer,
    ConsumerRecord,
    NewTopic,
    Producer,
    TopicPartition,
)
from dataplane.client._config import DEFAULT_BATCH_SIZE
from dataplane.client.admin import ConfigResource, ResourceType, TopicDescription
from dataplane.client.producer import RecordFuture
from dataplane.tools.command_config import command_security
from dataplane.tools.perf import (
    Acks,
    CompressionType,
    ProducePerfResult,
    Progress,
    run_consume_perf,
    run_produce_perf,
)
from raftlog.errors import ErrorCode, KafkaError

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "BootstrapOption",
    "JsonOption",
    "error_line",
    "kafka_errors",
    "print_json",
    "register",
    "servers",
]

DEFAULT_BOOTSTRAP = "127.0.0.11:9092,127.0.0.12:9092,127.0.0.13:9092"
MAX_ERROR_SAMPLES = 10  # delivery errors printed by produce; the rest are only counted
POLL_MAX_MS = 500  # consume polls at most this long, to notice --timeout-ms and Ctrl-C

topic_app = typer.Typer(
    help="Create, list, describe, alter and delete topics.", no_args_is_help=True
)
perf_app = typer.Typer(help="Throughput and latency tests.", no_args_is_help=True)
console = Console()
err_console = Console(stderr=True)

BootstrapOption = Annotated[
    str,
    typer.Option(
        "--bootstrap-server",
        envvar="RAFTLOG_BOOTSTRAP_SERVER",
        help="comma-separated broker addresses (default: the local cluster)",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="machine-readable output")]
ConfigOption = Annotated[
    list[str] | None, typer.Option("--config", help="key=value, repeatable", show_default=False)
]


class AcksChoice(enum.StrEnum):
    ALL = "all"
    MINUS_ONE = "-1"
    ZERO = "0"
    ONE = "1"

    def to_acks(self) -> Acks:
        return ACKS[self]


class CompressionChoice(enum.StrEnum):
    NONE = "none"
    GZIP = "gzip"
    SNAPPY = "snappy"
    LZ4 = "lz4"
    ZSTD = "zstd"

    def to_type(self) -> CompressionType:
        return COMPRESSION_TYPES[self]


ACKS: dict[AcksChoice, Acks] = {
    AcksChoice.ALL: "all",
    AcksChoice.MINUS_ONE: -1,
    AcksChoice.ZERO: 0,
    AcksChoice.ONE: 1,
}
COMPRESSION_TYPES: dict[CompressionChoice, CompressionType] = {
    CompressionChoice.NONE: "none",
    CompressionChoice.GZIP: "gzip",
    CompressionChoice.SNAPPY: "snappy",
    CompressionChoice.LZ4: "lz4",
    CompressionChoice.ZSTD: "zstd",
}


class IsolationChoice(enum.StrEnum):
    READ_UNCOMMITTED = "read_uncommitted"
    READ_COMMITTED = "read_committed"


AcksOption = Annotated[AcksChoice, typer.Option("--acks")]
CompressionOption = Annotated[CompressionChoice, typer.Option("--compression")]


# -- errors ----------------------------------------------------------------------------------
def error_line(error: KafkaError) -> str:
    return f"error: {error.error.name} ({error.error.code}): {error.message}"


def fail(error: KafkaError) -> NoReturn:
    print(error_line(error), file=sys.stderr)
    raise typer.Exit(1)


@contextmanager
def kafka_errors() -> Iterator[None]:
    """Turn a KafkaError into the one-line error and exit status 1."""
    try:
        yield
    except KafkaError as error:
        fail(error)


def servers(bootstrap: str) -> list[str]:
    found = [s.strip() for s in bootstrap.split(",") if s.strip()]
    if not found:
        raise typer.BadParameter("no address given", param_hint="--bootstrap-server")
    return found


def admin_client(bootstrap: str) -> AdminClient:
    """The admin client of a command: ``--bootstrap-server`` secured as ``--command-config``
    (or RAFTLOG_COMMAND_CONFIG) says. Producers and consumers take ``command_security()``."""
    return AdminClient(servers(bootstrap), security=command_security())


def parse_configs(items: list[str] | None) -> dict[str, str]:
    configs: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"expected key=value, got {item!r}", param_hint="--config")
        configs[key] = value
    return configs


def topic_partitions(bootstrap: str, topic: str) -> list[int]:
    """The topic's partition ids, from the controller: an unknown topic fails at once
    (UNKNOWN_TOPIC_OR_PARTITION) instead of after the clients' metadata wait."""
    with admin_client(bootstrap) as admin:
        description = admin.describe_topics([topic])[topic]
    return [p.partition for p in description.partitions]


def print_json(document: object) -> None:
    print(json.dumps(document, indent=2))


# -- topic -----------------------------------------------------------------------------------
@topic_app.command("create")
def topic_create(
    name: str,
    partitions: Annotated[int, typer.Option("--partitions", help="-1: num.partitions")] = -1,
    replication_factor: Annotated[
        int, typer.Option("--replication-factor", help="-1: default.replication.factor")
    ] = -1,
    config: ConfigOption = None,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """Create a topic."""
    topic = NewTopic(name, partitions, replication_factor, parse_configs(config))
    with kafka_errors(), admin_client(bootstrap) as admin:
        error = admin.create_topics([topic]).get(name)
        if error is not None:
            fail(error)
    if as_json:
        print_json({"topic": name, "created": True})
    else:
        console.print(f"Created topic {name}.")


@topic_app.command("list")
def topic_list(bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP, as_json: JsonOption = False) -> None:
    """List topic names."""
    with kafka_errors(), admin_client(bootstrap) as admin:
        names = admin.list_topics()
    if as_json:
        print_json(names)
        return
    table = Table("topic", title="topics")
    for name in names:
        table.add_row(name)
    console.print(table)


def description_json(topic: TopicDescription) -> dict[str, Any]:
    return {
        "name": topic.name,
        "topic_id": topic.topic_id.hex(),
        "partitions": [
            {
                "partition": p.partition,
                "leader": p.leader,
                "leader_epoch": p.leader_epoch,
                "replicas": list(p.replicas),
                "isr": list(p.isr),
                "elr": list(p.elr),
                "last_known_elr": list(p.last_known_elr),
            }
            for p in topic.partitions
        ],
        "configs": dict(topic.configs),
    }


def print_description(topic: TopicDescription) -> None:
    """kafka-topics' summary line, then one table row per partition."""
    replication = len(topic.partitions[0].replicas) if topic.partitions else 0
    overrides = ",".join(f"{k}={v}" for k, v in sorted(topic.configs.items()))
    console.print(
        f"Topic: {topic.name}  TopicId: {topic.topic_id.hex()}"
        f"  PartitionCount: {len(topic.partitions)}  ReplicationFactor: {replication}"
        f"  Configs: {overrides}",
        markup=False,
        highlight=False,
    )
    table = Table("partition", "leader", "leader epoch", "replicas", "isr", "elr",
                  "last known elr")  # fmt: skip
    for p in topic.partitions:
        table.add_row(
            str(p.partition),
            str(p.leader),
            str(p.leader_epoch),
            ",".join(map(str, p.replicas)),
            ",".join(map(str, p.isr)),
            ",".join(map(str, p.elr)),
            ",".join(map(str, p.last_known_elr)),
        )
    console.print(table)


@topic_app.command("describe")
def topic_describe(
    names: Annotated[list[str] | None, typer.Argument(help="topics (default: all)")] = None,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """Partitions (leader, leader epoch, replicas, ISR, KIP-966's ELR and last known ELR) and
    config overrides of topics."""
    with kafka_errors(), admin_client(bootstrap) as admin:
        described = admin.describe_topics(names or None)
    ordered = [described[name] for name in sorted(described)]
    if as_json:
        print_json([description_json(topic) for topic in ordered])
        return
    for topic in ordered:
        print_description(topic)


@topic_app.command("delete")
def topic_delete(
    names: Annotated[list[str], typer.Argument(help="topics to delete")],
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """Delete topics; exits 1 when any could not be deleted."""
    with kafka_errors(), admin_client(bootstrap) as admin:
        results = admin.delete_topics(names)
    for error in results.values():
        if error is not None:
            print(error_line(error), file=sys.stderr)
    if as_json:
        print_json(
            {
                name: None
                if error is None
                else {"error": error.error.name, "code": error.error.code}
                for name, error in results.items()
            }
        )
    else:
        for name, error in results.items():
            if error is None:
                console.print(f"Deleted topic {name}.")
    if any(error is not None for error in results.values()):
        raise typer.Exit(1)


@topic_app.command("alter")
def topic_alter(
    name: str,
    partitions: Annotated[
        int | None, typer.Option("--partitions", min=1, help="the new total (grow only)")
    ] = None,
    config: ConfigOption = None,
    delete_config: Annotated[
        list[str] | None, typer.Option("--delete-config", help="key, repeatable")
    ] = None,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """Grow a topic's partitions and set or delete its config overrides."""
    changes: dict[str, str | None] = dict(parse_configs(config))
    changes.update(dict.fromkeys(delete_config or ()))
    if partitions is None and not changes:
        raise typer.BadParameter("give --partitions, --config or --delete-config")
    with kafka_errors(), admin_client(bootstrap) as admin:
        if partitions is not None:
            error = admin.create_partitions({name: partitions}).get(name)
            if error is not None:
                fail(error)
        if changes:
            admin.alter_configs(ConfigResource(ResourceType.TOPIC, name), changes)
    if as_json:
        print_json({"topic": name, "partitions": partitions, "configs": changes})
    else:
        console.print(f"Altered topic {name}.")


# -- produce ---------------------------------------------------------------------------------
class DeliveryTally:
    """Acknowledgements and failures, counted from the producer's sender thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.acknowledged = 0
        self.errors = 0
        self.error_lines: list[str] = []  # the first MAX_ERROR_SAMPLES

    def failed(self, line: str) -> None:
        with self._lock:
            self.errors += 1
            if len(self.error_lines) < MAX_ERROR_SAMPLES:
                self.error_lines.append(line)

    def watch(self, future: RecordFuture) -> None:
        def on_done(done: RecordFuture) -> None:
            error = done.exception()
            if error is None:
                with self._lock:
                    self.acknowledged += 1
            elif isinstance(error, KafkaError):
                self.failed(error_line(error))
            else:
                self.failed(f"error: {error!r}")

        future.add_done_callback(on_done)


def stdin_records(
    key_separator: str | None, tally: DeliveryTally
) -> Iterator[tuple[bytes | None, bytes]]:
    """(key, value) per line of stdin; a line without the separator counts as an error."""
    separator = key_separator.encode() if key_separator is not None else None
    for number, raw in enumerate(sys.stdin.buffer, start=1):
        line = raw.removesuffix(b"\n").removesuffix(b"\r")
        if separator is None:
            yield None, line
            continue
        key, found, value = line.partition(separator)
        if not found:
            tally.failed(f"error: line {number} has no key separator {key_separator!r}")
            continue
        yield key, value


def generated_records(count: int, record_size: int | None) -> Iterator[tuple[None, bytes]]:
    """``record-<n>`` values, padded with ``x`` (or cut) to ``record_size`` bytes when given."""
    for n in range(count):
        value = f"record-{n}".encode()
        if record_size is not None:
            value = value[:record_size].ljust(record_size, b"x")
        yield None, value


def chosen_partitions(bootstrap: str, topic: str, partition: int | None) -> list[int]:
    """``[partition]`` when it exists, else every partition of the topic."""
    known = topic_partitions(bootstrap, topic)
    if partition is None:
        return known
    if partition not in known:
        raise KafkaError(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            f"partition {partition} is not in {topic} ({len(known)} partitions)",
        )
    return [partition]


def produce(
    topic: str,
    key_separator: Annotated[
        str | None, typer.Option("--key-separator", help="split each line into key and value")
    ] = None,
    count: Annotated[
        int | None, typer.Option("--count", min=1, help="generate N records, ignore stdin")
    ] = None,
    record_size: Annotated[
        int | None, typer.Option("--record-size", min=0, help="bytes per generated value")
    ] = None,
    acks: AcksOption = AcksChoice.ALL,
    compression: CompressionOption = CompressionChoice.NONE,
    partition: Annotated[int | None, typer.Option("--partition", min=0)] = None,
    linger_ms: Annotated[int, typer.Option("--linger-ms", min=0, max=600_000)] = 5,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """Send each line of stdin as a record (or --count generated ones); report the acks."""
    if count is not None and key_separator is not None:
        raise typer.BadParameter("--key-separator applies to stdin lines, not to --count")
    tally = DeliveryTally()
    records = (
        generated_records(count, record_size)
        if count is not None
        else stdin_records(key_separator, tally)
    )
    with kafka_errors():
        chosen_partitions(bootstrap, topic, partition)
        with Producer(
            servers(bootstrap),
            security=command_security(),
            acks=acks.to_acks(),
            compression_type=compression.to_type(),
            linger_ms=linger_ms,
        ) as producer:
            for key, value in records:
                tally.watch(producer.send(topic, value, key=key, partition=partition))
            producer.flush()
    for line in tally.error_lines:
        print(line, file=sys.stderr)
    if as_json:
        print_json({"acknowledged": tally.acknowledged, "errors": tally.errors})
    else:
        console.print(f"{tally.acknowledged} records acknowledged, {tally.errors} errors")
    if tally.errors:
        raise typer.Exit(1)


# -- consume ---------------------------------------------------------------------------------
def text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="backslashreplace")


def record_json(record: ConsumerRecord) -> str:
    return json.dumps(
        {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "timestamp": record.timestamp,
            "timestamp_type": record.timestamp_type,
            "key": text(record.key),
            "value": text(record.value),
            "headers": [[k, text(v)] for k, v in record.headers],
            "leader_epoch": record.leader_epoch,
        }
    )


def shown(data: bytes | None) -> str:
    return "null" if data is None else data.decode("utf-8", errors="backslashreplace")


def record_line(record: ConsumerRecord, print_key: bool, print_offset: bool) -> str:
    """``[partition:offset<TAB>][key<TAB>]value``, null keys and values as ``null``."""
    fields = [f"{record.partition}:{record.offset}"] if print_offset else []
    if print_key:
        fields.append(shown(record.key))
    fields.append(shown(record.value))
    return "\t".join(fields)


def start_positions(
    consumer: Consumer, partitions: list[TopicPartition], from_beginning: bool, offset: int | None
) -> None:
    """Assign and look the start offsets up now (not at the first poll), so that default
    "latest" means the end when the command started."""
    consumer.assign(partitions)
    if offset is not None:
        for tp in partitions:
            consumer.seek(tp, offset)
    elif from_beginning:
        consumer.seek_to_beginning()
    else:
        consumer.seek_to_end()
    for tp in partitions:
        consumer.position(tp)


def consume_loop(
    consumer: Consumer,
    max_records: int | None,
    timeout_ms: int | None,
    line: Callable[[ConsumerRecord], str],
) -> int:
    """Print records until ``max_records``, ``timeout_ms`` without any, Ctrl-C or a closed
    stdout; the number printed."""
    count = 0
    poll_ms = POLL_MAX_MS if timeout_ms is None else max(1, min(POLL_MAX_MS, timeout_ms))
    last_arrival = time.monotonic()
    try:
        while max_records is None or count < max_records:
            batches = consumer.poll(timeout_ms=poll_ms)
            taken = [record for records in batches.values() for record in records]
            if not taken:
                idle_ms = (time.monotonic() - last_arrival) * 1000
                if timeout_ms is not None and idle_ms >= timeout_ms:
                    break
                continue
            last_arrival = time.monotonic()
            if max_records is not None:
                taken = taken[: max_records - count]
            sys.stdout.write("".join(line(record) + "\n" for record in taken))
            sys.stdout.flush()
            count += len(taken)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how an unbounded consume ends
    except BrokenPipeError:  # e.g. `| head`: stop quietly, as cat does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return count


def consume(
    topic: str,
    from_beginning: Annotated[bool, typer.Option("--from-beginning")] = False,
    offset: Annotated[
        int | None, typer.Option("--offset", min=0, help="start offset in each partition")
    ] = None,
    partition: Annotated[
        int | None, typer.Option("--partition", min=0, help="default: all partitions")
    ] = None,
    max_records: Annotated[int | None, typer.Option("--max", min=1, help="stop after N")] = None,
    timeout_ms: Annotated[
        int | None, typer.Option("--timeout-ms", min=0, help="stop when idle this long")
    ] = None,
    print_key: Annotated[bool, typer.Option("--print-key")] = False,
    print_offset: Annotated[bool, typer.Option("--print-offset")] = False,
    group: Annotated[
        str | None,
        typer.Option("--group", help="consume as a member of this group, committing offsets"),
    ] = None,
    isolation_level: Annotated[
        IsolationChoice,
        typer.Option(
            "--isolation-level",
            help="read_committed: only committed transactions' records, up to the LSO",
        ),
    ] = IsolationChoice.READ_UNCOMMITTED,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """Print records: from the end (default), the beginning or an offset; one per line.
    With --group: the group's share of the partitions, from its committed offsets (new
    partitions from the end, or the beginning with --from-beginning)."""
    if from_beginning and offset is not None:
        raise typer.BadParameter("give --from-beginning or --offset, not both")
    if group is not None and (offset is not None or partition is not None):
        raise typer.BadParameter("--group takes no --offset or --partition: the group assigns")
    with kafka_errors():
        reset: Literal["earliest", "latest"] = "earliest" if from_beginning else "latest"
        with Consumer(
            servers(bootstrap),
            security=command_security(),
            auto_offset_reset=reset,
            group_id=group,
            isolation_level=isolation_level.value,
        ) as consumer:
            if group is not None:
                consumer.subscribe([topic])
            else:
                ids = chosen_partitions(bootstrap, topic, partition)
                partitions = [TopicPartition(topic, p) for p in ids]
                start_positions(consumer, partitions, from_beginning, offset)
            line: Callable[[ConsumerRecord], str] = (
                record_json if as_json else lambda r: record_line(r, print_key, print_offset)
            )
            count = consume_loop(consumer, max_records, timeout_ms, line)
    print(f"Processed a total of {count} messages", file=sys.stderr)


# -- perf ------------------------------------------------------------------------------------
TopicOption = Annotated[str, typer.Option("--topic", help="an existing topic")]
QuietOption = Annotated[bool, typer.Option("--quiet", help="no progress bar")]


@contextmanager
def progress_bar(description: str, total: int | None, disabled: bool) -> Iterator[Progress]:
    """A rich progress bar on stderr; yields the ``on_progress(done)`` callback."""
    with RichProgress(console=err_console, disable=disabled, transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda done: bar.update(task, completed=done)


def figures_table(title: str, figures: dict[str, str]) -> Table:
    table = Table(*figures, title=title)
    table.add_row(*figures.values())
    return table


def produce_figures(result: ProducePerfResult) -> dict[str, str]:
    latency = result.latency_ms
    return {
        "records": str(result.records),
        "seconds": f"{result.seconds:.2f}",
        "records/s": f"{result.records_per_s:.1f}",
        "MB/s": f"{result.mb_per_s:.2f}",
        "avg ms": f"{latency.avg:.2f}",
        "p50 ms": f"{latency.p50:.2f}",
        "p99 ms": f"{latency.p99:.2f}",
        "p99.9 ms": f"{latency.p999:.2f}",
        "max ms": f"{latency.max:.2f}",
        "errors": str(result.errors),
    }


@perf_app.command("produce")
def perf_produce(
    topic: TopicOption,
    num_records: Annotated[int, typer.Option("--num-records", min=1)],
    record_size: Annotated[int, typer.Option("--record-size", min=0, help="bytes")] = 1024,
    acks: AcksOption = AcksChoice.ALL,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, max=64 * 1024 * 1024)
    ] = DEFAULT_BATCH_SIZE,
    linger_ms: Annotated[int, typer.Option("--linger-ms", min=0, max=600_000)] = 5,
    compression: CompressionOption = CompressionChoice.NONE,
    throughput: Annotated[
        float, typer.Option("--throughput", help="records/s cap, -1: unthrottled")
    ] = -1,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    quiet: QuietOption = False,
    as_json: JsonOption = False,
) -> None:
    """Producer throughput and per-record latency (like kafka-producer-perf-test)."""
    with kafka_errors():
        topic_partitions(bootstrap, topic)
        with progress_bar("producing", num_records, quiet or as_json) as on_progress:
            result = run_produce_perf(
                servers(bootstrap),
                topic,
                num_records,
                record_size,
                security=command_security(),
                acks=acks.to_acks(),
                batch_size=batch_size,
                linger_ms=linger_ms,
                compression_type=compression.to_type(),
                throughput_per_s=throughput,
                on_progress=on_progress,
            )
    for line in result.error_samples:
        print(f"error: {line}", file=sys.stderr)
    if as_json:
        print_json(result.to_json())
    else:
        console.print(figures_table(f"produce {topic}", produce_figures(result)))
    if result.errors:
        raise typer.Exit(1)


@perf_app.command("consume")
def perf_consume(
    topic: TopicOption,
    num_records: Annotated[
        int | None, typer.Option("--num-records", min=1, help="default: up to the end offsets")
    ] = None,
    timeout_ms: Annotated[
        int, typer.Option("--timeout-ms", min=1, help="give up when idle this long")
    ] = 10_000,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    quiet: QuietOption = False,
    as_json: JsonOption = False,
) -> None:
    """Consumer throughput reading every partition from the beginning."""
    with kafka_errors():
        topic_partitions(bootstrap, topic)
        with progress_bar("consuming", num_records, quiet or as_json) as on_progress:
            result = run_consume_perf(
                servers(bootstrap),
                topic,
                num_records,
                timeout_ms / 1000,
                security=command_security(),
                on_progress=on_progress,
            )
    if result.timed_out:
        print(f"warning: nothing arrived for {timeout_ms} ms, stopped early", file=sys.stderr)
    if as_json:
        print_json(result.to_json())
        return
    figures = {
        "records": str(result.records),
        "MB": f"{result.payload_bytes / 1024 / 1024:.2f}",
        "seconds": f"{result.seconds:.2f}",
        "records/s": f"{result.records_per_s:.1f}",
        "MB/s": f"{result.mb_per_s:.2f}",
    }
    console.print(figures_table(f"consume {topic}", figures))


def register(app: typer.Typer) -> None:
    """Add ``topic``, ``produce``, ``consume`` and ``perf`` to the ``raftlog`` app."""
    app.add_typer(topic_app, name="topic")
    app.add_typer(perf_app, name="perf")
    app.command("produce")(produce)
    app.command("consume")(consume)
