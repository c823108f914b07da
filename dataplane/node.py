"""The node launcher: ``raftlog node --config node.toml``.

A node runs the roles its configuration names. The controller role runs the Raft metadata log,
the replicated metadata state, the controller (write path, sessions, timers) and ControllerService
on the CONTROLLER listener. The broker role arrives with the data plane. SIGTERM and SIGINT stop
the node cleanly: the gRPC server drains, the Raft log closes its journal.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import grpc

from dataplane.node_config import NodeConfig
from metadata_quorum.controller import MetadataState, QuorumController
from metadata_quorum.raft import MetadataLog, RaftTiming
from metadata_quorum.records import NO_LEADER
from metadata_quorum.service import ControllerServicer, serve

log = logging.getLogger(__name__)
SHUTDOWN_GRACE_S = 5.0


@dataclass
class ControllerRole:
    state: MetadataState
    metadata_log: MetadataLog
    controller: QuorumController
    servicer: ControllerServicer
    server: grpc.Server

    def stop(self) -> None:
        self.servicer.stop_streams = True
        self.server.stop(grace=SHUTDOWN_GRACE_S).wait(SHUTDOWN_GRACE_S)
        self.controller.close()
        self.metadata_log.close()


def start_controller(config: NodeConfig) -> ControllerRole:
    me = config.controller_voter()
    voters = config.voters
    by_raft = {v.raft_address: v.node_id for v in voters}
    state = MetadataState()
    election_max_s = config.controller_quorum_election_timeout_ms / 1000
    metadata_log = MetadataLog(
        me.raft_address,
        [v.raft_address for v in voters],
        Path(config.log_dirs) / "__cluster_metadata",
        state,
        RaftTiming(election_min_s=election_max_s / 2, election_max_s=election_max_s),
    )
    controller = QuorumController(
        me.node_id,
        state,
        metadata_log,
        leader_id_of=lambda address: by_raft.get(address or "", NO_LEADER),
        session_timeout_ms=config.broker_session_timeout_ms,
        rebalance_interval_ms=config.leader_imbalance_check_interval_seconds * 1000,
    )
    servicer = ControllerServicer(controller, voters, config.cluster_id)
    server = serve(servicer, me.address)
    controller.start()
    log.info("controller %d serving on %s (raft %s)", me.node_id, me.address, me.raft_address)
    return ControllerRole(state, metadata_log, controller, servicer, server)


def run(config: NodeConfig) -> None:
    """Run until SIGTERM/SIGINT."""
    Path(config.log_dirs).mkdir(parents=True, exist_ok=True)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    controller = start_controller(config) if config.is_controller else None
    try:
        stop.wait()
    finally:
        if controller is not None:
            controller.stop()
    log.info("node %d stopped", config.node_id)
