"""A reassign fault's heal: it waits for a fenced broker of the original assignment (one an
earlier fault restarted, still catching up) instead of failing once; other refusals fail it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from chaos import runner
from dataplane.client import TopicPartition
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
