"""The `membership` fault: the controller quorum changes one voter at a time while the other
faults and the workloads go on, through the product's own path (KIP-853's AddRaftVoter and
RemoveRaftVoter on the active controller), never by editing a configuration file.

- **add** (`PlannedFault.change`): start a new controller (controller role only, node id one
  above the cluster's, on the run's spare address), wait until it answers on its CONTROLLER
  listener, add it as a voter and wait until it has caught up (its lag, as the active
  controller sees it, at most `CAUGHT_UP_LAG_MAX`): the quorum now has one voter more, and its
  commits need one acknowledgement more. Each add starts from an empty directory of its own: a
  new machine, which catches up from a snapshot and the log. If the voters with the new one
  would have no live majority (a node the previous fault restarted may not have rejoined yet),
  the fault hits nobody.
- **remove**: take out a live voter (position `PlannedFault.node` among the live ones; the
  active controller too, which hands its leadership over first) when the live voters left are
  still a majority of the voters left; otherwise the fault hits nobody. Its process keeps
  running (in a combined node its broker keeps serving); the removed controller is sent
  nothing and can win no election. The schedule plans a removal only where it leaves at least
  `chaos.schedule.VOTERS_MIN` voters.

Healing (`VoterChanges.heal`) restores the voters the run started with: it removes any other
voter and stops the added controller by its pid, adds back any voter that was taken out (the
same process, with the log it kept), then waits until every voter has caught up, so the next
fault meets the quorum the run began with and the run ends on it. Faults come one at a time
(chaos/schedule.py), so a controller-kill never meets a quorum shrunk or grown by a change.

In a secure cluster (``--secure``) the new controller gets its own certificate (CN=node-<id>,
its address as IP SAN: ``LocalCluster.new_controller_config``), readable by its user
(chaos/secure.py `share_secrets`), and the changes are made with the admin's certificate.
"""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from chaos.network import NodeIdentity, prepare_data_dir, spawn
from chaos.schedule import PlannedFault
from chaos.secure import share_secrets
from dataplane.client.admin import AdminClient, QuorumDescription, RaftVoter
from dataplane.tools.local_cluster import LocalCluster, wait_for
from metadata_quorum.client import ControllerClient
from protos import controller_pb2 as pb
from raftlog.errors import KafkaError

log = logging.getLogger(__name__)

CAUGHT_UP_LAG_MAX = 5  # entries behind the leader a voter may be and count as caught up
START_TIMEOUT_S = 60.0  # a new controller process until it answers (2-4 s measured, loaded)
CATCH_UP_TIMEOUT_S = 60.0  # a voter until it has caught up after an add
STOP_TIMEOUT_S = 10.0  # SIGTERM until SIGKILL
REQUEST_TIMEOUT_MS = 30_000


class VoterChanges:
    """Adds and removes controllers of `local`'s quorum for `membership` faults; `heal`
    restores the voters it started with. The spare controller runs as `identity` (its own
    system user on its own address, so it is a node like the others) on `local`'s ports."""

    def __init__(
        self,
        local: LocalCluster,
        identity: NodeIdentity,
        work_dir: Path,
        repo: Path,
        python: str,
    ) -> None:
        self._local = local
        self._identity = identity
        self._work_dir = work_dir
        self._repo = repo
        self._python = python
        self.spare_id = max(s.node_id for s in local.specs) + 1
        self.spare = RaftVoter(self.spare_id, identity.addresses[0], local.port, local.port + 1)
        self.original = tuple(
            RaftVoter(s.node_id, s.host, local.port, local.port + 1) for s in local.controller_specs
        )
        self._proc: subprocess.Popen[bytes] | None = None
        self._admin = AdminClient(
            bootstrap_controllers=local.controller_addresses,
            request_timeout_ms=REQUEST_TIMEOUT_MS,
            security=local.admin_security,
        )

    def close(self) -> None:
        """Stop the spare controller (if running) and close the admin client."""
        self.stop_spare()
        self._admin.close()

    # -- the fault ------------------------------------------------------------------------------
    def inject(self, fault: PlannedFault) -> tuple[list[int], str, Callable[[], None]]:
        """Change the voters as `fault.change` says; (nodes hit, description, heal). A change
        that would leave no live majority (a node a previous fault restarted may not have
        rejoined yet) hits nobody, as a kill aimed at nobody does."""
        quorum = self._admin.describe_quorum()
        live = sorted(v.node_id for v in quorum.voters if _live(quorum, v.node_id))
        nobody = f"membership: no live majority after a change (voters live: {live})"
        if fault.change == "add":
            if not 2 * (len(live) + 1) > len(quorum.voters) + 1:
                return [], nobody, lambda: None
            took_s = self.add_spare(fault.id)
            detail = (
                f"add controller {self.spare_id} ({self.spare.address}) to voters "
                f"{[v.node_id for v in self.original]}; caught up in {took_s:.1f} s"
            )
            return [self.spare_id], detail, self.heal
        leaving = removable(quorum, fault.node)
        if leaving is None:
            return [], nobody, lambda: None
        role = " (the active controller)" if leaving == quorum.leader_id else ""
        voters = self._admin.remove_raft_voter(leaving)
        detail = f"remove controller {leaving}{role}; voters {[v.node_id for v in voters]}"
        return [leaving], detail, self.heal

    def add_spare(self, fault_id: int) -> float:
        """Start a new controller on the spare address and make it a voter; seconds from its
        start until it has caught up. On any failure the voters are restored."""
        started = time.monotonic()
        self.start_spare(fault_id)
        try:
            wait_for(f"controller {self.spare_id} to answer", self._spare_answers, START_TIMEOUT_S)
            wait_for(f"controller {self.spare_id} added", self._add_spare, CATCH_UP_TIMEOUT_S)
            wait_for(
                f"controller {self.spare_id} to catch up",
                lambda: self._caught_up({self.spare_id}),
                CATCH_UP_TIMEOUT_S,
            )
        except BaseException:
            self.heal()
            raise
        return time.monotonic() - started

    def _add_spare(self) -> bool:
        """AddRaftVoter for the spare; False to try again after a retriable refusal (whose
        change may have committed all the same: the voters are read first)."""
        try:
            if self.spare_id in {v.node_id for v in self._admin.describe_quorum().voters}:
                return True
            self._admin.add_raft_voter(self.spare)
        except KafkaError as error:
            if not error.retriable:
                raise
            log.info("adding controller %d: %s; trying again", self.spare_id, error)
            return False
        return True

    def heal(self) -> None:
        """Restore the voters the run started with (see the module docstring), one change at a
        time; a retriable refusal (an election, the previous change not committed yet) is
        tried again until `CATCH_UP_TIMEOUT_S`. A voter added back must catch up; the others
        are as the other faults left them."""
        added_back: set[int] = set()
        wait_for(
            "the first voters back", lambda: self._restore_step(added_back), CATCH_UP_TIMEOUT_S
        )
        self.stop_spare()

    def _restore_step(self, added_back: set[int]) -> bool:
        """One step towards the first voters; True once they are the voters, and those in
        `added_back` (the voters this heal added) caught up."""
        original = {v.node_id: v for v in self.original}
        try:
            current = {v.node_id for v in self._admin.describe_quorum().voters}
            extra, missing = sorted(current - set(original)), sorted(set(original) - current)
            if extra:
                self._admin.remove_raft_voter(extra[0])
            elif missing:
                added_back.add(missing[0])
                self._admin.add_raft_voter(original[missing[0]])
            else:
                self.stop_spare()
                return self._caught_up(added_back)
        except KafkaError as error:
            if not error.retriable:
                raise
            log.info("restoring the voters: %s; trying again", error)
        return False

    def _caught_up(self, voter_ids: set[int]) -> bool:
        """`voter_ids` are voters, each at most `CAUGHT_UP_LAG_MAX` entries behind."""
        try:
            lags = {v.node_id: v.lag for v in self._admin.describe_quorum().voters}
        except KafkaError as error:
            if not error.retriable:
                raise
            return False
        return all(0 <= lags.get(n, -1) <= CAUGHT_UP_LAG_MAX for n in voter_ids)

    # -- the spare controller's process -----------------------------------------------------------
    def start_spare(self, fault_id: int) -> None:
        """Start the spare controller on an empty directory of its own (``spare-<fault id>``):
        controller role only, the cluster's first voters in ``controller.quorum.voters``."""
        if self._proc is not None and self._proc.poll() is None:
            raise RuntimeError(f"controller {self.spare_id} is already running")
        directory = self._work_dir / f"spare-{fault_id}"
        shutil.rmtree(directory, ignore_errors=True)
        prepare_data_dir(self._identity, directory)
        config_path = directory / "node.toml"
        config_path.write_text(
            self._local.new_controller_config(self.spare_id, self.spare.host, directory)
        )  # in a secure cluster this made the new controller's certificate too
        if self._local.secure:
            share_secrets(self._local.secrets, self.spare_id, self._identity)
        argv = [self._python, "-m", "dataplane.tools.entry", "node", "--config", str(config_path)]
        with (directory / "node.log").open("ab") as out:
            self._proc = spawn(
                self._identity, argv, cwd=self._repo, stdout=out, stderr=subprocess.STDOUT
            )
        log.info("controller %d started: pid %d", self.spare_id, self._proc.pid)

    def stop_spare(self) -> None:
        """SIGTERM the spare controller by its pid (SIGKILL after `STOP_TIMEOUT_S`)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)

    @property
    def spare_pid(self) -> int | None:
        proc = self._proc
        return None if proc is None or proc.poll() is not None else proc.pid

    def _spare_answers(self) -> bool:
        if self.spare_pid is None:
            raise RuntimeError(f"controller {self.spare_id} exited: {self._proc}")
        client = ControllerClient([self.spare.address], security=self._local.admin_security)
        try:
            client.stub(self.spare.address).DescribeCluster(
                pb.DescribeClusterRequest(), timeout=1.0
            )
        except grpc.RpcError:
            return False
        finally:
            client.close()
        return True


def _live(quorum: QuorumDescription, node_id: int) -> bool:
    """The active controller is live; another voter is if the leader is connected to it."""
    return node_id == quorum.leader_id or any(
        v.node_id == node_id and v.connected for v in quorum.voters
    )


def removable(quorum: QuorumDescription, position: int) -> int | None:
    """The voter a remove takes out: the one at `position` (wrapping) among the live voters,
    if the live voters left are a majority of the voters left; else None."""
    live = sorted(v.node_id for v in quorum.voters if _live(quorum, v.node_id))
    if not live:
        return None
    leaving = live[position % len(live)]
    left = len(quorum.voters) - 1
    return leaving if left >= 1 and 2 * (len(live) - 1) > left else None
