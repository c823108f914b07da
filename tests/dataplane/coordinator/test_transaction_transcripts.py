"""Golden transcripts of the transaction coordinator's pure state (``TransactionShard``), in the
style of etcd's ``datadriven`` tests: each ``transcripts/transactions/<name>.txt`` holds steps
(``> command``) each followed by what it did, as plain text:

    > the step
      record <id>: ...     every record the step emitted (already replayed), in order
      tombstone <id>       a removed id
      = result             the step's answer, or ERROR_NAME: message

The steps are the input, the rest is the spec: ``pytest <this file> --update-txn-transcripts``
rewrites every output from the current code; review the diff line by line before keeping it.

Commands (times are plain ints, ms; partitions are ``topic-partition``):

    init <id> timeout=<ms> now=<ms> [expect=<pid>/<epoch>]
    add <id> pid=<pid> epoch=<epoch> now=<ms> <tp>,...
    offsets <id> pid=<pid> epoch=<epoch> group=<group> now=<ms>
    verify <id> pid=<pid> epoch=<epoch> <tp>
    end <id> pid=<pid> epoch=<epoch> commit|abort now=<ms>
    markers                     the prepared transactions' marker jobs
    complete <id> now=<ms>      the markers of <id>'s job are written
    abort-timed-out now=<ms>
    expire now=<ms>
    describe <id>
    list [states=<s>,...] [pids=<pid>,...]
    reload                      replay every record so far into a fresh shard: the same state?
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from dataplane.coordinator.transaction_state import (
    TopicPartition,
    TransactionShard,
    TxnLimits,
    TxnMetadata,
    decode,
)
from protos import transaction_pb2 as tpb
from raftlog.errors import KafkaError

TRANSCRIPTS = Path(__file__).parent / "transcripts" / "transactions"
LIMITS = TxnLimits(max_timeout_ms=900_000, id_expiration_ms=86_400_000)


def _shard() -> TransactionShard:
    ids = itertools.count(1000)
    return TransactionShard(lambda: next(ids), LIMITS, offsets_partitions=50)


def _tps(text: str) -> list[TopicPartition]:
    out: list[TopicPartition] = []
    for item in text.split(","):
        topic, _, partition = item.rpartition("-")
        out.append((topic, int(partition)))
    return out


def _show_tps(tps: frozenset[TopicPartition]) -> str:
    return ",".join(f"{t}-{p}" for t, p in sorted(tps)) or "-"


def _show(meta: TxnMetadata) -> str:
    previous = "" if meta.previous_producer_id < 0 else f" previous_pid={meta.previous_producer_id}"
    return (
        f"pid={meta.producer_id} epoch={meta.producer_epoch} last_epoch={meta.last_producer_epoch}"
        f"{previous} state={meta.state.kafka_name} timeout={meta.timeout_ms} "
        f"partitions={_show_tps(meta.partitions)} start={meta.start_ms} "
        f"update={meta.last_update_ms}"
    )


class Driver:
    def __init__(self) -> None:
        self.shard = _shard()
        self.log: list[tuple[bytes, bytes | None]] = []

    def step(self, line: str) -> list[str]:
        words = line.split()
        command, args = words[0], words[1:]
        kv = {k: v for k, _, v in (a.partition("=") for a in args if "=" in a)}
        plain = [a.strip('"') for a in args if "=" not in a]  # "" is the empty id
        try:
            result = self._run(command, plain, kv)
        except KafkaError as error:
            result = f"{error.error.name}: {error.message}"
        out = []
        for key, value in self.shard.take_emitted():
            self.log.append((key, value))
            tid = tpb.TransactionLogKey.FromString(key).transactional_id
            out.append(
                f"tombstone {tid}"
                if value is None
                else f"record {tid}: {_show(decode(tid, value))}"
            )
        return [*out, f"= {result}"]

    def _run(self, command: str, plain: list[str], kv: dict[str, str]) -> str:
        s = self.shard
        now = int(kv.get("now", "0"))
        if command == "init":
            expected = None
            if "expect" in kv:
                given_pid, _, given_epoch = kv["expect"].partition("/")
                expected = (int(given_pid), int(given_epoch))
            pid, epoch = s.init_producer_id(plain[0], int(kv["timeout"]), now, expected)
            return f"pid={pid} epoch={epoch}"
        if command == "add":
            s.add_partitions(plain[0], int(kv["pid"]), int(kv["epoch"]), _tps(plain[1]), now)
            return "NONE"
        if command == "offsets":
            topic, partition = s.add_offsets(
                plain[0], int(kv["pid"]), int(kv["epoch"]), kv["group"], now
            )
            return f"{topic}-{partition}"
        if command == "verify":
            return s.verify(plain[0], int(kv["pid"]), int(kv["epoch"]), _tps(plain[1])[0]).name
        if command == "end":
            s.end_transaction(plain[0], int(kv["pid"]), int(kv["epoch"]), plain[1] == "commit", now)
            return "NONE"
        if command == "markers":
            jobs = s.pending_markers()
            return (
                "; ".join(
                    f"{j.transactional_id} {'commit' if j.commit else 'abort'} pid={j.producer_id} "
                    f"epoch={j.producer_epoch} on {_show_tps(j.partitions)}"
                    for j in jobs
                )
                or "none"
            )
        if command == "complete":
            (job,) = [j for j in s.pending_markers() if j.transactional_id == plain[0]]
            return str(s.complete(job, now)).lower()
        if command == "abort-timed-out":
            return ",".join(s.abort_timed_out(now)) or "none"
        if command == "expire":
            return ",".join(s.expire_ids(now)) or "none"
        if command == "describe":
            return _show(s.describe(plain[0]))
        if command == "list":
            states = [x for x in kv.get("states", "").split(",") if x]
            pids = [int(x) for x in kv.get("pids", "").split(",") if x]
            return ",".join(m.transactional_id for m in s.listing(states, pids)) or "none"
        if command == "reload":
            fresh = _shard()
            for key, value in self.log:
                fresh.replay(key, value)
            same = fresh.transactions == s.transactions
            verdict = "the same state" if same else "A DIFFERENT STATE"
            return f"{len(fresh.transactions)} ids, {verdict}"
        raise AssertionError(f"unknown command {command!r}")


def run(text: str) -> str:
    """The transcript of the steps of ``text`` (its ``>`` lines; comments ``#`` kept)."""
    driver = Driver()
    out: list[str] = []
    for line in text.splitlines():
        if line.startswith("#") or (not line.strip() and out and out[-1] == ""):
            out.append(line)
        elif line.startswith("> "):
            if out and out[-1] != "" and not out[-1].startswith("#"):
                out.append("")
            out.append(line)
            out += [f"  {o}" for o in driver.step(line[2:])]
    return "\n".join(out).strip("\n") + "\n"


@pytest.mark.parametrize("path", sorted(TRANSCRIPTS.glob("*.txt")), ids=lambda p: p.stem)
def test_transcript(path: Path, request: pytest.FixtureRequest) -> None:
    expected = path.read_text()
    actual = run(expected)
    if request.config.getoption("--update-txn-transcripts"):
        path.write_text(actual)
        return
    assert actual == expected, f"{path.name} changed; diff it, or --update-txn-transcripts"


def test_there_are_transcripts() -> None:
    assert len(list(TRANSCRIPTS.glob("*.txt"))) >= 3
