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
