"""Distributed mode: workers with the same ``group.id`` share connectors and tasks.

State lives in three compacted topics, created by the first worker if missing (replication
factor min(3, brokers)): ``connect-configs`` (one partition: a total order of configuration
records, see ``connect.config_state``), ``connect-offsets`` (source offsets, keyed by connector
and source partition) and ``connect-status`` (the last state of each connector and task, with
the worker running it).

Membership is a classic group of protocol type ``connect`` (``dataplane.client.GroupMembership``):
the leader reads ``connect-configs`` to its end and deals the connectors and tasks round-robin
over the members (``connect.assignment``), SyncGroup hands each member its share. The protocol is
eager: before every rejoin a worker stops all its connectors and tasks (source tasks commit the
offsets of what was acknowledged, sink tasks flush and commit), so no task ever runs twice. A
worker killed without warning stops heartbeating; when its session expires the group rebalances,
and its tasks start on the others from the last committed offsets.

**Writes** from the REST API go straight to ``connect-configs`` from whichever worker got them,
not forwarded to the leader: the topic's single partition orders every write, every worker
(leader included) applies the same records in the same order, so the outcome does not depend on
who wrote; and a worker can serve writes while the leader is unreachable. The price: two workers
creating the same name at the same moment both succeed and the later config wins (Kafka Connect's
forwarding would answer the second with 409). The leader rejoins (a new generation) when the set
of connectors or tasks changed; a worker that runs a connector writes its task configs.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence

from connect.assignment import (
    PROTOCOL_NAME,
    PROTOCOL_TYPE,
    Assignment,
    WorkerMetadata,
    assign,
    decode_members,
)
from connect.config_state import Change
from connect.herder import ConnectError, Herder, Owned, Records
from connect.runtime import Runtime, Status
from connect.storage import TopicLog, TopicOffsetStore, ensure_topic
from connect.worker_config import WorkerConfig
from dataplane.client import ConsumerRecord, GroupAssignment, GroupMembership, JoinedMember
from raftlog.errors import KafkaError

log = logging.getLogger(__name__)
TICK_MS = 100
ERROR_BACKOFF_S = 0.5
CONNECTOR_STATUS = "status-connector-"
TASK_STATUS = "status-task-"


class DistributedHerder(Herder):
    def __init__(self, config: WorkerConfig, worker_id: str, url: str) -> None:
        super().__init__()
        if config.group_id is None:
            raise ValueError("distributed mode needs group.id")
        self.config = config
        self.worker_id = worker_id
        self.url = url
        self.timeout_s = config.request_timeout_ms / 1000
        servers = config.bootstrap_servers
        security = config.client_security("worker")  # the worker's own clients
        for topic, partitions in (
            (config.config_storage_topic, 1),
            (config.offset_storage_topic, config.offset_storage_partitions),
            (config.status_storage_topic, config.status_storage_partitions),
        ):
            ensure_topic(servers, topic, partitions, self.timeout_s, security)
        self.offsets = TopicOffsetStore(servers, config.offset_storage_topic,
                                        config.request_timeout_ms, security)  # fmt: skip
        self.configs = TopicLog(
            servers, config.config_storage_topic, self._apply_config, config.request_timeout_ms,
            security=security,
        )  # fmt: skip
        self.status_log = TopicLog(
            servers, config.status_storage_topic, self._apply_status, config.request_timeout_ms,
            security=security,
        )  # fmt: skip
        self.runtime = Runtime(
            config, worker_id, self.offsets, self.write_status, self.request_task_reconfiguration
        )
        self._assignment: Assignment | None = None
        self._pending: Assignment | None = None
        self._revocations = 0  # an assignment is installed only if none happened since
        self._pending_after = 0
        self._dirty = False
        self._rejoin_needed = False
        self._stopping = threading.Event()
        self.membership = GroupMembership(
            servers,
            config.group_id,
            protocol_type=PROTOCOL_TYPE,
            protocols=self._protocols,
            assign=self._assign,
            on_assigned=self._on_assigned,
            on_revoked=self._on_revoked,
            client_id=worker_id,
            session_timeout_ms=config.session_timeout_ms,
            rebalance_timeout_ms=config.rebalance_timeout_ms,
            heartbeat_interval_ms=config.heartbeat_interval_ms,
            request_timeout_ms=config.request_timeout_ms,
            security=security,
        )
        self._thread = threading.Thread(target=self._tick_loop, name="herder", daemon=True)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self.configs.read_to_end(self.timeout_s)
        self.status_log.read_to_end(self.timeout_s)
        self.membership.start()
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(self.timeout_s)
        self.stop_reconfiguring()
        with self._reconcile_lock:
            self.runtime.stop_all(unassigned=True)
            self.forget_started()
        self.membership.close()
        self.configs.close()
        self.status_log.close()
        self.offsets.close()

    # -- the herder's modes ----------------------------------------------------------------------
    def write(self, records: Records) -> None:
        try:
            self.configs.write(records, self.timeout_s)
            self.configs.read_to_end(self.timeout_s)
        except KafkaError as error:
            raise ConnectError(
                500, f"writing {self.config.config_storage_topic}: {error}"
            ) from error

    def refresh(self) -> None:
        try:
            self.configs.read_to_end(self.timeout_s)
            self.status_log.poll(0)
        except KafkaError as error:
            raise ConnectError(
                500, f"reading {self.config.config_storage_topic}: {error}"
            ) from error

    def owned(self) -> Owned:
        with self._lock:
            current = self._assignment
        if current is None:
            return Owned()
        return Owned(set(current.connectors), set(current.tasks))

    def check_writable(self) -> None:
        with self._lock:
            if self._assignment is None:
                raise ConnectError(
                    409,
                    "Cannot complete request because of a conflicting operation "
                    "(e.g. worker rebalance)",
                )

    def write_status(self, connector: str, task: str, status: Status | None) -> None:
        self.on_status(connector, task, status)
        key = f"{CONNECTOR_STATUS}{connector}" if not task else f"{TASK_STATUS}{connector}-{task}"
        value = None if status is None else {
            "state": status.state, "worker_id": status.worker_id, "trace": status.trace,
            "metrics": status.metrics,
        }  # fmt: skip
        self.status_log.send(key, value)

    # -- the internal topics ---------------------------------------------------------------------
    def _apply_config(self, key: str, value: bytes | None, record: ConsumerRecord) -> None:
        parsed = None if value is None else json.loads(value)
        with self._lock:
            change, _name = self.state.apply(key, parsed, record.offset)
            if change is not Change.NONE:
                self._dirty = True
            if change is Change.ASSIGNMENT:
                self._rejoin_needed = True

    def _apply_status(self, key: str, value: bytes | None, record: ConsumerRecord) -> None:
        if key.startswith(CONNECTOR_STATUS):
            item = (key[len(CONNECTOR_STATUS) :], "")
        elif key.startswith(TASK_STATUS):
            connector, _, task = key[len(TASK_STATUS) :].rpartition("-")
            item = (connector, task)
        else:
            return
        parsed = None if value is None else json.loads(value)
        status = None if parsed is None else Status(
            str(parsed["state"]), str(parsed["worker_id"]), str(parsed.get("trace", "")),
            parsed.get("metrics"),
        )  # fmt: skip
        self.on_status(*item, status)

    # -- the group -------------------------------------------------------------------------------
    def _protocols(self) -> list[tuple[str, bytes]]:
        with self._lock:
            offset = self.state.offset
        return [(PROTOCOL_NAME, WorkerMetadata(self.url, offset).encode())]

    def _assign(self, protocol: str, members: Sequence[JoinedMember]) -> dict[str, bytes]:
        self.configs.read_to_end(self.timeout_s)
        with self._lock:
            work = self.state.work()
            offset = self.state.offset
        decoded = decode_members([(m.member_id, m.metadata) for m in members])
        result = assign(self.membership.member_id, decoded, work, offset)
        shares = {m: (a.connectors, [str(t) for t in a.tasks]) for m, a in result.items()}
        log.info("leader %s assigns: %s", self.worker_id, shares)
        return {m: a.encode() for m, a in result.items()}

    def _on_assigned(self, assigned: GroupAssignment) -> None:
        with self._lock:
            self._pending = Assignment.decode(assigned.assignment)
            self._pending_after = self._revocations

    def _on_revoked(self) -> None:
        """Eager: stop everything before joining again."""
        with self._lock:
            self._assignment = None
            self._pending = None
            self._revocations += 1
        with self._reconcile_lock:
            self.runtime.stop_all()
            self.forget_started()

    # -- the herder's thread ---------------------------------------------------------------------
    def _tick_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self._tick()
            except (KafkaError, ConnectError) as error:
                log.warning("herder: %s; retrying", error)
                self._stopping.wait(ERROR_BACKOFF_S)

    def _tick(self) -> None:
        self.configs.poll(TICK_MS)
        self.status_log.poll(0)
        with self._lock:
            rejoin, self._rejoin_needed = self._rejoin_needed, False
            pending, self._pending = self._pending, None
            revocations = self._pending_after
        if rejoin and self.membership.is_leader():
            log.info("the connectors or tasks changed: rebalancing")
            self.membership.request_rejoin()
        if pending is not None:
            self._install(pending, revocations)
        with self._lock:
            run = self._dirty and self._assignment is not None
            self._dirty = False
        if run:
            self.reconcile()

    def _install(self, assignment: Assignment, revocations: int) -> None:
        if assignment.error:
            log.info("the leader is behind on %s: joining again", self.config.config_storage_topic)
            self.membership.request_rejoin()
            return
        with self._lock:
            behind = self.state.offset < assignment.config_offset
        if behind:
            self.configs.read_to_end(self.timeout_s)
            with self._lock:
                behind = self.state.offset < assignment.config_offset
        if behind:
            log.warning("%s is behind the assignment's: joining again",
                        self.config.config_storage_topic)  # fmt: skip
            self.membership.request_rejoin()
            return
        log.info("worker %s runs connectors %s and tasks %s", self.worker_id,
                 list(assignment.connectors), [str(t) for t in assignment.tasks])  # fmt: skip
        with self._lock:
            if self._revocations != revocations:
                return  # revoked meanwhile: a newer assignment follows
            self._assignment = assignment
            self._dirty = True
