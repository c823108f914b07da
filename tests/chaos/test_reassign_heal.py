"""A reassign fault's heal: it waits for a fenced broker of the original assignment (one an
earlier fault restarted, still catching up) instead of failing once; other refusals fail it.
And the final recovery's unclean election of partitions KIP-966 left offline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from chaos import runner, workloads
from dataplane.client import TopicPartition
from dataplane.client.admin import (
    BrokerDescription,
    ClusterDescription,
    PartitionDescription,
    TopicDescription,
)
from raftlog.errors import ErrorCode, KafkaError

TP = ("events", 5)


class Control:
    """An admin client whose controller answers each move with the next of ``answers``."""

    def __init__(self, *answers: KafkaError | None) -> None:
        self.answers = list(answers)
        self.moves: list[tuple[int, ...]] = []

    def alter_partition_reassignments(
        self, moves: Mapping[tuple[str, int], Sequence[int]]
    ) -> dict[TopicPartition, KafkaError | None]:
        self.moves.append(tuple(moves[TP]))
        return {TopicPartition(*TP): self.answers.pop(0)}


def fenced() -> KafkaError:
    return KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, "would add fenced brokers [1]")


def test_the_heal_waits_for_a_fenced_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dataplane.tools.local_cluster.POLL_S", 0.001)
    control = Control(fenced(), fenced(), None)
    runner._move_back(control, TP, (3, 2, 1))  # type: ignore[arg-type]
    assert control.moves == [(3, 2, 1)] * 3


def test_other_refusals_fail_the_heal() -> None:
    control = Control(KafkaError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "no ALTER"))
    with pytest.raises(KafkaError, match="no ALTER"):
        runner._move_back(control, TP, (3, 2, 1))  # type: ignore[arg-type]
    assert control.moves == [(3, 2, 1)]


class Offline:
    """An admin client over one topic: partition 0 KIP-966 left offline with last known ELR
    (1, 3), 3 is offline with an empty last known ELR, 1 has an eligible leader replica (it will
    lead when it returns) and 2 is led; `live` brokers are registered and unfenced."""

    def __init__(self, answer: KafkaError | None, live: tuple[int, ...] = (1, 2, 3)) -> None:
        self.answer, self.live = answer, live
        self.asked: list[list[tuple[str, int]]] = []

    def describe_topics(self, names: None) -> dict[str, TopicDescription]:
        partitions = (
            PartitionDescription(0, -1, 3, (1, 2, 3), (), last_known_elr=(1, 3)),
            PartitionDescription(1, -1, 3, (1, 2, 3), (), elr=(2,)),
            PartitionDescription(2, 1, 3, (1, 2, 3), (1,)),
            PartitionDescription(3, -1, 3, (1, 2, 3), ()),
        )
        return {"events": TopicDescription("events", bytes(16), partitions, {})}

    def describe_cluster(self) -> ClusterDescription:
        brokers = tuple(
            BrokerDescription(b, (), "", b not in self.live, 7, in_controlled_shutdown=False)
            for b in (1, 2, 3)
        )
        return ClusterDescription("c", 1, "", brokers, 99)

    def elect_leaders(
        self, kind: str, partitions: list[tuple[str, int]]
    ) -> dict[TopicPartition, KafkaError | None]:
        assert kind == "unclean"
        self.asked.append(partitions)
        return {TopicPartition(*tp): self.answer for tp in partitions}


def test_only_a_partition_with_no_eligible_replica_is_elected_uncleanly() -> None:
    control = Offline(None)
    elected = workloads.elect_offline_partitions(control, 42.0)  # type: ignore[arg-type]
    assert [(e.topic, e.partition, e.time_s) for e in elected] == [
        ("events", 0, 42.0), ("events", 3, 42.0),
    ]  # fmt: skip
    assert control.asked == [[("events", 0), ("events", 3)]]
    waiting = Offline(KafkaError(ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE, "none usable"))
    assert workloads.elect_offline_partitions(waiting, 43.0) == []  # type: ignore[arg-type]


def test_the_operator_waits_for_a_replica_that_held_the_records() -> None:
    """Only 2 is back: it was in neither partition's last known ELR, so partition 0 (last known
    1, 3) waits, and so does 3 (no last known ELR: it waits for every replica)."""
    control = Offline(None, live=(2,))
    assert workloads.elect_offline_partitions(control, 44.0) == []  # type: ignore[arg-type]
    assert control.asked == []
    control = Offline(None, live=(2, 3))
    elected = workloads.elect_offline_partitions(control, 45.0)  # type: ignore[arg-type]
    assert [(e.topic, e.partition) for e in elected] == [("events", 0)]
