"""MetadataState: the replicated state machine's history and what followers of it receive."""

from __future__ import annotations

import uuid

from metadata_quorum.codec import encode_batch
from metadata_quorum.controller import AppliedBatch, MetadataState
from metadata_quorum.records import Endpoint, RegisterBroker, TopicRecord

ENDPOINTS = (Endpoint("BROKER", "127.0.0.1", 9092),)


def _topic(n: int) -> TopicRecord:
    return TopicRecord(f"t{n}", uuid.UUID(int=n + 1))


def test_followers_get_deltas_then_the_whole_image_once_history_is_gone() -> None:
    state = MetadataState(history_max=5)
    applied = state.apply(encode_batch([RegisterBroker(1, "inc", ENDPOINTS, None)]), 1)
    assert applied == AppliedBatch(0, ())
    for n in range(3):
        state.apply(encode_batch([_topic(n)]), n + 2)
    image, records, high = state.updates_since(1, wait_s=0)
    assert image is None and high == 3
    assert [offset for offset, _ in records] == [1, 2, 3]
    assert records[0][1] == _topic(0)

    for n in range(3, 10):
        state.apply(encode_batch([_topic(n)]), n + 2)
    image, records, high = state.updates_since(1, wait_s=0)
    assert image is not None and records == [] and image.offset == high == 10
    assert sorted(image.topic_ids) == sorted(f"t{n}" for n in range(10))

    image, records, _ = state.updates_since(11, wait_s=0.01)
    assert image is None and records == []


def test_a_rejected_record_is_reported_and_still_takes_an_offset() -> None:
    state = MetadataState()
    state.apply(encode_batch([_topic(0)]), 1)
    applied = state.apply(encode_batch([_topic(0), _topic(1)]), 2)
    assert isinstance(applied, AppliedBatch)
    assert applied.first_offset == 1
    assert [r.offset for r in applied.rejected] == [1]
    assert state.image.offset == 2
    assert sorted(state.image.topic_ids) == ["t0", "t1"]


def test_snapshot_and_restore_give_the_same_image() -> None:
    state = MetadataState()
    state.apply(encode_batch([RegisterBroker(1, "inc", ENDPOINTS, "rack-a"), _topic(0)]), 1)
    other = MetadataState()
    other.restore(state.snapshot())
    assert other.image == state.image


def test_each_compaction_drops_the_history_the_previous_snapshot_covers() -> None:
    """The history follows the journal (Kafka's log start offset follows its snapshots): what
    the last snapshot covers stays one more compaction interval, what the one before covers
    goes. Without it only the 100,000-record cap bounded the history (docs/soak.md)."""
    state = MetadataState()
    for n in range(5):
        state.apply(encode_batch([_topic(n)]), n + 1)  # offsets 0-4
    state.snapshot()  # covers 0-4: they stay until the next compaction
    _, records, _ = state.updates_since(0, wait_s=0)
    assert [offset for offset, _ in records] == [0, 1, 2, 3, 4]

    for n in range(5, 8):
        state.apply(encode_batch([_topic(n)]), n + 1)  # offsets 5-7
    state.snapshot()  # covers 0-7: 0-4 (the previous snapshot's) go
    image, records, high = state.updates_since(5, wait_s=0)
    assert image is None and [offset for offset, _ in records] == [5, 6, 7] and high == 7
    image, records, _ = state.updates_since(4, wait_s=0)  # behind the history: the image
    assert image is not None and image.offset == 7 and records == []

    state.snapshot()  # nothing new since: 5-7 go, a follower at 8 still gets what comes
    assert state.updates_since(5, wait_s=0)[0] is not None
    state.apply(encode_batch([_topic(8)]), 9)
    image, records, _ = state.updates_since(8, wait_s=0)
    assert image is None and [offset for offset, _ in records] == [8]
