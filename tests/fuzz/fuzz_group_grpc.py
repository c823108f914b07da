"""Fuzz target: the group coordinator's gRPC handlers (GroupCoordinatorService).

As tests/fuzz/fuzz_broker_grpc.py, on the GroupServicer of an in-process broker that leads
``__consumer_offsets``-0. The classic protocol's waits (JoinGroup's rebalance timeout) are
clamped to none.
"""

from __future__ import annotations

from protos import group_pb2_grpc as gpb_grpc
from tests.fuzz.inprocess import BrokerPool, GrpcDoor

POOL = BrokerPool()
_doors: dict[int, GrpcDoor] = {}


def fuzz_one(data: bytes) -> None:
    broker = POOL.get()
    door = _doors.get(id(broker))
    if door is None:
        _doors.clear()
        add = gpb_grpc.add_GroupCoordinatorServiceServicer_to_server
        door = _doors[id(broker)] = GrpcDoor(lambda s: add(broker.groups, s))
    door.call(data, clamp={"rebalance_timeout_ms": 0, "max_wait_ms": 0})


if __name__ == "__main__":
    from tests.fuzz.runner import main

    main(fuzz_one)
