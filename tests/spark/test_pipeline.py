"""The reference pipeline: the checker's comparison (pure), the event generator, and one whole
run on a real 3-node cluster and Spark local[2], with the job stopped mid-stream and restarted
from its checkpoint."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyspark.sql import SparkSession

from dataplane.client import Consumer, ConsumerRecord
from dataplane.tools.local_cluster import LocalCluster, wait_for
from spark.pipeline.checker import WindowCount, compare, ground_truth, read_log, read_results
from spark.pipeline.events import EventTime, LoggedEvent, flush_event, generate
from spark.pipeline.run import CLICKS, PAGE_COUNTS, PipelineSettings, run_pipeline
from tests.dataplane.cluster_support import running_cluster
from tests.spark.support import session_for

WINDOW_MS = 10_000
T0 = 1_700_000_000_000


def written(start: int, page: str, count: int, length_ms: int = WINDOW_MS) -> WindowCount:
    return WindowCount(T0 + start, T0 + start + length_ms, page, count)


EXPECTED = {(T0, "/"): 3, (T0, "/cart"): 1, (T0 + WINDOW_MS, "/"): 2}


def test_checker_accepts_exactly_the_expected_windows() -> None:
    report = compare(
        EXPECTED,
        [written(0, "/", 3), written(0, "/cart", 1), written(WINDOW_MS, "/", 2)],
        WINDOW_MS,
    )
    assert report.ok and report.problems() == []
    assert (report.expected_windows, report.written_records) == (3, 3)


def test_checker_reports_a_duplicated_window_with_the_counts_written() -> None:
    report = compare(
        EXPECTED,
        [
            written(0, "/", 3),
            written(0, "/", 3),
            written(0, "/cart", 1),
            written(WINDOW_MS, "/", 2),
        ],
        WINDOW_MS,
    )
    assert not report.ok
    assert report.duplicated == {(T0, "/"): [3, 3]}
    assert report.problems() == [f"duplicated: window {T0} / written 2 times (counts [3, 3])"]


def test_checker_reports_a_missing_window() -> None:
    report = compare(EXPECTED, [written(0, "/", 3), written(WINDOW_MS, "/", 2)], WINDOW_MS)
    assert report.missing == {(T0, "/cart"): 1} and not report.duplicated
    assert report.problems() == [f"missing: window {T0} /cart (expected 1)"]


def test_checker_reports_a_wrong_count_and_an_unexpected_window() -> None:
    report = compare(
        EXPECTED,
        [
            written(0, "/", 4),
            written(0, "/cart", 1),
            written(WINDOW_MS, "/", 2),
            written(0, "/x", 1),
        ],
        WINDOW_MS,
    )
    assert report.wrong_count == {(T0, "/"): (3, 4)}
    assert report.unexpected == {(T0, "/x"): 1}
    assert report.problems() == [
        f"wrong count: window {T0} /: expected 3, written 4",
        f"unexpected: window {T0} /x written with count 1, no such events were logged",
    ]


def test_checker_reports_a_window_of_the_wrong_length() -> None:
    bad = written(WINDOW_MS, "/", 2, length_ms=5_000)
    report = compare(EXPECTED, [written(0, "/", 3), written(0, "/cart", 1), bad], WINDOW_MS)
    assert report.bad_length == [bad] and not report.ok


def test_ground_truth_counts_logged_events_per_window_and_page() -> None:
    clock = EventTime(T0, 25, 1_000)
    events = generate(7, 0, 1_000, clock)
    logged = [LoggedEvent(e, 0, n) for n, e in enumerate(events)]
    truth = ground_truth(logged, WINDOW_MS)
    assert sum(truth.values()) == 1_000
    assert all(start % WINDOW_MS == 0 for start, _ in truth)
    assert LoggedEvent.from_line(logged[5].to_line()) == logged[5]


def test_events_depend_only_on_the_seed_and_their_number() -> None:
    clock = EventTime(T0, 25, 1_000)
    whole = generate(7, 0, 300, clock)
    assert generate(7, 0, 100, clock) + generate(7, 100, 200, clock) == whole
    assert generate(8, 0, 300, clock) != whole
    # bounded lateness: each event within 1 s before its slot on the synthetic clock
    assert all(T0 + n * 25 - 1_000 <= e.ts <= T0 + n * 25 for n, e in enumerate(whole))
    assert flush_event(whole[-1].ts, 3_600_000).ts == whole[-1].ts + 3_600_000


def test_settings_that_could_make_events_late_are_refused() -> None:
    with pytest.raises(ValueError, match="watermark delay"):
        PipelineSettings(max_lateness_ms=3_000, chunk=100, step_ms=25, watermark_delay_s=5)


def first_record(consumer: Consumer) -> ConsumerRecord:
    polled: list[ConsumerRecord] = []

    def fetched() -> bool:
        polled.extend(r for rs in consumer.poll(timeout_ms=1_000).values() for r in rs)
        return bool(polled)

    wait_for("a record", fetched, 30)
    return polled[0]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("pipeline"), "spark_pipeline") as running:
        yield running


@pytest.fixture(scope="module")
def session() -> Iterator[SparkSession]:
    yield from session_for("pipeline")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.xdist_group("spark-pipeline")
def test_the_pipeline_stops_and_restarts_without_losing_or_double_counting_a_window(
    session: SparkSession, cluster: LocalCluster, tmp_path: Path
) -> None:
    settings = PipelineSettings()
    registry = ",".join(cluster.schema_registry_urls)
    result = run_pipeline(session, cluster.bootstrap_servers, registry, tmp_path, settings, print)
    assert result.report.problems() == [] and result.report.ok
    assert result.events == settings.events
    assert result.produced_while_stopped == settings.chunks_while_stopped * settings.chunk
    assert result.first_run_batches >= 1 and result.second_run_batches >= 1
    # every window of every page that had a click: 100 s of event time, 10 windows, 6 pages
    assert 50 <= result.report.expected_windows <= 66
    results = read_results(cluster.bootstrap_servers, PAGE_COUNTS)
    assert len(results) == result.report.expected_windows

    # the clicks are Avro in the registry's wire format: confluent-kafka's deserializer reads them
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": cluster.schema_registry_urls[0]}))
    logged = read_log(tmp_path / "clicks.jsonl")[:20]
    consumer = Consumer(cluster.bootstrap_servers, auto_offset_reset="earliest")
    try:
        for entry in logged:
            consumer.assign([(CLICKS, entry.partition)])
            consumer.seek((CLICKS, entry.partition), entry.offset)
            record = first_record(consumer)
            assert record.offset == entry.offset
            value = deserialize(record.value, SerializationContext(CLICKS, MessageField.VALUE))
            event = entry.event
            assert (value["user"], value["page"]) == (event.user, event.page)
            assert value["ts"] == datetime.fromtimestamp(event.ts / 1000, UTC)
    finally:
        consumer.close()
