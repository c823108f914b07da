"""The transactions workload's harness side (``raftlog chaos run --workload transactions``).

- `TransformerFleet` starts the transformer processes (chaos/transformer.py), each with its own
  transactional id ``chaos-transformer-<i>`` and its Kafka client (`TransformerSettings.clients`
  round-robin: raftlog's over gRPC, or librdkafka over the KAFKA listener), owned like the
  nodes (`popen_owned`: they die with the harness, and are stopped by their pid); a
  `transformer-kill` fault SIGKILLs one and its heal starts the next incarnation, whose
  ``init_transactions`` fences the dead one.
- `coordinator_leader` / `partition_leader`: the victims of `txn-coordinator-kill` (the leader
  of the ``__transaction_state`` partition of a transformer's transactional id, Kafka's hash)
  and `output-leader-kill`.
- After the producers stop: `wait_for_drain` lets the transformers consume the input to its end
  (the group's committed offsets at the input's end offsets), then the fleet stops (SIGTERM: the
  current transaction ends as meant) and `wait_for_stable` waits until no transaction is open on
  the output (last stable offset = high watermark); `read_output` reads the output both ways and
  the group's offsets; `read_output_batches` reads the output's batches and markers from a
  replica's segment files once the nodes are stopped.
- `read_transactions` turns the transformers' JSON lines into `Transaction`s.

Against a secure cluster (``--secure``, chaos/secure.py) the transformers connect as the run's
workload user (`TransformerSettings.client_config`, passed as ``--command-config``) and the
harness's reads as the admin (`TransformerSettings.security`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from chaos.schedule import PlannedFault
from chaos.txn_history import (
    OutputPartition,
    Transaction,
    TxnBatch,
    TxnClient,
    TxnFinal,
    TxnInput,
    TxnOutput,
)
from dataplane.client import AdminClient, Consumer, TopicPartition
from dataplane.tools.local_cluster import wait_for
from dataplane.tools.owned_process import popen_owned
from metadata_quorum.security.channels import ClientSecurity
from raftlog.batch import iter_batches
from raftlog.errors import CorruptRecordError, InvalidRecordError, KafkaError
from raftlog.log import partition_dir_name
from raftlog.txn import read_marker

log = logging.getLogger(__name__)

TRANSACTION_STATE_TOPIC = "__transaction_state"
STOP_TIMEOUT_S = 30.0  # a transformer's last transaction after SIGTERM
UNKNOWN_EXIT_STATUS = 3  # chaos/transformer.py: a transaction's outcome is unknown
TRANSFORMER_ID_PREFIX = "chaos-transformer"  # transformer i's transactional id: <prefix>-<i>
CLIENT_ERRORS = (KafkaError, grpc.RpcError, TimeoutError, OSError)
VICTIM_TIMEOUT_S = 10.0  # as long as a controller-kill waits for the active controller


@dataclass(frozen=True)
class TransformerSettings:
    """What every transformer of a run shares."""

    bootstrap: Sequence[str]
    input_topic: str
    input_partitions: int
    output_topic: str
    output_partitions: int
    group: str
    seed: int
    directory: Path  # history files and logs
    t0: float  # the run's time zero on time.monotonic()
    commit_records: int = 50
    commit_ms: int = 500
    abort_fraction: float = 0.1
    transaction_timeout_ms: int = 10_000
    kafka_bootstrap: Sequence[str] = ()  # the KAFKA listeners, for librdkafka transformers
    clients: Sequence[TxnClient] = ("ours",)  # assigned round-robin: transformer i gets i % len
    # a secure cluster: the transformers' client properties (the workload user), and how the
    # harness's own reads of the input and the output connect (the admin)
    client_config: Path | None = None
    security: ClientSecurity | None = None


class TransformerFleet:
    """The run's transformer processes, started, killed and restarted by pid."""

    def __init__(
        self, settings: TransformerSettings, count: int, repo: Path, python: str = sys.executable
    ) -> None:
        self.settings = settings
        self.ids = [f"{TRANSFORMER_ID_PREFIX}-{i}" for i in range(1, count + 1)]
        self.clients: dict[str, TxnClient] = {
            transactional_id: settings.clients[i % len(settings.clients)]
            for i, transactional_id in enumerate(self.ids)
        }
        self._repo = repo
        self._python = python
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.incarnations: dict[str, int] = dict.fromkeys(self.ids, 0)
        self._down: set[str] = set()  # killed by a fault, started again by its heal
        settings.directory.mkdir(parents=True, exist_ok=True)

    def history_path(self, transactional_id: str) -> Path:
        return self.settings.directory / f"{transactional_id}.jsonl"

    def _argv(self, transactional_id: str) -> list[str]:
        s = self.settings
        client = self.clients[transactional_id]
        bootstrap = s.kafka_bootstrap if client == "confluent" else s.bootstrap
        security = [] if s.client_config is None else ["--command-config", str(s.client_config)]
        return [
            self._python, "-m", "chaos.transformer", "--client", client,
            "--bootstrap", ",".join(bootstrap),
            "--input", s.input_topic, "--output", s.output_topic,
            "--output-partitions", str(s.output_partitions), "--group", s.group,
            "--transactional-id", transactional_id,
            "--incarnation", str(self.incarnations[transactional_id]), "--seed", str(s.seed),
            "--history", str(self.history_path(transactional_id)), "--t0", repr(s.t0),
            "--commit-records", str(s.commit_records), "--commit-ms", str(s.commit_ms),
            "--abort-fraction", str(s.abort_fraction),
            "--transaction-timeout-ms", str(s.transaction_timeout_ms), *security,
        ]  # fmt: skip

    def start(self, transactional_id: str) -> None:
        """Start the transformer's next incarnation (a no-op while one runs)."""
        proc = self.procs.get(transactional_id)
        if proc is not None and proc.poll() is None:
            return
        if proc is not None:
            self.incarnations[transactional_id] += 1
        log_path = self.settings.directory / f"{transactional_id}.log"
        with log_path.open("ab") as out:
            self.procs[transactional_id] = popen_owned(
                self._argv(transactional_id), cwd=self._repo, stdout=out, stderr=subprocess.STDOUT
            )
        self._down.discard(transactional_id)

    def start_all(self) -> None:
        for transactional_id in self.ids:
            self.start(transactional_id)

    def kill(self, index: int) -> tuple[str, Callable[[], None]]:
        """SIGKILL transformer `index` (modulo the fleet); (its id, the heal: start it again)."""
        transactional_id = self.ids[index % len(self.ids)]
        proc = self.procs.get(transactional_id)
        self._down.add(transactional_id)
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        return transactional_id, lambda: self.start(transactional_id)

    def exited(self) -> list[tuple[str, int]]:
        """(id, exit status) of transformers that ended though no fault killed them; each is
        started again (the next incarnation resolves a transaction left unknown)."""
        ended = []
        for transactional_id, proc in sorted(self.procs.items()):
            code = proc.poll()
            if code is None or transactional_id in self._down:
                continue
            ended.append((transactional_id, code))
            self.start(transactional_id)
        return ended

    def stop(self) -> list[tuple[str, int]]:
        """SIGTERM every transformer (it ends its transaction), SIGKILL one that does not exit
        within STOP_TIMEOUT_S; (id, exit status) of those that did not exit 0."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        failed = []
        for transactional_id, proc in sorted(self.procs.items()):
            try:
                code = proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait(timeout=10)
            if code != 0 and transactional_id not in self._down:
                failed.append((transactional_id, code))
        self._down = set(self.ids)
        return failed

    def kill_all(self) -> None:
        """The last resort on the way out: SIGKILL whatever still runs, by pid."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)

    def transactions(self) -> list[Transaction]:
        found: list[Transaction] = []
        for transactional_id in self.ids:
            path = self.history_path(transactional_id)
            if path.exists():
                found += read_transactions(path.read_text(encoding="utf-8").splitlines())
        return found


def read_transactions(lines: Sequence[str]) -> list[Transaction]:
    """The transactions of a transformer's history lines (chaos/transformer.py): a ``prepared``
    line with its ``ended`` line, or alone (the process died: outcome unknown). A torn last
    line (SIGKILL while writing) is skipped."""
    prepared: dict[tuple[str, int, int], dict[str, Any]] = {}
    ended: dict[tuple[str, int, int], dict[str, Any]] = {}
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        key = (entry["transformer"], entry["incarnation"], entry["serial"])
        (prepared if entry["event"] == "prepared" else ended)[key] = entry
    out = []
    for key, entry in prepared.items():
        end = ended.get(key, {})
        offsets = end.get("offsets") or [None] * len(entry["outputs"])
        out.append(
            Transaction(
                transformer=key[0], incarnation=key[1], serial=key[2],
                inputs=[TxnInput(**i) for i in entry["inputs"]],
                outputs=[
                    TxnOutput(partition=o["partition"], value=o["value"], offset=offset)
                    for o, offset in zip(entry["outputs"], offsets, strict=True)
                ],
                intent=entry["intent"], outcome=end.get("outcome", "unknown"),
                start_s=entry["start_s"], end_s=end.get("end_s"), error=end.get("error", ""),
                client=entry.get("client", "ours"),
            )
        )  # fmt: skip
    return out


# -- victims ------------------------------------------------------------------------------------
def partition_leader(admin: AdminClient, topic: str, partition: int) -> int:
    """The leader of `topic`-`partition` (-1: none, or the topic has no such partition)."""
    described = admin.describe_topics([topic])[topic].partitions
    return next((p.leader for p in described if p.partition == partition), -1)


def coordinator_leader(admin: AdminClient, transactional_id: str) -> int:
    """The node leading `transactional_id`'s ``__transaction_state`` partition: its
    transaction coordinator (-1: the topic is not there yet)."""
    if TRANSACTION_STATE_TOPIC not in admin.list_topics():
        return -1
    described = admin.describe_topics([TRANSACTION_STATE_TOPIC])[TRANSACTION_STATE_TOPIC]
    partition = state_partition(transactional_id, len(described.partitions))
    return next((p.leader for p in described.partitions if p.partition == partition), -1)


def state_partition(transactional_id: str, partitions: int) -> int:
    """Kafka's ``Utils.abs(transactionalId.hashCode()) % partitions``: the partition of
    ``__transaction_state`` that holds the id (Java's String.hashCode over UTF-16 code units;
    the chaos harness reaches the cluster only through its client, so it computes it here)."""
    h = 0
    data = transactional_id.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    signed = h - (1 << 32) if h >= 1 << 31 else h
    return (0 if signed == -(1 << 31) else abs(signed)) % max(1, partitions)


# -- the end of the run -------------------------------------------------------------------------
def input_ends(
    bootstrap: Sequence[str], topic: str, partitions: int, security: ClientSecurity | None = None
) -> dict[int, int]:
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with Consumer(list(bootstrap), request_timeout_ms=10_000, security=security) as reader:
        return {tp.partition: end for tp, end in reader.end_offsets(tps).items()}


def group_offsets(admin: AdminClient, group: str, topic: str) -> dict[int, int]:
    offsets = admin.list_group_offsets(group)
    return {tp.partition: o.offset for tp, o in offsets.items() if tp.topic == topic}


def describe_group(admin: AdminClient, group: str, topic: str) -> list[str]:
    """The group as its coordinator sees it, a line per member (its state, what it owns, its
    target) and its committed offsets of `topic`: what a drain that timed out leaves to read."""
    try:
        described = admin.describe_groups([group])[group]
        offsets = group_offsets(admin, group, topic)
    except CLIENT_ERRORS as error:
        return [f"group {group}: not described: {error}"]
    committed = dict(sorted(offsets.items()))
    lines = [
        f"group {group}: {described.state}, epoch {described.group_epoch} (assignment epoch "
        f"{described.assignment_epoch}), committed offsets of {topic}: {committed}"
    ]
    for m in described.members:
        owns = sorted(tp.partition for tp in m.assignment)
        target = sorted(tp.partition for tp in m.target_assignment)
        lines.append(
            f"  member {m.member_id} ({m.client_id}) epoch {m.member_epoch}, {m.state}: "
            f"owns {owns}, target {target}"
        )
    return lines


def wait_for_stable(
    bootstrap: Sequence[str],
    topic: str,
    partitions: int,
    timeout_s: float,
    security: ClientSecurity | None = None,
) -> None:
    """Until no transaction is open on `topic`: every partition's last stable offset at its
    high watermark. Raises TimeoutError."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with (
        Consumer(list(bootstrap), request_timeout_ms=10_000, security=security) as uncommitted,
        Consumer(
            list(bootstrap),
            request_timeout_ms=10_000,
            isolation_level="read_committed",
            security=security,
        ) as committed,
    ):
        wait_for(
            f"no open transaction on {topic}",
            lambda: committed.end_offsets(tps) == uncommitted.end_offsets(tps),
            timeout_s,
        )


def read_output(
    bootstrap: Sequence[str],
    topic: str,
    partitions: int,
    timeout_s: float,
    security: ClientSecurity | None = None,
) -> list[OutputPartition]:
    """Every output partition read read_committed and read_uncommitted from the start."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    committed, stable = _read_all(bootstrap, tps, "read_committed", timeout_s, security)
    uncommitted, high = _read_all(bootstrap, tps, "read_uncommitted", timeout_s, security)
    with Consumer(list(bootstrap), request_timeout_ms=10_000, security=security) as reader:
        starts = reader.beginning_offsets(tps)
    return [
        OutputPartition(
            partition=tp.partition,
            log_start_offset=starts[tp],
            last_stable_offset=stable[tp],
            high_watermark=high[tp],
            committed=committed[tp],
            uncommitted=uncommitted[tp],
        )
        for tp in tps
    ]


def _read_all(
    bootstrap: Sequence[str],
    tps: list[TopicPartition],
    isolation: Any,
    timeout_s: float,
    security: ClientSecurity | None,
) -> tuple[dict[TopicPartition, list[tuple[int, str]]], dict[TopicPartition, int]]:
    records: dict[TopicPartition, list[tuple[int, str]]] = {tp: [] for tp in tps}
    with Consumer(
        list(bootstrap), request_timeout_ms=10_000, max_poll_records=5_000,
        isolation_level=isolation, security=security,
    ) as reader:  # fmt: skip
        ends = reader.end_offsets(tps)
        reader.assign(tps)
        reader.seek_to_beginning(*tps)

        def read() -> bool:
            for tp, batch in reader.poll(200).items():
                records[tp].extend(
                    (r.offset, (r.value or b"").decode()) for r in batch if r.offset < ends[tp]
                )
            return all(reader.position(tp) >= ends[tp] for tp in tps)

        wait_for(f"the output read {isolation}", read, timeout_s)
    return records, ends


def read_output_batches(directory: Path) -> list[TxnBatch]:
    """The batches of one partition directory's segments, markers parsed (nodes stopped)."""
    batches = []
    for segment in sorted(directory.glob("*.log")):
        data = segment.read_bytes()
        for position, header in iter_batches(data):
            control = None
            if header.is_control and header.is_transactional:
                control = "commit" if read_marker(data, position).commit else "abort"
            batches.append(
                TxnBatch(
                    base_offset=header.base_offset, last_offset=header.last_offset,
                    producer_id=header.producer_id, producer_epoch=header.producer_epoch,
                    transactional=header.is_transactional, control=control,
                )
            )  # fmt: skip
    return batches


def wait_for_drain(
    fleet: TransformerFleet,
    admin: AdminClient,
    ends: dict[int, int],
    timeout_s: float,
    on_exit: Callable[[str, int], None],
) -> None:
    """Until the transformers' group has committed the input's end offsets (`ends`), starting
    again a transformer that exits meanwhile (`on_exit` hears of it). Raises TimeoutError."""
    settings = fleet.settings

    def drained() -> bool:
        for transactional_id, code in fleet.exited():
            on_exit(transactional_id, code)
        try:
            offsets = group_offsets(admin, settings.group, settings.input_topic)
        except CLIENT_ERRORS as error:
            log.info("OffsetFetch: %s", error)
            return False
        return all(offsets.get(p, 0) >= end for p, end in ends.items())

    wait_for("the transformers to consume the whole input", drained, timeout_s)


# -- the workload, as the runner drives it --------------------------------------------------------
DRAIN_TIMEOUT_S = 120.0
STABLE_TIMEOUT_S = 90.0  # beyond the transformers' transaction.timeout.ms
READ_TIMEOUT_S = 60.0


class TxnWorkload:
    """The transactions workload of one run: its output topic, its transformers, its victims
    and its final state. `problem` records what the harness could not do (a finding)."""

    def __init__(
        self,
        settings: TransformerSettings,
        count: int,
        repo: Path,
        problem: Callable[[str], None],
        say: Callable[[str], None],
    ) -> None:
        self.settings = settings
        self.fleet = TransformerFleet(settings, count, repo)
        self._problem = problem
        self._say = say
        self.leaders: dict[int, int] = {}  # output partition -> its leader at the final read

    def start(self) -> None:
        self.fleet.start_all()

    # fault hooks (chaos/faults.py FaultInjector.inject)
    def victim(self, admin: AdminClient, fault: PlannedFault) -> int:
        """The node a txn-coordinator-kill or output-leader-kill kills (-1: nobody known within
        VICTIM_TIMEOUT_S: the partition stayed leaderless, or no broker answered). A lookup
        that fails is asked again: the fault may come while an earlier one's election is on."""
        transactional_id = self.fleet.ids[fault.node % len(self.fleet.ids)]

        def lookup() -> int | None:
            try:
                if fault.kind == "output-leader-kill":
                    node = partition_leader(admin, self.settings.output_topic, fault.partition)
                else:
                    node = coordinator_leader(admin, transactional_id)
            except CLIENT_ERRORS as error:
                log.warning("the victim of %s: %s", fault.kind, error)
                return None
            return node if node >= 0 else None

        try:
            return wait_for(f"the victim of {fault.kind}", lookup, VICTIM_TIMEOUT_S)
        except TimeoutError:
            return -1

    def kill_transformer(self, fault: PlannedFault) -> tuple[list[int], str, Callable[[], None]]:
        transactional_id, heal = self.fleet.kill(fault.node)
        return [], f"SIGKILL transformer {transactional_id}", heal

    def watch(self) -> None:
        """A transformer that exits on its own is started again; an exit other than the one for
        an unknown outcome (chaos/transformer.py) is a finding."""
        for transactional_id, code in self.fleet.exited():
            self._exited(transactional_id, code)

    def _exited(self, transactional_id: str, code: int) -> None:
        log_path = self.settings.directory / f"{transactional_id}.log"
        if code == UNKNOWN_EXIT_STATUS:
            self._say(f"transformer {transactional_id} left a transaction unknown; started again")
        else:
            self._problem(
                f"transformer {transactional_id} exited on its own (status {code}); see {log_path}"
            )

    # the end of the run
    def finish(self, admin: AdminClient) -> TxnFinal:
        """Drain, stop the transformers, wait until no transaction is open, read the output."""
        s = self.settings
        drained = True
        try:
            ends = input_ends(s.bootstrap, s.input_topic, s.input_partitions, s.security)
            wait_for_drain(self.fleet, admin, ends, DRAIN_TIMEOUT_S, self._exited)
        except (*CLIENT_ERRORS, TimeoutError) as error:
            log.warning("the transformers did not drain the input: %s", error)
            drained = False
            for line in describe_group(admin, s.group, s.input_topic):
                self._say(line)
        for transactional_id, code in self.fleet.stop():
            self._problem(f"transformer {transactional_id} did not stop cleanly (status {code})")
        try:
            wait_for_stable(
                s.bootstrap, s.output_topic, s.output_partitions, STABLE_TIMEOUT_S, s.security
            )
        except TimeoutError as error:
            self._problem(f"a transaction stayed open on {s.output_topic}: {error}")
        outputs: list[OutputPartition] = []
        offsets: dict[int, int] | None = None
        try:
            outputs = read_output(
                s.bootstrap, s.output_topic, s.output_partitions, READ_TIMEOUT_S, s.security
            )
            offsets = group_offsets(admin, s.group, s.input_topic)
            described = admin.describe_topics([s.output_topic])[s.output_topic].partitions
            self.leaders = {p.partition: p.leader for p in described}
        except (*CLIENT_ERRORS, TimeoutError) as error:
            self._problem(f"the output could not be read: {error}")
        return TxnFinal(
            input_topic=s.input_topic,
            output_topic=s.output_topic,
            group=s.group,
            outputs=outputs,
            group_offsets=offsets,
            drained=drained,
            incarnations={t: n + 1 for t, n in self.fleet.incarnations.items()},
        )

    def with_batches(self, final: TxnFinal, data_dirs: dict[int, Path]) -> TxnFinal:
        """`final` with each output partition's batches read from its final leader's segment
        files (or another node's when the leader's cannot be read); nodes stopped."""
        outputs = []
        for read in final.outputs:
            part = read
            leader = self.leaders.get(part.partition, -1)
            name = partition_dir_name(final.output_topic, part.partition)
            for node_id in sorted(data_dirs, key=lambda n: n != leader):
                directory = data_dirs[node_id] / name
                if not directory.is_dir():
                    continue
                try:
                    batches = read_output_batches(directory)
                except (CorruptRecordError, InvalidRecordError) as error:
                    self._problem(f"node {node_id}, {name}: {error}")
                    continue
                part = read.model_copy(update={"batches": batches, "batches_node": node_id})
                break
            outputs.append(part)
        return final.model_copy(update={"outputs": outputs})

    def transactions(self) -> list[Transaction]:
        return self.fleet.transactions()

    def close(self) -> None:
        self.fleet.kill_all()
