"""The Raft transport under TLS (controller.quorum.raft.transport.security=tls, raft_tls.py).

Real `raft_node` processes on 127.0.0.251-254 (the range of test_raft_secret.py, hence its
xdist group): three voters, each with its own certificate of one CA for its own address, elect
and commit. A fourth address is a voter in everyone's configuration, so a process there *would*
be heard if it got through; it is refused by every voter (logged), gets no entry and moves no
term, with a certificate of another CA, with none (plaintext), and with a certificate of the
right CA issued for another host. With its own certificate the same process joins and catches
up; then a follower SIGKILLed and restarted reconnects (a new handshake) and catches up.
Without processes: which transport a node's settings give (a TLS CONTROLLER listener means TLS,
as in Kafka) and which certificate subjects may be a peer (`RaftPeers`); the product's refusal
of a CA-signed client certificate runs in tests/dataplane/server/test_rogue_node.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dataplane.server.config import NodeConfig
from dataplane.server.node import raft_options
from dataplane.tools.certificates import make_ca, make_cert
from metadata_quorum.raft import RaftOptions
from metadata_quorum.raft_tls import RaftPeers, RaftTlsFiles
from metadata_quorum.security.principal import KafkaPrincipal
from raftlog.config import ConfigError
from tests.metadata_quorum.raft_node import Cluster, NodeProcess, free_port, tls_arguments
from tests.metadata_quorum.test_raft_secret import (
    REFUSAL_LOG_EVERY_SECOND,
    WAIT_S,
    _refusals,
    _status,
    wait_until,
)

HOSTS = ("127.0.0.251", "127.0.0.252", "127.0.0.253")  # test_raft_secret.py's range
OUTSIDER_HOST = "127.0.0.254"


@pytest.fixture
def quorum(tmp_path: Path) -> Iterator[tuple[Cluster, str]]:
    outsider = f"{OUTSIDER_HOST}:{free_port(OUTSIDER_HOST)}"
    cluster = Cluster(tmp_path, REFUSAL_LOG_EVERY_SECOND, hosts=HOSTS, others=(outsider,))
    for node in cluster.nodes.values():
        node.add_arguments(tls_arguments(tmp_path / "ca", node.address.rsplit(":", 1)[0]))
    try:
        cluster.start()
        yield cluster, outsider
    finally:
        cluster.kill_all()


def _check_shut_out(cluster: Cluster, outsider: NodeProcess, before: dict[str, int]) -> None:
    """Every voter logs the outsider's refused connection (it dials them all: its address is
    the highest); the quorum keeps its term and leader and commits; nobody counts the
    outsider connected; the outsider gets no entry and sees no leader."""
    voters = [node for node in cluster.live() if node is not outsider]
    leader = cluster.leader(timeout_s=WAIT_S)
    term = _status(leader)["term"]
    wait_until(
        lambda: all(_refusals(node) > before[node.address] for node in voters),
        "every voter logged the outsider's refused connection",
    )
    for i in range(10):
        assert leader.request(f"append entry-{i}")["ok"]
    for node in voters:
        status = _status(node)
        assert status["term"] == term, f"{node.address} moved to term {status['term']}"
        assert status["leader"] == leader.address
        connected = {v["address"]: v["connected"] for v in status["voters"]}
        assert connected[outsider.address] is False, f"{node.address} talks to the outsider"
    seen = _status(outsider)
    assert seen["leader"] is None and not seen["is_leader"], seen
    assert seen["commit_index"] <= 1, seen  # only pysyncobj's initial entry


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.xdist_group("secure_cluster")  # test_raft_secret.py and the security bench: 251-254
def test_voters_over_tls_commit_reconnect_and_refuse_outsiders(
    quorum: tuple[Cluster, str], tmp_path: Path
) -> None:
    cluster, address = quorum
    leader = cluster.leader(timeout_s=WAIT_S)
    assert leader.request("append first")["ok"]
    other_ca = tls_arguments(tmp_path / "other-ca", OUTSIDER_HOST, ca_name="other-ca")
    own_ca = tmp_path / "ca"
    wrong_host = tls_arguments(own_ca, "127.0.0.9")  # right CA, a certificate for another host
    for extra in (other_ca, [], wrong_host):
        before = {node.address: _refusals(node) for node in cluster.live()}
        outsider = NodeProcess(address, cluster.addresses, tmp_path / "outsider", extra)
        cluster.nodes[address] = outsider  # killed by the fixture, also on failure
        outsider.start()
        _check_shut_out(cluster, outsider, before)
        outsider.kill()
    logs = "".join(node.log_path.read_text() for node in cluster.live())
    # one line per refused phase (the log is rate-limited per host, and each phase waits for
    # a new line): the outsider refused the voters' CA, the voters refused plaintext, then
    # a certificate that does not name the outsider's address
    reasons = ("TLSV1_ALERT_UNKNOWN_CA", "WRONG_VERSION_NUMBER", "its certificate does not name")
    for reason in reasons:
        assert reason in logs, f"no refusal logged with {reason!r}"
    # with its own certificate of the quorum's CA, the same voter is heard and catches up
    outsider = NodeProcess(
        address, cluster.addresses, tmp_path / "outsider", tls_arguments(own_ca, OUTSIDER_HOST)
    )
    cluster.nodes[address] = outsider
    outsider.start()
    leader = cluster.leader(timeout_s=WAIT_S)
    assert leader.request("append joined")["ok"]
    wait_until(
        lambda: "joined" in outsider.request("state").get("entries", []),
        "the outsider with its own certificate catches up",
    )
    # a follower SIGKILLed (3 of the 4 voters commit) and restarted: it handshakes again
    follower = next(node for node in cluster.live() if node is not leader)
    follower.kill()
    reply = leader.request("append while-down")
    assert reply["ok"], reply
    follower.start()
    assert leader.request("append after-restart")["ok"]
    wait_until(
        lambda: "after-restart" in follower.request("state").get("entries", []),
        "the restarted follower reconnects over TLS and catches up",
    )
    entries = follower.request("state")["entries"]
    assert entries[0] == "first" and "joined" in entries and "while-down" in entries


def _config(tmp_path: Path, **extra: object) -> NodeConfig:
    settings: dict[str, object] = {
        "node.id": 1,
        "process.roles": "broker,controller",
        "controller.quorum.voters": "1@127.0.0.251:9093",
        "listeners": "BROKER://127.0.0.251:9092,CONTROLLER://127.0.0.251:9093",
        "log.dirs": str(tmp_path / "node"),
        **extra,
    }
    return NodeConfig.model_validate(settings)


def test_the_transport_setting_is_checked_and_gives_the_node_files(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    keystore = make_cert(ca, tmp_path, "node-1", ips=("127.0.0.251",))
    tls = {
        "controller.quorum.raft.transport.security": "tls",
        "ssl.keystore.location": str(keystore),
        "ssl.truststore.location": str(ca.truststore),
    }
    options = raft_options(_config(tmp_path, **tls))
    assert options.tls == RaftTlsFiles(keystore, ca.truststore) and options.secret is None
    assert options.tls_peers == RaftPeers("DEFAULT", None)  # no authorizer: any principal
    assert raft_options(_config(tmp_path)) == RaftOptions()  # default: no secret, plaintext
    with pytest.raises(ValueError, match=r"ssl\.keystore\.location and ssl\.truststore\.location"):
        _config(tmp_path, **{"controller.quorum.raft.transport.security": "tls"})
    secret = tmp_path / "raft.secret"
    secret.write_text("x" * 32)
    with pytest.raises(ValueError, match=r"not controller\.quorum\.raft\.secret\.file"):
        _config(tmp_path, **tls, **{"controller.quorum.raft.secret.file": str(secret)})
    with pytest.raises(ValueError, match="Input should be 'encryption' or 'tls'"):
        _config(tmp_path, **{"controller.quorum.raft.transport.security": "ssl"})
    broken = {**tls, "ssl.truststore.location": str(tmp_path / "absent.crt")}
    with pytest.raises(ConfigError, match="Raft TLS"):
        raft_options(_config(tmp_path, **broken))


STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def test_a_tls_controller_listener_makes_the_raft_transport_tls(tmp_path: Path) -> None:
    """As Kafka: the CONTROLLER listener's protocol secures the quorum. SSL or SASL_SSL with a
    keystore and a truststore: TLS, whose peers must be super users when there is an
    authorizer; an explicit setting wins; a secret file beside it is refused, not ignored."""
    ca = make_ca(tmp_path)
    keystore = make_cert(ca, tmp_path, "node-1", ips=("127.0.0.251",))
    secret = tmp_path / "raft.secret"
    secret.write_text("x" * 32)
    secured = {
        "listener.security.protocol.map": "CONTROLLER:SASL_SSL,BROKER:SSL",
        "ssl.keystore.location": str(keystore),
        "ssl.truststore.location": str(ca.truststore),
        "ssl.principal.mapping.rules": "RULE:^CN=([^,]+).*$/$1/,DEFAULT",
        "authorizer.class.name": STANDARD_AUTHORIZER,
        "super.users": "User:node-1;User:node-2;User:admin",
    }
    config = _config(tmp_path, **secured)
    assert config.raft_transport_security == "tls"
    options = raft_options(config)
    assert options.tls == RaftTlsFiles(keystore, ca.truststore)
    nodes = {KafkaPrincipal.user(n) for n in ("node-1", "node-2", "admin")}
    assert options.tls_peers == RaftPeers(secured["ssl.principal.mapping.rules"], frozenset(nodes))
    ssl_only = _config(tmp_path, **{**secured, "listener.security.protocol.map": "CONTROLLER:SSL"})
    assert ssl_only.raft_transport_security == "tls"
    # an explicit setting wins: the secret (or plaintext) on a TLS listener
    encryption = {"controller.quorum.raft.transport.security": "encryption"}
    chosen = _config(
        tmp_path, **secured, **encryption, **{"controller.quorum.raft.secret.file": str(secret)}
    )
    assert chosen.raft_transport_security == "encryption"
    assert raft_options(chosen).secret == b"x" * 32 and raft_options(chosen).tls is None
    assert _config(tmp_path, **secured, **encryption).raft_transport_security == "plaintext"
    # plaintext CONTROLLER: the secret file, or plaintext
    plain = {**secured, "listener.security.protocol.map": "BROKER:SSL"}
    with_secret = _config(tmp_path, **plain, **{"controller.quorum.raft.secret.file": str(secret)})
    assert with_secret.raft_transport_security == "encryption"
    assert _config(tmp_path, **plain).raft_transport_security == "plaintext"
    with pytest.raises(ValueError, match=r"CONTROLLER listener is SASL_SSL.*remove the secret"):
        _config(tmp_path, **secured, **{"controller.quorum.raft.secret.file": str(secret)})
    with pytest.raises(ValueError, match="a Raft peer must be a super user"):
        _config(tmp_path, **{**secured, "super.users": ""})


def test_a_raft_peer_must_map_to_a_node_principal() -> None:
    """The cluster's CA also signs clients: mallory's certificate is not a node's."""
    rules = "RULE:^CN=([^,]+).*$/$1/,DEFAULT"
    nodes = RaftPeers(
        rules, frozenset({KafkaPrincipal.user("node-1"), KafkaPrincipal.user("admin")})
    )
    assert nodes.refusal("CN=node-1") is None
    assert nodes.refusal("CN=node-1,O=raftlog") is None
    refused = nodes.refusal("CN=mallory")
    assert refused == "User:mallory (certificate CN=mallory) is not a node: not in super.users"
    assert nodes.refusal(None) == "it presented no certificate"
    strict = RaftPeers("RULE:^CN=(node-[0-9]+)$/$1/", nodes.principals)
    assert "no ssl.principal.mapping.rules rule matches" in str(strict.refusal("CN=mallory"))
    assert RaftPeers().refusal("CN=mallory") is None  # no authorizer: any principal of the CA
