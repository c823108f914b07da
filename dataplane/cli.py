"""The ``raftlog`` command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from dataplane.storage_demo import run_demo
from raftlog.batch import HEADER_SIZE, read_header
from raftlog.records import decode_batch

app = typer.Typer(help="raftlog: a Kafka-style streaming log.", no_args_is_help=True)
demo_app = typer.Typer(help="End-to-end demonstrations.", no_args_is_help=True)
log_app = typer.Typer(help="Inspect log directories on disk.", no_args_is_help=True)
app.add_typer(demo_app, name="demo")
app.add_typer(log_app, name="log")
console = Console()


@demo_app.command("storage")
def demo_storage(
    records: Annotated[int, typer.Option(help="records to write in all")] = 1_000_000,
    partitions: Annotated[int, typer.Option(min=1, max=64)] = 4,
    keep: Annotated[bool, typer.Option(help="keep the data directory afterwards")] = False,
) -> None:
    """Write, SIGKILL mid-way, recover, verify, finish, compact; print what happened."""
    run_demo(Path(".raftlog/demo"), total_records=records, partitions=partitions, keep=keep)


@log_app.command("dump")
def log_dump(
    segment: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="a .log file")],
    records: Annotated[bool, typer.Option(help="also decode every record")] = False,
    limit: Annotated[int, typer.Option(min=1, help="batches to show at most")] = 1000,
) -> None:
    """Print the batches of a segment file, like kafka-dump-log.sh."""
    data = segment.read_bytes()
    table = Table(
        "position",
        "base offset",
        "last offset",
        "count",
        "epoch",
        "size",
        "compression",
        "max timestamp",
        "producer id",
    )
    position, shown = 0, 0
    while position + HEADER_SIZE <= len(data) and shown < limit:
        header = read_header(data, position)
        table.add_row(
            *(
                str(v)
                for v in (
                    position,
                    header.base_offset,
                    header.last_offset,
                    header.record_count,
                    header.partition_leader_epoch,
                    header.size_bytes,
                    header.compression,
                    header.max_timestamp,
                    header.producer_id,
                )
            )
        )
        if records:
            for record in decode_batch(data[position : position + header.size_bytes])[1]:
                table.add_row(
                    "",
                    str(record.offset),
                    "",
                    "",
                    "",
                    "",
                    "",
                    str(record.timestamp),
                    f"key={record.key!r} value={(record.value or b'')[:40]!r}",
                )
        position += header.size_bytes
        shown += 1
    console.print(table)
    if position < len(data) and shown < limit:
        console.print(f"[red]{len(data) - position} trailing bytes do not form a batch[/red]")


def main() -> None:
    app()
