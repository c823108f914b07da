"""One chaos run, start to verdict: ``raftlog chaos run`` and ``make chaos`` call `run`.

1. Start a cluster of combined nodes on 127.0.0.F.. (F = `first_host`), each node process as
   its own system user so iptables can cut it off (chaos/network.py), inside the run's
   `NetworkFaults` chain; with disk-full faults, each node's data on its own size-limited
   disk (chaos/disk.py); with power-loss faults, each node's data directory (logs and metadata
   journal) on its own forgetful filesystem (chaos/power.py), over that disk when both. With
   ``durability="fsync"`` every node runs with ``log.flush.interval.messages=1``.
2. Create the workload topic (RF = min(3, nodes), ``min.insync.replicas`` = 2) and start the
   workloads (chaos/workloads.py): producers, a consumer group, an admin workload, samplers.
3. Inject the faults of the seed's schedule (chaos/schedule.py) one at a time, healing each;
   a membership fault's new controller runs on the spare address 127.0.0.S (`spare_host`,
   default the address after the last node) as its own node user (chaos/membership.py).
4. Stop the producers, let the cluster recover (every partition led, its ISR complete), let the
   group consume to the end, and read the final state: every partition's records from its
   leader, the topic list, every controller's image; then stop the nodes (SIGTERM, by pid) and
   read every replica's batches from its segment files and check each node's files for crash
   consistency (dataplane.tools.check_data).
5. Check the history (chaos/checker.py), write report.json + report.html (chaos/report.py).

With ``secure=True`` (``--secure``) the cluster runs TLS, SCRAM and ACLs, the workloads and the
transformers connect as a least-privileged SCRAM user, the harness and its cluster faults with the
admin's certificate (chaos/secure.py).

With ``workload="transactions"`` the run also creates an output topic and runs transformer
processes (a consume-transform-produce loop in transactions, chaos/transactions.py; each on
raftlog's client or librdkafka, `RunConfig.clients`) beside the plain workloads; after the
producers stop they drain the input, stop, and the output is read both ways (and, once the
nodes are stopped, its batches and markers from the disk).

Whatever happens — an error, Ctrl-C, SIGTERM — every paused node is resumed, every iptables rule
removed, every node process stopped by its pid and every disk and forgetful filesystem unmounted
(its FUSE process stopped by pid) before `run` returns or raises.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import logging
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import grpc

from chaos.checker import check
from chaos.disk import DiskFaults
from chaos.faults import FaultInjector
from chaos.history import (
    POWER_FAULT_KINDS,
    TXN_FAULT_KINDS,
    BatchEntry,
    ControllerImage,
    DataCheck,
    Durability,
    FaultKind,
    FaultWindow,
    FinalPartition,
    History,
    PartitionImage,
    ReplicaLog,
    TopicImage,
    UncleanElection,
    Verdict,
)
from chaos.membership import VoterChanges
from chaos.network import (
    NetworkFaults,
    NodeIdentity,
    ensure_node_identity,
    node_user_name,
    prepare_data_dir,
    prepare_runtime,
    spawn,
)
from chaos.power import PowerFaults
from chaos.report import write_report
from chaos.schedule import PlannedFault, plan, reassign_target
from chaos.secure import RunSecurity, WorkloadResources, share_secrets
from chaos.secure import set_up as set_up_security
from chaos.transactions import TRANSFORMER_ID_PREFIX, TransformerSettings, TxnWorkload
from chaos.txn_history import TXN_CLIENTS, TxnClient, TxnFinal
from chaos.workloads import (
    CLIENT_ERRORS,
    AdminWorkload,
    CommittedWatcher,
    GroupMember,
    MetadataSampler,
    OfflineElector,
    ProducerWorkload,
    Recorder,
    elect_offline_partitions,
)
from dataplane.client import AdminClient, Consumer, NewTopic, TopicPartition
from dataplane.client.admin import PartitionDescription
from dataplane.tools.check_data import check_node_dir
from dataplane.tools.local_cluster import LocalCluster, pick_cluster_port, wait_for
from metadata_quorum.client import ControllerClient
from metadata_quorum.security.channels import ClientSecurity
from protos import controller_pb2 as cpb
from raftlog.batch import iter_batches
from raftlog.errors import CorruptRecordError, ErrorCode
from raftlog.log import partition_dir_name

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
NODE_MODULES = ("raftlog", "metadata_quorum", "dataplane", "protos", "grpc", "pysyncobj")
RECOVERY_TIMEOUT_S = 120.0
HEAL_TIMEOUT_S = 60.0
CATCH_UP_TIMEOUT_S = 60.0
FLUSH_TIMEOUT_S = 60.0
KILLS = ("kill", "controller-kill", "leader-kill")
# faults during which the node hit may be down
DOWN_EXPECTED = (
    *KILLS,
    *POWER_FAULT_KINDS,
    "disk-full",
    "txn-coordinator-kill",
    "output-leader-kill",
)
# The fsync-on-ack durability: every replica fsyncs each append before it counts towards the
# high watermark (the leader before it counts itself, a follower before its next fetch reports
# the offset); Kafka's flush.messages=1, set as the broker default for every topic.
FSYNC_OVERRIDES: dict[str, str | int] = {"log.flush.interval.messages": 1}


@dataclass(frozen=True)
class RunConfig:
    seed: int
    duration_s: float
    faults: list[FaultKind]
    work_dir: Path  # the cluster's nodes, data and logs
    report_dir: Path
    nodes: int = 3
    first_host: int = 41
    spare_host: int | None = None  # a membership fault's new controller; None: the next address
    partitions: int = 6
    producers: int = 2
    rate: float = 150.0  # records a second per producer
    members: int = 2
    topic: str = "chaos-events"
    group: str = "chaos-group"
    disk_bytes: int = 512 << 20  # each node's disk (tmpfs) when disk-full is among the faults
    overrides: dict[str, str | int] = field(default_factory=dict)
    # the transactions workload (chaos/transactions.py): transformers from `topic` to `output`
    workload: Literal["plain", "transactions"] = "plain"
    transformers: int = 2
    output_topic: str = "chaos-output"
    transformer_group: str = "chaos-transformers"
    abort_fraction: float = 0.1  # transactions aborted on purpose
    # each transformer's Kafka client, round-robin; () = both (ours, confluent) when there are
    # two or more transformers, else ours
    transformer_clients: tuple[TxnClient, ...] = ()
    # TLS, SCRAM and ACLs; the workloads as a least-privileged user (chaos/secure.py)
    secure: bool = False
    admin_topic_prefix: str = "chaos-admin"  # the admin workload's topics: <prefix>-<serial>
    # how an acknowledged record is made durable: Kafka's default, or fsync on every replica
    # before the acknowledgement (FSYNC_OVERRIDES); docs/chaos.md "Durability modes"
    durability: Durability = "default"

    def __post_init__(self) -> None:
        if not 3 <= self.nodes <= 9:
            raise ValueError(
                f"a chaos run needs 3..9 nodes (a quorum that survives one loss): {self.nodes}"
            )
        if self.duration_s < 30:
            raise ValueError(f"a chaos run lasts at least 30 s: {self.duration_s}")
        needs_txn = [k for k in self.faults if k in TXN_FAULT_KINDS]
        if needs_txn and self.workload != "transactions":
            raise ValueError(f"{', '.join(needs_txn)} need the transactions workload")
        if self.workload == "transactions" and not 1 <= self.transformers <= 8:
            raise ValueError(
                f"the transactions workload runs 1..8 transformers, not {self.transformers}"
            )
        unknown_clients = set(self.transformer_clients) - set(TXN_CLIENTS)
        if unknown_clients:
            raise ValueError(
                f"unknown transformer client(s) {', '.join(sorted(unknown_clients))}; "
                f"known: {', '.join(TXN_CLIENTS)}"
            )
        last = self.first_host + self.nodes - 1
        if (
            not 2 <= self.new_controller_host <= 254
            or self.first_host <= self.new_controller_host <= last
        ):
            raise ValueError(
                f"the spare host 127.0.0.{self.new_controller_host} must be outside the nodes' "
                f"127.0.0.{self.first_host}-{last}, in 127.0.0.2-254"
            )

    @property
    def clients(self) -> tuple[TxnClient, ...]:
        """The transformers' clients, assigned round-robin (`transformer_clients` or its
        default)."""
        if self.transformer_clients:
            return self.transformer_clients
        return TXN_CLIENTS if self.transformers >= 2 else ("ours",)

    @property
    def new_controller_host(self) -> int:
        """The last octet of the address a membership fault's new controller binds."""
        return self.first_host + self.nodes if self.spare_host is None else self.spare_host


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``1h`` -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if match is None:
        raise ValueError(f"not a duration (e.g. 90s, 10m): {text!r}")
    return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]


class _Cluster:
    """The run's LocalCluster with node processes started as their node users."""

    def __init__(self, config: RunConfig, identities: dict[int, NodeIdentity]) -> None:
        self.identities = identities
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        hosts = [identity.addresses[0] for identity in identities.values()]
        hosts.append(f"127.0.0.{config.new_controller_host}")  # the spare controller's ports too
        self.local = LocalCluster(
            config.work_dir,
            nodes=config.nodes,
            first_host=config.first_host,
            port=pick_cluster_port(hosts),
            overrides=(
                {**FSYNC_OVERRIDES, **config.overrides}
                if config.durability == "fsync"
                else config.overrides
            ),
            launcher=self._launch,
            secure=config.secure,
        )

    def _launch(self, node_id: int, argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        identity = self.identities[node_id]
        prepare_data_dir(identity, log_path.parent)
        if self.local.secure:  # LocalCluster.start_node made its secrets; the node must read them
            share_secrets(self.local.secrets, node_id, identity)
        with log_path.open("ab") as out:
            proc = spawn(identity, argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        self.procs[node_id] = proc
        return proc

    def exited(self, expected_down: set[int]) -> list[tuple[int, int]]:
        """(node id, exit status) of the node processes that ended though nobody stopped them
        (a negative status is the signal that ended it, as in Popen.returncode)."""
        return [
            (node_id, code)
            for node_id, proc in sorted(self.procs.items())
            if node_id not in expected_down and (code := proc.poll()) is not None
        ]

    # NodeProcesses, for the FaultInjector
    def pid(self, node_id: int) -> int | None:
        return self.local.pid(node_id)

    def start(self, node_id: int) -> None:
        self.local.start_node(node_id)


def _identities(config: RunConfig) -> dict[int, NodeIdentity]:
    out = {}
    for n in range(1, config.nodes + 1):
        host = config.first_host + n - 1
        out[n] = ensure_node_identity(node_user_name(host), [f"127.0.0.{host}"])
    prepare_runtime(out[1], Path(sys.executable), REPO, NODE_MODULES)
    return out


class Run:
    """The moving parts of one run; `execute` drives them in order."""

    def __init__(self, config: RunConfig, say: Callable[[str], None]) -> None:
        self.config = config
        self.say = say
        self.recorder = Recorder()
        self.schedule = plan(
            config.seed, config.duration_s, config.faults, config.nodes, config.partitions
        )
        self.windows: list[FaultWindow] = []
        self.final: list[FinalPartition] = []
        self.final_topics: list[str] | None = None
        self.controllers: list[ControllerImage] = []
        self.high_watermarks: dict[int, int] = {}
        self.started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self.workload_s = 0.0
        self.abort = threading.Event()
        self.cluster: _Cluster | None = None
        self.down: set[int] = set()  # nodes a fault in place killed
        self.voter_changes: VoterChanges | None = None  # with membership faults
        self.txn: TxnWorkload | None = None  # with the transactions workload
        self.txn_final: TxnFinal | None = None
        self.security: RunSecurity | None = None  # with a secure cluster
        self.data_checks: list[DataCheck] = []
        self.unclean_elections: list[UncleanElection] = []

    @property
    def harness_security(self) -> ClientSecurity | None:
        """How the harness's own clients connect: the admin's certificate, or plaintext."""
        return None if self.security is None else self.security.harness

    @property
    def workload_security(self) -> ClientSecurity | None:
        """How the workloads' clients connect: the workload user, or plaintext."""
        return None if self.security is None else self.security.workload

    @property
    def rf(self) -> int:
        return min(3, self.config.nodes)

    def execute(self) -> History:
        config = self.config
        identities = _identities(config)
        cluster = self.cluster = _Cluster(config, identities)
        self.say(
            f"chaos run: seed {config.seed}, {config.duration_s:.0f} s, {config.nodes} nodes on "
            f"127.0.0.{config.first_host}-{config.first_host + config.nodes - 1}, "
            f"{len(self.schedule)} faults planned"
        )
        with contextlib.ExitStack() as stack:
            network = stack.enter_context(NetworkFaults(list(identities.values())))
            disks, power = self._mount_disks(stack, network.run_id, cluster)
            injector = stack.enter_context(
                FaultInjector(cluster, identities, network, disks, power)
            )
            try:
                cluster.local.up(timeout_s=60)
                if "membership" in config.faults:
                    self.voter_changes = self._voter_changes(cluster.local)
                self._run_cluster(cluster, injector)
                cluster.local.down()
            finally:
                if self.voter_changes is not None:
                    self.voter_changes.close()  # stops the new controller by its pid
                for spec in cluster.local.specs:
                    cluster.local.stop_node(spec.node_id, kill=True)
            self._read_replicas(cluster.local)  # before the disks go
            self._check_data(cluster.local)
            if self.txn is not None and self.txn_final is not None:
                dirs = {spec.node_id: spec.directory / "data" for spec in cluster.local.specs}
                self.txn_final = self.txn.with_batches(self.txn_final, dirs)
        return self._history()

    def _mount_disks(
        self, stack: contextlib.ExitStack, run_id: str, cluster: _Cluster
    ) -> tuple[DiskFaults | None, PowerFaults | None]:
        """Each node's data directory on its own disk (disk-full) and/or forgetful filesystem
        (power-loss); with both, the forgetful filesystem's backing directory is the disk."""
        config = self.config
        disks = power = None
        if "disk-full" in config.faults:
            disks = stack.enter_context(DiskFaults(run_id, config.disk_bytes))
        if any(kind in POWER_FAULT_KINDS for kind in config.faults):
            power = stack.enter_context(PowerFaults())
        for spec in cluster.local.specs:
            identity = cluster.identities[spec.node_id]
            data = spec.directory / "data"
            backing = config.work_dir / "forgetful" / f"node-{spec.node_id}"
            if disks is not None:
                disks.mount(
                    spec.node_id, data if power is None else backing, identity.uid, identity.gid
                )
            if power is not None:
                power.mount(spec.node_id, data, backing, identity.uid, identity.gid)
        return disks, power

    def _check_data(self, local: LocalCluster) -> None:
        """The crash-consistency check of every node's files, the nodes stopped: no bad batch
        below a log's end, indexes that match their segments, checkpoints that parse."""
        for spec in local.specs:
            report = check_node_dir(spec.directory / "data")
            self.data_checks.append(DataCheck(node_id=spec.node_id, problems=list(report.problems)))

    def _voter_changes(self, local: LocalCluster) -> VoterChanges:
        host = self.config.new_controller_host
        identity = ensure_node_identity(node_user_name(host), [f"127.0.0.{host}"])
        return VoterChanges(local, identity, self.config.work_dir, REPO, sys.executable)

    def _run_cluster(self, cluster: _Cluster, injector: FaultInjector) -> None:
        config, rec = self.config, self.recorder
        bootstrap = cluster.local.bootstrap_servers
        control = AdminClient(
            bootstrap, request_timeout_ms=10_000, security=cluster.local.admin_security
        )
        workload_admin: AdminClient | None = None
        try:
            self._create_topic(control, config.topic)
            if config.workload == "transactions":
                self._create_topic(control, config.output_topic)
            if config.secure:
                self.security = set_up_security(cluster.local, self._workload_resources())
                self.say(f"secure: the workloads connect as {self.security.workload.sasl_username}")
            workload = self.workload_security
            workload_admin = AdminClient(bootstrap, request_timeout_ms=10_000, security=workload)
            stop_producers, stop_members, stop_rest = (threading.Event() for _ in range(3))
            producers = [
                ProducerWorkload(
                    f"p{i}", bootstrap, config.topic, config.partitions, config.rate, rec,
                    stop_producers, security=workload,
                )
                for i in range(1, config.producers + 1)
            ]  # fmt: skip
            members = [
                GroupMember(
                    f"m{i}",
                    bootstrap,
                    config.group,
                    config.topic,
                    rec,
                    stop_members,
                    security=workload,
                )
                for i in range(1, config.members + 1)
            ]
            others = [
                CommittedWatcher(workload_admin, config.group, config.topic, rec, stop_rest),
                AdminWorkload(
                    workload_admin, config.admin_topic_prefix, min(2, self.rf), rec, stop_rest
                ),
                MetadataSampler(workload_admin, config.topic, rec, stop_rest),
                OfflineElector(workload_admin, rec, stop_rest, self._elected_uncleanly),
            ]
            threads = [*producers, *members, *others]
            try:
                rec.start()
                for thread in threads:
                    thread.start()
                if config.workload == "transactions":
                    self.txn = self._txn_workload(bootstrap, cluster.local.kafka_bootstrap_servers)
                    self.txn.start()
                self._inject_faults(cluster, injector, control)
                self._wait_until(config.duration_s)
                self.workload_s = rec.now()
                self.say("workloads stopping; waiting for the cluster to recover")
                stop_producers.set()
                for producer in producers:
                    producer.join(timeout=10)
                    producer.finish(FLUSH_TIMEOUT_S)
                self._wait_for_recovery(control)
                self._wait_for_group(members, bootstrap)
                if self.txn is not None:
                    self.say("transformers draining the input")
                    self.txn_final = self.txn.finish(control)
            finally:
                for event in (stop_producers, stop_members, stop_rest):
                    event.set()
                for thread in threads:
                    thread.join(timeout=30)
                if self.txn is not None:
                    self.txn.close()  # SIGKILLs, by pid, any transformer still running
            self._read_final_state(cluster, control, bootstrap)
        finally:
            control.close()
            if workload_admin is not None:
                workload_admin.close()

    def _workload_resources(self) -> WorkloadResources:
        config = self.config
        transactions = config.workload == "transactions"
        topics = (config.topic, config.output_topic) if transactions else (config.topic,)
        groups = (config.group, config.transformer_group) if transactions else (config.group,)
        return WorkloadResources(
            topics=topics,
            groups=groups,
            admin_topic_prefix=f"{config.admin_topic_prefix}-",
            transactional_id_prefix=f"{TRANSFORMER_ID_PREFIX}-" if transactions else None,
        )

    def _create_topic(self, admin: AdminClient, name: str) -> None:
        config = self.config
        configs = {"min.insync.replicas": str(min(2, self.rf))}
        topic = NewTopic(name, config.partitions, self.rf, configs=configs)
        errors = admin.create_topics([topic])
        if errors.get(name) is not None:
            raise RuntimeError(f"cannot create {name}: {errors[name]}")
        wait_for(
            f"leaders for every partition of {name}",
            lambda: all(p.leader >= 0 for p in admin.describe_topics([name])[name].partitions),
            30,
        )

    def _txn_workload(self, bootstrap: list[str], kafka_bootstrap: list[str]) -> TxnWorkload:
        config = self.config
        settings = TransformerSettings(
            bootstrap=bootstrap,
            input_topic=config.topic,
            input_partitions=config.partitions,
            output_topic=config.output_topic,
            output_partitions=config.partitions,
            group=config.transformer_group,
            seed=config.seed,
            directory=config.work_dir / "transformers",
            t0=time.monotonic() - self.recorder.now(),
            abort_fraction=config.abort_fraction,
            kafka_bootstrap=kafka_bootstrap,
            clients=config.clients,
            client_config=None if self.security is None else self.security.workload_properties,
            security=self.harness_security,
        )
        return TxnWorkload(settings, config.transformers, REPO, self._problem, self.say)

    def _describe(self, admin: AdminClient) -> tuple[PartitionDescription, ...]:
        return admin.describe_topics([self.config.topic])[self.config.topic].partitions

    # -- faults ---------------------------------------------------------------------------------
    def _wait_until(self, time_s: float, on_tick: Callable[[], None] | None = None) -> None:
        """Let the run go on until `time_s` seconds after its start (pacing the schedule),
        watching for node processes that end on their own (and calling `on_tick` often)."""
        while (left := time_s - self.recorder.now()) > 0:
            self.abort.wait(min(left, 0.5 if on_tick is None else 0.05))
            self._watch_nodes()
            if on_tick is not None:
                on_tick()

    def _watch_nodes(self) -> None:
        """A node that exits without being killed is a finding (a crash, a failed start); it
        is started again so the run goes on, as a service manager would."""
        if self.txn is not None:
            self.txn.watch()  # a transformer that exited on its own is started again
        cluster = self.cluster
        if cluster is None:
            return
        for node_id, code in cluster.exited(self.down):
            self._problem(
                f"node {node_id} exited on its own ({_how(code)}) at {self.recorder.now():.1f} s; "
                f"see {cluster.local.spec(node_id).log_path}"
            )
            cluster.start(node_id)

    def _inject_faults(
        self, cluster: _Cluster, injector: FaultInjector, control: AdminClient
    ) -> None:
        def controller() -> int:
            try:
                return cluster.local.wait_for_leader(timeout_s=10)
            except TimeoutError:
                return -1

        def leader(partition: int) -> int:
            try:
                return next(p.leader for p in self._describe(control) if p.partition == partition)
            except CLIENT_ERRORS as error:  # no controller answers: nobody to kill
                log.warning("leader of partition %d: %s", partition, error)
                return -1

        # A fault that acts through the admin API waits for an active controller first: after a
        # power-loss-all (or a controller's disk-full) the quorum may still be electing, as a
        # heal waits for one (HEAL_TIMEOUT_S; a timeout is a problem, as before).
        def mover(fault: PlannedFault) -> tuple[list[int], str, Callable[[], None]]:
            cluster.local.wait_for_leader(timeout_s=HEAL_TIMEOUT_S)
            return self._move(control, injector.node_ids, fault)

        changes = self.voter_changes

        def change_voters(fault: PlannedFault) -> tuple[list[int], str, Callable[[], None]]:
            assert changes is not None
            cluster.local.wait_for_leader(timeout_s=HEAL_TIMEOUT_S)
            return changes.inject(fault)

        voters = None if changes is None else change_voters
        txn = self.txn
        victim = None if txn is None else functools.partial(txn.victim, control)
        transformers = None if txn is None else txn.kill_transformer

        for fault in self.schedule:
            self._wait_until(fault.at_s)
            start = self.recorder.now()
            try:
                active = injector.inject(
                    fault, controller=controller, leader=leader, mover=mover, voters=voters,
                    victim=victim, transformers=transformers,
                )  # fmt: skip
            except Exception as error:  # noqa: BLE001 - recorded as a problem: fails the verdict
                self._problem(f"fault {fault.id} ({fault.kind}) could not be injected: {error}")
                continue
            self.say(f"[{start:7.1f} s] fault {fault.id} {fault.kind}: {active.detail}")
            if fault.kind in DOWN_EXPECTED:
                self.down = set(active.nodes)
            halted: dict[int, tuple[float, int]] = {}  # a disk-full's node: (when, how) it ended
            watch = (
                functools.partial(self._note_halts, cluster, active.nodes, halted)
                if fault.kind == "disk-full"
                else None
            )
            self._wait_until(start + fault.length_s, watch)
            for node_id, (_, code) in sorted(halted.items()):
                active.detail += f"; {node_id} halted ({_how(code)})"
            try:
                active.heal()
            except Exception as error:  # noqa: BLE001 - recorded as a problem: fails the verdict
                self._problem(f"fault {fault.id} ({fault.kind}) could not be healed: {error}")
            self.down = set()
            end = self.recorder.now()
            after = f": {active.detail}" if fault.kind == "disk-full" else ""
            self.say(f"[{end:7.1f} s] fault {fault.id} healed{after}")
            self.windows.append(
                FaultWindow(
                    id=fault.id,
                    kind=fault.kind,
                    nodes=active.nodes,
                    start_s=start,
                    end_s=end,
                    detail=active.detail,
                    effect_s=min((at for at, _ in halted.values()), default=None),
                    cuts=active.cuts,
                )
            )

    def _move(
        self, control: AdminClient, nodes: list[int], fault: PlannedFault
    ) -> tuple[list[int], str, Callable[[], None]]:
        """Start moving the fault's partition (`reassign_target`); the heal moves it back to
        where it was (whether or not the move completed: a new target replaces the old one)."""
        tp = (self.config.topic, fault.partition)
        current = next(p for p in self._describe(control) if p.partition == fault.partition)
        original = tuple(b for b in current.replicas if b not in current.adding_replicas)
        target = reassign_target(original, nodes, fault)
        _reassign(control, tp, target)
        name = f"{tp[0]}-{tp[1]}"
        detail = f"move {name} {list(original)} -> {list(target)}"
        heal = functools.partial(_move_back, control, tp, original)
        return sorted(set(original) | set(target)), detail, heal

    def _note_halts(
        self, cluster: _Cluster, nodes: list[int], halted: dict[int, tuple[float, int]]
    ) -> None:
        """Note when and how each of `nodes` ended (a broker whose disk fills halts)."""
        for node_id, code in cluster.exited(set()):
            if node_id in nodes and node_id not in halted:
                halted[node_id] = (self.recorder.now(), code)

    def _problem(self, text: str) -> None:
        log.warning("%s", text)
        self.recorder.add(self.recorder.problems, text)

    # -- recovery -------------------------------------------------------------------------------
    def _wait_for_recovery(self, control: AdminClient) -> None:
        def recovered() -> bool:
            self._watch_nodes()
            try:
                self._elect_offline(control)
                partitions = self._describe(control)
            except CLIENT_ERRORS:  # the controllers are still electing: not yet
                return False
            return all(p.leader >= 0 and len(p.isr) == self.rf for p in partitions)

        try:
            wait_for("every partition led, with a complete ISR", recovered, RECOVERY_TIMEOUT_S)
        except TimeoutError as error:
            self._problem(f"the cluster did not recover after healing: {error}")

    def _elect_offline(self, control: AdminClient) -> None:
        for election in elect_offline_partitions(control, self.recorder.now()):
            self._elected_uncleanly(election)

    def _elected_uncleanly(self, election: UncleanElection) -> None:
        self.unclean_elections.append(election)
        self.say(
            f"[{election.time_s:7.1f} s] {election.topic}-{election.partition}: offline "
            "with no eligible leader (KIP-966); elected uncleanly"
        )

    def _wait_for_group(self, members: list[GroupMember], bootstrap: list[str]) -> None:
        tps = [TopicPartition(self.config.topic, p) for p in range(self.config.partitions)]
        with Consumer(
            bootstrap, request_timeout_ms=10_000, security=self.harness_security
        ) as reader:

            def read_ends() -> dict[TopicPartition, int] | None:
                try:
                    return reader.end_offsets(tps)
                except CLIENT_ERRORS:  # a leader still busy after the heal (a loaded machine)
                    return None

            try:
                ends = wait_for("the partitions' end offsets", read_ends, RECOVERY_TIMEOUT_S)
            except TimeoutError as error:
                self._problem(f"the end offsets could not be read after healing: {error}")
                return

        def caught_up() -> bool:
            return all(
                max((m.positions.get(tp, 0) for m in members), default=0) >= end
                for tp, end in ends.items()
            )

        try:
            wait_for("the group to consume every record", caught_up, CATCH_UP_TIMEOUT_S)
        except TimeoutError as error:
            self._problem(f"the consumer group did not catch up: {error}")

    # -- the final state ------------------------------------------------------------------------
    def _read_final_state(
        self, cluster: _Cluster, control: AdminClient, bootstrap: list[str]
    ) -> None:
        config = self.config
        try:
            self.final_topics = sorted(control.list_topics())
        except CLIENT_ERRORS as error:
            self._problem(f"the final topic list could not be read: {error}")
        described = {p.partition: p for p in self._describe(control)}
        tps = [TopicPartition(config.topic, p) for p in range(config.partitions)]
        with Consumer(
            bootstrap, request_timeout_ms=10_000, max_poll_records=5_000,
            security=self.harness_security,
        ) as reader:  # fmt: skip
            try:  # a partition still without a leader: asked again until the deadline
                starts, ends = wait_for(
                    "every partition's offsets", lambda: _offsets(reader, tps), CATCH_UP_TIMEOUT_S
                )
            except TimeoutError as error:  # the report is still written, with this problem
                self._problem(f"the final offsets could not be read: {error}")
                starts = ends = {}
            reader.assign(tps)
            reader.seek_to_beginning(*tps)
            records: dict[int, list[tuple[int, str]]] = {tp.partition: [] for tp in tps}

            def read_all() -> bool:
                for tp, batch in reader.poll(200).items():
                    records[tp.partition].extend(
                        (r.offset, (r.value or b"").decode()) for r in batch if r.offset < ends[tp]
                    )
                return all(reader.position(tp) >= ends[tp] for tp in tps)

            try:
                if ends:
                    wait_for("the final records of every partition", read_all, CATCH_UP_TIMEOUT_S)
            except TimeoutError as error:
                self._problem(f"the final records could not be read: {error}")
        for tp in tps if ends else []:
            p = described[tp.partition]
            self.final.append(
                FinalPartition(
                    topic=config.topic,
                    partition=tp.partition,
                    leader=p.leader,
                    isr=sorted(p.isr),
                    log_start_offset=starts[tp],
                    high_watermark=ends[tp],
                    records=records[tp.partition],
                )
            )
        self.controllers = self._controller_images(cluster.local)

    def _controller_images(self, local: LocalCluster) -> list[ControllerImage]:
        """Every controller's committed image, once they all stand at the same metadata offset
        (or after the deadline, as they are)."""
        answers: dict[int, cpb.DescribeTopicsResponse | None] = {}

        def agree() -> bool:
            for spec in local.specs:
                answers[spec.node_id] = _describe_node(
                    f"{spec.host}:{local.port}", local.admin_security
                )
            offsets = {a.metadata_offset if a else None for a in answers.values()}
            return len(offsets) == 1 and None not in offsets

        try:
            wait_for("every controller at the same metadata offset", agree, 30)
        except TimeoutError:
            log.warning("controllers stand at different metadata offsets: %s", answers)
        return [_image(node_id, answer) for node_id, answer in sorted(answers.items())]

    def _read_replicas(self, local: LocalCluster) -> None:
        """Add each replica's on-disk batches to the final partitions (nodes stopped)."""
        for i, final in enumerate(self.final):
            replicas = []
            for spec in local.specs:
                directory = (
                    spec.directory / "data" / partition_dir_name(final.topic, final.partition)
                )
                if not directory.is_dir():
                    continue
                try:
                    batches = read_batches(directory)
                except CorruptRecordError as error:
                    self._problem(f"node {spec.node_id}, {directory.name}: {error}")
                    continue
                replicas.append(ReplicaLog(node_id=spec.node_id, batches=batches))
            self.final[i] = final.model_copy(update={"replicas": replicas})

    def _history(self) -> History:
        config, rec = self.config, self.recorder
        return History(
            seed=config.seed,
            nodes=list(range(1, config.nodes + 1)),
            faults_requested=list(config.faults),
            duration_s=config.duration_s,
            topic=config.topic,
            partitions=config.partitions,
            group=config.group,
            started_at=self.started_at,
            workload_s=self.workload_s,
            end_s=rec.now(),
            writes=sorted(rec.writes, key=lambda w: (w.producer, w.seq)),
            consumed=rec.consumed,
            commits=rec.commits,
            committed=rec.committed,
            admin=rec.admin,
            faults=self.windows,
            samples=rec.samples,
            final=self.final,
            final_topics=self.final_topics,
            controllers=self.controllers,
            problems=rec.problems,
            workload=config.workload,
            transactions=[] if self.txn is None else self.txn.transactions(),
            txn_final=self.txn_final,
            durability=config.durability,
            data_checks=self.data_checks,
            unclean_elections=self.unclean_elections,
        )


def _offsets(
    reader: Consumer, tps: list[TopicPartition]
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]] | None:
    """(log start offsets, high watermarks) of ``tps``, or None while one cannot be read."""
    try:
        return reader.beginning_offsets(tps), reader.end_offsets(tps)
    except CLIENT_ERRORS as error:
        log.info("final offsets: %s", error)
        return None


def _reassign(control: AdminClient, tp: tuple[str, int], target: tuple[int, ...]) -> None:
    error = control.alter_partition_reassignments({tp: target})[TopicPartition(*tp)]
    if error is not None:
        raise error


def _move_back(control: AdminClient, tp: tuple[str, int], original: tuple[int, ...]) -> None:
    """Heal a reassign fault: move the partition back to ``original``. A broker of ``original``
    that an earlier fault restarted may still be fenced (catching up with the metadata), and the
    controller does not add a replica to a fenced broker: wait for it, with a deadline."""

    def moved() -> bool:
        error = control.alter_partition_reassignments({tp: original})[TopicPartition(*tp)]
        if error is None:
            return True
        if error.error == ErrorCode.INVALID_REPLICA_ASSIGNMENT or error.retriable:
            return False  # the original was valid when the fault began: a fenced broker
        raise error

    wait_for(f"brokers {list(original)} to be unfenced to move back to", moved, HEAL_TIMEOUT_S)


def _how(code: int) -> str:
    """How a process ended, from its Popen.returncode."""
    return f"signal {-code}" if code < 0 else f"status {code}"


def _describe_node(
    address: str, security: ClientSecurity | None
) -> cpb.DescribeTopicsResponse | None:
    client = ControllerClient([address], security=security)
    try:
        response: cpb.DescribeTopicsResponse = client.stub(address).DescribeTopics(
            cpb.DescribeTopicsRequest(), timeout=2.0
        )
        # NOT_CONTROLLER: still replaying its journal, no image to compare yet
        return response if response.status.error_code == 0 else None
    except grpc.RpcError:
        return None
    finally:
        client.close()


def _image(node_id: int, answer: cpb.DescribeTopicsResponse | None) -> ControllerImage:
    if answer is None:
        return ControllerImage(node_id=node_id, topics=None)
    topics = [
        TopicImage(
            name=t.name,
            topic_id=t.topic_id.hex(),
            partitions=[
                PartitionImage(
                    partition=p.partition,
                    leader=p.leader,
                    leader_epoch=p.leader_epoch,
                    partition_epoch=p.partition_epoch,
                    replicas=list(p.replicas),
                    isr=sorted(p.isr),
                )
                for p in sorted(t.partitions, key=lambda p: p.partition)
            ],
        )
        for t in sorted(answer.topics, key=lambda t: t.name)
    ]
    return ControllerImage(node_id=node_id, topics=topics)


def read_batches(directory: Path) -> list[BatchEntry]:
    """The batch headers of every segment of a partition directory, in offset order; raises
    CorruptRecordError at a torn or corrupt batch (nodes are stopped cleanly before this)."""
    return [
        BatchEntry(
            base_offset=header.base_offset,
            last_offset=header.last_offset,
            crc=header.crc,
            leader_epoch=header.partition_leader_epoch,
        )
        for segment in sorted(directory.glob("*.log"))
        for _, header in iter_batches(segment.read_bytes())
    ]


def run(config: RunConfig, say: Callable[[str], None]) -> tuple[History, Verdict]:
    """Run, check and report; returns the history and the verdict (report in report_dir)."""
    history = Run(config, say).execute()
    verdict = check(history)
    write_report(history, verdict, config.report_dir)
    return history, verdict
