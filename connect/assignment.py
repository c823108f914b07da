"""Who runs what in distributed mode. Pure: plain data in, plain data out.

Workers join the classic group ``group.id`` with protocol type ``connect`` and protocol
``default`` (Kafka Connect's eager protocol). Each worker's metadata is its REST URL and the
offset up to which it has read ``connect-configs``. The leader (the coordinator picks it)
computes the assignment with :func:`assign`: the connectors, then the tasks, dealt round-robin
over the members sorted by member id, continuing where the connectors stopped, as Kafka
Connect's eager assignor does. Every member gets the whole picture's config offset, so it reads
``connect-configs`` at least that far before starting its work, and the leader's URL.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PROTOCOL_TYPE = "connect"
PROTOCOL_NAME = "default"
VERSION = 1


@dataclass(frozen=True, order=True)
class ConnectorTaskId:
    connector: str
    task: int

    def __str__(self) -> str:
        return f"{self.connector}-{self.task}"


@dataclass(frozen=True)
class WorkerMetadata:
    url: str
    config_offset: int

    def encode(self) -> bytes:
        return json.dumps(
            {"version": VERSION, "url": self.url, "config_offset": self.config_offset}
        ).encode()

    @staticmethod
    def decode(data: bytes) -> WorkerMetadata:
        value = _object(data)
        return WorkerMetadata(str(value["url"]), int(value["config_offset"]))


@dataclass(frozen=True)
class Assignment:
    leader: str
    leader_url: str
    config_offset: int
    connectors: tuple[str, ...] = ()
    tasks: tuple[ConnectorTaskId, ...] = ()
    error: int = 0  # 1: the leader had not read as far as a member (join again)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": VERSION,
                "error": self.error,
                "leader": self.leader,
                "leader_url": self.leader_url,
                "config_offset": self.config_offset,
                "connectors": list(self.connectors),
                "tasks": [[t.connector, t.task] for t in self.tasks],
            }
        ).encode()

    @staticmethod
    def decode(data: bytes) -> Assignment:
        value = _object(data)
        return Assignment(
            leader=str(value["leader"]),
            leader_url=str(value["leader_url"]),
            config_offset=int(value["config_offset"]),
            connectors=tuple(str(c) for c in value["connectors"]),
            tasks=tuple(ConnectorTaskId(str(c), int(t)) for c, t in value["tasks"]),
            error=int(value.get("error", 0)),
        )


@dataclass(frozen=True)
class WorkToAssign:
    connectors: tuple[str, ...]
    tasks: tuple[ConnectorTaskId, ...] = field(default=())


def assign(
    leader: str,
    members: Mapping[str, WorkerMetadata],
    work: WorkToAssign,
    config_offset: int,
) -> dict[str, Assignment]:
    """Round-robin of connectors, then tasks, over the members sorted by member id.

    If some member has read ``connect-configs`` further than the leader (``config_offset``),
    every member gets error 1 and joins again once the leader has caught up."""
    order = sorted(members)
    leader_url = members[leader].url if leader in members else ""
    if any(m.config_offset > config_offset for m in members.values()):
        return {m: Assignment(leader, leader_url, config_offset, error=1) for m in order}
    connectors: dict[str, list[str]] = {m: [] for m in order}
    tasks: dict[str, list[ConnectorTaskId]] = {m: [] for m in order}
    turn = 0
    for name in sorted(work.connectors):
        connectors[order[turn % len(order)]].append(name)
        turn += 1
    for task in sorted(work.tasks):
        tasks[order[turn % len(order)]].append(task)
        turn += 1
    return {
        m: Assignment(leader, leader_url, config_offset, tuple(connectors[m]), tuple(tasks[m]))
        for m in order
    }


def decode_members(members: Sequence[tuple[str, bytes]]) -> dict[str, WorkerMetadata]:
    return {member_id: WorkerMetadata.decode(data) for member_id, data in members}


def _object(data: bytes) -> dict[str, Any]:
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value
