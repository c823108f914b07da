"""The Structured Streaming job: clicks in, per-page counts of event-time windows out.

``clicks`` is read through the ``raftlog`` source; the Avro values are decoded with their
registered schema (``spark.registry.from_registry``, the topic's value subject, ``clicks-value``),
the events
grouped into tumbling ``window_s``-second windows of their event time per page, with a
watermark ``watermark_delay_s`` behind the latest event time seen; in append mode a window is
written once, to ``page-counts`` through the ``raftlog`` sink, in the first micro-batch after
the watermark passed its end. The sink is exactly once (each micro-batch's records commit in
transactions with the batch, see ``spark/_writer.py``): read ``page-counts`` read_committed.
The checkpoint holds the source offsets and the windows' state, so a query started again on
the same checkpoint continues where the last one stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from dataplane.tools.local_cluster import wait_for
from spark.pipeline.events import value_subject
from spark.registry import from_registry

STOP_DEADLINE_S = 120.0


@dataclass(frozen=True)
class JobSettings:
    bootstrap_servers: str
    schema_registry_url: str  # one or more http://host:port, comma-separated
    source_topic: str
    sink_topic: str
    checkpoint: Path
    window_s: int
    watermark_delay_s: int
    trigger_ms: int


def window_counts(events: DataFrame, settings: JobSettings) -> DataFrame:
    """Raw ``clicks`` rows to ``page-counts`` rows: key = page, value = the window's JSON."""
    subject = value_subject(settings.source_topic)
    decoded = from_registry("value", settings.schema_registry_url, subject)
    parsed = events.select(decoded.alias("e"))
    counts = (
        parsed.where(F.col("e.page").isNotNull() & F.col("e.ts").isNotNull())
        .select(F.col("e.page").alias("page"), F.col("e.ts").alias("event_time"))
        .withWatermark("event_time", f"{settings.watermark_delay_s} seconds")
        .groupBy(F.window("event_time", f"{settings.window_s} seconds"), "page")
        .count()
    )
    value = F.to_json(
        F.struct(
            F.unix_millis(F.col("window.start")).alias("window_start_ms"),
            F.unix_millis(F.col("window.end")).alias("window_end_ms"),
            F.col("page"),
            F.col("count"),
        )
    )
    return counts.select(F.col("page").cast("binary").alias("key"), value.alias("value"))


def start(session: SparkSession, settings: JobSettings) -> StreamingQuery:
    """Start (or, on an existing checkpoint, resume) the job."""
    events = (
        session.readStream.format("raftlog")
        .option("raftlog.bootstrap.servers", settings.bootstrap_servers)
        .option("subscribe", settings.source_topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    writer = (
        window_counts(events, settings)
        .writeStream.format("raftlog")
        .option("raftlog.bootstrap.servers", settings.bootstrap_servers)
        .option("topic", settings.sink_topic)
        .option("exactlyOnce", "true")
        .option("transactionalIdPrefix", f"page-counts-of-{settings.source_topic}")
        .option("checkpointLocation", str(settings.checkpoint))
        .outputMode("append")
        .queryName(f"page-counts-of-{settings.source_topic}")
    )
    query: StreamingQuery = writer.trigger(
        processingTime=f"{settings.trigger_ms} milliseconds"
    ).start()
    return query


def raise_if_failed(query: StreamingQuery) -> None:
    error = query.exception()
    if error is not None:
        raise RuntimeError(f"the streaming job failed: {error}")


def stop_between_batches(query: StreamingQuery) -> None:
    """Stop the query while no micro-batch runs: a clean stop, though with the exactly-once
    sink a stop in the middle of a batch is safe too (its prepared transactions are aborted, or
    found committed by the restarted query, which then skips them)."""

    def idle() -> bool:
        raise_if_failed(query)
        return not query.status["isTriggerActive"]

    wait_for("the streaming job between two micro-batches", idle, STOP_DEADLINE_S)
    query.stop()
    raise_if_failed(query)
