"""The share consumer's acknowledgement bookkeeping (dataplane/client/_share_acks.py) and its
decoding of a ShareFetch answer: pure, no broker."""

from __future__ import annotations

import pytest

from dataplane.client._share_acks import (
    GAP,
    Acknowledgements,
    AcknowledgeType,
    AckRun,
    IllegalStateError,
    runs,
)
from dataplane.client._types import TopicPartition
from dataplane.client.share_consumer import decode_acquired, new_member_id, next_epoch
from protos import broker_pb2 as pb
from raftlog.records import Record, encode_batch

TP = TopicPartition("t", 0)
OTHER = TopicPartition("t", 1)
A, B = "10.0.0.1:9092", "10.0.0.2:9092"
ACCEPT, RELEASE, REJECT = AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.REJECT


def test_runs_join_consecutive_offsets_of_one_type() -> None:
    acks = {5: 1, 6: 1, 7: 3, 8: 1, 10: 1, 4: 1}
    assert runs(acks) == [AckRun(4, 6, 1), AckRun(7, 7, 3), AckRun(8, 8, 1), AckRun(10, 10, 1)]
    assert runs({}) == []


def test_implicit_mode_accepts_the_last_poll_on_the_next() -> None:
    acks = Acknowledgements(explicit=False)
    acks.delivered(A, TP, [3, 4, 5])
    with pytest.raises(IllegalStateError):
        acks.acknowledge(TP, 3, ACCEPT)  # implicit: the consumer acknowledges, not the app
    assert acks.addresses() == set()  # nothing settled before the next poll
    acks.before_poll()
    assert acks.take(A) == {TP: [AckRun(3, 5, ACCEPT)]}
    assert acks.take(A) == {} and acks.addresses() == set()


def test_implicit_commit_accepts_what_was_delivered() -> None:
    acks = Acknowledgements(explicit=False)
    acks.delivered(A, TP, [1, 2])
    acks.delivered(B, OTHER, [7])
    acks.before_commit()
    assert acks.addresses() == {A, B}
    assert acks.take(B) == {OTHER: [AckRun(7, 7, ACCEPT)]}
    acks.before_poll()  # already settled: nothing twice
    assert acks.take(A) == {TP: [AckRun(1, 2, ACCEPT)]}


def test_explicit_mode_needs_every_record_acknowledged_before_the_next_poll() -> None:
    acks = Acknowledgements(explicit=True)
    acks.delivered(A, TP, [10, 11, 12])
    acks.acknowledge(TP, 10, ACCEPT)
    acks.acknowledge(TP, 12, REJECT)
    assert acks.unacknowledged() == 1
    with pytest.raises(IllegalStateError):
        acks.before_poll()
    with pytest.raises(IllegalStateError):
        acks.acknowledge(TP, 10, RELEASE)  # once
    with pytest.raises(IllegalStateError):
        acks.acknowledge(TP, 99, ACCEPT)  # not delivered
    with pytest.raises(IllegalStateError):
        acks.acknowledge(OTHER, 11, ACCEPT)  # another partition's offset
    # a commit sends what is acknowledged; the rest stays the application's
    acks.before_commit()
    assert acks.take(A) == {TP: [AckRun(10, 10, ACCEPT), AckRun(12, 12, REJECT)]}
    acks.acknowledge(TP, 11, RELEASE)
    acks.before_poll()
    assert acks.take(A) == {TP: [AckRun(11, 11, RELEASE)]}
    with pytest.raises(IllegalStateError):
        acks.acknowledge(TP, 11, ACCEPT)  # the new poll forgot the old records


def test_gaps_are_ready_at_once_and_a_lost_session_forgets_its_records() -> None:
    acks = Acknowledgements(explicit=True)
    acks.gaps(A, TP, [4, 5])
    acks.delivered(A, TP, [6])
    acks.delivered(B, OTHER, [1])
    assert acks.ready_partitions(A) == {TP}
    assert acks.take(A, {OTHER}) == {}  # only the partitions asked for
    dropped = acks.forget(A)  # the session on A is gone: its records were released
    assert dropped == {TP: [AckRun(4, 5, GAP)]}
    assert acks.unacknowledged() == 1  # B's record is still owed
    with pytest.raises(IllegalStateError):
        acks.acknowledge(TP, 6, ACCEPT)


def _batch(base: int, values: list[bytes]) -> bytes:
    records = [Record(base + n, 1_000 + n, None, v) for n, v in enumerate(values)]
    return bytes(encode_batch(records, base_offset=base, partition_leader_epoch=3))


def test_decoding_keeps_the_acquired_records_with_their_delivery_counts() -> None:
    data = _batch(0, [b"a", b"b", b"c"]) + _batch(3, [b"d", b"e"])
    acquired = [
        pb.ShareAcquiredRecords(first_offset=1, last_offset=2, delivery_count=1),
        pb.ShareAcquiredRecords(first_offset=4, last_offset=6, delivery_count=3),
    ]
    records, gaps = decode_acquired(TP, data, acquired)
    assert [(r.offset, r.value, r.delivery_count) for r in records] == [
        (1, b"b", 1), (2, b"c", 1), (4, b"e", 3),
    ]  # fmt: skip
    assert records[0].leader_epoch == 3 and records[0].topic == "t"
    assert gaps == [5, 6]  # acquired, no record: GAP


def test_member_ids_and_session_epochs() -> None:
    ids = {new_member_id() for _ in range(10)}
    assert len(ids) == 10 and all(len(i) == 22 for i in ids)
    assert [next_epoch(e) for e in (0, 1, 2**31 - 1, -1)] == [1, 2, 1, 1]


def test_a_renewed_record_is_sent_now_and_stays_owed_across_polls() -> None:
    """KIP-1222's RENEW (explicit mode): ready at once (the next request restarts the lock),
    counts as acknowledged for the next poll, is never accepted on the application's behalf,
    and stays acknowledgeable (ACCEPT at last, or RENEW again) across polls."""
    renew = AcknowledgeType.RENEW
    acks = Acknowledgements(explicit=True)
    acks.delivered(A, TP, [3, 4])
    acks.acknowledge(TP, 3, renew)
    acks.acknowledge(TP, 4, ACCEPT)
    acks.before_commit()
    assert acks.take(A) == {TP: [AckRun(3, 3, renew), AckRun(4, 4, ACCEPT)]}
    acks.before_poll()  # 3 renewed: the poll is allowed
    assert acks.take(A) == {}  # and 3 is not accepted for the application
    acks.delivered(A, TP, [5])
    acks.acknowledge(TP, 3, renew)  # a poll later: renewed again
    acks.acknowledge(TP, 5, ACCEPT)
    acks.before_poll()
    assert acks.take(A) == {TP: [AckRun(3, 3, renew), AckRun(5, 5, ACCEPT)]}
    assert acks.unacknowledged() == 0  # 3 is owed but renewed: the next poll is allowed
    with pytest.raises(IllegalStateError):
        acks.acknowledge(TP, 5, ACCEPT)  # 5 was settled by the last poll
    acks.acknowledge(TP, 3, RELEASE)  # done with it at last
    acks.before_poll()
    assert acks.take(A) == {TP: [AckRun(3, 3, RELEASE)]}
    with pytest.raises(IllegalStateError):
        acks.acknowledge(TP, 3, ACCEPT)  # settled: no longer owed
    implicit = Acknowledgements(explicit=False)
    implicit.delivered(A, TP, [1])
    with pytest.raises(IllegalStateError):
        implicit.acknowledge(TP, 1, renew)  # as Kafka: RENEW needs explicit mode
