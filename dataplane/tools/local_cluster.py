"""A local cluster of node processes on loopback: ``raftlog cluster up|down|status|kill|restart``.

Node N binds 127.0.0.(first_host + N - 1) and runs in combined mode (controller and broker in
one process). With ``port`` P every node listens on the same ports of its own address:
BROKER P-1, CONTROLLER P, the Raft transport P+1 and METRICS P+2 (so 9092/9093/9094/9095 by
default, as Kafka users expect), KAFKA P+3, the web console P+4 (HTTP; on a secure cluster
HTTPS with a login, docs/console.md) and, unless the cluster is secure, the schema registry P+5
(HTTP, docs/schema-registry.md).
Configuration, data and logs live under ``root/node-N/``; the
pids are in ``root/cluster.json`` so a later command finds and stops exactly those processes,
beside the cluster's layout (addresses, port, which nodes vote, nodes added and removed since it
started: ``add_node``, ``forget_node``), from which ``LocalCluster.from_state`` rebuilds it.

``secure=True`` (``raftlog cluster up --secure``): TLS, SCRAM, ACLs and a Raft transport under
TLS between node certificates, with the certificates and secrets under ``root/secrets/``
(dataplane/tools/secure_cluster.py); the cluster's own commands talk to it with the admin's
certificate.

Nodes die with the process that started them (`owned_launcher`, the default: tests, chaos,
benchmarks, demos), except those of ``raftlog cluster up|restart`` (`detached_launcher`), which
outlive the command.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc

from dataplane.client._cluster import Cluster
from dataplane.client.admin import AdminClient, UserScramCredentialUpsertion
from dataplane.server.config import NodeConfig
from dataplane.tools.entry import COMMAND
from dataplane.tools.owned_process import popen_owned
from dataplane.tools.secure_cluster import ADMIN_USER, ClusterSecrets
from metadata_quorum.client import ControllerClient
from metadata_quorum.security.channels import ClientSecurity
from metadata_quorum.security.scram import ScramMechanism
from protos import controller_pb2 as pb
from raftlog.errors import ErrorCode, KafkaError

Launcher = Callable[[int, list[str], Path], "subprocess.Popen[bytes]"]
STOP_TIMEOUT_S = 10.0
UP_TIMEOUT_S = 60.0  # a controller active, every broker unfenced (loaded CI: 30 s was short)
POLL_S = 0.05
MAX_NODE_ID = 9  # nodes 1..9 on consecutive addresses


T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = 30.0) -> T:
    """Poll ``probe`` until it returns something other than None/False; TimeoutError naming
    ``what`` after the deadline. (Tests, demos and benchmarks wait on clusters with it.)"""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(POLL_S)  # polling a condition with a deadline


def free_port(host: str) -> int:
    """A port that is free on ``host`` now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


# broker, controller, raft, metrics, kafka, console, schema registry: offsets from the port
PORT_SPAN = (-1, 0, 1, 2, 3, 4, 5)
# Local clusters notice a dead broker within seconds (Kafka's defaults, 9 s sessions, suit
# real networks); every value can still be overridden.
LOCAL_DEFAULTS: dict[str, str | int] = {
    "broker.session.timeout.ms": 2000,
    "broker.heartbeat.interval.ms": 250,
    "replica.lag.time.max.ms": 10_000,
    "group.consumer.session.timeout.ms": 10_000,
    "group.consumer.heartbeat.interval.ms": 500,
    "group.share.session.timeout.ms": 10_000,
    "group.share.heartbeat.interval.ms": 500,
    # As Kafka's own development config: a local group rebalances at once, no 3 s gathering.
    "group.initial.rebalance.delay.ms": 0,
}


def pick_cluster_port(hosts: list[str], attempts: int = 50) -> int:
    """A port P such that P-1..P+5 are free on every host (every offset of PORT_SPAN)."""
    for _ in range(attempts):
        port = free_port(hosts[0])
        if 1024 < port < 65536 - max(PORT_SPAN) and all(
            _port_free(h, port + d) for h in hosts for d in PORT_SPAN
        ):
            return port
    raise OSError(f"no free port range on {hosts} after {attempts} attempts")


def owned_launcher(node_id: int, argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """The library's launcher (tests, chaos, benchmarks, demos): the node dies with this process
    (dataplane/tools/owned_process.py), also when this process is killed."""
    with log_path.open("ab") as out:
        return popen_owned(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip


def detached_launcher(node_id: int, argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """``raftlog cluster up|restart``: the node outlives the command that started it."""
    with log_path.open("ab") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip


@dataclass(frozen=True)
class NodeSpec:
    node_id: int
    host: str
    directory: Path

    @property
    def config_path(self) -> Path:
        return self.directory / "node.toml"

    @property
    def log_path(self) -> Path:
        return self.directory / "node.log"


class LocalCluster:
    def __init__(
        self,
        root: Path,
        nodes: int = 3,
        first_host: int = 11,
        port: int = 9093,
        overrides: dict[str, str | int] | None = None,
        launcher: Launcher = owned_launcher,
        roles: str = "controller,broker",
        controllers: int | None = None,
        secure: bool = False,
        node_overrides: dict[int, dict[str, str | int]] | None = None,
    ) -> None:
        """``nodes`` processes on consecutive addresses from 127.0.0.``first_host``; the first
        ``controllers`` (default: all) run ``roles`` and vote in the metadata quorum, the rest
        are brokers only. ``node_overrides``: settings of one node (by id) over ``overrides``
        (``broker.rack``, say); not kept in cluster.json."""
        if not 1 <= nodes <= MAX_NODE_ID or not 2 <= first_host <= 254 - nodes:
            raise ValueError(f"nodes must be 1..{MAX_NODE_ID} on 127.0.0.2..254")
        if controllers is not None and not 1 <= controllers <= nodes:
            raise ValueError(f"controllers must be 1..{nodes}")
        self.root = root.resolve()
        self.first_host = first_host
        self.specs = [self._new_spec(n) for n in range(1, nodes + 1)]
        self.removed: set[int] = set()  # node ids removed from the cluster, never reused
        self.port = port
        self.overrides = overrides or {}
        self.node_overrides = node_overrides or {}
        self.launcher = launcher
        self.roles = roles
        self.controllers = nodes if controllers is None else controllers
        self.secure = secure
        self.secrets = ClusterSecrets(self.root / "secrets")
        self._procs: dict[int, subprocess.Popen[bytes]] = {}

    @classmethod
    def from_state(cls, root: Path, launcher: Launcher = owned_launcher) -> LocalCluster | None:
        """The cluster recorded in ``root/cluster.json`` (its added nodes included, its removed
        ones left out), or None if there is none. A file that records only a node count (older
        versions) is that many combined nodes."""
        try:
            state = json.loads((root / "cluster.json").read_text())
        except FileNotFoundError:
            return None
        node_ids = [int(n) for n in state.get("node_ids") or range(1, int(state["nodes"]) + 1)]
        controllers = int(state.get("controllers") or len(node_ids))
        cluster = cls(
            root, nodes=controllers, first_host=int(state.get("first_host", 11)),
            port=int(state["port"]), launcher=launcher,
            roles=str(state.get("roles", "controller,broker")), controllers=controllers,
            secure=bool(state.get("secure", False)),
        )  # fmt: skip
        cluster.specs = [cluster._new_spec(n) for n in sorted(node_ids)]
        cluster.removed = {int(n) for n in state.get("removed", ())}
        return cluster

    def _new_spec(self, node_id: int) -> NodeSpec:
        host = f"127.0.0.{self.first_host + node_id - 1}"
        return NodeSpec(node_id, host, self.root / f"node-{node_id}")

    # -- configuration -----------------------------------------------------------------------
    @property
    def controller_specs(self) -> list[NodeSpec]:
        return self.specs[: self.controllers]

    @property
    def voters(self) -> str:
        return ",".join(f"{s.node_id}@{s.host}:{self.port}" for s in self.controller_specs)

    @property
    def controller_addresses(self) -> list[str]:
        return [f"{s.host}:{self.port}" for s in self.controller_specs]

    def roles_of(self, spec: NodeSpec) -> str:
        return self.roles if spec in self.controller_specs else "broker"

    @property
    def bootstrap_servers(self) -> list[str]:
        return [self.broker_address(s.node_id) for s in self.specs]

    def broker_address(self, node_id: int) -> str:
        return f"{self.spec(node_id).host}:{self.port - 1}"

    def metrics_address(self, node_id: int) -> str:
        return f"{self.spec(node_id).host}:{self.port + 2}"

    def kafka_address(self, node_id: int) -> str:
        """The node's KAFKA listener (Kafka's binary protocol)."""
        return f"{self.spec(node_id).host}:{self.port + 3}"

    def console_address(self, node_id: int) -> str | None:
        """The node's web console (HTTP; HTTPS with a login on a secure cluster: ``console_url``);
        None on a controller-only node (it reads through the node's own BROKER listener)."""
        spec = self.spec(node_id)
        if "broker" not in self.roles_of(spec):
            return None
        return f"{spec.host}:{self.port + 4}"

    def console_url(self, node_id: int) -> str | None:
        address = self.console_address(node_id)
        scheme = "https" if self.secure else "http"
        return None if address is None else f"{scheme}://{address}/"

    def schema_registry_address(self, node_id: int) -> str | None:
        """The node's schema registry (HTTP, Confluent's REST API); None on a controller-only
        node and on a secure cluster (the registry has no authentication yet)."""
        console = self.console_address(node_id)
        if console is None or self.secure:
            return None
        return f"{self.spec(node_id).host}:{self.port + 5}"

    @property
    def schema_registry_urls(self) -> list[str]:
        """``http://host:port`` of every node's schema registry (schema.registry.url)."""
        found = (self.schema_registry_address(s.node_id) for s in self.specs)
        return [f"http://{address}" for address in found if address is not None]

    @property
    def kafka_bootstrap_servers(self) -> list[str]:
        return [self.kafka_address(s.node_id) for s in self.specs]

    def config(self, spec: NodeSpec) -> NodeConfig:
        """The node's configuration. A controller names the voters; a broker-only node (one
        ``add_node`` started, say) only some controllers, ``controller.quorum.bootstrap.servers``
        (KIP-853), and learns the voters from the metadata."""
        voting = spec in self.controller_specs
        controller = f"CONTROLLER://{spec.host}:{self.port}," if voting else ""
        quorum = (
            ("controller.quorum.voters", self.voters)
            if voting
            else ("controller.quorum.bootstrap.servers", ",".join(self.controller_addresses))
        )
        values: dict[str, object] = {
            "node.id": spec.node_id,
            "process.roles": self.roles_of(spec),
            quorum[0]: quorum[1],
            "listeners": (
                f"BROKER://{spec.host}:{self.port - 1},{controller}"
                f"METRICS://{spec.host}:{self.port + 2},KAFKA://{spec.host}:{self.port + 3}"
            ),
            "log.dirs": str(spec.directory / "data"),
            **LOCAL_DEFAULTS,
            **self._secure_settings(spec.node_id),
        }
        values.update(self.overrides)
        values.update(self.node_overrides.get(spec.node_id, {}))
        console = self.console_address(spec.node_id)
        protocols = str(values.get("listener.security.protocol.map", ""))
        # plaintext: HTTP; the secure cluster's SASL_SSL: HTTPS with a login; a BROKER listener
        # given by the overrides: none (an SSL one has no passwords to log in with)
        if console and (self.secure or "BROKER:" not in protocols):
            scheme = "HTTPS" if self.secure else "HTTP"
            values.setdefault("console.listener", f"{scheme}://{console}")  # docs/console.md
        registry = self.schema_registry_address(spec.node_id)
        if registry and "BROKER:" not in protocols:
            values.setdefault("schema.registry.listener", f"HTTP://{registry}")
        return NodeConfig.parse(values)

    def _secure_settings(self, node_id: int) -> dict[str, object]:
        """Nothing unless secure; then TLS (the Raft transport's too), SCRAM and ACLs
        (secure_cluster). Every id a node of this cluster may have is a super user, so a node
        added later is one, and a Raft peer."""
        if not self.secure:
            return {}
        return self.secrets.node_settings(node_id, range(1, MAX_NODE_ID + 1))

    def new_controller_config(self, node_id: int, host: str, directory: Path) -> str:
        """The node.toml (text) of a controller that is not a voter yet, on ``host`` at the
        cluster's ports, its data under ``directory``: controller role only, the cluster's first
        voters in ``controller.quorum.voters``. Start it, then add it with AddRaftVoter
        (``raftlog quorum add-controller``, KIP-853; the chaos harness's membership fault)."""
        values: dict[str, object] = {
            "node.id": node_id,
            "process.roles": "controller",
            "controller.quorum.voters": self.voters,
            "listeners": f"CONTROLLER://{host}:{self.port}",
            "log.dirs": str(directory / "data"),
            **LOCAL_DEFAULTS,
            **self._secure_settings(node_id),
            **self.overrides,
        }
        if self.secure:
            self.secrets.ensure([(node_id, host)])
        return NodeConfig.parse(values).to_toml()

    def spec(self, node_id: int) -> NodeSpec:
        """The node's spec (one another command added too: cluster.json is read again)."""
        for attempt in range(2):
            for spec in self.specs:
                if spec.node_id == node_id:
                    return spec
            if attempt == 0:
                self._sync_layout()
        nodes = ",".join(str(s.node_id) for s in self.specs)
        raise KeyError(f"no node {node_id}; the nodes are {nodes}")

    # -- pids ----------------------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.root / "cluster.json"

    def _load_pids(self) -> dict[int, int]:
        try:
            data = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return {}
        return {int(k): int(v) for k, v in data.get("pids", {}).items()}

    def _recorded_layout(self) -> tuple[set[int], set[int]]:
        """(node ids, removed node ids) as cluster.json records them (empty if it does not)."""
        try:
            state = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return set(), set()
        node_ids = {int(n) for n in state.get("node_ids", ())}
        return node_ids, {int(n) for n in state.get("removed", ())}

    def _sync_layout(self) -> None:
        """Learn the nodes another command added to or removed from this cluster."""
        recorded, removed = self._recorded_layout()
        self.removed |= removed
        known = {s.node_id for s in self.specs}
        self.specs = [s for s in self.specs if s.node_id not in self.removed]
        self.specs += [self._new_spec(n) for n in sorted(recorded - known - self.removed)]

    def _save_pids(self, pids: dict[int, int]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._sync_layout()
        state = {
            "pids": pids, "port": self.port, "nodes": len(self.specs),
            "node_ids": [s.node_id for s in self.specs], "removed": sorted(self.removed),
            "first_host": self.first_host, "controllers": self.controllers, "roles": self.roles,
            "secure": self.secure,
        }  # fmt: skip
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_path)

    def pid(self, node_id: int) -> int | None:
        """The node's pid if that process is alive and is our node."""
        pid = self._load_pids().get(node_id)
        if pid is None:
            return None
        proc = self._procs.get(node_id)
        if proc is not None and proc.poll() is not None:
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        return pid if str(self.spec(node_id).config_path).encode() in cmdline else None

    # -- lifecycle -----------------------------------------------------------------------------
    def start_node(self, node_id: int) -> int:
        spec = self.spec(node_id)
        existing = self.pid(node_id)
        if existing is not None:
            return existing
        spec.directory.mkdir(parents=True, exist_ok=True)
        if self.secure:
            self.secrets.ensure([(spec.node_id, spec.host)])
        spec.config_path.write_text(self.config(spec).to_toml())
        argv = [*COMMAND, "node", "--config", str(spec.config_path)]
        proc = self.launcher(node_id, argv, spec.log_path)
        self._procs[node_id] = proc
        pids = self._load_pids()
        pids[node_id] = proc.pid
        self._save_pids(pids)
        return proc.pid

    def up(self, timeout_s: float = UP_TIMEOUT_S) -> None:
        """Start every node; return once a controller is active and every broker unfenced."""
        for spec in self.specs:
            self.start_node(spec.node_id)
        self.wait_for_leader(timeout_s)
        self.wait_for_brokers(timeout_s=timeout_s)
        if self.secure:
            ensure_admin_user(self)

    def signal_node(self, node_id: int, signum: int) -> None:
        pid = self.pid(node_id)
        if pid is not None:
            os.kill(pid, signum)

    def stop_node(
        self, node_id: int, kill: bool = False, timeout_s: float = STOP_TIMEOUT_S
    ) -> None:
        """SIGTERM (or SIGKILL) the node by its pid and wait until it is gone."""
        pid = self.pid(node_id)
        if pid is None:
            return
        os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
        if not self._wait_gone(node_id, pid, timeout_s):
            os.kill(pid, signal.SIGKILL)
            self._wait_gone(node_id, pid, timeout_s)
        pids = self._load_pids()
        pids.pop(node_id, None)
        self._save_pids(pids)

    def _wait_gone(self, node_id: int, pid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        proc = self._procs.get(node_id)
        while time.monotonic() < deadline:
            if proc is not None and proc.pid == pid:
                if proc.poll() is not None:
                    return True
            elif self.pid(node_id) is None:
                return True
            time.sleep(POLL_S)  # polling a condition with a deadline
        return False

    def down(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM every node at once (those another command added too), wait for each
        (SIGKILL after ``timeout_s``)."""
        self._sync_layout()
        signalled = []
        for spec in self.specs:
            pid = self.pid(spec.node_id)
            if pid is not None:
                os.kill(pid, signal.SIGTERM)
                signalled.append((spec.node_id, pid))
        for node_id, pid in signalled:
            if not self._wait_gone(node_id, pid, timeout_s):
                os.kill(pid, signal.SIGKILL)
                self._wait_gone(node_id, pid, timeout_s)
        pids = self._load_pids()
        for node_id, _ in signalled:
            pids.pop(node_id, None)
        self._save_pids(pids)

    def restart_node(self, node_id: int) -> int:
        self.stop_node(node_id)
        return self.start_node(node_id)

    # -- membership ----------------------------------------------------------------------------
    def add_node(self, timeout_s: float = 30.0) -> int:
        """Start a broker-only node on the next address (its id one above every node the
        cluster has had: a removed node's id and directory are never reused), record it in
        cluster.json, and return its id once it is registered and unfenced."""
        self._sync_layout()
        node_id = max([s.node_id for s in self.specs] + list(self.removed)) + 1
        if node_id > MAX_NODE_ID or self.first_host + node_id - 1 > 254:
            raise ValueError(f"a local cluster has at most {MAX_NODE_ID} nodes; no node {node_id}")
        spec = self._new_spec(node_id)
        busy = [self.port + d for d in PORT_SPAN if not _port_free(spec.host, self.port + d)]
        if busy:
            raise OSError(f"ports {busy} of {spec.host} are in use: node {node_id} cannot start")
        self.specs.append(spec)
        self.start_node(node_id)
        self.wait_for_brokers([node_id], timeout_s=timeout_s)
        return node_id

    def forget_node(self, node_id: int) -> None:
        """Drop a stopped broker-only node from the cluster (cluster.json included); its
        directory stays. Its controller must not be a voter: the quorum would not know."""
        spec = self.spec(node_id)
        if spec in self.controller_specs:
            raise ValueError(f"node {node_id} is a controller (a voter): it cannot be forgotten")
        if self.pid(node_id) is not None:
            raise ValueError(f"node {node_id} is still running (pid {self.pid(node_id)})")
        self.specs.remove(spec)
        self.removed.add(node_id)
        pids = self._load_pids()
        pids.pop(node_id, None)
        self._save_pids(pids)

    # -- observation ---------------------------------------------------------------------------
    def wait_for_brokers(
        self, broker_ids: list[int] | None = None, timeout_s: float = 30.0
    ) -> None:
        """Poll DescribeCluster until every broker in ``broker_ids`` (default: every node, when
        the nodes run the broker role) is registered and unfenced."""
        brokers = (s.node_id for s in self.specs if "broker" in self.roles_of(s))
        wanted = set(broker_ids if broker_ids is not None else brokers)
        if not wanted:
            return
        deadline = time.monotonic() + timeout_s
        client = self.client()
        try:
            while time.monotonic() < deadline:
                try:
                    described = client.call(
                        "DescribeCluster", pb.DescribeClusterRequest(), deadline_s=2.0
                    )
                except KafkaError:  # no active controller yet; keep polling
                    described = None
                if described is not None and wanted <= {
                    b.broker_id for b in described.brokers if not b.fenced
                }:
                    return
                time.sleep(POLL_S)  # polling a condition with a deadline
        finally:
            client.close()
        raise TimeoutError(f"brokers {sorted(wanted)} not unfenced within {timeout_s} s")

    def client(self) -> ControllerClient:
        return ControllerClient(self.controller_addresses, security=self.admin_security)

    @property
    def admin_security(self) -> ClientSecurity | None:
        """How the cluster's own commands connect: plaintext, or the admin's certificate."""
        return self.secrets.admin_certificate_security() if self.secure else None

    @property
    def client_settings(self) -> dict[str, str]:
        """What a client needs besides the bootstrap servers (empty unless secure): the SCRAM
        user admin over TLS, in librdkafka's names (`ClientSecurity.from_properties` takes
        them; so does confluent-kafka)."""
        return self.secrets.client_settings(self.secrets.admin_password()) if self.secure else {}

    def wait_for_leader(self, timeout_s: float = 30.0) -> int:
        """Poll DescribeQuorum until a live node names an active controller; its id."""
        deadline = time.monotonic() + timeout_s
        client = self.client()
        try:
            while time.monotonic() < deadline:
                for spec in self.controller_specs:
                    if self.pid(spec.node_id) is None:
                        continue
                    try:
                        described = client.stub(f"{spec.host}:{self.port}").DescribeCluster(
                            pb.DescribeClusterRequest(), timeout=1.0
                        )
                    except grpc.RpcError:  # not up yet; keep polling
                        continue
                    if described.controller_id >= 0 and described.status.controller_address:
                        return int(described.controller_id)
                time.sleep(POLL_S)  # polling a condition with a deadline
        finally:
            client.close()
        raise TimeoutError(f"no active controller within {timeout_s} s; see {self.root}/*/node.log")


def ensure_admin_user(cluster: LocalCluster) -> None:
    """The SCRAM user ``admin`` (SHA-256 and SHA-512, one random password kept under
    ``secrets/``), created over the admin's certificate; once every broker authenticates it,
    ``secrets/client.properties``."""
    secrets_of = cluster.secrets
    password = secrets_of.admin_password()
    with AdminClient(cluster.bootstrap_servers, security=cluster.admin_security) as admin:
        # one request per mechanism: Kafka refuses a user altered twice in one request
        for mechanism in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512):
            upsertion = UserScramCredentialUpsertion(ADMIN_USER, mechanism, password)
            error = admin.alter_user_scram_credentials([upsertion])[ADMIN_USER]
            if error is not None:
                raise error
    live = [
        cluster.broker_address(spec.node_id)
        for spec in cluster.specs
        if "broker" in cluster.roles_of(spec) and cluster.pid(spec.node_id) is not None
    ]
    wait_until_brokers_know(live, ClientSecurity.from_properties(cluster.client_settings))
    secrets_of.write_client_properties(password, cluster.bootstrap_servers)


def wait_until_brokers_know(
    brokers: Sequence[str],
    security: ClientSecurity,
    topics: Iterable[str] = (),
    timeout_s: float = 30.0,
) -> None:
    """Until each broker authenticates `security`'s SCRAM user and shows it every one of
    `topics` without an error. Credentials and ACLs reach a broker through the metadata log a
    moment after the controller commits them, so a client right after their creation could be
    refused by a broker still behind (a failed SASL exchange is not retried). The refusals of
    this wait are on the audit log as failed authentications. TimeoutError names the broker."""
    wanted = set(topics)
    for broker in brokers:

        def knows(broker: str = broker) -> bool:
            cluster = Cluster([broker], request_timeout_ms=10_000, security=security)
            try:
                snapshot = cluster.refresh(wanted)
            except KafkaError:  # refused (not there yet) or unreachable: ask again
                return False
            finally:
                cluster.close()
            found = [snapshot.topics.get(topic) for topic in wanted]
            return all(t is not None and t.error is ErrorCode.NONE for t in found)

        wait_for(f"broker {broker} to know user {security.sasl_username}", knows, timeout_s)
