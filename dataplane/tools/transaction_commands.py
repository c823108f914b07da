"""``raftlog transactions``: list and describe transactions, describe a partition's producers.

The shapes of Kafka's kafka-transactions.sh: ``list`` (TransactionalId, Coordinator,
ProducerId, TransactionState), ``describe ID`` (the coordinator's view of one transactional
id, with the open transaction's start, duration and partitions) and ``describe-producers``
(what a partition's leader remembers of each producer: epoch, last sequence and timestamp, the
first offset of its open transaction).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.table import Table

from dataplane.client import TopicPartition
from dataplane.client.admin import ProducerState, TransactionDescription
from dataplane.tools.client_commands import (
    DEFAULT_BOOTSTRAP,
    BootstrapOption,
    JsonOption,
    admin_client,
    console,
    kafka_errors,
    print_json,
)

__all__ = ["transactions_app"]

transactions_app = typer.Typer(
    help="List and describe transactions and the producers of a partition.",
    no_args_is_help=True,
)


@transactions_app.command("list")
def transactions_list(
    state: Annotated[
        list[str] | None,
        typer.Option("--state", help="only this state (Ongoing, CompleteCommit, ...), repeatable"),
    ] = None,
    producer_id: Annotated[
        list[int] | None, typer.Option("--producer-id", help="only this producer, repeatable")
    ] = None,
    duration_filter_ms: Annotated[
        int, typer.Option("--duration-filter-ms", min=0, help="only those open longer than this")
    ] = 0,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """Every transactional id of the cluster, with its coordinator, producer id and state."""
    with kafka_errors(), admin_client(bootstrap) as admin:
        listed = admin.list_transactions(state or (), producer_id or (), duration_filter_ms)
    if as_json:
        print_json(
            [
                {
                    "transactional_id": t.transactional_id,
                    "coordinator": t.coordinator_id,
                    "producer_id": t.producer_id,
                    "state": t.state,
                }
                for t in listed
            ]
        )
        return
    table = Table("TRANSACTIONAL-ID", "COORDINATOR", "PRODUCER-ID", "STATE")
    for t in listed:
        table.add_row(t.transactional_id, str(t.coordinator_id), str(t.producer_id), t.state)
    console.print(table)


DESCRIBE_COLUMNS = {
    "coordinator": "COORDINATOR",
    "transactional_id": "TRANSACTIONAL-ID",
    "producer_id": "PRODUCER-ID",
    "producer_epoch": "PRODUCER-EPOCH",
    "state": "STATE",
    "transaction_timeout_ms": "TIMEOUT-MS",
    "transaction_start_ms": "START-TIME-MS",
    "transaction_duration_ms": "DURATION-MS",
}
PRODUCER_COLUMNS = {
    "producer_id": "PRODUCER-ID",
    "producer_epoch": "PRODUCER-EPOCH",
    "coordinator_epoch": "LATEST-COORDINATOR-EPOCH",
    "last_sequence": "LAST-SEQUENCE",
    "last_timestamp": "LAST-TIMESTAMP",
    "current_transaction_start_offset": "CURRENT-TRANSACTION-START-OFFSET",
}


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def description_json(d: TransactionDescription, now_ms: int) -> dict[str, Any]:
    started = d.transaction_start_ms
    return {
        "transactional_id": d.transactional_id,
        "coordinator": d.coordinator_id,
        "producer_id": d.producer_id,
        "producer_epoch": d.producer_epoch,
        "state": d.state,
        "transaction_timeout_ms": d.transaction_timeout_ms,
        "transaction_start_ms": None if started < 0 else started,
        "transaction_duration_ms": None if started < 0 else max(0, now_ms - started),
        "topic_partitions": [[tp.topic, tp.partition] for tp in sorted(d.topic_partitions)],
    }


@transactions_app.command("describe")
def transactions_describe(
    transactional_id: Annotated[str, typer.Argument(help="the transactional id")],
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """The coordinator's view of a transactional id: producer id and epoch, state, timeout,
    and the open transaction's start, duration and partitions."""
    with kafka_errors(), admin_client(bootstrap) as admin:
        described = admin.describe_transactions([transactional_id])[transactional_id]
    document = description_json(described, int(time.time() * 1000))
    if as_json:
        print_json(document)
        return
    table = Table(*DESCRIBE_COLUMNS.values(), "TOPIC-PARTITIONS")
    partitions = sorted(described.topic_partitions)
    table.add_row(
        *(_cell(document[key]) for key in DESCRIBE_COLUMNS),
        ",".join(f"{tp.topic}-{tp.partition}" for tp in partitions) or "-",
    )
    console.print(table)


def producer_json(p: ProducerState) -> dict[str, Any]:
    return {
        "producer_id": p.producer_id,
        "producer_epoch": p.producer_epoch,
        "coordinator_epoch": None if p.coordinator_epoch < 0 else p.coordinator_epoch,
        "last_sequence": p.last_sequence,
        "last_timestamp": p.last_timestamp,
        "current_transaction_start_offset": (
            None if p.current_transaction_start_offset < 0 else p.current_transaction_start_offset
        ),
    }


@transactions_app.command("describe-producers")
def transactions_describe_producers(
    topic: Annotated[str, typer.Option("--topic", help="the topic")],
    partition: Annotated[int, typer.Option("--partition", min=0, help="the partition")],
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """The producers the partition's leader remembers, and their open transactions."""
    tp = TopicPartition(topic, partition)
    with kafka_errors(), admin_client(bootstrap) as admin:
        producers = admin.describe_producers([tp])[tp]
    rows = [producer_json(p) for p in sorted(producers, key=lambda p: p.producer_id)]
    if as_json:
        print_json(rows)
        return
    table = Table(*PRODUCER_COLUMNS.values())
    for row in rows:
        table.add_row(*(_cell(row[key]) for key in PRODUCER_COLUMNS))
    console.print(table)
