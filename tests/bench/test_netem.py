"""bench.netem: the names and commands of the simulated network (pure), and its set-up and
tear-down on this machine (root and iproute2), also when the body raises or SIGTERM comes."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from bench.delay_line import DelayQueue, destination
from bench.netem import (
    NAME_PREFIX,
    NetemPlan,
    NetemUnavailable,
    in_delays,
    listed_namespaces,
    netem_network,
    set_delay,
    stale_namespaces,
    sweep,
)

TEST_SUBNET = "10.77.1"  # not the benchmark's 10.77.0: a run beside the tests does not collide
MAX_PID = 4_194_304  # /proc/sys/kernel/pid_max's ceiling on 64-bit Linux

# one worker at a time: every run's client address is on TEST_SUBNET in this namespace
pytestmark = pytest.mark.xdist_group("netem")
needs_root_and_ip = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
    reason="network namespaces need root and iproute2 (ip, tc)",
)


def _ours(plan: NetemPlan) -> list[str]:
    return [name for name in listed_namespaces() if name in plan.namespaces]


def _links() -> str:
    done = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True, check=True)
    return done.stdout


# -- the pure core -------------------------------------------------------------------------------
def test_interface_names_fit_linux_even_for_the_largest_pid() -> None:
    plan = NetemPlan(MAX_PID)
    names = [plan.host_veth, plan.host_veth + "b"]
    names += [plan.node_veth(n) for n in plan.node_ids] + [plan.bridge_port(n) for n in (1, 2, 3)]
    assert all(len(name) <= 15 for name in names)


def test_every_node_gets_a_namespace_and_an_address_and_the_client_one_too() -> None:
    plan = NetemPlan(42, subnet="10.77.9")
    flat = [" ".join(command) for command in plan.setup_commands()]
    for node in (1, 2, 3):
        assert f"ip netns add {NAME_PREFIX}-42-n{node}" in flat
        assert f"ip -n {NAME_PREFIX}-42-n{node} addr add 10.77.9.{node}/24 dev rn42n{node}" in flat
    assert "ip addr add 10.77.9.254/24 dev rn42h" in flat
    assert flat[0] == f"ip netns add {NAME_PREFIX}-42-br"  # the bridge's first: veths join it


def test_the_delay_is_on_every_end_outside_the_bridge_and_zero_removes_it() -> None:
    plan = NetemPlan(7)
    delayed = plan.delay_commands(20.0)
    assert len(delayed) == 4  # three nodes and this process
    assert all("netem" in command and "20.0ms" in command for command in delayed)
    assert all(command[-2:] == ["limit", "100000"] for command in delayed)
    assert all("del" in command for command in plan.delay_commands(0))


def test_teardown_deletes_the_host_veth_then_every_namespace_the_bridge_last() -> None:
    plan = NetemPlan(7)
    first, *rest = plan.teardown_commands()
    assert first == ["ip", "link", "del", plan.host_veth]
    deleted = [command[-1] for command in rest]
    assert sorted(deleted) == sorted(plan.namespaces)
    assert deleted[-1] == plan.bridge_namespace


def test_only_namespaces_of_runs_that_are_gone_are_stale() -> None:
    listed = (
        f"{NAME_PREFIX}-100-n1 (id: 3)\n{NAME_PREFIX}-100-br\n{NAME_PREFIX}-200-n1\n"
        "someone-elses-300\n"
    )
    assert stale_namespaces(listed, alive={200}) == [
        f"{NAME_PREFIX}-100-n1",
        f"{NAME_PREFIX}-100-br",
    ]


def test_latencies_are_counted_in_one_way_delays() -> None:
    assert in_delays(81.0, 20.0) == 4.0
    assert in_delays(3.0, 0.0) is None


# -- the real thing --------------------------------------------------------------------------------
@needs_root_and_ip
def test_the_network_is_made_and_removed() -> None:
    plan = NetemPlan(os.getpid(), subnet=TEST_SUBNET)
    with netem_network(plan):
        assert sorted(_ours(plan)) == sorted(plan.namespaces)
        assert plan.host_veth in _links()
        # a node's namespace reaches this process's address through the bridge
        with socket.create_server((plan.client_address, 0)) as server:
            port = server.getsockname()[1]
            dial = f"import socket; socket.create_connection(('{plan.client_address}', {port}), 5)"
            done = subprocess.run(
                ["ip", "netns", "exec", plan.namespace(1), sys.executable, "-c", dial],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
        assert done.returncode == 0, done.stderr
    assert _ours(plan) == []
    assert plan.host_veth not in _links()


@needs_root_and_ip
def test_the_network_is_removed_when_the_body_raises() -> None:
    plan = NetemPlan(os.getpid(), subnet=TEST_SUBNET)
    with pytest.raises(ZeroDivisionError), netem_network(plan):
        assert _ours(plan)
        _ = 1 / 0
    assert _ours(plan) == []
    assert plan.host_veth not in _links()


@needs_root_and_ip
def test_sigterm_removes_the_network_and_restores_the_handler() -> None:
    plan = NetemPlan(os.getpid(), subnet=TEST_SUBNET)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped, netem_network(plan):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs as os.kill returns
        pytest.fail("SIGTERM did not stop the body")
    assert stopped.value.code == 128 + signal.SIGTERM
    assert _ours(plan) == []
    assert signal.getsignal(signal.SIGTERM) is before


@needs_root_and_ip
def test_netem_is_set_on_every_end_and_removed_with_the_network() -> None:
    plan = NetemPlan(os.getpid(), subnet=TEST_SUBNET)
    with netem_network(plan):
        try:
            set_delay(plan, 2.0)
        except NetemUnavailable as missing:
            pytest.skip(str(missing))
        for node in plan.node_ids:
            shown = subprocess.run(
                ["tc", "-n", plan.namespace(node), "qdisc", "show", "dev", plan.node_veth(node)],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            assert "netem" in shown and "delay 2ms" in shown
    assert _ours(plan) == []


@needs_root_and_ip
def test_a_killed_runs_namespaces_are_swept() -> None:
    dead = NetemPlan(MAX_PID + 1)  # no process has this pid
    subprocess.run(["ip", "netns", "add", dead.bridge_namespace], check=True)
    try:
        assert dead.bridge_namespace in sweep()
        assert dead.bridge_namespace not in listed_namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", dead.bridge_namespace], check=False)


def test_the_delay_line_wire_has_no_bridge_and_a_device_per_node_and_here() -> None:
    plan = NetemPlan(7, subnet="10.77.9", wire="tun")
    assert plan.namespaces == [plan.namespace(n) for n in (1, 2, 3)]
    assert plan.delay_line_devices() == [
        "rn7t1=10.77.9.1", "rn7t2=10.77.9.2", "rn7t3=10.77.9.3", "rn7h=10.77.9.254",
    ]  # fmt: skip
    moved = [c for c in plan.tun_commands() if c[:3] == ["ip", "link", "set"] and "netns" in c]
    assert [c[3] for c in moved] == ["rn7t1", "rn7t2", "rn7t3"]


def test_the_delay_queue_holds_each_packet_the_delay_in_order() -> None:
    now = [0.0]
    queue = DelayQueue(0.020, clock=lambda: now[0])
    queue.add(1, b"a")
    now[0] = 0.005
    queue.add(2, b"b")
    assert queue.due() == [] and queue.wait_s() == pytest.approx(0.015)
    now[0] = 0.021
    assert queue.due() == [(1, b"a")]
    now[0] = 0.030
    assert queue.due() == [(2, b"b")] and queue.wait_s() is None


def test_packets_are_routed_by_their_ipv4_destination() -> None:
    header = (
        bytes([0x45]) + bytes(11) + socket.inet_aton("10.77.0.1") + socket.inet_aton("10.77.0.3")
    )
    assert destination(header) == socket.inet_aton("10.77.0.3")
    assert destination(bytes([0x60]) + bytes(39)) is None  # IPv6: not routed
    assert destination(b"\x45") is None


@needs_root_and_ip
def test_the_delay_line_delays_every_hop_and_goes_with_the_network() -> None:
    plan = NetemPlan(os.getpid(), subnet=TEST_SUBNET, wire="tun")
    delay_ms = 20.0
    with netem_network(plan, delay_ms):
        assert sorted(_ours(plan)) == sorted(plan.namespaces)
        with socket.create_server((plan.client_address, 0)) as server:
            port = server.getsockname()[1]
            dial = (
                "import socket, time; t = time.monotonic(); "
                f"socket.create_connection(('{plan.client_address}', {port}), 5); "
                "print((time.monotonic() - t) * 1000)"
            )
            done = subprocess.run(
                ["ip", "netns", "exec", plan.namespace(2), sys.executable, "-c", dial],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert float(done.stdout) >= 2 * delay_ms  # SYN there, SYN-ACK back
    assert _ours(plan) == []
    assert plan.host_veth not in _links()
