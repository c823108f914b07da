"""What a chaos run recorded: the plain data the checker judges and the report draws.

The runner records every operation the workloads attempted (with the time it started and the
time its outcome was known), every fault window, periodic samples of the cluster's metadata and,
after healing and recovery, the final state: each partition's records as its leader serves them,
each replica's batches as they are on disk, each controller's image. Times are seconds since the
run started (monotonic clock). Everything is a frozen pydantic model, so a history is written to
and read back from JSON unchanged (``report.json`` holds it) and the checker, a pure function,
can be fed hand-made histories in tests.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from chaos.lazyfs import CutMode
from chaos.txn_history import Transaction, TxnFinal, TxnSummary

FaultKind = Literal[
    "kill",
    "pause",
    "partition",
    "controller-kill",
    "leader-kill",
    "disk-full",
    "reassign",
    "membership",
    "power-loss",
    "power-loss-all",
    # the transactions workload's own (chaos/transactions.py)
    "txn-coordinator-kill",
    "output-leader-kill",
    "transformer-kill",
]
FAULT_KINDS: tuple[FaultKind, ...] = (
    "kill",
    "pause",
    "partition",
    "controller-kill",
    "leader-kill",
    "disk-full",
    "reassign",
    "membership",
    "power-loss",
)
# Every node loses power at once (a rack, a data centre): opt-in, as with Kafka's default
# durability it may lose the last acknowledged writes (the checker reports that loss, it does not
# fail the run for it; see chaos/checker.py and `Durability`).
CORRELATED_FAULT_KINDS: tuple[FaultKind, ...] = ("power-loss-all",)
# The kinds that cut power: each node's data directory is then a forgetful filesystem
# (chaos/power.py, chaos/lazyfs).
POWER_FAULT_KINDS: tuple[FaultKind, ...] = ("power-loss", "power-loss-all")
# Kinds that need the transactions workload (``--workload transactions``): SIGKILL the leader of
# a transformer's transaction coordinator (its ``__transaction_state`` partition), the leader of
# an output partition, a transformer process.
TXN_FAULT_KINDS: tuple[FaultKind, ...] = (
    "txn-coordinator-kill",
    "output-leader-kill",
    "transformer-kill",
)
ALL_FAULT_KINDS: tuple[FaultKind, ...] = (*FAULT_KINDS, *CORRELATED_FAULT_KINDS, *TXN_FAULT_KINDS)
# How the cluster makes an acknowledged record durable (docs/chaos.md, "Durability modes"):
# "default" is Kafka's (acks=all: in the ISR's logs, fsync in the background); "fsync" sets the
# broker default log.flush.interval.messages=1 (each topic's flush.messages), so every replica
# fsyncs an append before it counts towards the high watermark.
Durability = Literal["default", "fsync"]
DURABILITIES: tuple[Durability, ...] = ("default", "fsync")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Write(_Model):
    """One record a producer sent with acks=all: unique `value`, `seq` = its send order.

    ``ok`` means acknowledged: the broker answered with `offset`. Not ok (an error, a timeout,
    the run ending first) means indeterminate: the record may or may not have been stored, but
    never twice.
    """

    producer: str
    seq: int
    topic: str
    partition: int
    value: str
    start_s: float
    end_s: float | None = None  # None: no outcome before the run ended
    ok: bool = False
    offset: int | None = None
    error: str = ""


class Consumed(_Model):
    """One record a consumer-group member received from `Consumer.poll`."""

    member: str
    topic: str
    partition: int
    offset: int
    value: str
    time_s: float


class Commit(_Model):
    """An offset commit a member sent: `offset` is the next record it will read."""

    member: str
    topic: str
    partition: int
    offset: int
    start_s: float
    end_s: float
    ok: bool
    error: str = ""


class CommittedObservation(_Model):
    """The group's committed offset of one partition as an OffsetFetch answered at `time_s`
    (-1: nothing committed yet)."""

    topic: str
    partition: int
    offset: int
    time_s: float


class AdminOp(_Model):
    """A topic created or deleted by the admin workload (each create uses a fresh name)."""

    op: Literal["create", "delete"]
    topic: str
    start_s: float
    end_s: float
    ok: bool
    error: str = ""


class PowerCut(_Model):
    """What one node's forgetful filesystem dropped at a power cut (chaos.lazyfs.CutReport):
    ``mode`` "all" drops every unsynced byte, "torn" keeps a seeded, sector-aligned prefix of each
    file's last unsynced write (``torn``: path -> bytes kept of it)."""

    node_id: int
    mode: CutMode
    seed: int
    files: int  # files that survived
    dropped_names: int  # names (files, directories) created or renamed since their dir's fsync
    reverted_files: int  # surviving files whose content went back to their last fsync
    torn: dict[str, int] = Field(default_factory=dict)


class FaultWindow(_Model):
    """One injected fault: from `start_s` (injected) to `end_s` (healed: restarted, resumed,
    rules removed). `nodes` are the node ids it hit; for a partition, `detail` names the
    sides, e.g. ``"isolate 2"``, ``"split [1] | [2, 3]"``, ``"one-way 1 -> 3"``."""

    id: int
    kind: FaultKind
    nodes: list[int]
    start_s: float
    end_s: float
    detail: str = ""
    # When the fault took hold, if later than its injection: a disk-full's node halts at its
    # first write that needs a new page. Recovery is measured from here.
    effect_s: float | None = None
    cuts: list[PowerCut] = Field(default_factory=list)  # a power-loss fault's, one per node


class UncleanElection(_Model):
    """A partition KIP-966 left offline (no leader, ISR and ELR empty: every replica that held
    its committed records restarted without a clean shutdown) that the harness brought back
    after the workload, as an operator does: ElectLeaders UNCLEAN at `time_s`. Acknowledged
    records only the lost replicas held are gone (the checker reports them with the default
    durability)."""

    topic: str
    partition: int
    time_s: float


class MetadataSample(_Model):
    """One partition's leadership as the cluster described it at `time_s`."""

    time_s: float
    topic: str
    partition: int
    leader: int  # -1: no leader
    leader_epoch: int
    isr: list[int]


class BatchEntry(_Model):
    """One record batch as stored on a replica's disk: its offsets and its CRC."""

    base_offset: int
    last_offset: int
    crc: int
    leader_epoch: int


class ReplicaLog(_Model):
    """The batches one replica holds for one partition (read from its segment files)."""

    node_id: int
    batches: list[BatchEntry]


class FinalPartition(_Model):
    """One partition after recovery: its records as the leader serves them (log start to the
    high watermark) and what each replica holds on disk."""

    topic: str
    partition: int
    leader: int
    isr: list[int]
    log_start_offset: int
    high_watermark: int
    records: list[tuple[int, str]]  # (offset, value), ascending offsets
    replicas: list[ReplicaLog] = Field(default_factory=list)


class PartitionImage(_Model):
    """One partition as a controller's committed metadata image holds it."""

    partition: int
    leader: int
    leader_epoch: int
    partition_epoch: int
    replicas: list[int]
    isr: list[int]


class TopicImage(_Model):
    name: str
    topic_id: str
    partitions: list[PartitionImage]


class ControllerImage(_Model):
    """What one controller's committed image holds after recovery (None: it did not answer)."""

    node_id: int
    topics: list[TopicImage] | None


class DataCheck(_Model):
    """The crash-consistency check of one node's data directory after the run
    (dataplane.tools.check_data): every problem it found (none: consistent)."""

    node_id: int
    problems: list[str] = Field(default_factory=list)


class History(_Model):
    """Everything a run recorded. `workload_s` is when the workloads stopped; `end_s` when
    the final state had been read."""

    seed: int
    nodes: list[int]
    faults_requested: list[FaultKind]
    duration_s: float
    topic: str
    partitions: int
    group: str
    started_at: str  # ISO wall-clock time the run started, for people
    workload_s: float
    end_s: float
    writes: list[Write] = Field(default_factory=list)
    consumed: list[Consumed] = Field(default_factory=list)
    commits: list[Commit] = Field(default_factory=list)
    committed: list[CommittedObservation] = Field(default_factory=list)
    admin: list[AdminOp] = Field(default_factory=list)
    faults: list[FaultWindow] = Field(default_factory=list)
    samples: list[MetadataSample] = Field(default_factory=list)
    final: list[FinalPartition] = Field(default_factory=list)
    final_topics: list[str] | None = None  # topics the cluster lists after recovery
    controllers: list[ControllerImage] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)  # steps the harness itself could not do
    # the transactions workload (chaos/txn_history.py); plain runs leave these empty
    workload: Literal["plain", "transactions"] = "plain"
    transactions: list[Transaction] = Field(default_factory=list)
    txn_final: TxnFinal | None = None
    durability: Durability = "default"
    data_checks: list[DataCheck] = Field(default_factory=list)
    unclean_elections: list[UncleanElection] = Field(default_factory=list)


FindingKind = Literal[
    "lost-write",  # acknowledged, absent from the final log
    "moved-write",  # acknowledged at one offset, stored at another
    "duplicate",  # one value stored more than once
    "unknown-value",  # a stored value no producer sent
    "order",  # a producer's records in a partition out of send order
    "replica-divergence",  # replicas hold different batches below the high watermark
    "replica-missing",  # an ISR member lacks batches below the high watermark
    "committed-backwards",  # a group's committed offset went down
    "skipped-after-commit",  # a record below the committed offset no member received
    "consumed-then-lost",  # a member received a record the final log does not hold there
    "admin-lost-topic",  # an acknowledged create whose topic is gone (never deleted)
    "admin-resurrected-topic",  # an acknowledged delete whose topic still exists
    "metadata-divergence",  # controllers' images differ after recovery
    "crash-consistency",  # a node's files after the run: a bad batch, index or checkpoint
    "harness",  # the run itself could not complete a step (the verdict cannot be clean)
    # the transactions workload (chaos/txn_checker.py)
    "txn-missing",  # an input record no visible output record carries
    "txn-duplicate",  # an input record carried by more than one visible output record
    "txn-aborted-visible",  # a record of an aborted transaction read read_committed
    "txn-committed-invisible",  # a record of a committed transaction not read read_committed
    "txn-partial",  # a transaction whose records are partly visible
    "txn-unknown-output",  # an output record no transaction of the history sent
    "txn-marker",  # a finished transaction's partition without its marker (or the wrong one)
    "txn-offsets",  # the group's committed offsets differ from what committed transactions read
]


class Finding(_Model):
    """One anomaly: what, where (partition, offset, value when they apply), when, and the
    fault windows it falls in (active at `time_s`, or else the last one before it)."""

    kind: FindingKind
    message: str
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    value: str | None = None
    time_s: float | None = None
    faults: list[int] = Field(default_factory=list)


class FaultRecovery(_Model):
    """How long acknowledged writes took to resume on every partition after one fault."""

    fault_id: int
    kind: FaultKind
    recovery_s: float | None  # None: some partition never acknowledged a write again


class PowerLossLoss(_Model):
    """What one power-loss-all took from one partition with Kafka's default durability: the
    acknowledged records fsynced on no replica when every node lost power (a tail of the
    partition's records acknowledged before the cut)."""

    fault_id: int
    topic: str
    partition: int
    count: int
    first_offset: int
    last_offset: int


class Summary(_Model):
    """The figures of a run: counts, availability and recovery per fault."""

    attempted_writes: int
    acknowledged_writes: int
    indeterminate_writes: int
    lost_writes: int
    duplicated_values: int
    availability: float  # fraction of the workload's seconds with >= 1 acknowledged write
    faults_by_kind: dict[str, int]
    recoveries: list[FaultRecovery]
    consumed_records: int
    commits_ok: int
    admin_ops_ok: int
    transactions: TxnSummary | None = None  # with the transactions workload
    durability: Durability = "default"
    # acknowledged writes a power-loss-all took with the default durability (reported, not
    # failed: Kafka's default trades them for speed), by fault and partition
    lost_to_power_loss: int = 0
    power_loss_losses: list[PowerLossLoss] = Field(default_factory=list)
    # partitions KIP-966 left offline until the harness elected a leader uncleanly, and the
    # acknowledged writes that election lost (reported, not failed, with the default durability)
    unclean_elections: int = 0
    lost_to_unclean_election: int = 0


class Verdict(_Model):
    ok: bool
    findings: list[Finding]
    summary: Summary
    # What the checker found and the run's durability mode allows (lost writes, and what follows
    # from them, after a power-loss-all with the default durability): shown, not failed.
    reported: list[Finding] = Field(default_factory=list)
