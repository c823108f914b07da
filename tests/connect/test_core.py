"""The pure core of Connect: assignment, config validation, config records, offset bookkeeping,
and the file connectors' tasks against real files (no cluster)."""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connect.api import OffsetReader, SinkRecord, SourceRecord, SourceTask
from connect.assignment import (
    Assignment,
    ConnectorTaskId,
    WorkerMetadata,
    WorkToAssign,
    assign,
)
from connect.config_state import Change, ConfigState, task_records
from connect.file import READ_BYTES, FileStreamSinkTask, FileStreamSource, FileStreamSourceTask
from connect.offsets import OffsetKeys, SubmittedRecords, offset_key
from connect.plugins import ConfigInvalid, validate
from connect.runtime import Runtime, Status
from connect.storage import FileOffsetStore
from connect.worker import FAILED, RUNNING, UNASSIGNED, WorkerSourceTask, WorkerTask
from connect.worker_config import WorkerConfig
from dataplane.client import BatchResult, RecordFuture, RecordMetadata, TopicPartition
from raftlog.errors import ErrorCode, KafkaError


def tid(name: str, task: int) -> ConnectorTaskId:
    return ConnectorTaskId(name, task)


# -- assignment --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("members", "work", "expected"),
    [
        (
            ["w1"],
            WorkToAssign(("a",), (tid("a", 0), tid("a", 1))),
            {"w1": (("a",), (tid("a", 0), tid("a", 1)))},
        ),
        (  # connectors first, then tasks continue the round where the connectors stopped
            ["w2", "w1"],
            WorkToAssign(("b", "a"), (tid("a", 0), tid("a", 1), tid("b", 0))),
            {
                "w1": (("a",), (tid("a", 0), tid("b", 0))),
                "w2": (("b",), (tid("a", 1),)),
            },
        ),
        (
            ["w1", "w2", "w3"],
            WorkToAssign(("a",), (tid("a", 0), tid("a", 1), tid("a", 2), tid("a", 3))),
            {
                "w1": (("a",), (tid("a", 2),)),
                "w2": ((), (tid("a", 0), tid("a", 3))),
                "w3": ((), (tid("a", 1),)),
            },
        ),
        (["w1", "w2"], WorkToAssign(()), {"w1": ((), ()), "w2": ((), ())}),
    ],
)
def test_assignment_is_round_robin_over_sorted_members(
    members: list[str],
    work: WorkToAssign,
    expected: dict[str, tuple[tuple[str, ...], tuple[ConnectorTaskId, ...]]],
) -> None:
    metadata = {m: WorkerMetadata(f"http://{m}", 7) for m in members}
    result = assign(members[0], metadata, work, 7)
    assert {m: (a.connectors, a.tasks) for m, a in result.items()} == expected
    assert all(a.leader == members[0] and a.config_offset == 7 for a in result.values())
    assert all(a.leader_url == f"http://{members[0]}" for a in result.values())
    every = [t for a in result.values() for t in a.tasks]
    assert sorted(every) == sorted(work.tasks), "each task exactly once"


def test_a_leader_behind_a_member_assigns_nothing_and_says_so() -> None:
    metadata = {"w1": WorkerMetadata("u1", 3), "w2": WorkerMetadata("u2", 5)}
    result = assign("w1", metadata, WorkToAssign(("a",), (tid("a", 0),)), 3)
    assert all(a.error == 1 and not a.connectors and not a.tasks for a in result.values())


def test_assignment_and_metadata_round_trip_their_bytes() -> None:
    assignment = Assignment("w1", "http://x:1", 9, ("a",), (tid("a-b", 2),))
    assert Assignment.decode(assignment.encode()) == assignment
    metadata = WorkerMetadata("http://x:1", 4)
    assert WorkerMetadata.decode(metadata.encode()) == metadata


# -- config validation -------------------------------------------------------------------------
SOURCE = {"connector.class": "FileStreamSource", "file": "/tmp/in.txt", "topic": "t"}


def test_a_valid_config_parses_with_kafka_names_and_string_numbers() -> None:
    validated = validate("src", {**SOURCE, "tasks.max": "3", "batch.size": "10"})
    assert validated.kind == "source"
    assert validated.config.tasks_max == 3
    kafka_name = "org.apache.kafka.connect.file.FileStreamSinkConnector"
    sink = validate("snk", {"connector.class": kafka_name, "file": "/tmp/o", "topics": "a,b"})
    assert sink.kind == "sink"


@pytest.mark.parametrize(
    ("config", "fields"),
    [
        ({**SOURCE, "tasks.max": 0}, ["tasks.max"]),
        ({**SOURCE, "batch.size": "many"}, ["batch.size"]),
        ({**SOURCE, "bogus": 1}, ["bogus"]),
        ({"connector.class": "FileStreamSource", "file": "x"}, ["topic"]),
        ({"connector.class": "FileStreamSource", "topic": "t"}, ["set exactly one"]),
        ({"connector.class": "NoSuchConnector"}, ["connector.class"]),
        ({"topic": "t"}, ["connector.class"]),
        ({**SOURCE, "tasks.max": -1, "batch.size": 10**9}, ["tasks.max", "batch.size"]),
        ({**SOURCE, "name": "other"}, ["name"]),
    ],
)
def test_an_invalid_config_names_each_invalid_field(
    config: dict[str, Any], fields: list[str]
) -> None:
    with pytest.raises(ConfigInvalid) as raised:
        validate("src", config)
    assert len(raised.value.errors) == len(fields)
    for field, error in zip(fields, raised.value.errors, strict=True):
        assert field in error
    assert str(raised.value).startswith("Connector configuration is invalid")


def test_file_source_splits_its_files_over_tasks() -> None:
    connector = FileStreamSource()
    connector.start(validate("s", {**SOURCE, "file": None, "files": "a,b,c"}).config)
    assert [c["files"] for c in connector.task_configs(2)] == ["a,c", "b"]
    assert [c["files"] for c in connector.task_configs(5)] == ["a", "b", "c"]


# -- connect-configs records -------------------------------------------------------------------
def test_config_records_replay_into_connectors_tasks_and_states() -> None:
    state = ConfigState()
    changes = []
    records: list[tuple[str, Any]] = [
        ("connector-a", {"properties": {"x": 1}}),
        ("target-state-a", {"state": "STARTED"}),
        ("task-a-0", {"properties": {"t": 0}}),  # pending until the commit
        *task_records("a", [{"t": 0}, {"t": 1}]).items(),
        ("connector-a", {"properties": {"x": 2}}),
        ("target-state-a", {"state": "PAUSED"}),
        ("restart-a", {"request": "r1"}),
        ("task-a-0", {"properties": {"t": 9}}),
        ("commit-a", {"tasks": 2}),  # task 1 of this round is missing: ignored
        ("connector-a", None),
    ]
    for offset, (key, value) in enumerate(records):
        changes.append(state.apply(key, value, offset)[0])
        if key == "commit-a" and offset == 5:
            assert state.task_ids("a") == [tid("a", 0), tid("a", 1)]
            assert state.work().tasks == (tid("a", 0), tid("a", 1))
        if key == "target-state-a" and value["state"] == "PAUSED":
            assert state.target_state("a") == "PAUSED"
    assert changes == [
        Change.ASSIGNMENT, Change.NONE, Change.NONE, Change.NONE, Change.NONE,
        Change.ASSIGNMENT, Change.CONFIG, Change.TARGET_STATE, Change.RESTART, Change.NONE,
        Change.NONE, Change.ASSIGNMENT,
    ]  # fmt: skip
    assert state.connectors == {} and state.tasks == {} and state.offset == len(records)


# -- source offsets ----------------------------------------------------------------------------
def test_an_offset_is_committable_only_after_every_earlier_record_of_its_partition() -> None:
    submitted = SubmittedRecords()
    a1 = submitted.submit("A", {"position": 1})
    a2 = submitted.submit("A", {"position": 2})
    b1 = submitted.submit("B", {"position": 10})
    a3 = submitted.submit("A", {"position": 3})
    submitted.ack(a2)
    submitted.ack(b1)
    assert submitted.committable() == {"B": {"position": 10}}, "a1 still outstanding"
    submitted.ack(a3)
    assert submitted.committable() == {}
    submitted.ack(a1)
    assert submitted.committable() == {"A": {"position": 3}}
    assert submitted.outstanding == 0 and submitted.pending() == 0
    assert submitted.committable() == {}


class BatchingProducer:
    """Stands in for the producer's ``send``: records go to real producer batches
    (``BatchResult``), ``per_batch`` of them each; the test completes the batches."""

    def __init__(self, per_batch: int) -> None:
        self.per_batch = per_batch
        self.batches: list[BatchResult] = []
        self._in_last = per_batch

    def send(self, topic: str, value: bytes | None, key: bytes | None, **_: Any) -> RecordFuture:
        if self._in_last == self.per_batch:
            self.batches.append(BatchResult(TopicPartition(topic, 0)))
            self._in_last = 0
        self._in_last += 1
        return RecordFuture(self.batches[-1], self._in_last - 1, (key, value, 0, ()))


class QuietTask(SourceTask):
    """A task the test feeds by hand (``WorkerSourceTask._send``), not through ``poll``."""

    def start(self, config: dict[str, Any], offsets: OffsetReader) -> None:
        pass

    def poll(self) -> list[SourceRecord]:
        return []

    def stop(self) -> None:
        pass


class CommittingTask(QuietTask):
    def __init__(self) -> None:
        self.committed: list[tuple[int, int]] = []  # (the record's position, its offset)

    def commit_record(self, record: SourceRecord, metadata: RecordMetadata) -> None:
        self.committed.append((record.source_offset["position"], metadata.offset))


def source_worker(task: SourceTask) -> WorkerSourceTask:
    config = WorkerConfig.model_validate({"bootstrap.servers": ["127.0.0.1:1"]})
    return WorkerSourceTask(
        tid("c", 0), config, lambda *_: None, task, {}, FileOffsetStore(Path("unused"))
    )


def lines(first: int, count: int) -> list[SourceRecord]:
    return [
        SourceRecord({"file": "f"}, {"position": n}, "t", value=b"x")
        for n in range(first, first + count)
    ]


def test_a_source_task_s_records_are_acknowledged_per_producer_batch_in_order() -> None:
    """One callback per batch, not per record; a batch completed before the next poll sent
    more records to it is watched again (the records join it after its callback ran)."""
    task = CommittingTask()
    worker = source_worker(task)
    producer = BatchingProducer(per_batch=3)
    worker._send(producer, lines(0, 4))  # type: ignore[arg-type]
    first, second = producer.batches
    second.succeed(base_offset=103, log_append_time_ms=-1)
    assert worker._submitted.outstanding == 3
    assert worker._submitted.committable() == {}, "records 0-2 are not acknowledged yet"
    first.succeed(base_offset=100, log_append_time_ms=-1)
    assert worker._submitted.committable() == {offset_key("c", {"file": "f"}): {"position": 3}}
    worker._send(producer, lines(4, 1))  # type: ignore[arg-type]  # joins the completed batch
    assert producer.batches[-1] is second, "the record did not join the completed batch"
    assert worker._submitted.outstanding == 0, "a completed batch's new record was not acked"
    assert task.committed == [(3, 103), (0, 100), (1, 101), (2, 102), (4, 104)]
    assert worker._batches == {}, "a completed batch's records are kept"


def test_records_sharing_a_source_partition_object_share_one_offset_key_encoding() -> None:
    worker = source_worker(QuietTask())
    asked: list[dict[str, Any]] = []
    encode = worker._offset_keys

    def counting(partition: Mapping[str, Any]) -> str:
        asked.append(dict(partition))
        return encode(partition)

    worker._offset_keys = counting  # type: ignore[assignment]
    shared = {"file": "f"}
    records = [SourceRecord(shared, {"position": n}, "t", value=b"x") for n in range(3)]
    records += lines(3, 2)  # equal partitions, each its own object
    worker._send(BatchingProducer(per_batch=10), records)  # type: ignore[arg-type]
    assert asked == [{"file": "f"}] * 3, "one encoding for the shared object, one per other"
    assert list(worker._submitted._by_partition) == [offset_key("c", {"file": "f"})]
    assert worker._submitted.outstanding == 5


def test_a_failed_batch_fails_the_task_and_its_records_stay_unacknowledged() -> None:
    worker = source_worker(QuietTask())
    producer = BatchingProducer(per_batch=2)
    worker._send(producer, lines(0, 2))  # type: ignore[arg-type]
    producer.batches[0].fail(KafkaError(ErrorCode.MESSAGE_TOO_LARGE, "too large"))
    assert worker._submitted.outstanding == 2
    with pytest.raises(RuntimeError, match="was not delivered"):
        worker._raise_send_error()


def test_records_of_one_partition_in_one_batch_are_one_submission() -> None:
    """A run (consecutive records, one source partition, one producer batch) is one entry
    carrying its last offset and its count; interleaved partitions and a new batch start new
    runs, and a run is acknowledged only when its batch is."""
    worker = source_worker(QuietTask())
    producer = BatchingProducer(per_batch=4)
    a, b = {"file": "a"}, {"file": "b"}
    records = [
        SourceRecord(p, {"position": n}, "t", value=b"x")
        for p, n in [(a, 1), (a, 2), (b, 1), (a, 3), (a, 4), (a, 5)]
    ]
    worker._send(producer, records)  # type: ignore[arg-type]
    queues = worker._submitted._by_partition
    key_a, key_b = offset_key("c", a), offset_key("c", b)
    assert [(r.offset, r.count) for r in queues[key_a]] == [
        ({"position": 2}, 2), ({"position": 3}, 1), ({"position": 5}, 2),
    ]  # fmt: skip  # a's third and fourth records are split by the batch boundary
    assert [(r.offset, r.count) for r in queues[key_b]] == [({"position": 1}, 1)]
    assert worker._submitted.outstanding == 6 and worker._submitted.pending() == 6
    first, second = producer.batches
    second.succeed(base_offset=10, log_append_time_ms=-1)
    assert worker._submitted.outstanding == 4 and worker._submitted.committable() == {}
    first.succeed(base_offset=0, log_append_time_ms=-1)
    assert worker._submitted.committable() == {key_a: {"position": 5}, key_b: {"position": 1}}
    assert worker._submitted.outstanding == 0 and worker._batches == {}


def test_a_split_batch_acknowledges_the_runs_before_its_first_failed_part() -> None:
    worker = source_worker(QuietTask())
    producer = BatchingProducer(per_batch=4)
    a, b = {"file": "a"}, {"file": "b"}
    records = [
        SourceRecord(p, {"position": n}, "t", value=b"x") for p, n in [(a, 1), (a, 2), (b, 1)]
    ]
    worker._send(producer, records)  # type: ignore[arg-type]
    (batch,) = producer.batches
    left, right = BatchResult(TopicPartition("t", 0)), BatchResult(TopicPartition("t", 0))
    batch.split([(0, left), (2, right)])
    left.succeed(base_offset=0, log_append_time_ms=-1)
    right.fail(KafkaError(ErrorCode.MESSAGE_TOO_LARGE, "too large"))
    assert worker._submitted.committable() == {offset_key("c", a): {"position": 2}}
    assert worker._submitted.outstanding == 1, "b's record was not delivered"
    with pytest.raises(RuntimeError, match="was not delivered"):
        worker._raise_send_error()


def test_a_submission_counts_its_records() -> None:
    submitted = SubmittedRecords()
    run = submitted.submit("A", {"position": 9}, count=3)
    assert submitted.outstanding == 3 and submitted.pending() == 3
    submitted.ack(run)
    assert submitted.outstanding == 0 and submitted.committable() == {"A": {"position": 9}}
    with pytest.raises(ValueError, match="at least one record"):
        submitted.submit("A", {"position": 9}, count=0)


class StoppedMidStart(WorkerTask):
    """A task whose start runs until the test releases it, then reports RUNNING (as a late
    start would) and raises (as when a ``stop`` closed the client ``start`` was using)."""

    def __init__(self, config: WorkerConfig, reports: list[tuple[str, str]]) -> None:
        super().__init__(
            tid("c", 0), config, lambda _c, task, state, *_: reports.append((task, state))
        )
        self.started = threading.Event()
        self.release = threading.Event()

    def execute(self) -> None:
        self.started.set()
        self.release.wait(30)
        self.report(RUNNING)
        raise RuntimeError("the client is closed")


def test_a_task_that_raises_after_it_was_asked_to_stop_is_not_failed() -> None:
    reports: list[tuple[str, str]] = []
    task = StoppedMidStart(WorkerConfig.model_validate({"bootstrap.servers": ["h:1"]}), reports)
    task.start()
    assert task.started.wait(10)
    task.stop()
    task.release.set()
    assert task.join(10)
    assert reports == [("0", RUNNING)], "logged, not FAILED"

    # the same error from a task not asked to stop fails it
    reports.clear()
    running = StoppedMidStart(WorkerConfig.model_validate({"bootstrap.servers": ["h:1"]}), reports)
    running.release.set()
    running.start()
    assert running.join(10)
    assert [state for _, state in reports] == [RUNNING, FAILED]


def test_a_task_cancelled_after_the_graceful_timeout_reports_nothing_more() -> None:
    """The runtime gives up on a task after task.shutdown.graceful.timeout.ms and cancels it:
    its late RUNNING and its failure cannot overwrite a newer instance's state; the runtime
    itself reports the task UNASSIGNED when the worker is leaving."""
    config = WorkerConfig.model_validate(
        {"bootstrap.servers": ["h:1"], "task.shutdown.graceful.timeout.ms": 0}
    )
    statuses: list[tuple[str, str | None]] = []

    def record(_connector: str, task: str, status: Status | None) -> None:
        statuses.append((task, status.state if status else None))

    runtime = Runtime(config, "w", FileOffsetStore(Path("unused")), record, lambda _name: None)
    task_reports: list[tuple[str, str]] = []
    task = StoppedMidStart(config, task_reports)
    runtime.tasks[task.id] = task
    task.start()
    assert task.started.wait(10)
    runtime.stop_tasks([task.id], unassigned=True)
    assert task.cancelled
    assert statuses == [("0", UNASSIGNED)]
    task.release.set()
    assert task.join(10)
    assert task_reports == [], "the orphan reported nothing"


def test_file_offset_store_survives_a_reload(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    store = FileOffsetStore(path)
    store.commit({offset_key("c", {"filename": "f"}): {"position": 42}})
    assert FileOffsetStore(path).get("c", {"filename": "f"}) == {"position": 42}
    assert FileOffsetStore(path).get("c", {"filename": "g"}) is None
    assert [p.name for p in tmp_path.iterdir()] == ["offsets.json"], "no temp file left"


# -- the file tasks ----------------------------------------------------------------------------
class Offsets(OffsetReader):
    def __init__(self, offsets: dict[str, int]) -> None:
        self.offsets = offsets

    def offset(self, partition: Mapping[str, Any]) -> dict[str, Any] | None:
        position = self.offsets.get(partition["filename"])
        return None if position is None else {"position": position}


def source_task(
    path: Path, offsets: dict[str, int], batch: int = 100, max_line_bytes: int = 64
) -> FileStreamSourceTask:
    task = FileStreamSourceTask()
    config = {"topic": "t", "files": str(path), "batch.size": batch, "poll.interval.ms": 1,
              "max.line.bytes": max_line_bytes}  # fmt: skip
    task.start(config, Offsets(offsets))
    return task


def test_file_source_emits_complete_lines_and_resumes_at_a_position(tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    assert source_task(path, {}).poll() == [], "a missing file is waited for"
    path.write_bytes(b"one\ntwo\r\nthr")
    task = source_task(path, {})
    records = task.poll()
    assert [r.value for r in records] == [b"one", b"two"]
    assert [r.source_offset["position"] for r in records] == [4, 9]
    assert records[0].source_partition == {"filename": str(path)} and records[0].key is None
    assert task.poll() == [], "the partial line waits for its newline"
    with path.open("ab") as f:
        f.write(b"ee\nfour\n")
    assert [r.value for r in task.poll()] == [b"three", b"four"]
    resumed = source_task(path, {str(path): 9}, batch=1)
    assert [r.value for r in resumed.poll()] == [b"three"], "batch.size bounds a poll"
    assert [r.value for r in resumed.poll()] == [b"four"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")), max_size=30),
    st.booleans(),
    st.integers(1, 7),
)
def test_polls_give_every_complete_line_once_with_the_position_after_it(
    lines: list[bytes], partial_tail: bool, batch: int
) -> None:
    """Against a model: the file's complete lines (a trailing \\r dropped), in order, each with
    the byte position after its newline, however ``batch.size`` cuts the polls; the partial
    last line is not given."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "in.txt"
        data = b"".join(line + b"\n" for line in lines) + (b"tail" if partial_tail else b"")
        path.write_bytes(data)
        task = source_task(path, {}, batch=batch)
        polled: list[SourceRecord] = []
        while records := task.poll():
            assert len(records) <= batch
            polled += records
    expected, position = [], 0
    for line in lines:
        position += len(line) + 1
        expected.append((line[:-1] if line.endswith(b"\r") else line, position))
    assert [(r.value, r.source_offset["position"]) for r in polled] == expected


def test_a_poll_of_1_kib_lines_fills_its_batch_and_a_line_longer_than_one_read_comes_whole(
    tmp_path: Path,
) -> None:
    path = tmp_path / "in.txt"
    line = b"x" * 1023 + b"\n"
    path.write_bytes(line * 1500)
    task = source_task(path, {}, batch=1000, max_line_bytes=1024 * 1024)
    assert [len(r.value or b"") for r in task.poll()] == [1023] * 1000
    long_line = b"y" * (READ_BYTES + READ_BYTES // 2)
    path.write_bytes(long_line + b"\n" + line)
    task = source_task(path, {}, batch=10, max_line_bytes=2 * READ_BYTES)
    assert [r.value for r in task.poll()] == [long_line, line[:-1]]


def test_offset_keys_remember_offset_key_per_source_partition() -> None:
    keys = OffsetKeys("c")
    first = keys({"filename": "f"})
    assert first == offset_key("c", {"filename": "f"})
    assert keys({"filename": "f"}) is first, "the same partition's key is not encoded again"
    assert keys({"topic": "t", "partition": 1}) == offset_key("c", {"partition": 1, "topic": "t"})
    assert keys({"files": ["a", "b"]}) == offset_key("c", {"files": ["a", "b"]}), "unhashable"
    assert keys({"p": 1}) != keys({"p": True}), "equal as dict keys, not as JSON"
    keys.MEMO_MAX = 2  # a full memo starts again
    third = keys({"filename": "g"})
    assert third == offset_key("c", {"filename": "g"}) and keys({"filename": "g"}) is third


def test_file_source_refuses_a_line_longer_than_max_line_bytes(tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    path.write_bytes(b"x" * 100)
    with pytest.raises(ValueError, match=r"max\.line\.bytes"):
        source_task(path, {}).poll()


def test_file_sink_appends_values_as_lines(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    task = FileStreamSinkTask()
    task.start({"file": str(path)})
    task.put([SinkRecord("t", 0, i, None, v, 0) for i, v in enumerate([b"a", None, b"b"])])
    task.flush({("t", 0): 3})
    task.stop()
    assert path.read_bytes() == b"a\nb\n"


# -- reconciliation (standalone herder, a recording runtime) -----------------------------------
class RecordingRuntime:
    """Stands in for the runtime: records what the herder asks it to do."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def start_connector(self, name: str, config: dict[str, Any], target: str) -> list[Any]:
        self.calls.append(("start_connector", name, target))
        return [{"files": f} for f in str(config["files"]).split(",")]

    def stop_connector(self, name: str) -> None:
        self.calls.append(("stop_connector", name))

    def set_target_state(self, name: str, state: str) -> None:
        self.calls.append(("target", name, state))

    def start_task(
        self, task: ConnectorTaskId, config: Any, task_config: Any, target: str,
        task_count: int | None = None,
    ) -> None:  # fmt: skip
        self.calls.append(("start_task", str(task), task_config["files"], target))

    def stop_tasks(self, ids: Any, *, unassigned: bool = False) -> None:
        self.calls.extend(("stop_task", str(t)) for t in ids)

    def take(self) -> list[tuple[str, ...]]:
        calls, self.calls = self.calls, []
        return calls


def test_standalone_herder_reconciles_creates_pauses_restarts_updates_and_deletes(
    tmp_path: Path,
) -> None:
    from connect.herder import ConnectError  # noqa: PLC0415
    from connect.standalone import StandaloneHerder  # noqa: PLC0415
    from connect.worker_config import WorkerConfig  # noqa: PLC0415

    config = WorkerConfig.model_validate(
        {"bootstrap.servers": "127.0.0.1:1", "offset.storage.file.filename": str(tmp_path / "o")}
    )
    herder = StandaloneHerder(config, "w")
    runtime = RecordingRuntime()
    herder.runtime = runtime  # type: ignore[assignment]
    src = {"connector.class": "FileStreamSource", "files": "a,b", "topic": "t", "tasks.max": 2}
    created, info = herder.put_config("src", src)
    assert created and [t["task"] for t in info["tasks"]] == [0, 1]
    assert runtime.take() == [
        ("start_connector", "src", "STARTED"),
        ("start_task", "src-0", "a", "STARTED"),
        ("start_task", "src-1", "b", "STARTED"),
    ]
    herder.set_target_state("src", "PAUSED")
    assert runtime.take() == [("target", "src", "PAUSED")] * 3
    herder.set_target_state("src", "STARTED")
    assert runtime.take() == [("target", "src", "STARTED")] * 3
    herder.restart("src")
    assert [c[0] for c in runtime.take()] == ["start_connector", "start_task", "start_task"]
    assert herder.put_config("src", src)[0] is False
    assert runtime.take() == [], "the same config changes nothing"
    herder.put_config("src", {**src, "files": "a"})
    assert runtime.take() == [
        ("start_connector", "src", "STARTED"),
        ("stop_task", "src-1"),  # one task fewer
        ("start_task", "src-0", "a", "STARTED"),  # restarted once, with the new configs
    ]
    with pytest.raises(ConnectError) as raised:
        herder.create("src", src)
    assert raised.value.status == 409
    herder.delete("src")
    assert runtime.take() == [("stop_connector", "src"), ("stop_task", "src-0")]
    assert herder.connectors() == []
    with pytest.raises(ConnectError) as missing:
        herder.status("src")
    assert (missing.value.status, missing.value.message) == (404, "Connector src not found")


@pytest.mark.parametrize(
    ("listeners", "exposed"),
    [("http://127.0.0.5:8083", False), ("http://localhost:0", False), ("http://[::1]:1", False),
     ("http://0.0.0.0:8083", True), ("http://10.1.2.3:8083", True),
     ("http://connect.example.com:8083", True)],
)  # fmt: skip
def test_the_rest_api_takes_any_address_and_warns_beyond_loopback(
    listeners: str, exposed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    from connect.rest import warn_if_exposed  # noqa: PLC0415
    from connect.worker_config import WorkerConfig  # noqa: PLC0415

    values = {"bootstrap.servers": "127.0.0.1:1", "listeners": listeners}
    config = WorkerConfig.model_validate(values)
    assert config.listeners == listeners
    with caplog.at_level("WARNING", logger="connect.rest"):
        assert warn_if_exposed(config.rest_host) is exposed
    warned = [r for r in caplog.records if "without authentication" in r.getMessage()]
    assert len(warned) == (1 if exposed else 0)


@pytest.mark.parametrize("listeners", ["https://127.0.0.1:1", "http://127.0.0.1", "127.0.0.1:1"])
def test_listeners_must_be_one_http_url(listeners: str) -> None:
    from pydantic import ValidationError  # noqa: PLC0415

    from connect.worker_config import WorkerConfig  # noqa: PLC0415

    with pytest.raises(ValidationError):
        WorkerConfig.model_validate({"bootstrap.servers": "127.0.0.1:1", "listeners": listeners})
