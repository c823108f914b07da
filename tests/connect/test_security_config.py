"""Connect's and MirrorMaker 2's client security settings reach ClientSecurity (pure)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from connect.mirror import MirrorSourceConfig
from connect.worker_config import WorkerConfig

JAAS = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required "
    'username="{user}" password="pw-{user}";'
)


def _sasl(prefix: str, user: str) -> dict[str, str]:
    return {
        f"{prefix}security.protocol": "SASL_SSL",
        f"{prefix}sasl.mechanism": "SCRAM-SHA-512",
        f"{prefix}sasl.jaas.config": JAAS.format(user=user),
        f"{prefix}ssl.truststore.location": f"/ca-{user}.crt",
    }


def test_worker_settings_by_prefix_as_kafka_connect_takes_them() -> None:
    config = WorkerConfig.model_validate(
        {
            "bootstrap.servers": "127.0.0.11:9092",
            "group.id": "g",
            "producer.transaction.timeout.ms": 30_000,  # a producer. key that is not security
            **_sasl("", "worker"),
            **_sasl("producer.", "source"),
            **_sasl("consumer.", "sink"),
        }
    )
    assert config.transaction_timeout_ms == 30_000
    for role, user in (("worker", "worker"), ("producer", "source"), ("consumer", "sink")):
        security = config.client_security(role)  # type: ignore[arg-type]
        assert security is not None and security.sasl_username == user, role
        assert security.sasl_password == f"pw-{user}"
    assert config.client_security("admin") is None  # no inheritance, as in Kafka Connect


def test_a_plaintext_worker_has_no_security() -> None:
    config = WorkerConfig.model_validate({"bootstrap.servers": "h:1"})
    assert all(config.client_security(r) is None for r in ("worker", "producer", "consumer"))


def test_bad_worker_security_names_its_prefix() -> None:
    with pytest.raises(ValidationError, match=r"consumer\.security settings"):
        WorkerConfig.model_validate(
            {"bootstrap.servers": "h:1", "consumer.security.protocol": "SASL_SSL"}
        )


def test_mirror_settings_by_cluster_and_passed_to_tasks() -> None:
    values = {
        "name": "m",
        "connector.class": "MirrorSourceConnector",
        "source.cluster.alias": "a",
        "source.cluster.bootstrap.servers": "127.0.0.1:1",
        "target.cluster.bootstrap.servers": "127.0.0.2:1",
        **_sasl("source.cluster.", "upstream"),
        "target.cluster.security.protocol": "SSL",
        "target.cluster.ssl.ca.location": "/ca.crt",
        "target.cluster.ssl.keystore.location": "/mirror.pem",
    }
    config = MirrorSourceConfig.model_validate(values)
    source, target = config.source_security(), config.target_security()
    assert source is not None and source.sasl_username == "upstream"
    assert target is not None and target.security_protocol == "SSL"
    assert str(target.ssl_certificate_location) == "/mirror.pem"
    shared = config.shared()
    assert shared["source.cluster.sasl.jaas.config"] == JAAS.format(user="upstream")
    assert shared["target.cluster.ssl.keystore.location"] == "/mirror.pem"
