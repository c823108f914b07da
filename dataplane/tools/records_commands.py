"""``raftlog topic delete-records``: move partitions' log start offsets (Kafka's
kafka-delete-records).

Either one topic with ``--offset`` (default -1: up to the high watermark) for ``--partition``
(repeatable; default every partition), or Kafka's ``--offset-json-file``::

    {"version": 1, "partitions": [{"topic": "t", "partition": 0, "offset": 42}]}

Prints the new low watermark of each partition (the lowest log start offset of its replicas);
exits 1 if any partition was refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from dataplane.client import TopicPartition
from dataplane.client.admin import AdminClient, DeletedRecords
from dataplane.tools.client_commands import (
    DEFAULT_BOOTSTRAP,
    BootstrapOption,
    JsonOption,
    admin_client,
    console,
    err_console,
    error_line,
    kafka_errors,
    print_json,
)
from raftlog.errors import ErrorCode, KafkaError

__all__ = ["read_offset_json", "topic_delete_records"]


def read_offset_json(path: Path) -> dict[TopicPartition, int]:
    """Kafka's offset JSON file: ``{"partitions": [{"topic", "partition", "offset"}, ...]}``."""
    try:
        document = json.loads(path.read_text())
        entries = document["partitions"]
        wanted = {
            TopicPartition(str(e["topic"]), int(e["partition"])): int(e["offset"]) for e in entries
        }
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise typer.BadParameter(f"{path}: not an offset JSON file: {error}") from error
    if len(wanted) != len(entries):
        raise typer.BadParameter(f"{path}: a partition is named twice")
    return wanted


def _requested(
    admin: AdminClient, topic: str, partitions: list[int], offset: int
) -> dict[TopicPartition, int]:
    if not partitions:
        described = admin.describe_topics([topic])[topic]
        partitions = [p.partition for p in described.partitions]
    return {TopicPartition(topic, p): offset for p in sorted(set(partitions))}


def _row_json(tp: TopicPartition, outcome: DeletedRecords) -> dict[str, Any]:
    return {
        "topic": tp.topic,
        "partition": tp.partition,
        "low_watermark": outcome.low_watermark,
        "error": None if outcome.error is None else error_line(outcome.error),
    }


def topic_delete_records(
    name: Annotated[str | None, typer.Argument(help="the topic (or --offset-json-file)")] = None,
    partition: Annotated[
        list[int] | None,
        typer.Option("--partition", min=0, help="repeatable (default: every partition)"),
    ] = None,
    offset: Annotated[
        int, typer.Option("--offset", min=-1, help="the new log start offset; -1: the HW")
    ] = -1,
    offset_json_file: Annotated[
        Path | None, typer.Option("--offset-json-file", help="Kafka's offset JSON file")
    ] = None,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """Delete the records below an offset: prints each partition's new low watermark."""
    if (name is None) == (offset_json_file is None):
        raise typer.BadParameter("give a topic or --offset-json-file")
    with kafka_errors(), admin_client(bootstrap) as admin:
        if offset_json_file is not None:
            wanted = read_offset_json(offset_json_file)
        else:
            assert name is not None, "checked above"
            wanted = _requested(admin, name, partition or [], offset)
        if not wanted:
            raise KafkaError(ErrorCode.INVALID_REQUEST, "no partition to delete records of")
        outcomes = admin.delete_records(wanted)
    ordered = sorted(outcomes.items())
    if as_json:
        print_json([_row_json(tp, outcome) for tp, outcome in ordered])
    else:
        table = Table("TOPIC", "PARTITION", "LOW-WATERMARK")
        for tp, outcome in ordered:
            if outcome.error is None:
                table.add_row(tp.topic, str(tp.partition), str(outcome.low_watermark))
        console.print(table)
    failed = [(tp, o.error) for tp, o in ordered if o.error is not None]
    for tp, error in failed:
        err_console.print(f"{tp.topic}-{tp.partition}: {error_line(error)}")
    if failed:
        raise typer.Exit(1)
