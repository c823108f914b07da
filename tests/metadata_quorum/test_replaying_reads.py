"""A controller still replaying its journal (started again, not yet caught up with the commit
index a leader told it) does not answer reads from its partial image: DescribeCluster,
DescribeTopics, DescribeConfigs and ListPartitionReassignments answer NOT_CONTROLLER with the
active controller's address, which the controller client follows; its health is NOT_SERVING.
Once caught up, a standby answers from its own image again."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from metadata_quorum.controller import MetadataState, QuorumController
from metadata_quorum.raft import QuorumStatus, VoterStatus
from metadata_quorum.records import ControllerVoter
from metadata_quorum.service import ControllerServicer
from protos import controller_pb2 as pb
from raftlog.errors import ErrorCode

SELF = ControllerVoter(2, "127.0.0.2", 9093, 9094)
ACTIVE = ControllerVoter(1, "127.0.0.1", 9093, 9094)


class StandbyLog:
    """A standby's metadata log: the leader is node 1; ``caught_up`` as the test sets it."""

    def __init__(self) -> None:
        self.caught_up = False

    def append(self, payload: bytes) -> Future[object]:
        raise AssertionError("a standby's reads write nothing")

    def is_leader(self) -> bool:
        return False

    def leader(self) -> str:
        return ACTIVE.raft_address

    def voters(self) -> frozenset[str]:
        return frozenset({SELF.raft_address, ACTIVE.raft_address})

    def status(self) -> QuorumStatus:
        voters = (VoterStatus(ACTIVE.raft_address, None, True),
                  VoterStatus(SELF.raft_address, None, True))  # fmt: skip
        return QuorumStatus(SELF.raft_address, ACTIVE.raft_address, self.term(), 40, 12, True,
                            voters, caught_up=self.caught_up)  # fmt: skip

    def term(self) -> int:
        return 3


def test_a_replaying_standby_sends_reads_to_the_active_controller() -> None:
    standby_log = StandbyLog()
    log: Any = standby_log
    by_raft = {v.raft_address: v.node_id for v in (SELF, ACTIVE)}

    def leader_id_of(raft_address: str | None) -> int:
        return by_raft.get(raft_address or "", -1)

    controller = QuorumController(2, MetadataState(), log, leader_id_of,
                                  static_voters=(ACTIVE, SELF))  # fmt: skip
    servicer = ControllerServicer(controller, "replay-cluster")
    reads: list[tuple[str, Any]] = [
        ("DescribeCluster", pb.DescribeClusterRequest()),
        ("DescribeTopics", pb.DescribeTopicsRequest()),
        ("DescribeConfigs", pb.DescribeConfigsRequest()),
        ("ListPartitionReassignments", pb.ListPartitionReassignmentsRequest()),
    ]
    assert not controller.in_serving_quorum()
    for method, request in reads:
        answer = getattr(servicer, method)(request, None)
        assert answer.status.error_code == ErrorCode.NOT_CONTROLLER.code, method
        assert answer.status.controller_address == ACTIVE.address, method
        assert "replaying" in answer.status.error_message

    # what a replaying controller still says: who is active, and the voters it follows
    replaying = servicer.DescribeCluster(pb.DescribeClusterRequest(), None)
    assert replaying.controller_id == 1 and replaying.cluster_id == "replay-cluster"
    assert [v.node_id for v in replaying.voters] == [1, 2] and not replaying.brokers

    standby_log.caught_up = True
    assert controller.in_serving_quorum()
    for method, request in reads:
        assert getattr(servicer, method)(request, None).status.error_code == 0, method
    assert servicer.DescribeCluster(pb.DescribeClusterRequest(), None).controller_id == 1
