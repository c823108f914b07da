"""Golden transcripts of the pure controller (see ``transcript.py`` for the format).

Each scenario's expected text is ``transcripts/<name>.txt``;
``pytest tests/metadata_quorum/test_transcripts.py --update-transcripts`` rewrites them (the option
lives in this directory's conftest, so name a path in it). Review a rewritten transcript line by
line before keeping it: it is the spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from metadata_quorum.replication import NewTopic
from tests.metadata_quorum.transcript import (
    AllocateProducerIds,
    AlterPartition,
    AlterPartitions,
    ApplyHeld,
    CreatePartitions,
    CreateTopics,
    DeleteTopics,
    ElectLeaders,
    ExpireSessions,
    Heartbeat,
    PreferredRebalance,
    Register,
    Step,
    run_scenario,
)

TRANSCRIPTS = Path(__file__).parent / "transcripts"
UNCLEAN = {"unclean.leader.election.enable": "true"}


def boot(racks: Mapping[int, str | None], now_ms: int = 0) -> list[Step]:
    """Register the brokers, then one heartbeat each, which unfences them (caught up)."""
    steps: list[Step] = [Register(b, rack) for b, rack in racks.items()]
    steps.append(Heartbeat(tuple(racks), now_ms))
    return steps


SIX_BROKERS_THREE_RACKS: dict[int, str | None] = {1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: "c"}
THREE_BROKERS: dict[int, str | None] = {1: None, 2: None, 3: None}

SCENARIOS: dict[str, list[Step]] = {
    # Placement: rack-aware, never a broker twice, leaders spread evenly across topics.
    "placement": [
        *boot(SIX_BROKERS_THREE_RACKS),
        # RF 3 over 3 racks: every partition on 3 racks; 6 partitions, one preferred leader each.
        CreateTopics((NewTopic("orders", 6, 3),)),
        # The next topics continue where the previous one stopped: the spread stays even.
        CreateTopics((NewTopic("payments", 3, 2),)),
        CreateTopics((NewTopic("audit", 3, 2),)),
        # A broker that registered but has not caught up stays fenced: no replicas for it.
        Register(7, "a"),
        Heartbeat((7,), 100, behind=True),
        CreateTopics((NewTopic("without-7", 6, 3),)),
        Heartbeat((7,), 200),
        CreateTopics((NewTopic("with-7", 7, 1),)),
    ],
    # CreateTopics validation: every refusal is per topic and writes nothing.
    "create_topics": [
        *boot(THREE_BROKERS),
        CreateTopics((NewTopic("t", 3, 3),)),
        CreateTopics(
            (
                NewTopic("t", 1, 1),
                NewTopic("bad/name", 1, 1),
                NewTopic("", 1, 1),
                NewTopic(".", 1, 1),
                NewTopic("x" * 250, 1, 1),
                NewTopic("too-many-replicas", 1, 4),
                NewTopic("no-replicas", 1, 0),
                NewTopic("no-partitions", 0, 1),
                NewTopic("bad-config", 1, 1, configs={"retention.mss": "1"}),
                NewTopic("bad-value", 1, 1, configs={"min.insync.replicas": "0"}),
                NewTopic("twice", 1, 1),
                NewTopic("twice", 1, 1),
            )
        ),
        CreateTopics((NewTopic("dry-run", 2, 3),), validate_only=True),
        CreateTopics((NewTopic("defaults"),)),
        CreateTopics(
            (
                NewTopic(
                    "manual", assignments={0: [3, 1], 1: [2, 3]}, configs={"retention.ms": "60000"}
                ),
            )
        ),
        Heartbeat((3,), 100, want_fence=True),
        CreateTopics(
            (
                NewTopic("manual-dup", assignments={0: [1, 1]}),
                NewTopic("manual-unknown", assignments={0: [1, 9]}),
                NewTopic("manual-gap", assignments={0: [1, 2], 2: [2, 1]}),
                NewTopic("manual-uneven", assignments={0: [1, 2], 1: [2]}),
                NewTopic("manual-fenced", assignments={0: [3]}),
                # A fenced broker may be assigned; it just starts outside the ISR.
                NewTopic("manual-part-fenced", assignments={0: [3, 1]}),
            )
        ),
        # Broker 3 is fenced: automatic placement leaves it out.
        CreateTopics((NewTopic("two-brokers", 2, 2), NewTopic("rf3-now-too-large", 1, 3))),
    ],
    # Session expiry fences brokers one by one; leadership follows the ISR in replica order.
    "fencing_and_recovery": [
        *boot(THREE_BROKERS),
        CreateTopics((NewTopic("t", 3, 3),)),
        Heartbeat((2, 3), 8000),
        # Broker 1 last heard at 0: its session (9000 ms) lapsed at 9001.
        ExpireSessions(9000),
        ExpireSessions(9001),
        Heartbeat((3,), 16000),
        ExpireSessions(18000),
        # The last ISR member goes: every partition offline, the ISR keeps broker 3.
        ExpireSessions(30000),
        # Broker 1 comes back: it is not in any ISR, so a clean election cannot use it.
        Heartbeat((1,), 31000),
        ElectLeaders(unclean=False),
        # Broker 3 (the last ISR member) comes back and leads everything again.
        Heartbeat((3,), 32000),
        Heartbeat((2,), 33000),
        # Leaders add caught-up followers back to the ISR (ISR order does not matter).
        AlterPartition(3, "t", 0, (3, 1, 2)),
        AlterPartition(3, "t", 1, (3, 2, 1)),
        AlterPartition(3, "t", 2, (3, 1, 2)),
        PreferredRebalance(),
        PreferredRebalance(),
    ],
    # unclean.leader.election.enable per topic, and ElectLeaders UNCLEAN by request.
    "unclean_election": [
        *boot(THREE_BROKERS),
        CreateTopics(
            (
                NewTopic("clean", assignments={0: [1, 2]}),
                NewTopic("dirty", assignments={0: [1, 2]}, configs=UNCLEAN),
                NewTopic("lonely", assignments={0: [1]}, configs=UNCLEAN),
            )
        ),
        # Broker 2 fell behind: the leader shrinks the ISRs to itself.
        AlterPartition(1, "clean", 0, (1,)),
        AlterPartition(1, "dirty", 0, (1,)),
        # Broker 1 goes: "dirty" elects out-of-sync broker 2 (ISR = [2]); "clean" goes offline
        # keeping ISR [1]; "lonely" has no live replica at all.
        Heartbeat((1,), 1000, want_fence=True),
        ElectLeaders(unclean=True, wanted=(("dirty", 0), ("lonely", 0), ("nope", 0))),
        # Broker 1 returns: "clean" gets its leader back cleanly; "dirty" keeps broker 2.
        Heartbeat((1,), 2000),
        # Broker 1 goes again; an operator elects "clean" uncleanly by request.
        Heartbeat((1,), 3000, want_fence=True),
        ElectLeaders(unclean=True, wanted=(("clean", 0),)),
        ElectLeaders(unclean=True, wanted=(("clean", 0),)),
        ElectLeaders(unclean=False, wanted=(("clean", 0),)),
    ],
    # Controlled shutdown moves leadership first, then fences; the broker comes back.
    "controlled_shutdown": [
        *boot(THREE_BROKERS),
        CreateTopics((NewTopic("t", 3, 2), NewTopic("solo", assignments={0: [1]}))),
        # A second process claiming a live broker's id is refused.
        Register(2, incarnation="b2-2"),
        Heartbeat((1,), 1000, want_shutdown=True),
        # Broker 1 is shutting down: placement and preferred elections skip it.
        CreateTopics((NewTopic("while-shutting-down", 2, 2),)),
        ElectLeaders(unclean=False, wanted=(("t", 0), ("t", 1))),
        Heartbeat((1,), 1500, want_shutdown=True),
        # The restarted process registers a new incarnation (the old one is fenced) ...
        Register(1, incarnation="b1-2"),
        Register(1, incarnation="b1-2"),
        Heartbeat((1,), 2000, behind=True),
        Heartbeat((1,), 2100, broker_epoch=0),
        # ... caught up: unfenced; "solo" (ISR [1]) gets its leader back.
        Heartbeat((1,), 2200),
        AlterPartition(2, "t", 0, (2, 1)),
        PreferredRebalance(),
    ],
    # AlterPartition is a compare-and-set: stale epochs, wrong leaders and bad ISRs are refused.
    "alter_partition": [
        *boot({1: None, 2: None, 3: None, 4: None}),
        CreateTopics((NewTopic("t", 1, 3),)),
        AlterPartition(1, "t", 0, (1, 2)),
        AlterPartition(1, "t", 0, (1, 2)),
        AlterPartition(1, "t", 0, (1, 2, 3), partition_epoch_delta=-1),
        AlterPartition(1, "t", 0, (1, 2, 3), leader_epoch_delta=+1),
        AlterPartition(2, "t", 0, (1, 2, 3)),
        AlterPartition(1, "t", 0, (2, 3)),
        AlterPartition(1, "t", 0, (1, 4)),
        AlterPartition(1, "t", 0, (1, 2, 2)),
        AlterPartition(1, "t", 0, (1, 2, 3), broker_epoch=99),
        AlterPartition(1, "t", 0, (1, 2, 3)),
        # Leadership moves to broker 2 (leader epoch 1): the old leader's request is fenced.
        Heartbeat((1,), 100, want_fence=True),
        AlterPartition(2, "t", 0, (2, 3), leader_epoch_delta=-1),
        AlterPartition(1, "t", 0, (1, 2, 3), broker_epoch=0),
        # Broker 1 is fenced: adding it back is refused.
        AlterPartition(2, "t", 0, (2, 3, 1)),
        # The leader's shrink is generated, then broker 3 is fenced before it commits:
        # the held record's partition epoch no longer matches and it is rejected on replay.
        AlterPartition(2, "t", 0, (2,), hold=True),
        Heartbeat((3,), 200, want_fence=True),
        ApplyHeld(),
    ],
    # An item listed twice in one request is refused (it would race itself: the second record
    # would carry a stale partition epoch, or re-create the same partitions).
    "repeated_items": [
        *boot(THREE_BROKERS),
        CreateTopics((NewTopic("t", 2, 2),)),
        Heartbeat((2,), 100, want_fence=True),
        Heartbeat((2,), 200),
        AlterPartition(3, "t", 1, (3, 2)),
        ElectLeaders(unclean=False, wanted=(("t", 0), ("t", 1), ("t", 1))),
        AlterPartitions(1, (("t", 0, (1,)), ("t", 0, (1, 2)))),
        CreatePartitions("t", 3, also=(("t", 4),)),
        # The same requests without the repeats.
        ElectLeaders(unclean=False, wanted=(("t", 0), ("t", 1))),
        AlterPartitions(1, (("t", 0, (1, 2)),)),
        CreatePartitions("t", 3),
    ],
    # Topic deletion and growth, and producer-id blocks.
    "topics_and_producer_ids": [
        *boot(THREE_BROKERS),
        CreateTopics((NewTopic("t", 2, 2), NewTopic("u", 1, 1))),
        CreatePartitions("t", 4),
        CreatePartitions("t", 3),
        CreatePartitions("t", 5, {4: [3, 3]}),
        CreatePartitions("t", 5, {4: [3]}),
        CreatePartitions("t", 5, {4: [3, 1]}),
        CreatePartitions("nope", 2),
        DeleteTopics(("t", "nope", "t")),
        CreateTopics((NewTopic("t", 1, 3),)),
        AllocateProducerIds(1),
        AllocateProducerIds(2),
        AllocateProducerIds(2, broker_epoch=0),
        AllocateProducerIds(9, broker_epoch=0),
        # Two brokers ask at once; both blocks are computed against the same image.
        AllocateProducerIds(3, hold=True),
        AllocateProducerIds(1),
        ApplyHeld(),
        AllocateProducerIds(3),
    ],
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_transcript(name: str, request: pytest.FixtureRequest) -> None:
    actual = run_scenario(SCENARIOS[name])
    path = TRANSCRIPTS / f"{name}.txt"
    if request.config.getoption("--update-transcripts", default=False):
        TRANSCRIPTS.mkdir(exist_ok=True)
        path.write_text(actual)
        return
    assert path.exists(), f"{path} is missing: run pytest --update-transcripts and review it"
    expected = path.read_text()
    assert actual == expected, f"{name} changed; diff it, or --update-transcripts if intended"


def test_every_transcript_has_a_scenario() -> None:
    stored = {p.stem for p in TRANSCRIPTS.glob("*.txt")}
    assert stored == set(SCENARIOS)
