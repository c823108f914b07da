"""Across machines, simulated: the 3-node cluster with each node in a network namespace of its
own and a delay between them (issue 32). Needs root and iproute2 (``ip``, ``tc``).

``python -m bench.netem --out bench/results/latest.json [--quick] [--delays 0,0.2,2,20]
[--wire auto|netem|tun]``

The network (:func:`netem_network`, created and removed by this module), ``netem`` wire::

    namespace rlnetem-<pid>-n1  rn<pid>n1 10.77.0.1/24 --veth--+
    namespace rlnetem-<pid>-n2  rn<pid>n2 10.77.0.2/24 --veth--+-- bridge br0 in namespace
    namespace rlnetem-<pid>-n3  rn<pid>n3 10.77.0.3/24 --veth--+   rlnetem-<pid>-br
    this namespace              rn<pid>h  10.77.0.254/24 -veth-+

``tc netem delay D`` sits on the egress of every end outside the bridge (each node's and this
process's), so a packet between any two of them, the clients' included, takes D one way: D is
the one-way delay between machines (0.2 ms: one rack, 2 ms: one region, 20 ms: across zones),
a round trip 2D. netem's queue holds ``NETEM_LIMIT`` packets (its default, 1,000, would drop
packets of a fast producer at 20 ms).

A kernel built without netem (``CONFIG_NET_SCH_NETEM``; the machine this was written on has no
qdisc that delays at all) gets the ``tun`` wire: the same namespaces and addresses, each with a
TUN device instead of a veth, and ``bench.delay_line``, a process of this harness's, forwarding
every packet between the devices D later. Both give every hop D; the delay line adds its own
wake-up jitter and CPU (``--wire auto``, the default, picks netem where a probe namespace takes
it). The results say which wire ran.

Node processes run under ``ip netns exec`` (it execs: the pid is the node's, and it dies with
this process as every owned node does, ``dataplane.tools.owned_process``); clients run here and
reach them through ``rn<pid>h``.

Everything is removed on the way out, by exception, SIGINT or SIGTERM too (SIGTERM is turned
into ``SystemExit`` while the network exists); a run killed by SIGKILL leaves its namespaces
(its delay line dies with it), and the next run removes those of runs whose pid is gone
(:func:`sweep`). Deleting a namespace deletes the devices in it, and a veth's peer with it.

For each delay a fresh network and cluster:

1. produce throughput: ``bench.e2e_latency``'s saturation run (as fast as the gRPC client goes,
   acks=all, RF 3, 1 KiB);
2. produce latency at half of it (``raftlog perf produce``'s core, paced; ``--rate N``: at N):
   p50, p99, p999;
3. end-to-end latency at half of it, to a consumer process (``bench.e2e_latency``, gRPC);
4. both also at ``PROBE_RATE_PER_S`` (``probe``, run first, on the fresh cluster), a rate the
   machine's CPU does not limit: there the delay's multiple shows;
5. leader failover (``bench.dataplane_bench.failover_round``) and controller failover
   (``bench.quorum_bench.failover_once``): SIGKILL, seconds to the next acknowledged write.

Each median latency is also given in one-way delays (``p50_in_delays``): what multiplies the
delay. The failovers SIGKILL the leader of the half-saturation run's topic.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import RECORD_BYTES, bench_main
from bench.dataplane_bench import create_topic, failover_round
from bench.delay_line import MTU as DELAY_LINE_MTU
from bench.e2e_latency import LOAD, e2e_run, saturation
from bench.quorum_bench import CLIENT_DEADLINE_S, failover_once
from dataplane.tools.local_cluster import LocalCluster, NodeSpec, wait_for
from dataplane.tools.owned_process import popen_owned
from dataplane.tools.perf import run_produce_perf
from metadata_quorum.client import ControllerClient

DELAYS_MS = (0.0, 0.2, 2.0, 20.0)  # one way; 0: the namespaces without netem
WIRES = ("netem", "tun")
SUBNET = "10.77.0"  # /24; node N is .N, this process .254
CLIENT_HOST = 254
NETEM_LIMIT = 100_000  # packets netem may hold (its default 1,000 drops at 20 ms)
NAME_PREFIX = "rlnetem"
PORT = 9093  # every node has its own address: the ports need not be picked
IP_TIMEOUT_S = 30.0
LATENCY_S = {"full": 10.0, "quick": 2.0}
# a rate the machine's CPU does not limit: the latency of the network's round trips
PROBE_RATE_PER_S = 100
PROBE_S = {"full": 10.0, "quick": 3.0}
FAILOVER_ROUNDS = {"full": 3, "quick": 1}
WAIT_S = 120.0
TOPIC = "netem"
_OWN_NAMESPACE = re.compile(rf"^{NAME_PREFIX}-(\d+)-")


# -- the pure core: names and commands ----------------------------------------------------------
@dataclass(frozen=True)
class NetemPlan:
    """One run's network: ``nodes`` namespaces on ``subnet``.0/24, names tagged with ``tag``
    (the harness's pid: interface names stay within Linux's 15 characters)."""

    tag: int
    nodes: int = 3
    subnet: str = SUBNET
    wire: str = "netem"  # or "tun": bench.delay_line's devices instead of veths and a bridge

    def __post_init__(self) -> None:
        assert 1 <= self.nodes < CLIENT_HOST, "nodes fit the /24 below the client's address"
        assert len(self.host_veth + "b") <= 15, "interface names of at most 15 characters"
        assert self.wire in WIRES, f"a wire is one of {WIRES}"

    @property
    def bridge_namespace(self) -> str:
        return f"{NAME_PREFIX}-{self.tag}-br"

    def namespace(self, node: int) -> str:
        return f"{NAME_PREFIX}-{self.tag}-n{node}"

    def node_veth(self, node: int) -> str:
        return f"rn{self.tag}n{node}"

    def node_tun(self, node: int) -> str:
        return f"rn{self.tag}t{node}"

    def bridge_port(self, node: int) -> str:
        return f"rn{self.tag}b{node}"

    @property
    def host_veth(self) -> str:
        return f"rn{self.tag}h"

    def address(self, node: int) -> str:
        return f"{self.subnet}.{node}"

    @property
    def client_address(self) -> str:
        return f"{self.subnet}.{CLIENT_HOST}"

    @property
    def namespaces(self) -> list[str]:
        nodes = [self.namespace(n) for n in self.node_ids]
        return [self.bridge_namespace, *nodes] if self.wire == "netem" else nodes

    @property
    def node_ids(self) -> range:
        return range(1, self.nodes + 1)

    def setup_commands(self) -> list[list[str]]:
        """netem: the bridge's namespace, a namespace and a veth pair per node, this process's
        veth; tun: the nodes' namespaces (the delay line makes the devices)."""
        if self.wire == "tun":
            return [
                command
                for node in self.node_ids
                for command in (
                    ["ip", "netns", "add", self.namespace(node)],
                    ["ip", "-n", self.namespace(node), "link", "set", "lo", "up"],
                )
            ]
        br = self.bridge_namespace
        commands = [
            ["ip", "netns", "add", br],
            ["ip", "-n", br, "link", "add", "br0", "type", "bridge"],
            ["ip", "-n", br, "link", "set", "br0", "up"],
        ]
        for node in self.node_ids:
            ns, veth, port = self.namespace(node), self.node_veth(node), self.bridge_port(node)
            commands += [
                ["ip", "netns", "add", ns],
                ["ip", "link", "add", veth, "type", "veth", "peer", "name", port],
                ["ip", "link", "set", veth, "netns", ns],
                ["ip", "link", "set", port, "netns", br],
                ["ip", "-n", ns, "addr", "add", f"{self.address(node)}/24", "dev", veth],
                ["ip", "-n", ns, "link", "set", veth, "up"],
                ["ip", "-n", ns, "link", "set", "lo", "up"],
                ["ip", "-n", br, "link", "set", port, "master", "br0", "up"],
            ]
        host, port = self.host_veth, self.host_veth + "b"
        commands += [
            ["ip", "link", "add", host, "type", "veth", "peer", "name", port],
            ["ip", "link", "set", port, "netns", br],
            ["ip", "-n", br, "link", "set", port, "master", "br0", "up"],
            ["ip", "addr", "add", f"{self.client_address}/24", "dev", host],
            ["ip", "link", "set", host, "up"],
        ]
        return commands

    def delay_line_devices(self) -> list[str]:
        """``bench.delay_line``'s NAME=ADDRESS arguments: one device per node, one here."""
        nodes = [f"{self.node_tun(n)}={self.address(n)}" for n in self.node_ids]
        return [*nodes, f"{self.host_veth}={self.client_address}"]

    def tun_commands(self) -> list[list[str]]:
        """Once the delay line made its devices: each node's into its namespace, addresses,
        the large MTU, up."""
        commands = []
        for node in self.node_ids:
            ns, tun = self.namespace(node), self.node_tun(node)
            commands += [
                ["ip", "link", "set", tun, "netns", ns],
                ["ip", "-n", ns, "addr", "add", f"{self.address(node)}/24", "dev", tun],
                ["ip", "-n", ns, "link", "set", tun, "mtu", str(DELAY_LINE_MTU), "up"],
            ]
        host = self.host_veth
        return [
            *commands,
            ["ip", "addr", "add", f"{self.client_address}/24", "dev", host],
            ["ip", "link", "set", host, "mtu", str(DELAY_LINE_MTU), "up"],
        ]

    def delay_commands(self, delay_ms: float) -> list[list[str]]:
        """netem on every end outside the bridge (``replace``: a first one adds it); 0 removes
        it (``del``, which fails where there is none: the caller ignores that)."""
        ends = [(["-n", self.namespace(n)], self.node_veth(n)) for n in self.node_ids]
        ends.append(([], self.host_veth))
        if delay_ms <= 0:
            return [["tc", *ns, "qdisc", "del", "dev", dev, "root"] for ns, dev in ends]
        return [
            ["tc", *ns, "qdisc", "replace", "dev", dev, "root", "netem",
             "delay", f"{delay_ms}ms", "limit", str(NETEM_LIMIT)]
            for ns, dev in ends
        ]  # fmt: skip

    def teardown_commands(self) -> list[list[str]]:
        """This process's veth first (with its peer: at once, where the ends in a deleted
        namespace go some moments later, in the kernel's cleanup), then the namespaces, which
        delete every veth end in them."""
        namespaces = [["ip", "netns", "del", ns] for ns in reversed(self.namespaces)]
        return [["ip", "link", "del", self.host_veth], *namespaces]


def stale_namespaces(listed: str, alive: set[int]) -> list[str]:
    """The names ``ip netns list`` printed that a harness whose pid is not in ``alive`` left."""
    stale = []
    for line in listed.splitlines():
        name = line.split(" ", 1)[0]
        match = _OWN_NAMESPACE.match(name)
        if match is not None and int(match.group(1)) not in alive:
            stale.append(name)
    return stale


def in_delays(latency_ms: float, delay_ms: float) -> float | None:
    """A latency in one-way delays (None without a delay)."""
    return round(latency_ms / delay_ms, 1) if delay_ms > 0 else None


# -- the shell ---------------------------------------------------------------------------------
class NetemUnavailable(RuntimeError):
    """Not root, or no iproute2: the namespaces cannot be made here."""


def check_available() -> None:
    if os.geteuid() != 0:
        raise NetemUnavailable("network namespaces and netem need root")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise NetemUnavailable(f"{', '.join(missing)} missing: `apt-get install -y iproute2`")


def _run(command: list[str], check: bool = True) -> str:
    done = subprocess.run(  # the status is judged below: a teardown step may fail harmlessly
        command, capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")
    return done.stdout


def listed_namespaces() -> list[str]:
    return [line.split(" ", 1)[0] for line in _run(["ip", "netns", "list"]).splitlines()]


def sweep() -> list[str]:
    """Remove the namespaces of harness runs that are gone (killed by SIGKILL); their names."""
    alive = {int(pid) for pid in os.listdir("/proc") if pid.isdigit()}
    stale = stale_namespaces(_run(["ip", "netns", "list"]), alive)
    for name in stale:
        _run(["ip", "netns", "del", name], check=False)
    return stale


def set_delay(plan: NetemPlan, delay_ms: float) -> None:
    """netem ``delay_ms`` on every end; NetemUnavailable when the kernel has no netem."""
    for command in plan.delay_commands(delay_ms):
        try:
            _run(command, check=delay_ms > 0)
        except RuntimeError as error:
            if "qdisc kind is unknown" in str(error):
                raise NetemUnavailable(
                    "this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM, module sch_netem)"
                ) from error
            raise


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM raises SystemExit in the main thread while the network exists, so the ``finally``
    that removes it runs (SIGINT raises KeyboardInterrupt already)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def netem_network(plan: NetemPlan, delay_ms: float = 0.0) -> Iterator[NetemPlan]:
    """The plan's namespaces and wire with ``delay_ms`` one way, removed on the way out
    whatever the way (the delay line, a process, stopped by its pid first)."""
    check_available()
    sweep()
    with _sigterm_raises():
        delay_line: subprocess.Popen[bytes] | None = None
        try:
            for command in plan.setup_commands():
                _run(command)
            if plan.wire == "tun":
                delay_line = _start_delay_line(plan, delay_ms)
                for command in plan.tun_commands():
                    _run(command)
            elif delay_ms > 0:
                set_delay(plan, delay_ms)
            yield plan
        finally:
            if delay_line is not None:
                delay_line.kill()  # its devices go with it
                delay_line.wait(timeout=IP_TIMEOUT_S)
            for command in plan.teardown_commands():
                _run(command, check=False)  # those not made yet (a failed set-up) are no error


def _start_delay_line(plan: NetemPlan, delay_ms: float) -> subprocess.Popen[bytes]:
    """``bench.delay_line`` (owned: it dies with this process), once its devices exist."""
    ready = Path(tempfile.mkdtemp(prefix="delay-line-")) / "ready"
    argv = [sys.executable, "-m", "bench.delay_line", "--delay-ms", str(delay_ms)]
    # a session of its own: a signal to this process's group (Ctrl-C, `timeout`) must not take
    # the network away under the teardown (clients flushing, nodes stopping); stopped by its pid
    proc = popen_owned(
        [*argv, "--ready", str(ready), *plan.delay_line_devices()], start_new_session=True
    )
    try:
        wait_for("the delay line's devices", lambda: ready.exists() or proc.poll() is not None)
        if proc.poll() is not None:
            raise RuntimeError(f"the delay line exited {proc.returncode}")
    except BaseException:
        proc.kill()
        proc.wait(timeout=IP_TIMEOUT_S)
        raise
    finally:
        shutil.rmtree(ready.parent, ignore_errors=True)
    return proc


def netem_supported(tag: int) -> bool:
    """Whether this kernel has the netem qdisc: tried on the loopback of a namespace made for
    the question (its name is the harness's, so a crash leaves nothing `sweep` misses)."""
    probe = f"{NAME_PREFIX}-{tag}-probe"
    _run(["ip", "netns", "add", probe])
    try:
        done = subprocess.run(
            ["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
            capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False,
        )  # fmt: skip
        return done.returncode == 0
    finally:
        _run(["ip", "netns", "del", probe], check=False)


class NetemCluster(LocalCluster):
    """A LocalCluster whose node N runs in the plan's namespace N at its address."""

    def __init__(
        self, root: Path, plan: NetemPlan, overrides: dict[str, str | int] | None = None
    ) -> None:
        self.plan = plan
        super().__init__(
            root, nodes=plan.nodes, port=PORT, overrides=overrides, launcher=self._launch
        )

    def _new_spec(self, node_id: int) -> NodeSpec:
        return NodeSpec(node_id, self.plan.address(node_id), self.root / f"node-{node_id}")

    def _launch(self, node_id: int, argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        """Under ``ip netns exec`` (which execs: the pid stays the node's), owned."""
        in_namespace = ["ip", "netns", "exec", self.plan.namespace(node_id), *argv]
        with log_path.open("ab") as out:
            return popen_owned(
                in_namespace, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip


@contextlib.contextmanager
def netem_cluster(plan: NetemPlan, workdir: Path, console: Console) -> Iterator[NetemCluster]:
    root = Path(tempfile.mkdtemp(prefix="netem-", dir=workdir))
    cluster = NetemCluster(root, plan)
    try:
        console.log(f"starting 3 nodes on {', '.join(cluster.bootstrap_servers)}")
        cluster.up(timeout_s=WAIT_S)
        yield cluster
    finally:
        cluster.down()
        shutil.rmtree(root, ignore_errors=True)


# -- the figures -------------------------------------------------------------------------------
def _latency(summary: Any, delay_ms: float) -> dict[str, Any]:
    quantiles = {"p50": summary.p50, "p99": summary.p99, "p999": summary.p999, "max": summary.max}
    return {
        "latency_ms": {name: round(value, 2) for name, value in quantiles.items()},
        "p50_in_delays": in_delays(summary.p50, delay_ms),
    }


def controller_failovers(cluster: LocalCluster, rounds: int) -> list[float]:
    client = ControllerClient(cluster.controller_addresses, deadline_s=CLIENT_DEADLINE_S)
    try:
        return [failover_once(cluster, client, n)["seconds"] for n in range(rounds)]
    finally:
        client.close()


def at_rate(
    cluster: LocalCluster, rate: float, seconds: float, delay_ms: float, workdir: Path, name: str
) -> dict[str, Any]:
    """Produce latency, then end-to-end latency, each at ``rate`` for ``seconds`` on a
    one-partition topic of its own."""
    create_topic(cluster, f"{TOPIC}-{name}", 1)
    paced = run_produce_perf(
        cluster.bootstrap_servers, f"{TOPIC}-{name}", max(1, int(rate * seconds)), RECORD_BYTES,
        throughput_per_s=rate,
    )  # fmt: skip
    create_topic(cluster, f"{TOPIC}-{name}-e2e", 1)
    e2e = e2e_run(cluster.bootstrap_servers, "grpc", f"{TOPIC}-{name}-e2e", rate, seconds, workdir)
    return {
        "offered_records_per_s": round(rate),
        "produce_paced": _latency(paced.latency_ms, delay_ms),
        "end_to_end": {**e2e, "p50_in_delays": in_delays(e2e["latency_ms"]["p50"], delay_ms)},
    }


def one_delay(
    plan: NetemPlan,
    delay_ms: float,
    size: str,
    workdir: Path,
    console: Console,
    rate_per_s: float | None = None,
) -> dict[str, Any]:
    """The figures at one delay; ``rate_per_s``: offered instead of half the saturation."""
    console.log(f"one-way delay {delay_ms} ms ({plan.wire})")
    with netem_network(plan, delay_ms), netem_cluster(plan, workdir, console) as cluster:
        # the probe first, on a cluster that has done nothing yet: after the loaded runs the
        # consumers' backlog and the followers' catch-up were still in its figures here
        console.log(f"latency at {PROBE_RATE_PER_S} records/s")
        probe = at_rate(cluster, PROBE_RATE_PER_S, PROBE_S[size], delay_ms, workdir, "probe")
        produced = saturation(cluster, size, console)
        rate = produced["records_per_s"] * LOAD if rate_per_s is None else rate_per_s
        console.log(f"latency at {rate:,.0f} records/s")
        loaded = at_rate(cluster, rate, LATENCY_S[size], delay_ms, workdir, "half")
        console.log(f"failovers x{FAILOVER_ROUNDS[size]}")
        topic = f"{TOPIC}-half"
        leader = [round(failover_round(cluster, topic), 3) for _ in range(FAILOVER_ROUNDS[size])]
        controller = controller_failovers(cluster, FAILOVER_ROUNDS[size])
    return {
        "delay_ms": delay_ms,
        "produce": produced,
        **loaded,
        "probe": probe,
        "leader_failover_s": leader,
        "controller_failover_s": controller,
    }


def run(
    workdir: Path,
    size: str,
    console: Console,
    delays: Sequence[float],
    wire: str,
    rate_per_s: float | None = None,
) -> dict[str, Any]:
    """Every delay on a network and a cluster of its own; ``wire`` "auto": netem where the
    kernel has it, else the delay line."""
    check_available()
    if wire == "auto":
        wire = "netem" if netem_supported(os.getpid()) else "tun"
    plan = NetemPlan(os.getpid(), wire=wire)
    scratch = Path(tempfile.mkdtemp(prefix="netem-run-", dir=workdir))
    try:
        runs = [one_delay(plan, d, size, scratch, console, rate_per_s) for d in delays]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "wire": wire,
        "subnet": f"{plan.subnet}.0/24",
        "record_bytes": RECORD_BYTES,
        "replication_factor": 3,
        "load": LOAD,
        "runs": runs,
    }


def report(console: Console, figures: dict[str, Any]) -> None:
    table = Table(
        "one way ms", "produce records/s", "offered", "produce p50/p99 ms", "e2e p50/p99 ms",
        f"at {PROBE_RATE_PER_S}/s: produce p50 ms", "e2e p50 ms", "e2e p50 in delays",
        "leader failover s", "controller failover s",
    )  # fmt: skip
    for found in figures["runs"]:
        produce, e2e = found["produce_paced"]["latency_ms"], found["end_to_end"]["latency_ms"]
        probe = found["probe"]
        table.add_row(
            str(found["delay_ms"]), f"{found['produce']['records_per_s']:,}",
            f"{found['offered_records_per_s']:,}",
            f"{produce['p50']} / {produce['p99']}", f"{e2e['p50']} / {e2e['p99']}",
            str(probe["produce_paced"]["latency_ms"]["p50"]),
            str(probe["end_to_end"]["latency_ms"]["p50"]),
            str(probe["end_to_end"]["p50_in_delays"]),
            str(max(found["leader_failover_s"])), str(max(found["controller_failover_s"])),
        )  # fmt: skip
    console.print(table)


def main(argv: Sequence[str] | None = None) -> int:
    """``bench_main``'s options and ``--delays`` (one-way ms, comma-separated)."""
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument(
        "--delays",
        default=",".join(str(d) for d in DELAYS_MS),
        help="one-way delays in ms, comma-separated",
    )
    own.add_argument(
        "--wire",
        choices=("auto", *WIRES),
        default="auto",
        help="how the delay is made (auto: netem where the kernel has it)",
    )
    own.add_argument(
        "--rate",
        type=float,
        default=None,
        help="records/s offered (default: half the saturation measured first)",
    )
    options, rest = own.parse_known_args(argv)
    delays = [float(d) for d in options.delays.split(",")]
    try:
        check_available()
    except NetemUnavailable as missing:  # `make bench` goes on without this section
        Console(stderr=True).print(f"[yellow]bench.netem not run:[/yellow] {missing}")
        return 0

    def figures(workdir: Path, quick: bool, progress: Console) -> dict[str, Any]:
        size = "quick" if quick else "full"
        return run(workdir, size, progress, delays, options.wire, options.rate)

    return bench_main(
        rest, __doc__.splitlines()[0] if __doc__ else "", "netem", figures, report, own
    )


if __name__ == "__main__":
    sys.exit(main())
