"""One run of the reference pipeline against a running cluster (see the package docstring).

1. Create ``clicks`` and ``page-counts``, register the clicks' Avro schema (``clicks-value``)
   in the schema registry, and start the job.
2. Produce the first half of the events, chunk by chunk (each chunk acknowledged and logged
   before the next is sent), and wait until the job has written its first windows.
3. Stop the job between two micro-batches, produce more events while it is down, and start it
   again on the same checkpoint.
4. Produce the rest and the flush event, wait until ``page-counts`` holds as many records as
   the ground truth has windows (or the deadline passes: the checker then says what is
   missing), stop the job between micro-batches and run the checker.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from dataplane.client import AdminClient, Closing, Consumer, NewTopic, Producer
from dataplane.client.admin import raise_for_errors
from dataplane.tools.local_cluster import wait_for
from spark.pipeline import job
from spark.pipeline.checker import (
    POLL_MS,
    CheckReport,
    compare,
    ground_truth,
    read_log,
    read_results,
)
from spark.pipeline.events import (
    CLICK_SCHEMA,
    EventTime,
    LoggedEvent,
    flush_event,
    generate,
    value_subject,
)
from spark.registry import register

CLICKS = "clicks"
PAGE_COUNTS = "page-counts"
REPLICATION_FACTOR = 3
TOPIC_CONFIGS = {"min.insync.replicas": "2"}
FLUSH_TIMEOUT_S = 60.0
LEADERS_DEADLINE_S = 30.0
WINDOWS_DEADLINE_S = 120.0


@dataclass(frozen=True)
class PipelineSettings:
    """The run's shape. Event time runs ``step_ms`` per event, ``chunk`` events per
    ``chunk_interval_ms`` of wall time: 25 ms x 50 per 100 ms is 12.5 s of event time per
    wall second, so 4,000 events span ten 10-second windows in about 8 s of producing."""

    events: int = 4_000
    chunk: int = 50
    chunk_interval_ms: int = 100
    chunks_while_stopped: int = 10
    seed: int = 20240601
    start_ms: int = 1_700_000_000_000  # a multiple of the window
    step_ms: int = 25
    max_lateness_ms: int = 1_000
    window_s: int = 10
    watermark_delay_s: int = 5
    flush_ahead_ms: int = 3_600_000
    trigger_ms: int = 1_000
    clicks_partitions: int = 3
    counts_partitions: int = 2

    def __post_init__(self) -> None:
        # A chunk is acknowledged before the next is sent, so no partition is read more than
        # a chunk behind another: an event is at most this far behind the latest event time
        # read, which must stay within the watermark delay, or Spark would drop it as late.
        behind_ms = self.max_lateness_ms + self.chunk * self.step_ms
        if behind_ms >= self.watermark_delay_s * 1000:
            raise ValueError(
                f"max_lateness_ms + chunk * step_ms = {behind_ms} ms must stay below the "
                f"watermark delay ({self.watermark_delay_s} s), or events would be dropped"
            )
        if self.events < 2 * self.chunk or self.start_ms % (self.window_s * 1000):
            raise ValueError("need at least two chunks of events and a window-aligned start")

    @property
    def clock(self) -> EventTime:
        return EventTime(self.start_ms, self.step_ms, self.max_lateness_ms)

    @property
    def window_ms(self) -> int:
        return self.window_s * 1000


@dataclass(frozen=True)
class PipelineResult:
    events: int
    produced_while_stopped: int
    first_run_batches: int
    second_run_batches: int
    downtime_s: float
    streaming_s: float
    report: CheckReport


class Generator(Closing):
    """Produces the events chunk by chunk with acks=all; each acknowledged event is appended
    to the log with its partition and offset before the next chunk is sent."""

    def __init__(
        self, servers: Sequence[str], log_path: Path, settings: PipelineSettings, schema_id: int
    ) -> None:
        self.settings = settings
        self.schema_id = schema_id  # CLICK_SCHEMA's in the registry
        self.producer = Producer(list(servers), acks="all", linger_ms=5)
        self.log = log_path.open("a")
        self.produced = 0
        self.last_ts = settings.start_ms

    def close(self) -> None:
        self.producer.close()
        self.log.close()

    def produce(self, chunks: int) -> int:
        """Up to ``chunks`` more chunks (fewer when the events run out); how many events."""
        s, produced = self.settings, 0
        for _ in range(chunks):
            count = min(s.chunk, s.events - self.produced)
            if count == 0:
                break
            started = time.monotonic()
            events = generate(s.seed, self.produced, count, s.clock)
            futures = [
                self.producer.send(CLICKS, e.to_avro(self.schema_id), key=e.page.encode())
                for e in events
            ]
            self.producer.flush(timeout=FLUSH_TIMEOUT_S)
            for event, future in zip(events, futures, strict=True):
                stored = future.result(timeout=0)  # raises the record's delivery error
                self.log.write(LoggedEvent(event, stored.partition, stored.offset).to_line())
                self.log.write("\n")
                self.last_ts = max(self.last_ts, event.ts)
            self.log.flush()
            self.produced += count
            produced += count
            pause_s = s.chunk_interval_ms / 1000 - (time.monotonic() - started)
            if pause_s > 0:
                time.sleep(pause_s)  # pacing the offered load, not synchronisation
        return produced

    def send_flush(self) -> None:
        event = flush_event(self.last_ts, self.settings.flush_ahead_ms)
        self.producer.send(CLICKS, event.to_avro(self.schema_id), key=event.page.encode())
        self.producer.flush(timeout=FLUSH_TIMEOUT_S)


def create_topics(servers: Sequence[str], partitions: dict[str, int]) -> None:
    """Create the topics (replication factor 3) and wait until each partition has a leader."""
    admin = AdminClient(list(servers))
    try:
        topics = [
            NewTopic(name, count, REPLICATION_FACTOR, TOPIC_CONFIGS)
            for name, count in partitions.items()
        ]
        raise_for_errors(admin.create_topics(topics))

        def led() -> bool:
            described = admin.describe_topics(list(partitions)).values()
            return all(p.leader >= 0 for topic in described for p in topic.partitions)

        wait_for(f"leaders of {', '.join(partitions)}", led, LEADERS_DEADLINE_S)
    finally:
        admin.close()


def _batches(query: StreamingQuery) -> int:
    return sum(1 for p in query.recentProgress if p["numInputRows"] > 0)


class _Written:
    """How many committed records ``page-counts`` holds, read as its readers do
    (read_committed). Not the sum of its high watermarks: the sink is transactional, and every
    transaction's commit marker takes an offset of each partition it wrote."""

    def __init__(self, servers: Sequence[str]) -> None:
        self.consumer = Consumer(
            list(servers), auto_offset_reset="earliest", isolation_level="read_committed"
        )
        partitions = sorted(self.consumer.partitions_for_topic(PAGE_COUNTS))
        self.consumer.assign([(PAGE_COUNTS, p) for p in partitions])
        self.count = 0

    def __call__(self) -> int:
        polled = self.consumer.poll(timeout_ms=POLL_MS)
        self.count += sum(len(records) for records in polled.values())
        return self.count

    def wait(self, query: StreamingQuery, at_least: int, deadline_s: float) -> bool:
        """Until at least ``at_least`` records are written (True) or the deadline (False)."""

        def enough() -> bool:
            job.raise_if_failed(query)
            return self() >= at_least

        try:
            wait_for(f"{at_least} records in {PAGE_COUNTS}", enough, deadline_s)
        except TimeoutError:
            return False
        return True


def run_pipeline(
    session: SparkSession,
    servers: Sequence[str],
    registry_url: str,
    workdir: Path,
    settings: PipelineSettings,
    say: Callable[[str], None] = lambda _: None,
) -> PipelineResult:
    """Steps 1-4 of the module docstring against the cluster of ``servers`` and its schema
    registry (``registry_url``: one or more, comma-separated); ``workdir`` gets the log and the
    checkpoint, ``say`` hears of each step."""
    create_topics(
        servers, {CLICKS: settings.clicks_partitions, PAGE_COUNTS: settings.counts_partitions}
    )
    schema_id = register(registry_url, value_subject(CLICKS), CLICK_SCHEMA)
    log_path = workdir / "clicks.jsonl"
    job_settings = job.JobSettings(
        bootstrap_servers=",".join(servers),
        schema_registry_url=registry_url,
        source_topic=CLICKS,
        sink_topic=PAGE_COUNTS,
        checkpoint=workdir / "checkpoint",
        window_s=settings.window_s,
        watermark_delay_s=settings.watermark_delay_s,
        trigger_ms=settings.trigger_ms,
    )
    written = _Written(servers)
    started = time.monotonic()

    def step(message: str) -> None:
        say(f"[{time.monotonic() - started:5.1f} s] {message}")

    step(f"registered {value_subject(CLICKS)} (Avro) as schema id {schema_id}")
    step(f"starting the job: {CLICKS} -> {settings.window_s} s windows per page -> {PAGE_COUNTS}")
    query = job.start(session, job_settings)
    try:
        with Generator(servers, log_path, settings, schema_id) as generator:
            step(f"producing the first {settings.events // 2:,} of {settings.events:,} events")
            generator.produce(settings.events // settings.chunk // 2)
            if not written.wait(query, 1, WINDOWS_DEADLINE_S):
                raise TimeoutError(f"the job wrote no window within {WINDOWS_DEADLINE_S} s")
            job.stop_between_batches(query)
            stopped_at, first_run_batches = time.monotonic(), _batches(query)
            step(f"stopped the job between micro-batches ({written()} windows written so far)")
            while_stopped = generator.produce(settings.chunks_while_stopped)
            step(f"produced {while_stopped:,} events while it was down; restarting it")
            query = job.start(session, job_settings)
            downtime_s = time.monotonic() - stopped_at
            generator.produce(settings.events)  # the rest
            generator.send_flush()
            step("produced the rest and the flush event; waiting for the last windows")
        expected = ground_truth(read_log(log_path), settings.window_ms)
        written.wait(query, len(expected), WINDOWS_DEADLINE_S)  # short: the checker says why
        job.stop_between_batches(query)
        step(f"stopped the job; checking {PAGE_COUNTS} against the generator's log")
    finally:
        query.stop()  # a no-op when stopped already
        written.consumer.close()
    streaming_s = time.monotonic() - started
    report = compare(expected, read_results(servers, PAGE_COUNTS), settings.window_ms)
    return PipelineResult(
        events=generator.produced,
        produced_while_stopped=while_stopped,
        first_run_batches=first_run_batches,
        second_run_batches=_batches(query),
        downtime_s=downtime_s,
        streaming_s=streaming_s,
        report=report,
    )
