"""The active controller generates records on its speculative image (committed + in flight). When
a write fails, that image may no longer be the log's: a timed-out entry can still commit, a
record can come back rejected at replay, a new Raft term can have dropped entries. The controller
then activates again from the committed image (metadata_quorum/controller.py), so what it writes
next is computed on what the log holds.

A CI chaos run lost acknowledged records the way the first test shows with the earlier code: an
ISR change timed out at the controller but committed; the controller had dropped it from its
image, so its next ISR change, computed on the old ISR, was rejected at replay but stayed in its
image; the change after that passed the partition-epoch check (the epochs coincided) with an ISR
computed on that wrong image, and made a replica that lacked the acknowledged records the leader.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import pytest

from metadata_quorum import controller as controller_module
from metadata_quorum.codec import encode_batch
from metadata_quorum.controller import MetadataState, NotControllerError, QuorumController
from metadata_quorum.image import MetadataImage, PartitionRegistration
from metadata_quorum.raft import QuorumStatus, VoterStatus
from metadata_quorum.records import (
    ControllerVoter,
    MetadataRecord,
    PartitionChange,
    PartitionRecord,
    TopicRecord,
)
from raftlog.errors import ErrorCode, KafkaError

VOTER = ControllerVoter(1, "127.0.0.1", 9093, 9094)
TOPIC = uuid.UUID(int=7)
Generate = Callable[[MetadataImage], tuple[Sequence[MetadataRecord], None]]


class HeldLog:
    """A one-voter metadata log in memory; while ``held``, appends wait for ``release`` (a
    commit slower than the controller's write timeout)."""

    def __init__(self, state: MetadataState) -> None:
        self.state = state
        self.index = 0
        self.current_term = 1
        self.held = False
        self._pending: list[tuple[bytes, Future[object]]] = []

    def append(self, payload: bytes) -> Future[object]:
        future: Future[object] = Future()
        self._pending.append((payload, future))
        if not self.held:
            self.release()
        return future

    def release(self) -> None:
        while self._pending:
            payload, future = self._pending.pop(0)
            future.set_result(self.commit(payload))

    def commit(self, payload: bytes) -> object:
        self.index += 1
        return self.state.apply(payload, self.index)

    def is_leader(self) -> bool:
        return True

    def leader(self) -> str:
        return VOTER.raft_address

    def voters(self) -> frozenset[str]:
        return frozenset({VOTER.raft_address})

    def status(self) -> QuorumStatus:
        voter = VoterStatus(VOTER.raft_address, self.index, True)
        return QuorumStatus(VOTER.raft_address, VOTER.raft_address, self.term(), self.index,
                            self.index, True, (voter,))  # fmt: skip

    def term(self) -> int:
        return self.current_term


def _active(log: HeldLog) -> QuorumController:
    any_log: Any = log  # the MetadataLogLike calls the controller makes here
    controller = QuorumController(1, log.state, any_log, lambda _: 1, static_voters=(VOTER,))
    controller._tick()  # the LeaderChange and the bootstrap features committed
    assert controller.is_active
    topic: list[MetadataRecord] = [
        TopicRecord("t", TOPIC),
        PartitionRecord(TOPIC, 0, (1, 2, 3), (1, 2, 3), 1),
    ]
    controller.write(lambda _: (topic, None))
    return controller


def _partition(image: MetadataImage) -> PartitionRegistration:
    registration = image.partition(TOPIC, 0)
    assert registration is not None
    return registration


def _shrink(broker: int) -> Generate:
    """A leader's ISR shrink without ``broker``, computed on the image it is generated on (the
    leader moves to the first replica left if it was ``broker``)."""

    def generate(image: MetadataImage) -> tuple[Sequence[MetadataRecord], None]:
        current = _partition(image)
        isr = tuple(b for b in current.isr if b != broker)
        leader = current.leader if current.leader in isr else isr[0]
        change = PartitionChange(TOPIC, 0, current.partition_epoch, leader=leader, isr=isr)
        return [change], None

    return generate


def test_a_write_that_commits_after_timing_out_is_in_the_image_the_next_one_sees(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = HeldLog(MetadataState())
    controller = _active(log)
    monkeypatch.setattr(controller_module, "WRITE_TIMEOUT_S", 0.05)
    log.held = True
    with pytest.raises(KafkaError) as timed_out:
        controller.write(_shrink(3))
    assert timed_out.value.error is ErrorCode.REQUEST_TIMED_OUT
    # the controller does not write on an image that may lack the entry: clients retry
    assert not controller.is_active
    with pytest.raises(NotControllerError):
        controller.write(_shrink(2))

    log.held = False
    log.release()  # the timed-out shrink commits after all
    assert _partition(log.state.image).isr == (1, 2)
    controller._tick()
    assert controller.is_active

    # computed on the log's ISR (1, 2): the leader moves to 2. (On the ISR (1, 2, 3) the image
    # had before, it was rejected at replay and left (2, 3) there; the next shrink then made 3,
    # out of the ISR since the first one, the only member and the leader.)
    controller.write(_shrink(1))
    registration = _partition(log.state.image)
    assert (registration.isr, registration.leader, registration.partition_epoch) == ((2,), 2, 2)


def test_a_record_rejected_at_replay_leaves_nothing_in_the_image_writes_are_made_on() -> None:
    log = HeldLog(MetadataState())
    controller = _active(log)
    # an entry the controller did not propose reaches the log first (what a write's race with
    # an earlier leader's entries, or a bug, would do)
    log.commit(encode_batch([PartitionChange(TOPIC, 0, 0, isr=(1, 2))]))
    with pytest.raises(KafkaError, match="retry") as rejected:
        controller.write(_shrink(2))  # generated on ISR (1, 2, 3)
    assert rejected.value.error is ErrorCode.REQUEST_TIMED_OUT
    assert not controller.is_active
    controller._tick()

    # the image the controller writes on is the log's again: ISR (1, 2), not (1, 3)
    seen, _ = controller.write(lambda image: ([], _partition(image)))
    assert seen.isr == (1, 2) and seen.partition_epoch == 1
    controller.write(_shrink(1))
    registration = _partition(log.state.image)
    assert (registration.isr, registration.leader) == ((2,), 2)


def test_a_new_raft_term_makes_the_controller_commit_a_leader_change_first() -> None:
    log = HeldLog(MetadataState())
    controller = _active(log)
    log.current_term = 2  # lost the leadership and won it back between two ticks
    with pytest.raises(NotControllerError):
        controller.write(_shrink(3))
    controller._tick()
    assert controller.is_active
    assert log.state.image.controller_term == 2
    controller.write(_shrink(3))
    assert _partition(log.state.image).isr == (1, 2)
