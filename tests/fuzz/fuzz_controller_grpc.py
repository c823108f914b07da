"""Fuzz target: ControllerService's gRPC handlers (metadata_quorum/service.py).

As tests/fuzz/fuzz_broker_grpc.py, on a ControllerServicer over a real, active QuorumController
whose metadata log is in memory (`MemoryLog`: an append commits and applies at once), so
CreateTopics, AlterConfigs, RegisterBroker ... generate, replay and commit real records.
Membership changes (Add/RemoveRaftVoter) and the FetchMetadata stream's waits need a Raft
quorum and are not called. A fresh controller every `INPUTS_PER_CONTROLLER` inputs keeps the
image small.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from metadata_quorum.controller import MetadataState, QuorumController
from metadata_quorum.raft import QuorumStatus
from metadata_quorum.records import ControllerVoter
from metadata_quorum.service import ControllerServicer
from protos import controller_pb2_grpc as cpb_grpc
from tests.fuzz.inprocess import GrpcDoor

VOTER = ControllerVoter(1, "127.0.0.212", 9093, 9094)
ADDRESS = "127.0.0.212:9094"  # its Raft address
INPUTS_PER_CONTROLLER = 2000
NOT_CALLED = frozenset({"AddRaftVoter", "RemoveRaftVoter", "FetchMetadata"})


class MemoryLog:
    """A one-voter metadata log that commits each append at once."""

    def __init__(self, state: MetadataState) -> None:
        self.state = state
        self.index = 0

    def append(self, payload: bytes) -> Future[object]:
        self.index += 1
        future: Future[object] = Future()
        future.set_result(self.state.apply(payload, self.index))
        return future

    def is_leader(self) -> bool:
        return True

    def leader(self) -> str:
        return ADDRESS

    def voters(self) -> frozenset[str]:
        return frozenset({ADDRESS})

    def status(self) -> QuorumStatus:
        return QuorumStatus(ADDRESS, ADDRESS, self.term(), self.index, self.index, True, ())

    def term(self) -> int:
        return 1


def _door() -> GrpcDoor:
    state = MetadataState()
    memory_log: Any = MemoryLog(state)  # the MetadataLogLike calls this target makes
    controller = QuorumController(1, state, memory_log, lambda address: 1, static_voters=(VOTER,))
    controller._tick()  # active: the LeaderChange and the bootstrap features committed
    servicer = ControllerServicer(controller, "fuzz-cluster")
    return GrpcDoor(lambda s: cpb_grpc.add_ControllerServiceServicer_to_server(servicer, s))


_door_and_inputs: list[object] = []


def fuzz_one(data: bytes) -> None:
    if not _door_and_inputs or _door_and_inputs[1] >= INPUTS_PER_CONTROLLER:  # type: ignore[operator]
        _door_and_inputs[:] = [_door(), 0]
    door: GrpcDoor = _door_and_inputs[0]  # type: ignore[assignment]
    _door_and_inputs[1] += 1  # type: ignore[operator]
    if data and door.methods[data[0] % len(door.methods)] in NOT_CALLED:
        return
    door.call(data)


if __name__ == "__main__":
    from tests.fuzz.runner import main

    main(fuzz_one)
