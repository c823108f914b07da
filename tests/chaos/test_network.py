"""Network faults between real node processes: real system users, real iptables, real TCP.

The node processes are `netnode.py` (an echo server plus a client driven over stdin), each run as
its own node user on its own address in 127.0.0.151-159, the range reserved for these tests.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from chaos.network import (
    CONNMARK_MASK,
    NetworkFaultError,
    NetworkFaults,
    NodeIdentity,
    _acl_from_mode,
    _acl_with_group_search,
    _decode_acl,
    _encode_acl,
    _sweep_plan,
    cut_rules,
    ensure_node_identity,
    marking_rule,
    node_user_name,
    prepare_runtime,
    spawn,
    stale_run_ids,
    sweep,
)

REPO = Path(__file__).resolve().parents[2]
NODE_SCRIPT = Path(__file__).with_name("netnode.py")
# Three slots of three nodes in 127.0.0.151-159. Each test process takes a free slot, so two
# processes never share node users (pytest-xdist 3.8 under pytest 9.2 ignores xdist_group:
# pytest-dev/pytest-xdist#1386, and a cut of a shared user would cut the other process's nodes).
SLOTS = tuple(tuple(f"127.0.0.{151 + 3 * slot + i}" for i in range(3)) for slot in range(3))
SLOT_WAIT_S = 60.0
CUT_PROBE_S = 0.5  # a connection attempt that gets no answer this long counts as cut
ANSWER_S = 10.0  # how long a node may take to answer a command (plus what the command waits)


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll `condition` until it holds; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s} s: {what}")
        time.sleep(0.02)  # the poll interval; the deadline above is what bounds the wait


def read_line(proc: subprocess.Popen[bytes], pending: bytearray, timeout_s: float) -> str | None:
    """The next line `proc` prints, reading its stdout pipe unbuffered; None on silence or exit."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout_s
    while b"\n" not in pending:
        ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
        chunk = os.read(fd, 4096) if ready else b""
        if not chunk:
            return None
        pending += chunk
    line, _, rest = bytes(pending).partition(b"\n")
    pending[:] = rest
    return line.decode()


@dataclass
class Node:
    """A running netnode.py process and the line protocol to drive it."""

    identity: NodeIdentity
    proc: subprocess.Popen[bytes]
    stderr_path: Path
    port: int = 0
    pending: bytearray = field(default_factory=bytearray)

    @property
    def address(self) -> str:
        return self.identity.addresses[0]

    def read_line(self, timeout_s: float) -> str:
        line = read_line(self.proc, self.pending, timeout_s)
        if line is None:
            pytest.fail(f"{self.identity.user} silent for {timeout_s} s or exited: {self.stderr()}")
        return line

    def ask(self, command: str, waits_s: float = 0.0) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command.encode() + b"\n")
        self.proc.stdin.flush()
        return self.read_line(ANSWER_S + waits_s)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-2000:]

    def reach(self, other: Node) -> str:
        """Connect to `other`, ping, await the echo: "ok", "timeout" or "fail ..."."""
        return self.ask(f"probe {other.address} {other.port} {CUT_PROBE_S}", CUT_PROBE_S)

    def received(self) -> int:
        answer = self.ask("received")
        assert answer.startswith("count "), answer
        return int(answer.split()[1])


def assert_cut(src: Node, dst: Node) -> None:
    result = src.reach(dst)
    # A dropped SYN or SYN-ACK shows as a timeout; some kernels report the OUTPUT drop as EPERM.
    # A refusal would mean the peer is down, which is not what is being tested.
    assert result == "timeout" or result.startswith("fail PermissionError"), (
        f"{src.identity.user} -> {dst.identity.user}: {result}"
    )


def assert_reach(src: Node, dst: Node) -> None:
    assert src.reach(dst) == "ok", f"{src.identity.user} cannot reach {dst.identity.user}"


def iptables_lines_of(run_id: str) -> list[str]:
    listing = subprocess.run(
        ["iptables", "-w", "5", "-S"], capture_output=True, text=True, timeout=15, check=True
    ).stdout
    return [line for line in listing.splitlines() if f"-{run_id}" in line]


def start_node(identity: NodeIdentity, log_dir: Path) -> Node:
    stderr_path = log_dir / f"{identity.user}.stderr"
    with stderr_path.open("wb") as stderr:
        proc = spawn(
            identity,
            [sys.executable, str(NODE_SCRIPT), identity.addresses[0]],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    node = Node(identity, proc, stderr_path)
    first = node.read_line(ANSWER_S)
    assert first.startswith("listening "), first
    node.port = int(first.split()[1])
    return node


@contextlib.contextmanager
def address_slot() -> Iterator[tuple[str, ...]]:
    """Hold one of `SLOTS` (an flock on its file) for as long as the context lasts."""
    deadline = time.monotonic() + SLOT_WAIT_S
    while True:
        for slot, addresses in enumerate(SLOTS):
            with Path(f"/tmp/raftlog-netfault-slot-{slot}.lock").open("a") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                try:
                    yield addresses
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
                return
        if time.monotonic() > deadline:
            pytest.fail(f"no free address slot of {len(SLOTS)} within {SLOT_WAIT_S} s")
        time.sleep(0.1)  # the poll interval; the deadline above bounds the wait


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Node, Node, Node]]:
    """Three node processes, each its own user on its own address; killed by pid at the end."""
    if os.geteuid() != 0:
        pytest.skip("creates system users and iptables rules: needs root")
    with address_slot() as addresses:
        identities = [
            ensure_node_identity(node_user_name(int(address.rsplit(".", 1)[1])), [address])
            for address in addresses
        ]
        for identity in identities:
            modules = ("raftlog", "chaos.network")
            prepare_runtime(identity, Path(sys.executable), REPO, modules, [NODE_SCRIPT])
        log_dir = tmp_path_factory.mktemp("netnodes")
        started: list[Node] = []
        try:
            for identity in identities:
                started.append(start_node(identity, log_dir))
            yield started[0], started[1], started[2]
        finally:
            for node in started:
                node.proc.kill()
                node.proc.wait(timeout=10)
                assert node.proc.stdin is not None
                node.proc.stdin.close()


# ----------------------------------------------------------------------------- real processes


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.xdist_group("netfault")
def test_each_node_runs_as_its_own_user(nodes: tuple[Node, Node, Node]) -> None:
    for node in nodes:
        status = Path(f"/proc/{node.proc.pid}/status").read_text()
        uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
        assert uids == [str(node.identity.uid)] * 4, status
    assert len({node.identity.uid for node in nodes}) == 3
    again = prepare_runtime(nodes[0].identity, Path(sys.executable), REPO, ("raftlog",))
    assert again == [], "granting is idempotent"


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.xdist_group("netfault")
def test_cut_separates_two_nodes_both_ways_until_healed(nodes: tuple[Node, Node, Node]) -> None:
    a, b, c = nodes
    assert_reach(a, b)
    assert_reach(b, a)
    with NetworkFaults(node.identity for node in nodes) as faults:
        faults.cut(a.identity, b.identity)
        assert_cut(a, b)
        assert_cut(b, a)
        assert_reach(a, c)
        assert_reach(c, b)
        assert_reach(b, c)
        faults.heal()
        assert_reach(a, b)
        assert_reach(b, a)
    assert iptables_lines_of(faults.run_id) == []


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.xdist_group("netfault")
def test_cut_stops_open_connections_in_both_directions(nodes: tuple[Node, Node, Node]) -> None:
    a, b, _ = nodes
    with NetworkFaults(node.identity for node in nodes) as faults:
        assert a.ask(f"open ab {b.address} {b.port} 5") == "ok"
        assert a.ask("send ab before") == "ok"
        assert a.ask("recv ab 5", 5) == "line before"
        received_by_b = b.received()

        faults.cut(a.identity, b.identity)
        assert a.ask("send ab during") == "ok", "the kernel takes it; the packets are dropped"
        assert b.ask("push pushed").startswith("ok "), "B writes on the connection A opened"
        assert a.ask("recv ab 1.5", 1.5) == "timeout", "neither the echo nor B's push arrives"
        assert b.received() == received_by_b, "A's line did not reach B"

        faults.heal()
        got = [a.ask("recv ab 8", 8), a.ask("recv ab 8", 8)]  # TCP retransmits them
        assert sorted(got) == ["line during", "line pushed"]
        assert b.received() == received_by_b + 1


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.xdist_group("netfault")
def test_cut_one_way_drops_only_what_src_sends(nodes: tuple[Node, Node, Node]) -> None:
    a, b, c = nodes
    with NetworkFaults(node.identity for node in nodes) as faults:
        assert b.ask(f"open ba {a.address} {a.port} 5") == "ok"
        faults.cut_one_way(a.identity, b.identity)
        assert_cut(a, b)
        assert_cut(b, a)  # B's SYN arrives, but A's SYN-ACK does not: no handshake
        assert_reach(c, a)
        assert_reach(c, b)
        received_by_a = a.received()
        assert b.ask("send ba one-way") == "ok"
        wait_until(lambda: a.received() == received_by_a + 1, 10, "B's line reaches A")
        assert b.ask("recv ba 0.5", 0.5) == "timeout", "A's echo of it does not reach B"
    assert_reach(a, b)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.xdist_group("netfault")
def test_isolate_cuts_one_node_from_the_others_only(nodes: tuple[Node, Node, Node]) -> None:
    a, b, c = nodes
    with NetworkFaults(node.identity for node in nodes) as faults:
        faults.isolate(a.identity, [b.identity, c.identity, a.identity])
        users = (a.identity.user, b.identity.user, c.identity.user)
        expected = {(users[0], users[1]), (users[1], users[0])}
        expected |= {(users[0], users[2]), (users[2], users[0])}
        assert faults.cuts() == expected
        for src, dst in [(a, b), (a, c), (b, a), (c, a)]:
            assert_cut(src, dst)
        assert_reach(b, c)
        assert_reach(c, b)
    assert_reach(a, b)
    assert_reach(c, a)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.xdist_group("netfault")
def test_leaving_the_context_removes_every_rule_also_on_error(
    nodes: tuple[Node, Node, Node],
) -> None:
    a, b, _ = nodes
    faults = NetworkFaults(node.identity for node in nodes)
    with pytest.raises(RuntimeError, match="body failed"), faults:
        faults.cut(a.identity, b.identity)
        lines = iptables_lines_of(faults.run_id)
        assert f"-N {faults.chain}" in lines
        assert any(line.startswith("-A OUTPUT") and faults.comment in line for line in lines)
        assert sum(" -j DROP" in line for line in faults.rules()) == 4
        raise RuntimeError("body failed")
    assert iptables_lines_of(faults.run_id) == []
    assert_reach(a, b)
    faults.close()  # idempotent


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.xdist_group("netfault")
def test_sweep_removes_the_rules_of_a_crashed_run(nodes: tuple[Node, Node, Node]) -> None:
    a, b, _ = nodes
    code = (
        "import json, sys\n"
        "from chaos.network import NetworkFaults, NodeIdentity\n"
        "a, b = (NodeIdentity(d['user'], d['uid'], d['gid'], tuple(d['addresses']))\n"
        "        for d in json.loads(sys.argv[1]))\n"
        "faults = NetworkFaults([a, b])\n"
        "faults.install()\n"
        "faults.cut(a, b)\n"
        "print(faults.run_id, flush=True)\n"
        "sys.stdin.read()\n"
    )
    pair = json.dumps([vars(a.identity), vars(b.identity)])
    crashing = subprocess.Popen(
        [sys.executable, "-c", code, pair],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        run_id = read_line(crashing, bytearray(), ANSWER_S)
        assert run_id, "the crashing run did not start; its stderr follows in the report"
        assert_cut(a, b)
    finally:
        crashing.kill()  # SIGKILL: no atexit handler runs
        crashing.wait(timeout=10)
    assert iptables_lines_of(run_id) != [], "a SIGKILLed run leaves its rules behind"
    assert run_id in stale_run_ids()
    assert sweep(run_id) == [run_id]
    assert iptables_lines_of(run_id) == []
    assert_reach(a, b)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.xdist_group("netfault")
def test_a_failing_iptables_command_is_named_and_cleans_up_nothing_else(
    nodes: tuple[Node, Node, Node],
) -> None:
    with NetworkFaults(node.identity for node in nodes) as first:
        second = NetworkFaults(run_id=first.run_id)
        with pytest.raises(NetworkFaultError, match=rf"-N {first.chain}` exited with 1: .*exists"):
            second.install()
        assert f"-N {first.chain}" in iptables_lines_of(first.run_id), "first run untouched"
    assert iptables_lines_of(first.run_id) == []


# ----------------------------------------------------------------------------- pure parts


A = NodeIdentity("raftlog-n151", 991, 991, ("127.0.0.151",))
B = NodeIdentity("raftlog-n152", 992, 992, ("127.0.0.152", "127.0.0.162"))


def test_cut_rules_drop_by_owner_to_each_address_and_by_initiator_mark() -> None:
    owner_a = ["-m", "owner", "--uid-owner", "991"]
    mark_b = f"0x3e00000/{CONNMARK_MASK:#x}"
    assert cut_rules(A, B) == [
        [*owner_a, "-d", "127.0.0.152/32", "-j", "DROP"],
        [*owner_a, "-d", "127.0.0.162/32", "-j", "DROP"],
        [*owner_a, "-m", "connmark", "--mark", mark_b, "-j", "DROP"],
    ]
    assert marking_rule(A)[-2:] == ["--set-xmark", f"0x3df0000/{CONNMARK_MASK:#x}"]
    assert marking_rule(A)[2:4] == ["--ctdir", "ORIGINAL"]


def test_node_identity_refuses_root_and_bad_addresses() -> None:
    with pytest.raises(ValueError, match="root"):
        NodeIdentity("root", 0, 0, ("127.0.0.151",))
    with pytest.raises(ValueError, match=r"127\.0\.0\.300"):
        NodeIdentity("raftlog-n1", 900, 900, ("127.0.0.300",))
    with pytest.raises(ValueError, match="no listen address"):
        NodeIdentity("raftlog-n1", 900, 900, ())
    with pytest.raises(ValueError, match="run id"):
        NetworkFaults(run_id="x" * 21)


def test_acl_gains_group_search_and_nothing_else() -> None:
    minimal = _acl_from_mode(0o700)
    granted = _acl_with_group_search(minimal, 977)
    undefined = 0xFFFFFFFF
    user_obj, group_obj, other = (1, 7, undefined), (4, 0, undefined), (32, 0, undefined)
    assert granted == [user_obj, group_obj, (8, 1, 977), (16, 1, undefined), other]
    assert _decode_acl(_encode_acl(granted)) == granted
    assert _acl_with_group_search(granted, 977) == granted, "idempotent"
    with pytest.raises(ValueError, match="POSIX ACL"):
        _decode_acl(b"\x01\x00\x00\x00")


def test_sweep_plan_takes_only_the_runs_with_the_prefix() -> None:
    listing = [
        "-P OUTPUT ACCEPT",
        "-N RAFTLOG-11-aa",
        "-N RAFTLOG-12-bb",
        "-N OTHER",
        "-A OUTPUT -m comment --comment raftlog-11-aa -j RAFTLOG-11-aa",
        "-A OUTPUT -m comment --comment raftlog-12-bb -j RAFTLOG-12-bb",
        "-A OUTPUT -m comment --comment raftlog-11-cc -j DROP",
        '-A OUTPUT -m comment --comment "someone else" -j OTHER',
        "-A RAFTLOG-11-aa -m owner --uid-owner 991 -m comment --comment raftlog-11-aa -j DROP",
    ]
    deletes, chains = _sweep_plan(listing, "11-")
    assert chains == ["RAFTLOG-11-aa"]
    assert deletes == [
        ["-D", "OUTPUT", "-m", "comment", "--comment", "raftlog-11-aa", "-j", "RAFTLOG-11-aa"],
        ["-D", "OUTPUT", "-m", "comment", "--comment", "raftlog-11-cc", "-j", "DROP"],
    ]


def test_missing_iptables_is_a_clear_error() -> None:
    faults = NetworkFaults([A], iptables="/nonexistent/iptables")
    with pytest.raises(NetworkFaultError, match=r"/nonexistent/iptables -w 5 -N RAFTLOG-.*found"):
        faults.install()
    with pytest.raises(NetworkFaultError, match="not installed"):
        faults.cut(A, B)
    faults.close()  # nothing was created, nothing to remove
