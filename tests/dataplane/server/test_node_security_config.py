"""How a node's configuration secures its listeners and its own connections to the other nodes:
`NodeConfig.server_security`, `NodeConfig.node_client_security`, the per-listener
``listener.name.<listener>.ssl.client.auth``, and the KAFKA and METRICS listeners' TLS."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest

from dataplane.server.config import NodeConfig
from dataplane.server.node import kafka_listener_security, metrics_tls
from dataplane.tools.certificates import make_ca, make_cert
from metadata_quorum.security.node_cert import NODE_CERT_MECHANISM
from raftlog.config import ConfigError

BASE: dict[str, Any] = {
    "node.id": 1,
    "process.roles": "controller,broker",
    "controller.quorum.voters": "1@127.0.0.11:9093",
    "listeners": "CONTROLLER://127.0.0.11:9093,BROKER://127.0.0.11:9092",
    "log.dirs": "/tmp/node-1",
}


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(directory)
    keystore = make_cert(ca, directory, "node-1", ips=("127.0.0.11",))
    return {"ssl.keystore.location": str(keystore), "ssl.truststore.location": str(ca.cert)}


def _config(stores: dict[str, str], protocols: str, client_auth: str) -> NodeConfig:
    return NodeConfig.parse(
        BASE
        | stores
        | {"listener.security.protocol.map": protocols, "ssl.client.auth": client_auth}
    )


def _none(listener: str, mechanism: Any) -> None:
    return None


def test_plaintext_listeners_stay_insecure() -> None:
    config = NodeConfig.parse(BASE)
    assert config.node_client_security("CONTROLLER") is None
    assert config.server_security("BROKER", _none) is None


@pytest.mark.parametrize(
    ("protocols", "client_auth", "listener", "client_mechanism", "server_mechanisms"),
    [
        # required: the certificate is asked for in TLS; the exchange is offered all the same
        ("CONTROLLER:SSL,BROKER:SSL", "required", "CONTROLLER", None, (NODE_CERT_MECHANISM,)),
        # requested: grpcio cannot ask for it, so nodes prove it in the exchange
        ("CONTROLLER:SSL,BROKER:SSL", "requested", "CONTROLLER", NODE_CERT_MECHANISM,
         (NODE_CERT_MECHANISM,)),
        # none: TLS only, no client is authenticated on an SSL listener
        ("CONTROLLER:SSL,BROKER:SSL", "none", "BROKER", None, ()),
        # SASL_SSL: SCRAM for clients, the certificate exchange for nodes
        ("CONTROLLER:SSL,BROKER:SASL_SSL", "none", "BROKER", NODE_CERT_MECHANISM,
         ("SCRAM-SHA-256", "SCRAM-SHA-512", NODE_CERT_MECHANISM)),
    ],
)  # fmt: skip
def test_listener_security(
    stores: dict[str, str],
    protocols: str,
    client_auth: str,
    listener: str,
    client_mechanism: str | None,
    server_mechanisms: tuple[str, ...],
) -> None:
    config = _config(stores, protocols, client_auth)
    client = config.node_client_security(listener)
    assert client is not None and client.uses_tls
    assert client.ssl_certificate_location == Path(stores["ssl.keystore.location"])
    assert client.ssl_ca_location == Path(stores["ssl.truststore.location"])
    assert client.exchanges == (client_mechanism is not None)
    if client_mechanism is not None:
        assert client.sasl_mechanism == client_mechanism
    server = config.server_security(listener, _none)
    assert server is not None and server.tls is not None
    assert server.tls.client_auth == client_auth
    assert server.authenticator.mechanisms == server_mechanisms
    assert server.authenticator.security_protocol == config.security_protocol(listener)


def test_a_listener_overrides_ssl_client_auth(stores: dict[str, str]) -> None:
    """Kafka's ``listener.name.<listener>.ssl.client.auth`` (lower-case listener name) beats
    ``ssl.client.auth`` for that listener only, everywhere the listener's TLS is built: the gRPC
    server, how the other nodes reach it, the KAFKA listener and METRICS."""
    config = NodeConfig.parse(
        BASE
        | stores
        | {
            "listeners": "CONTROLLER://127.0.0.11:9093,BROKER://127.0.0.11:9092,"
            "KAFKA://127.0.0.11:9096,METRICS://127.0.0.11:9095",
            "listener.security.protocol.map": "CONTROLLER:SSL,BROKER:SSL,KAFKA:SSL,METRICS:SSL",
            "ssl.client.auth": "requested",
            "listener.name.controller.ssl.client.auth": "required",
            "listener.name.metrics.ssl.client.auth": "none",
        }
    )
    assert [config.client_auth(n) for n in ("CONTROLLER", "BROKER", "KAFKA", "METRICS")] == [
        "required", "requested", "requested", "none",
    ]  # fmt: skip
    # CONTROLLER asks for the certificate in TLS; BROKER cannot, so nodes prove it by exchange
    controller = config.node_client_security("CONTROLLER")
    broker = config.node_client_security("BROKER")
    assert controller is not None and not controller.exchanges
    assert broker is not None and broker.sasl_mechanism == NODE_CERT_MECHANISM
    server = config.server_security("CONTROLLER", _none)
    assert server is not None and server.tls is not None
    assert server.tls.client_auth == "required"
    kafka = kafka_listener_security(config)
    assert kafka.tls is not None and kafka.tls.client_auth == "requested"
    metrics = metrics_tls(config)
    assert metrics is not None and metrics.verify_mode == ssl.CERT_NONE


def test_the_override_comes_from_the_environment_too(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(NodeConfig.parse(BASE).to_toml())
    environ = {"RAFTLOG_LISTENER_NAME_KAFKA_SSL_CLIENT_AUTH": "required"}
    config = NodeConfig.load(path, environ)
    assert config.client_auth("KAFKA") == "required" and config.client_auth("BROKER") == "none"
    assert '"listener.name.kafka.ssl.client.auth" = "required"' in config.to_toml()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"listener.name.broker.ssl.client.auth": "sometimes"}, "listener.name.broker"),
        ({"listener.name.replication.ssl.client.auth": "required"}, "replication"),
        ({"listener.security.protocol.map": "METRICS:SASL_SSL"}, "METRICS cannot be SASL_SSL"),
    ],
)
def test_bad_listener_security_is_refused(
    stores: dict[str, str], change: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        NodeConfig.parse(BASE | stores | change)


def test_metrics_tls_follows_the_protocol_map(stores: dict[str, str]) -> None:
    plain = NodeConfig.parse(
        BASE | stores | {"listener.security.protocol.map": "METRICS:PLAINTEXT"}
    )
    assert metrics_tls(plain) is None
    required = NodeConfig.parse(
        BASE
        | stores
        | {"listener.security.protocol.map": "METRICS:SSL", "ssl.client.auth": "required"}
    )
    context = metrics_tls(required)
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED
