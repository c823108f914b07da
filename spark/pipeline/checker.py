"""The checker: the windows the job wrote to ``page-counts`` against the ground truth computed
from the generator's log.

Ground truth: every logged (acknowledged) event counted in its tumbling window
``[ts - ts % window, ... + window)`` per page; the flush event is not in the log. The job's
output is one record per (window, page) with value
``{"window_start_ms", "window_end_ms", "page", "count"}``, read as committed (the sink writes
in transactions). :func:`compare` is pure and names
each problem: a (window, page) written more than once (and the counts each copy carried), one
expected but never written, one written with the wrong count, one written that no logged
event explains, and a window of the wrong length.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dataplane.client import Consumer
from dataplane.tools.local_cluster import wait_for
from spark.pipeline.events import LoggedEvent

WindowKey = tuple[int, str]  # (window start, epoch ms; page)
READ_DEADLINE_S = 60.0
POLL_MS = 200


@dataclass(frozen=True, slots=True)
class WindowCount:
    """One record of ``page-counts``."""

    window_start_ms: int
    window_end_ms: int
    page: str
    count: int

    @property
    def key(self) -> WindowKey:
        return (self.window_start_ms, self.page)

    @staticmethod
    def from_json(value: bytes) -> WindowCount:
        d = json.loads(value)
        return WindowCount(
            int(d["window_start_ms"]), int(d["window_end_ms"]), str(d["page"]), int(d["count"])
        )


def ground_truth(logged: Iterable[LoggedEvent], window_ms: int) -> dict[WindowKey, int]:
    """Events per (window start, page)."""
    counts: Counter[WindowKey] = Counter()
    for entry in logged:
        ts = entry.event.ts
        counts[(ts - ts % window_ms, entry.event.page)] += 1
    return dict(counts)


@dataclass(frozen=True)
class CheckReport:
    expected_windows: int
    written_records: int
    duplicated: dict[WindowKey, list[int]] = field(default_factory=dict)  # the counts written
    missing: dict[WindowKey, int] = field(default_factory=dict)  # the count expected
    wrong_count: dict[WindowKey, tuple[int, int]] = field(default_factory=dict)  # (want, got)
    unexpected: dict[WindowKey, int] = field(default_factory=dict)  # the count written
    bad_length: list[WindowCount] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        problems = (self.duplicated, self.missing, self.wrong_count, self.unexpected)
        return not any(problems) and not self.bad_length

    def problems(self) -> list[str]:
        """One line per problem, windows named as ``<start ms> <page>``."""
        lines = [
            f"duplicated: window {s} {p} written {len(c)} times (counts {c})"
            for (s, p), c in sorted(self.duplicated.items())
        ]
        lines += [f"missing: window {s} {p} (expected {n})" for (s, p), n in self.missing.items()]
        lines += [
            f"wrong count: window {s} {p}: expected {want}, written {got}"
            for (s, p), (want, got) in sorted(self.wrong_count.items())
        ]
        lines += [
            f"unexpected: window {s} {p} written with count {n}, no such events were logged"
            for (s, p), n in sorted(self.unexpected.items())
        ]
        lines += [
            f"bad window: {w.page} [{w.window_start_ms}, {w.window_end_ms})"
            for w in self.bad_length
        ]
        return lines


def compare(
    expected: dict[WindowKey, int], written: Sequence[WindowCount], window_ms: int
) -> CheckReport:
    """Every problem of ``written`` against ``expected`` (see the module docstring)."""
    by_key: dict[WindowKey, list[int]] = {}
    for record in written:
        by_key.setdefault(record.key, []).append(record.count)
    duplicated = {k: counts for k, counts in by_key.items() if len(counts) > 1}
    wrong = {
        k: (expected[k], counts[0])
        for k, counts in by_key.items()
        if k in expected and len(counts) == 1 and counts[0] != expected[k]
    }
    return CheckReport(
        expected_windows=len(expected),
        written_records=len(written),
        duplicated=duplicated,
        missing={k: n for k, n in sorted(expected.items()) if k not in by_key},
        wrong_count=wrong,
        unexpected={k: counts[0] for k, counts in by_key.items() if k not in expected},
        bad_length=[w for w in written if w.window_end_ms - w.window_start_ms != window_ms],
    )


def read_log(path: Path) -> list[LoggedEvent]:
    """The generator's log: one JSON line per acknowledged event."""
    with path.open() as lines:
        return [LoggedEvent.from_line(line) for line in lines if line.strip()]


def _wait_for_markers(
    bootstrap_servers: Sequence[str], consumer: Consumer, tps: list[tuple[str, int]]
) -> None:
    """Until the last stable offsets reach the high watermarks: the job's last commit returned
    once the coordinator accepted it, the markers that make its records readable follow. A
    transaction still open after the deadline (a job stopped in the middle of a batch) holds
    its partitions' last stable offsets: the checker then reads up to them and reports what is
    missing."""
    with Consumer(list(bootstrap_servers)) as uncommitted:
        try:
            wait_for(
                "the markers of the job's transactions",
                lambda: consumer.end_offsets(tps) == uncommitted.end_offsets(tps),
                READ_DEADLINE_S,
            )
        except TimeoutError:
            return


def read_results(bootstrap_servers: Sequence[str], topic: str) -> list[WindowCount]:
    """Every committed record of ``topic`` (read_committed, up to the last stable offsets),
    as window counts: what the job's readers see. The sink is exactly-once, so a window
    written twice is a duplicate the checker reports, not the sink's expected retry."""
    written: list[WindowCount] = []
    with Consumer(
        list(bootstrap_servers), auto_offset_reset="earliest", isolation_level="read_committed"
    ) as consumer:
        tps = [(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        _wait_for_markers(bootstrap_servers, consumer, tps)
        ends = consumer.end_offsets(tps)

        def read_to_end() -> bool:
            for records in consumer.poll(timeout_ms=POLL_MS).values():
                written.extend(WindowCount.from_json(r.value or b"{}") for r in records)
            return all(consumer.position(tp) >= end for tp, end in ends.items())

        wait_for(f"every record of {topic}", read_to_end, READ_DEADLINE_S)
    return written
