"""Idempotent producer state: the rules table-driven, then on real replicas (a retry gets its
original offsets, the state moves to a new leader with the log and survives a reopen)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from dataplane.partition import Partition
from dataplane.producer_state import SEQUENCE_MAX, ProducerStates, next_sequence
from metadata_quorum.image import PartitionRegistration
from raftlog.batch import read_header
from raftlog.errors import ErrorCode, KafkaError
from raftlog.log import Log
from raftlog.records import encode_batch
from tests.dataplane.test_replication_core import Clock, fetch_round

TOPIC_ID = uuid.UUID(int=11)


def batch(producer_id: int, epoch: int, sequence: int, count: int = 2) -> bytes:
    return encode_batch(
        [(None, b"v%d" % (sequence + n), 1_000_000, ()) for n in range(count)],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
    )


def stored(states: ProducerStates, data: bytes, base_offset: int) -> None:
    states.update(read_header(data)._replace(base_offset=base_offset))


@pytest.mark.parametrize(
    ("epoch", "sequence", "outcome"),
    [
        (0, 4, None),  # the next batch
        (0, 2, "duplicate"),  # a retry of the last batch
        (0, 0, "duplicate"),  # a retry of an older one still cached
        (0, 6, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),  # a gap
        (0, 3, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),  # overlapping, not a retry
        (1, 0, None),  # a new epoch starts at 0
        (1, 4, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    ],
)
def test_check_rules(epoch: int, sequence: int, outcome: object) -> None:
    states = ProducerStates()
    stored(states, batch(7, 0, 0), 10)
    stored(states, batch(7, 0, 2), 12)
    header = read_header(batch(7, epoch, sequence))
    if isinstance(outcome, ErrorCode):
        with pytest.raises(KafkaError) as raised:
            states.check(header)
        assert raised.value.error is outcome
    elif outcome == "duplicate":
        found = states.check(header)
        assert found is not None and found.first_offset == 10 + sequence
    else:
        assert states.check(header) is None


def test_an_unknown_producer_starts_at_sequence_zero() -> None:
    states = ProducerStates()
    with pytest.raises(KafkaError) as raised:
        states.check(read_header(batch(9, 0, 2)))  # overtook its first batch
    assert raised.value.error is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert states.check(read_header(batch(9, 0, 0))) is None


def test_an_older_epoch_is_fenced_and_sequences_wrap() -> None:
    states = ProducerStates()
    stored(states, batch(7, 3, 0), 0)
    with pytest.raises(KafkaError) as raised:
        states.check(read_header(batch(7, 2, 2)))
    assert raised.value.error is ErrorCode.INVALID_PRODUCER_EPOCH
    assert next_sequence(SEQUENCE_MAX) == 0
    assert next_sequence(SEQUENCE_MAX - 1, 3) == 1


def test_only_five_batches_are_remembered() -> None:
    states = ProducerStates()
    for n in range(6):
        stored(states, batch(7, 0, 2 * n), 2 * n)
    with pytest.raises(KafkaError):
        states.check(read_header(batch(7, 0, 0)))  # evicted: now it looks like a gap
    assert states.check(read_header(batch(7, 0, 2))) is not None


def replica(root: Path, broker_id: int, clock: Clock) -> Partition:
    log = Log(root / f"broker-{broker_id}" / "t-0", topic_id=TOPIC_ID, clock=clock)
    return Partition("t", 0, TOPIC_ID, log, broker_id, clock)


def test_a_retry_on_the_new_leader_gets_its_original_offsets(tmp_path: Path) -> None:
    clock = Clock()
    a, b = replica(tmp_path, 1, clock), replica(tmp_path, 2, clock)
    a.make_leader(PartitionRegistration((1, 2), (1, 2), 1, 0, 0))
    b.make_follower(PartitionRegistration((1, 2), (1, 2), 1, 0, 0))
    first, _ = a.append_as_leader(batch(42, 0, 0), acks=-1, min_insync_replicas=1)
    second, _ = a.append_as_leader(batch(42, 0, 2), acks=-1, min_insync_replicas=1)
    fetch_round(b, a)
    # a dies before answering the second batch; b leads; the producer retries it there.
    b.make_leader(PartitionRegistration((1, 2), (2,), 2, 1, 1))
    retried, _ = b.append_as_leader(batch(42, 0, 2), acks=-1, min_insync_replicas=1)
    assert retried.first_offset == second.first_offset == 2
    assert b.log.log_end_offset == 4, "the retry was not appended again"
    b.log.close()
    reopened = replica(tmp_path, 2, clock)
    reopened.make_leader(PartitionRegistration((1, 2), (2,), 2, 2, 2))
    again, _ = reopened.append_as_leader(batch(42, 0, 0), acks=-1, min_insync_replicas=1)
    assert again.first_offset == first.first_offset == 0, "the state is rebuilt from the log"
    with pytest.raises(KafkaError) as raised:
        reopened.append_as_leader(batch(42, 0, 9), acks=-1, min_insync_replicas=1)
    assert raised.value.error is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
