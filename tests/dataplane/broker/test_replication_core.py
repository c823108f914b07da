"""The replication core without processes: the HW/ISR arithmetic under hypothesis, and real
partition replicas (real logs on disk) replicating in-process through the same functions the
fetcher and BrokerService use, including a divergence that must be truncated."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dataplane.broker import replica_state as rs
from dataplane.broker.fetcher import apply_fetched
from dataplane.broker.partition import ON_APPEND, Partition
from metadata_quorum.image import PartitionRegistration
from protos import broker_pb2 as pb
from raftlog.errors import ErrorCode, KafkaError
from raftlog.log import Log
from raftlog.records import Record, encode_batch, iter_records

TOPIC_ID = uuid.UUID(int=7)


# -- the arithmetic ---------------------------------------------------------------------------
@given(
    st.integers(0, 1000),
    st.dictionaries(st.integers(2, 5), st.integers(-1, 1000), max_size=4),
    st.integers(0, 1000),
)
def test_high_watermark_is_the_isr_minimum_and_never_goes_back(
    leader_leo: int, follower_leos: dict[int, int], current_hw: int
) -> None:
    followers = {b: rs.FollowerState(b, leo) for b, leo in follower_leos.items()}
    isr = [1, *follower_leos]
    hw = rs.high_watermark(current_hw, 1, leader_leo, followers, isr)
    assert hw >= current_hw
    if any(leo < 0 for leo in follower_leos.values()):
        assert hw == current_hw, "an ISR member that never fetched holds the HW"
    else:
        assert hw == max(current_hw, min([leader_leo, *follower_leos.values()]))


@given(st.lists(st.tuples(st.integers(0, 500), st.integers(0, 500)), min_size=1, max_size=30))
def test_caught_up_time_is_monotone_and_set_when_the_follower_reaches_the_end(
    fetches: list[tuple[int, int]],
) -> None:
    state = rs.FollowerState(2)
    now_ms = 0
    for fetch_offset, leader_leo in fetches:
        now_ms += 10
        before = state.last_caught_up_ms
        state = rs.after_fetch(state, fetch_offset, leader_leo, now_ms)
        assert state.last_caught_up_ms >= before
        if fetch_offset >= leader_leo:
            assert state.last_caught_up_ms == now_ms


def test_out_of_sync_and_rejoin() -> None:
    followers = {2: rs.FollowerState(2, 10, last_caught_up_ms=1000), 3: rs.FollowerState(3, 4, 0)}
    assert rs.out_of_sync(1, (1, 2, 3), followers, now_ms=1500, lag_max_ms=1000) == {3}
    assert not rs.may_join_isr(followers[3], (1, 2), high_watermark=10, epoch_start_offset=0)
    assert rs.may_join_isr(followers[2], (1,), high_watermark=10, epoch_start_offset=10)
    assert rs.acks_all_outcome(11, 10, 3, 2) is None
    assert rs.acks_all_outcome(10, 10, 3, 2) is ErrorCode.NONE
    assert rs.acks_all_outcome(10, 10, 1, 2) is ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND


# -- replicas on disk ------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


def replica(tmp_path: Path, broker_id: int, clock: Clock) -> Partition:
    log = Log(tmp_path / f"broker-{broker_id}" / "t-0", topic_id=TOPIC_ID, clock=clock)
    return Partition("t", 0, TOPIC_ID, log, broker_id, clock)


def registration(leader: int, epoch: int, isr: tuple[int, ...]) -> PartitionRegistration:
    return PartitionRegistration((1, 2), isr, leader, epoch, epoch)


def fetch_round(follower: Partition, leader: Partition) -> ErrorCode:
    """One follower fetch, as the fetcher thread and BrokerService.Fetch do it."""
    state = follower.fetch_state()
    assert state is not None
    fetch_offset, last_epoch, leader_epoch, _ = state
    item = pb.FetchPartitionResponse()
    records = b""
    try:
        read, _change = leader.read_for_follower(
            follower.broker_id, fetch_offset, last_epoch, leader_epoch, 1 << 20
        )
    except KafkaError as error:
        item.error_code = error.error.code
        item.log_start_offset = leader.log.log_start_offset
        item.log_end_offset = leader.log.log_end_offset
    else:
        records, item.high_watermark = read.records, read.high_watermark
        if read.diverging is not None:
            item.diverging_epoch.epoch, item.diverging_epoch.end_offset = read.diverging
    # as the fetcher gets them: a view of the answer's bytes
    return apply_fetched(follower, fetch_offset, leader_epoch, item, memoryview(records))


def batch(*values: bytes) -> bytes:
    return encode_batch([(None, v, 1_000_000, ()) for v in values])


def values(partition: Partition) -> list[bytes | None]:
    data = partition.log.read(partition.log.log_start_offset, 1 << 24)
    return [r.value for r in iter_records(data)]


def test_acks_all_waits_for_the_follower_and_the_hw_follows(tmp_path: Path) -> None:
    clock = Clock()
    a, b = replica(tmp_path, 1, clock), replica(tmp_path, 2, clock)
    a.make_leader(registration(1, 0, (1, 2)))
    b.make_follower(registration(1, 0, (1, 2)))
    info, epoch = a.append_as_leader(batch(b"x", b"y"), acks=-1, min_insync_replicas=2)
    assert a.acks_all_outcome(info.last_offset + 1, epoch, 2) is None, "not replicated yet"
    assert fetch_round(b, a) is ErrorCode.NONE  # b copies the batch
    assert a.high_watermark == 0
    assert fetch_round(b, a) is ErrorCode.NONE  # b's next fetch offset acknowledges it
    assert a.high_watermark == 2
    assert a.acks_all_outcome(info.last_offset + 1, epoch, 2) is ErrorCode.NONE
    assert values(b) == [b"x", b"y"]


def test_waiters_are_woken_by_what_they_wait_for_and_all_by_role_changes(
    tmp_path: Path,
) -> None:
    clock = Clock()
    a, b = replica(tmp_path, 1, clock), replica(tmp_path, 2, clock)
    a.make_leader(registration(1, 0, (1, 2)))
    b.make_follower(registration(1, 0, (1, 2)))
    fetcher, first, second = threading.Event(), threading.Event(), threading.Event()
    follower = threading.Event()
    a.add_waiter(fetcher)  # a consumer's fetch long poll: every change
    a.add_waiter(follower, ON_APPEND)  # a follower's: appends
    a.add_waiter(first, high_watermark=2)  # acks=all produces of two batches
    a.add_waiter(second, high_watermark=3)
    a.append_as_leader(batch(b"x", b"y"), acks=-1, min_insync_replicas=2)
    a.append_as_leader(batch(b"z"), acks=-1, min_insync_replicas=2)
    assert fetcher.is_set() and follower.is_set()
    assert not first.is_set() and not second.is_set()
    follower.clear()
    fetch_round(b, a)
    fetch_round(b, a)  # acknowledges all three records
    assert a.high_watermark == 3 and first.is_set() and second.is_set()
    assert not follower.is_set(), "a high watermark move brings a follower nothing to copy"

    for event in (fetcher, first, second):
        event.clear()
    a.append_as_leader(batch(b"w"), acks=-1, min_insync_replicas=2)
    a.add_waiter(first, high_watermark=4)
    follower.clear()
    a.make_follower(registration(2, 1, (1, 2)))  # leadership moved: every waiter answers
    assert first.is_set() and follower.is_set()
    for event in (first, second, fetcher, follower):
        a.remove_waiter(event)


def test_a_returning_leader_truncates_what_it_never_replicated(tmp_path: Path) -> None:
    clock = Clock()
    a, b = replica(tmp_path, 1, clock), replica(tmp_path, 2, clock)
    a.make_leader(registration(1, 0, (1, 2)))
    b.make_follower(registration(1, 0, (1, 2)))
    a.append_as_leader(batch(b"committed"), acks=-1, min_insync_replicas=1)
    fetch_round(b, a)
    fetch_round(b, a)
    # acks=1 writes that never reach b; then a dies and b is elected at epoch 1.
    a.append_as_leader(batch(b"lost-1", b"lost-2"), acks=1, min_insync_replicas=1)
    b.make_leader(registration(2, 1, (2,)))
    b.append_as_leader(batch(b"new-1"), acks=1, min_insync_replicas=1)
    # a comes back as b's follower.
    a.make_follower(registration(2, 1, (2,)))
    for _ in range(5):
        assert fetch_round(a, b) is ErrorCode.NONE
    assert values(a) == values(b) == [b"committed", b"new-1"]
    assert a.log.read(0, 1 << 24) == b.log.read(0, 1 << 24), "replicas are byte-identical"


def test_a_stale_leader_epoch_is_fenced_and_a_newer_one_unknown(tmp_path: Path) -> None:
    clock = Clock()
    a = replica(tmp_path, 1, clock)
    a.make_leader(registration(1, 3, (1, 2)))
    for epoch, error in ((2, ErrorCode.FENCED_LEADER_EPOCH), (4, ErrorCode.UNKNOWN_LEADER_EPOCH)):
        try:
            a.read_for_consumer(0, 100, epoch, True)
        except KafkaError as raised:
            assert raised.error is error
        else:
            raise AssertionError(f"epoch {epoch} was served")


def test_a_lagging_follower_leaves_the_isr_and_rejoins_when_caught_up(tmp_path: Path) -> None:
    clock = Clock()
    a, b = replica(tmp_path, 1, clock), replica(tmp_path, 2, clock)
    a.make_leader(registration(1, 0, (1, 2)))
    b.make_follower(registration(1, 0, (1, 2)))
    a.append_as_leader(batch(b"1"), acks=1, min_insync_replicas=1)
    clock.now_ms += 2000
    change = a.isr_shrink(clock.now_ms, lag_max_ms=1000)
    assert change is not None and change.new_isr == (1,)
    a.isr_change_done(change, PartitionRegistration((1, 2), (1,), 1, 0, 1))
    assert a.isr == (1,)
    fetch_round(b, a)
    state = b.fetch_state()
    assert state is not None
    _, expansion = a.read_for_follower(2, state[0], state[1], 0, 1 << 20)
    assert expansion is not None and expansion.new_isr == (1, 2)


def test_a_new_leader_hides_its_end_offset_until_its_high_watermark_reaches_its_epoch(
    tmp_path: Path,
) -> None:
    """KIP-207: a follower learns the leader's high watermark one fetch late; elected, it must
    not report that lagging end offset (below acknowledged records) to a client."""
    clock = Clock()
    a, b, c = (replica(tmp_path, n, clock) for n in (1, 2, 3))
    first = PartitionRegistration((1, 2, 3), (1, 2, 3), 1, 0, 0)
    a.make_leader(first)
    b.make_follower(first)
    c.make_follower(first)
    a.append_as_leader(batch(b"x", b"y"), acks=-1, min_insync_replicas=2)
    fetch_round(b, a)  # b copies; its next fetch offset will say so
    fetch_round(c, a)
    fetch_round(b, a)
    fetch_round(c, a)  # the HW reaches 2 on c's fetch: c learns it, b does not
    assert (a.high_watermark, b.high_watermark, c.high_watermark) == (2, 0, 2)
    second = PartitionRegistration((1, 2, 3), (2, 3), 2, 1, 1)
    b.make_leader(second)
    c.make_follower(second)
    try:
        b.leader_state(-1, committed=True)
    except KafkaError as raised:
        assert raised.error is ErrorCode.OFFSET_NOT_AVAILABLE
    else:
        raise AssertionError("a lagging high watermark was reported")
    assert b.leader_state(-1) == (1, 0), "the debugging replica still gets an answer"
    fetch_round(c, b)
    assert b.leader_state(-1, committed=True) == (1, 2)


def test_a_replica_added_within_the_leader_epoch_fetches_and_joins_the_isr(
    tmp_path: Path,
) -> None:
    """A reassignment adds broker 3 to (1, 2) without a new leader epoch: the leader must serve
    its fetches and propose it for the ISR once it has caught up; a dropped replica is refused."""
    clock = Clock()
    leader, newcomer = replica(tmp_path, 1, clock), replica(tmp_path, 3, clock)
    leader.make_leader(PartitionRegistration((1, 2), (1,), 1, 4, 4))
    leader.append_as_leader(batch(b"a", b"b"), -1, 1)
    assert leader.high_watermark == 2
    with pytest.raises(KafkaError) as unknown:
        leader.read_for_follower(3, 0, -1, 4, 1 << 20)
    assert unknown.value.error is ErrorCode.NOT_LEADER_OR_FOLLOWER
    moving = PartitionRegistration((3, 1, 2), (1,), 1, 4, 5, (3,), (2,))
    assert not leader.make_leader(moving)  # the same leadership
    newcomer.make_follower(moving)
    state = newcomer.fetch_state()
    assert state is not None
    _, change = leader.read_for_follower(3, state[0], state[1], state[2], 1 << 20)
    assert change is None  # nothing fetched yet
    assert fetch_round(newcomer, leader) is ErrorCode.NONE
    assert values(newcomer) == [b"a", b"b"]
    state = newcomer.fetch_state()
    assert state is not None
    _, change = leader.read_for_follower(3, state[0], state[1], state[2], 1 << 20)
    assert change is not None and change.new_isr == (1, 3)
    done = PartitionRegistration((3, 1), (1, 3), 1, 4, 7)
    leader.isr_change_done(change, done)
    assert (leader.replicas, leader.isr) == ((3, 1), (1, 3))
    with pytest.raises(KafkaError) as refused:
        leader.read_for_follower(2, 2, 4, 4, 1 << 20)
    assert refused.value.error is ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_a_leader_whose_isr_change_completed_a_move_away_keeps_waiting_on_the_new_leader(
    tmp_path: Path,
) -> None:
    """The newcomer's ISR join completes a reassignment that moves the leadership to it (a new
    leader epoch). Until the metadata demotes the old leader, its high watermark must still wait
    on the newcomer, which stopped fetching to lead: acknowledging on the smaller ISR would lose
    a record the new leader never had."""
    clock = Clock()
    leader, follower = replica(tmp_path, 1, clock), replica(tmp_path, 2, clock)
    newcomer = replica(tmp_path, 3, clock)
    moving = PartitionRegistration((3, 2, 1), (1, 2), 1, 4, 5, (3,), (1,))
    leader.make_leader(moving)
    for other in (follower, newcomer):
        other.make_follower(moving)
    leader.append_as_leader(batch(b"a", b"b"), -1, 1)
    for _ in range(2):
        assert fetch_round(follower, leader) is ErrorCode.NONE
    assert fetch_round(newcomer, leader) is ErrorCode.NONE
    state = newcomer.fetch_state()
    assert state is not None
    _, change = leader.read_for_follower(3, state[0], state[1], state[2], 1 << 20)
    assert change is not None and change.new_isr == (1, 2, 3)
    assert leader.high_watermark == 2
    leader.isr_change_done(change, PartitionRegistration((3, 2), (2, 3), 3, 5, 7))
    info, epoch = leader.append_as_leader(batch(b"c"), acks=-1, min_insync_replicas=1)
    for _ in range(2):
        assert fetch_round(follower, leader) is ErrorCode.NONE  # 2 copies it; 3 leads now
    assert leader.high_watermark == 2
    assert leader.acks_all_outcome(info.last_offset + 1, epoch, 1) is None


def test_a_leader_batch_below_the_follower_log_end_truncates_there(tmp_path: Path) -> None:
    """Issue 30 §1, the fetcher's side: a follower whose epoch checkpoint lies (a power cut
    undid its truncation) fetches with a last epoch the leader finds no divergence for; the
    leader's batch then starts below the follower's log end. The follower truncates there and
    fetches again, instead of refusing the append forever."""
    clock = Clock()
    a, b = replica(tmp_path, 1, clock), replica(tmp_path, 2, clock)
    a.make_leader(registration(1, 0, (1, 2)))
    b.make_follower(registration(1, 0, (1, 2)))
    a.append_as_leader(batch(b"committed"), acks=-1, min_insync_replicas=1)
    assert fetch_round(b, a) is ErrorCode.NONE
    # b's stale epoch-0 batch at 1..2, the leader never had it; b's checkpoint gives 1.. to
    # epoch 1, as the durable checkpoint did over the resurrected batch
    stale = [Record(-1, 1_000_000, None, value) for value in (b"stale-1", b"stale-2")]
    b.log.append_as_follower(encode_batch(stale, base_offset=1, partition_leader_epoch=0))
    b.log.epochs.assign(1, 1)
    a.make_leader(registration(1, 1, (1, 2)))
    a.append_as_leader(batch(b"new-1"), acks=1, min_insync_replicas=1)
    a.append_as_leader(batch(b"new-2", b"new-3"), acks=1, min_insync_replicas=1)
    b.make_follower(registration(1, 1, (1, 2)))
    # b fetches at 3 with last epoch 1: the leader's batch there starts at 2
    assert fetch_round(b, a) is ErrorCode.NONE
    assert b.log.log_end_offset == 1, "the stale batch went whole; the next fetch fills from 1"
    for _ in range(3):
        assert fetch_round(b, a) is ErrorCode.NONE
    assert values(b) == values(a) == [b"committed", b"new-1", b"new-2", b"new-3"]
    assert a.log.read(0, 1 << 24) == b.log.read(0, 1 << 24), "replicas are byte-identical"
    assert b.log.epochs.entries == a.log.epochs.entries


def test_an_answer_for_a_replica_stopped_and_closed_meanwhile_is_dropped(tmp_path: Path) -> None:
    """A chaos run's find: a reassignment moved a follower's replica away (stopped, its log
    closed) while a fetch for it was out; applying the answer read the closed log
    (IndexError), which ended the fetcher thread, and with it every partition it fetched."""
    clock = Clock()
    a, b = replica(tmp_path, 1, clock), replica(tmp_path, 2, clock)
    a.make_leader(registration(1, 0, (1, 2)))
    b.make_follower(registration(1, 0, (1, 2)))
    a.append_as_leader(batch(b"x"), acks=1, min_insync_replicas=1)
    state = b.fetch_state()
    assert state is not None
    fetch_offset, last_epoch, leader_epoch, _ = state
    read, _change = a.read_for_follower(2, fetch_offset, last_epoch, leader_epoch, 1 << 20)
    answer = pb.FetchPartitionResponse(high_watermark=read.high_watermark)
    diverged = pb.FetchPartitionResponse()
    diverged.diverging_epoch.epoch, diverged.diverging_epoch.end_offset = 0, 0
    b.stop()  # what the replica manager does to a replica moved away
    b.log.close()
    records = memoryview(read.records)
    assert apply_fetched(b, fetch_offset, leader_epoch, answer, records) is ErrorCode.NONE
    assert apply_fetched(b, fetch_offset, leader_epoch, diverged, records[:0]) is ErrorCode.NONE


def test_the_high_watermark_waits_while_the_isr_is_under_min_isr(tmp_path: Path) -> None:
    """KIP-966 (Kafka's maybeIncrementLeaderHW since 3.7): an acks=1 append under min ISR is
    in the log but not committed until the ISR is back at min ISR, so a replica that left the
    ISR (an eligible leader replica) holds every committed record."""
    clock = Clock()
    a = replica(tmp_path, 1, clock)
    a.min_insync_replicas = 2
    a.make_leader(registration(1, 0, (1,)))
    a.append_as_leader(batch(b"x"), acks=1, min_insync_replicas=2)
    assert (a.log.log_end_offset, a.high_watermark) == (1, 0)
    a.min_insync_replicas = 3  # above the replica count: the effective min ISR is 2
    a.make_leader(PartitionRegistration((1, 2), (1, 2), 1, 0, 1))
    assert a.high_watermark == 0, "2 has not fetched the record yet"
    a.min_insync_replicas = 1
    a.make_leader(PartitionRegistration((1, 2), (1,), 1, 0, 2))
    assert a.high_watermark == 1, "at min ISR, the leader alone commits"
