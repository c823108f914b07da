"""pysyncobj's journal, meta file and snapshots (through MetadataLog, fsync on) under power loss:
a one-voter log appends, compacts and appends again on the forgetful filesystem (chaos.lazyfs);
the power goes after a durability point of a reference run, the unsynced state is dropped (all of
it, or with a torn prefix of each file's last write), and the log reopened on what survived
must start, lead, and hold every entry it had acknowledged, in order, with nothing that was not
appended. pysyncobj runs on its own threads, so the durability points of two runs are not the
same ones (how appends batch into journal syncs depends on the ticks): the crash points are the
reference run's counts, each landing wherever that run's k-th durability point falls.

Address 127.0.0.24 is this module's (one voter at a time, a free port per voter); a seeded sample
of crash points runs in ``make test``, every one with ``RAFTLOG_POWER_LOSS_ALL=1``.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from pathlib import Path

import pytest

from chaos.lazyfs import CutMode, ForgetfulFS, FsyncEvent, available
from metadata_quorum.raft import SNAPSHOT_FILE, MetadataLog, MetadataLogError, RaftOptions
from tests.metadata_quorum.raft_node import ListMachine, free_port

pytestmark = [
    pytest.mark.skipif(available() is not None, reason=f"no FUSE: {available()}"),
    pytest.mark.slow,
]

HOST = "127.0.0.24"
EVERY_POINT = os.environ.get("RAFTLOG_POWER_LOSS_ALL") == "1"
SAMPLE = 4  # crash points per mode
ROUNDS = 4
PER_ROUND = 8
LEAD_TIMEOUT_S = 20.0
APPEND_TIMEOUT_S = 20.0
PAYLOADS = [f"entry-{n:03d}".encode() for n in range(ROUNDS * PER_ROUND)]


def _wait(probe: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if probe():  # type: ignore[operator]
            return
        time.sleep(0.01)  # poll interval, bounded by the deadline
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def _open(data_dir: Path, address: str, machine: ListMachine) -> MetadataLog:
    log = MetadataLog(address, [address], data_dir, machine, options=RaftOptions())
    try:
        _wait(log.is_leader, LEAD_TIMEOUT_S, "leadership")
    except BaseException:
        log.close()
        raise
    return log


def workload(data_dir: Path, address: str, acknowledged: list[bytes]) -> None:
    """Rounds of pipelined appends; a compaction after the second (snapshot + journal cut)."""
    log = _open(data_dir, address, ListMachine())
    try:
        for round_ in range(ROUNDS):
            payloads = PAYLOADS[round_ * PER_ROUND : (round_ + 1) * PER_ROUND]
            futures = [log.append(payload) for payload in payloads]
            for payload, future in zip(payloads, futures, strict=True):
                future.result(timeout=APPEND_TIMEOUT_S)
                acknowledged.append(payload)
            if round_ == 1:
                log.compact()
                _wait((data_dir / SNAPSHOT_FILE).exists, APPEND_TIMEOUT_S, "a snapshot")
    finally:
        log.close()


def check_recovered(data_dir: Path, address: str, acknowledged: list[bytes]) -> None:
    machine = ListMachine()
    log = _open(data_dir, address, machine)
    try:
        # the no-op of the new term is applied once it leads: every committed entry is too
        applied = list(machine.entries)
    finally:
        log.close()
    assert applied == PAYLOADS[: len(applied)], f"not the appended entries in order: {applied}"
    assert len(applied) >= len(acknowledged), (
        f"{len(acknowledged) - len(applied)} acknowledged entries lost: "
        f"{len(applied)} applied of {len(acknowledged)} acknowledged"
    )


def crash_at(tmp_path: Path, point: int, mode: CutMode) -> str | None:
    acknowledged: list[bytes] = []
    run = tmp_path / f"{mode}-{point}"
    address = f"{HOST}:{free_port(HOST)}"
    with ForgetfulFS(run / "backing", run / "mount") as fs:
        fs.power_off_after(point)
        data_dir = fs.mountpoint / "metadata"
        # the power goes: the fsync error stops the node, its appends fail
        with contextlib.suppress(OSError, MetadataLogError, AssertionError, TimeoutError):
            workload(data_dir, address, acknowledged)
        cut = fs.cut_power(seed=point, mode=mode)
        try:
            check_recovered(data_dir, address, acknowledged)
        except (AssertionError, OSError, MetadataLogError) as error:
            return f"after durability point {point} ({mode}, torn {cut.torn}): {error!r}"
    return None


def _points(trace: list[FsyncEvent]) -> list[int]:
    """Every crash point (``RAFTLOG_POWER_LOSS_ALL=1``), or a seeded sample: the last, two just
    before a journal sync (acknowledgements in flight), one anywhere."""
    if EVERY_POINT:
        return list(range(len(trace) + 1))
    rng = random.Random(24)
    before_journal_sync = [k for k, event in enumerate(trace) if event.kind == "fdatasync"]
    sample = {len(trace), *rng.sample(before_journal_sync, 2)}
    sample.update(rng.sample(range(len(trace)), SAMPLE - len(sample)))
    return sorted(sample)


# The voter's tick thread outlives the power: its journal close meets the unmounted filesystem
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_acknowledged_entries_survive_power_loss(tmp_path: Path) -> None:
    with ForgetfulFS(tmp_path / "reference-backing", tmp_path / "reference") as fs:
        acknowledged: list[bytes] = []
        workload(fs.mountpoint / "metadata", f"{HOST}:{free_port(HOST)}", acknowledged)
        trace = fs.fsync_trace()
    total = len(trace)
    assert acknowledged == PAYLOADS and total > 10, f"{total} durability points"
    assert {"fdatasync", "fsync", "fsyncdir"} <= {event.kind for event in trace}, trace
    failures = [
        failure
        for mode in ("all", "torn")
        for point in _points(trace)
        if (failure := crash_at(tmp_path, point, mode)) is not None
    ]
    assert not failures, f"{len(failures)} crash points of {total} failed:\n" + "\n".join(failures)
