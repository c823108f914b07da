"""Mirroring's pure rules: topic selection and naming, the configs copied, topic plans, offset
sync emission, offset translation (never past what was mirrored, never skipping), the
checkpoints and group offsets synced, lag arithmetic, and the ``raftlog mirror`` settings."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connect.api import SourceRecord
from connect.mirror import MirrorSourceTask, decode_sync, encode_sync, source_partition
from connect.mirror_checkpoint import _checkpoint_record, decode_checkpoint
from connect.mirror_cli import mirror_configs, topics_setting, worker_settings
from connect.mirror_core import (
    Checkpoint,
    OffsetSync,
    OffsetSyncStore,
    PartitionLag,
    PartitionSyncState,
    checkpoints,
    compile_patterns,
    configs_to_copy,
    group_selected,
    group_task,
    lag_report,
    offsets_to_sync,
    plan_topics,
    remote_topic,
    split_partitions,
    sync_needed,
    topic_selected,
    translate,
)
from connect.plugins import validate
from dataplane.client import BatchResult, RecordFuture, TopicPartition


@pytest.mark.parametrize(
    ("topic", "selected"),
    [("orders", True), ("events", True), ("orders-eu", False), ("logs.app", True),
     ("__consumer_offsets", False), ("connect-offsets", False), ("mm2-offset-syncs.b.internal",
     False), ("A.checkpoints.internal", False), ("B.orders", False), ("secret", False)],
)  # fmt: skip
def test_topic_selection(topic: str, selected: bool) -> None:
    include = compile_patterns("orders,events,logs\\..*,B\\..*,secret")
    exclude = compile_patterns("secret")
    assert topic_selected(topic, include, exclude, target_alias="B") is selected


def test_names_configs_and_groups() -> None:
    assert remote_topic("A", "orders") == "A.orders"
    assert configs_to_copy({
        "retention.ms": ("60000", False), "cleanup.policy": ("delete", True),
        "min.insync.replicas": ("2", False), "max.message.bytes": ("2000000", False),
    }) == {"retention.ms": "60000", "max.message.bytes": "2000000"}  # fmt: skip
    include, exclude = compile_patterns(".*"), compile_patterns("connect-.*,__.*")
    assert group_selected("billing", include, exclude)
    assert not group_selected("connect-sink", include, exclude)
    assert {group_task(f"g{i}", 3) for i in range(30)} == {0, 1, 2}
    assert group_task("billing", 3) == group_task("billing", 3)


def test_topic_plan_creates_and_grows_but_never_shrinks() -> None:
    plan = plan_topics({"a": 3, "b": 4, "c": 2}, {"A.b": 2, "A.c": 5, "other": 1}, "A")
    assert plan.create == {"A.a": 3}
    assert plan.grow == {"A.b": 4}


def test_partitions_are_dealt_round_robin() -> None:
    parts = [("b", 0), ("a", 1), ("a", 0)]
    assert split_partitions(parts, 2) == [[("a", 0), ("b", 0)], [("a", 1)]]
    assert split_partitions(parts, 10) == [[("a", 0)], [("a", 1)], [("b", 0)]]
    assert split_partitions([], 3) == []


def test_sync_emission_follows_mm2() -> None:
    state = PartitionSyncState()
    emitted = [sync_needed(state, u, u + 10, offset_lag_max=3) for u in range(8)]
    # the first record, then whenever translation would fall 3 records behind
    assert emitted == [True, False, False, False, True, False, False, False]
    assert sync_needed(state, 10, 18, 3), "a gap upstream (compacted source) is synced"
    assert sync_needed(state, 11, 5, 3), "a downstream rewind is synced"


def test_translation_uses_the_latest_sync_at_or_below() -> None:
    syncs = [OffsetSync("t", 0, 10, 100), OffsetSync("t", 0, 20, 130)]
    assert translate(syncs, 5) is None, "nothing known at or below: no translation"
    assert translate(syncs, 10) == 100
    assert translate(syncs, 15) == 101
    assert translate(syncs, 20) == 130
    assert translate(syncs, 500) == 131, "never past the last mirrored record + 1"


def test_store_drops_syncs_a_restart_superseded_and_stays_bounded() -> None:
    store = OffsetSyncStore(kept_max=8)
    for u in range(0, 100, 10):
        store.add(OffsetSync("t", 0, u, u + 1000))
    store.add(OffsetSync("t", 0, 50, 2000))  # the mirror restarted and re-sent from 50
    kept = store.syncs[("t", 0)]
    assert [s.upstream_offset for s in kept][-1] == 50
    assert store.translate("t", 0, 70) == 2001
    assert store.translate("t", 0, 40) == 1040
    for u in range(60, 10_000, 7):
        store.add(OffsetSync("t", 0, u, u + 3000))
    kept = store.syncs[("t", 0)]
    assert len(kept) == 8
    assert kept[0].upstream_offset == 0 and kept[-1].upstream_offset == 9993
    ups = [s.upstream_offset for s in kept]
    assert ups == sorted(ups)


@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=300),  # 0: no duplicate after a record
    st.integers(1, 20),
    st.data(),
)
def test_translated_offsets_never_skip_and_never_pass_the_mirror(
    duplicates: list[int], offset_lag_max: int, data: st.DataObject
) -> None:
    """A model of the target log: upstream records 0..n-1 mirrored in order, some re-sent after
    simulated restarts (at-least-once). Whatever upstream offset a group committed, the target
    from the translated offset on holds every upstream record from it on, and the translated
    offset is at most the target's end."""
    target: list[int] = []
    store = OffsetSyncStore(kept_max=16)
    state = PartitionSyncState()
    upstream = 0
    while upstream < len(duplicates):
        target.append(upstream)
        if sync_needed(state, upstream, len(target) - 1, offset_lag_max):
            store.add(OffsetSync("t", 0, upstream, len(target) - 1))
        rewind = min(duplicates[upstream], upstream)
        if rewind and data.draw(st.booleans()):  # a restart: resume after an earlier commit
            upstream -= rewind
            state = PartitionSyncState()
        upstream += 1
    committed = data.draw(st.integers(0, len(duplicates)))
    translated = store.translate("t", 0, committed)
    if translated is None:
        return
    assert translated <= len(target)
    assert set(range(committed, len(duplicates))) <= set(target[translated:])


def test_checkpoints_and_group_offsets_to_sync() -> None:
    store = OffsetSyncStore()
    store.add(OffsetSync("orders", 0, 0, 0))
    store.add(OffsetSync("orders", 1, 40, 45))
    found = checkpoints(
        "g", {("orders", 0): (7, "m"), ("orders", 1): (30, ""), ("orders", 2): (3, "")}, store
    )
    assert found == [Checkpoint("g", "orders", 0, 7, 1, "m")], "no sync at or below: left out"
    assert offsets_to_sync(found, {}, "A") == {("A.orders", 0): 1}
    assert offsets_to_sync(found, {("A.orders", 0): 1}, "A") == {}, "nothing newer"
    assert offsets_to_sync(found, {("A.orders", 0): 5}, "A") == {}, "never moved back"
    record = _checkpoint_record(found[0], "A")
    assert record.topic == "A.checkpoints.internal"
    assert record.key is not None and record.value is not None
    assert decode_checkpoint(record.key, record.value) == found[0]
    sync = OffsetSync("orders", 3, 10, 12)
    assert decode_sync(encode_sync(sync)) == sync


def test_lag_report() -> None:
    report = lag_report(
        [PartitionLag("b", 0, 100, 40), PartitionLag("a", 1, 5, 9), PartitionLag("a", 0, 7, 7)],
        "A",
    )
    assert report["replication_lag_records"] == 60
    rows = report["partitions"]
    assert isinstance(rows, list)
    assert [(r["target_topic"], r["partition"], r["lag_records"]) for r in rows] == [
        ("A.a", 0, 0), ("A.a", 1, 0), ("A.b", 0, 60),
    ]  # fmt: skip


def test_mirror_command_settings_validate() -> None:
    assert topics_setting("orders,ev.ents", None) == "orders,ev\\.ents"
    assert topics_setting(None, "bench-.*") == "bench-.*"
    source, checkpoint = mirror_configs(
        source_bootstrap="127.0.0.1:1", target_bootstrap="127.0.0.2:1", source_alias="A",
        target_alias="B", topics="orders", groups=".*", tasks_max=2, sync_group_offsets=True,
        settings={"offset.lag.max": 10, "emit.checkpoints.interval.ms": 500,
                  "request.timeout.ms": 5000},
    )  # fmt: skip
    assert source["offset.lag.max"] == 10 and "emit.checkpoints.interval.ms" not in source
    assert checkpoint["emit.checkpoints.interval.ms"] == 500 and "offset.lag.max" not in checkpoint
    assert source["request.timeout.ms"] == checkpoint["request.timeout.ms"] == 5000
    validate("MirrorSourceConnector", source)
    validate("MirrorCheckpointConnector", checkpoint)
    worker = worker_settings("127.0.0.2:1", "A", "http://127.0.0.197:0", {"session.timeout.ms": 3})
    assert worker["group.id"] == "A-mm2"
    assert worker["offset.storage.topic"] == "mm2-offsets.A.internal"


@given(
    st.lists(st.tuples(st.integers(1, 3), st.integers(1, 4)), min_size=1, max_size=60),
    st.integers(1, 10),
)
def test_a_run_acknowledged_at_once_decides_the_syncs_a_record_at_a_time_would(
    steps: list[tuple[int, int]], offset_lag_max: int
) -> None:
    """The worker gives the mirror a run of records (one producer batch's) through
    ``commit_records``; the syncs, the mirrored position and the offsets are those of calling
    ``commit_record`` for each record in turn. ``steps``: per record, its upstream gap (1: none,
    as after compaction or a transaction marker) and the run it ends (records are cut into runs
    where the draw is 1)."""

    def task() -> MirrorSourceTask:
        t = MirrorSourceTask()
        t.offset_lag_max = offset_lag_max
        return t

    partition = source_partition("A", "t", 0)
    upstream = 0
    records = []
    for gap, _ in steps:
        upstream += gap
        records.append(SourceRecord(partition, {"offset": upstream}, "A.t", b"v", None, 0))
    per_record, per_run = task(), task()
    downstream = 500
    run: list[SourceRecord] = []
    for record, (_, cut) in zip(records, steps, strict=True):
        run.append(record)
        if cut != 1 and record is not records[-1]:
            continue
        batch = BatchResult(TopicPartition("A.t", 0))
        futures = [RecordFuture(batch, n, (None, b"v", 0, ())) for n in range(len(run))]
        batch.succeed(base_offset=downstream, log_append_time_ms=-1)
        per_run.commit_records(run, futures)
        for r, f in zip(run, futures, strict=True):
            per_record.commit_record(r, f.result(0))
        downstream += len(run)
        run = []
    assert per_run._pending_syncs == per_record._pending_syncs
    assert per_run._mirrored == per_record._mirrored == {("t", 0): upstream + 1}
    assert per_run._sync_states == per_record._sync_states
