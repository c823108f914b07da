"""MetadataLog membership changes (pysyncobj's dynamic membership) with real voter processes.

Three voters on 127.0.0.141-143 (raft_node.HOSTS), new ones on 127.0.0.144-145 (this module's).
Every voter compacts every 50 entries, so joins, restarts and removals cross snapshots.
"""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from metadata_quorum import raft
from metadata_quorum.raft import MembershipChangeError, MetadataLogError
from tests.metadata_quorum.raft_node import Cluster, ListMachine, NodeProcess
from tests.metadata_quorum.test_raft import open_single, states_equal, wait_until

NEW_HOSTS = ("127.0.0.144", "127.0.0.145")
EXTRA = ["--max-journal-entries", "50"]
NO_COMMIT_WINDOW_S = 3.0  # how long a quorum without a majority is shown not to commit

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, EXTRA)
    try:
        yield cluster
    finally:
        cluster.kill_all()


def voter_set(node: NodeProcess) -> list[str]:
    return list(node.request("status")["voter_set"])


def commits(nodes: list[NodeProcess], text: str) -> bool:
    """One append committed through whichever of ``nodes`` leads now."""
    return any(node.request(f"append {text}")["ok"] for node in nodes if node.alive)


def change(leader: NodeProcess, command: str, address: str) -> list[str]:
    reply = leader.request(f"{command} {address}")
    assert reply["ok"], reply
    return list(reply["voters"])


def test_grow_shrink_restart_and_a_removed_voter_cannot_vote(
    cluster: Cluster, tmp_path: Path
) -> None:
    a, b, c = cluster.addresses
    cluster.start()
    leader = cluster.leader()
    assert leader.request("append_many 60 first")["ok"]  # the voters' logs start at a snapshot
    expected = [f"first-{i}" for i in range(60)]

    d, e = (cluster.add_process(host, tmp_path, EXTRA) for host in NEW_HOSTS)
    for new in (d, e):
        new.start()  # told of a, b, c only; nobody talks to it before it is added
        assert not new.request("status")["is_leader"]
        voters = change(cluster.leader(), "add_voter", new.address)
        assert new.address in voters
        wait_until(partial(states_equal_of, [new], expected), 15, "the catch-up")
        assert commits([cluster.leader()], f"with-{len(voters)}")
        expected.append(f"with-{len(voters)}")
    everyone = sorted([a, b, c, d.address, e.address])
    wait_until(lambda: all(voter_set(n) == everyone for n in cluster.live()), 10, "5 voters")

    leader = cluster.leader()
    leaving = [n for n in (cluster.nodes[a], cluster.nodes[b], cluster.nodes[c]) if n is not leader]
    for old in leaving:
        voters = change(cluster.leader(), "remove_voter", old.address)
        assert old.address not in voters
        old.kill()
    staying = sorted(set(everyone) - {n.address for n in leaving})
    assert commits(cluster.live(), "three-left")
    expected.append("three-left")

    d.request("compact")  # d restarts from a snapshot that holds the voter set
    d.kill()
    assert commits(cluster.live(), "without-d")  # 2 of 3 voters
    expected.append("without-d")

    removed = leaving[0]
    removed.start()  # its own log still names it a voter of a, b, c
    survivor = next(n for n in cluster.live() if n.address in staying and n is not removed)
    third = next(n for n in cluster.live() if n.address in staying and n not in (removed, survivor))
    third.kill()  # one voter of three left: no majority, whatever the removed node does
    deadline = time.monotonic() + NO_COMMIT_WINDOW_S
    while time.monotonic() < deadline:  # a bounded check that nothing commits, not a wait
        assert not commits([survivor, removed], "must-not-commit")
        assert not removed.request("status")["is_leader"]

    d.start()
    assert voter_set(d) == staying, "d rebuilt its configuration from its own snapshot"
    wait_until(lambda: commits([survivor, d], "d-is-back"), 15, "a commit with d back")
    expected.append("d-is-back")
    third.start()
    assert voter_set(third) == staying
    wait_until(lambda: all(voter_set(n) == staying for n in (survivor, d, third)), 10, "voters")
    voting = [survivor, d, third]

    # An append that found survivor still leading is in its log, uncommitted; a later leader
    # may commit it (Raft), after the window: it is not in the expected list, so drop it.
    def states() -> list[list[str]]:
        entries = [n.request("state")["entries"] for n in voting]
        return [[x for x in e if x != "must-not-commit"] for e in entries]

    wait_until(lambda: states() == [expected] * 3, 15, "three equal states")
    assert removed.request("state")["entries"] != expected, "nothing reaches a removed voter"
    assert not removed.request("status")["is_leader"]


def states_equal_of(nodes: list[NodeProcess], expected: list[str]) -> bool:
    return all(node.request("state")["entries"] == expected for node in nodes)


def test_refused_changes(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start()
    leader = cluster.leader()
    follower = next(n for n in cluster.live() if n is not leader)
    for command, address, error in (
        ("add_voter", follower.address, "MembershipChangeError"),  # already a voter
        ("remove_voter", f"{NEW_HOSTS[0]}:1", "MembershipChangeError"),  # not a voter
        ("remove_voter", leader.address, "MembershipChangeError"),  # the leader itself
    ):
        reply = leader.request(f"{command} {address}")
        assert (reply["ok"], reply.get("error")) == (False, error), (command, reply)
    reply = follower.request(f"add_voter {NEW_HOSTS[0]}:1")
    assert (reply["ok"], reply["error"], reply["leader"]) == (
        False,
        "NotLeaderError",
        leader.address,
    )
    assert voter_set(leader) == sorted(cluster.addresses)
    assert commits([leader], "unchanged")
    wait_until(lambda: states_equal(cluster, ["unchanged"]), 10, "three equal states")


def test_a_second_change_waits_for_the_first_to_commit(tmp_path: Path) -> None:
    """pysyncobj 0.3.17 means to refuse a change while the previous one is uncommitted but never
    does (its ``__changeClusterIDx`` is never set); MetadataLog refuses it. A single voter adds
    a second that never answers: 2 of 2 acks needed, so that change cannot commit."""
    log = open_single(tmp_path, ListMachine())
    try:
        first = log.add_voter(f"{NEW_HOSTS[0]}:1")
        with pytest.raises(MembershipChangeError, match="not committed"):
            log.add_voter(f"{NEW_HOSTS[1]}:1").result(timeout=5)
        both = {log.self_address, f"{NEW_HOSTS[0]}:1"}
        wait_until(lambda: log.voters() == both, 5, "the first change in the configuration")
        assert not first.done() or isinstance(first.exception(), MetadataLogError)
    finally:
        log.close()


def test_snapshots_keep_their_voter_set_and_old_ones_still_load() -> None:
    last, prev = (b"\x01", 7, 2), (b"\x01", 6, 2)
    voters = frozenset({"127.0.0.141:1", "127.0.0.144:2"})
    blob = raft._encode_snapshot(raft._Snapshot(last, prev, b"state", voters))
    assert raft._decode_snapshot(blob, "v2") == raft._Snapshot(last, prev, b"state", voters)
    head = raft._SNAPSHOT_HEAD_V1.pack(raft._SNAPSHOT_MAGIC_V1, 7, 2, 6, 2, 1, 1, 5)
    body = head + b"\x01\x01state"
    old = raft._decode_snapshot(body + struct.pack(">I", zlib.crc32(body)), "v1")
    assert (old.state, old.voters) == (b"state", None)
