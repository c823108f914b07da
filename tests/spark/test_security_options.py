"""The ``kafka.``-prefixed security options of the source and sink reach ClientSecurity (pure)."""

from __future__ import annotations

import pytest

from spark._options import client_security, parse_read_options, parse_write_options
from spark.errors import OptionError

JAAS = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required "
    'username="alice" password="secret-1";'
)
SECURE = {
    "kafka.bootstrap.servers": "127.0.0.11:9092",
    "kafka.security.protocol": "SASL_SSL",
    "kafka.sasl.mechanism": "SCRAM-SHA-256",
    "kafka.sasl.jaas.config": JAAS,
    "kafka.ssl.truststore.type": "PEM",
    "kafka.ssl.truststore.location": "/secrets/raftlog-ca.crt",
}


def test_read_and_write_options_carry_the_security() -> None:
    read = parse_read_options({**SECURE, "subscribe": "t"}, streaming=False)
    write = parse_write_options({**SECURE, "topic": "t"})
    for options in (read, write):
        security = options.security
        assert security is not None
        assert security.security_protocol == "SASL_SSL"
        assert security.sasl_mechanism == "SCRAM-SHA-256"
        assert (security.sasl_username, security.sasl_password) == ("alice", "secret-1")
        assert str(security.ssl_ca_location) == "/secrets/raftlog-ca.crt"


def test_librdkafka_names_and_mixed_case_keys() -> None:
    security = client_security(
        {
            "KAFKA.SECURITY.PROTOCOL": "ssl",
            "kafka.ssl.ca.location": "/ca.pem",
            "kafka.ssl.keystore.location": "/me.pem",
        }
    )
    assert security is not None and security.security_protocol == "SSL"
    assert str(security.ssl_certificate_location) == str(security.ssl_key_location) == "/me.pem"


def test_no_security_options_mean_plaintext() -> None:
    assert parse_write_options({"kafka.bootstrap.servers": "h:1", "topic": "t"}).security is None
    assert client_security({"kafka.isolation.level": "read_committed"}) is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kafka.security.protocol": "SASL_SSL"}, "needs ssl.ca.location"),
        ({"kafka.sasl.jaas.config": "nonsense"}, "sasl.jaas.config"),
        ({"kafka.ssl.unknown.thing": "x"}, "ssl.unknown.thing"),
    ],
)
def test_bad_security_options_fail_up_front(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_write_options({"kafka.bootstrap.servers": "h:1", "topic": "t", **options})
