"""``--command-config FILE`` / RAFTLOG_COMMAND_CONFIG: Java properties → ClientSecurity."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dataplane.tools import command_config
from dataplane.tools.cli import app
from dataplane.tools.command_config import (
    CommandConfigError,
    command_security,
    format_properties,
    parse_properties,
    read_command_config,
)

JAAS = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required "
    'username="admin" password="p=ss:word";'
)


def test_java_properties_syntax() -> None:
    text = "\n".join(
        [
            "# a comment",
            "! another",
            "security.protocol = SASL_SSL",
            "sasl.mechanism:SCRAM-SHA-256",
            "client.id raftlog-cli",
            "ssl.truststore.location=/tmp/ca\\",
            "    .crt",
            "weird\\=key=x\\ty",
            "empty=",
            f"sasl.jaas.config={JAAS}",
        ]
    )
    assert parse_properties(text) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "client.id": "raftlog-cli",
        "ssl.truststore.location": "/tmp/ca.crt",
        "weird=key": "x\ty",
        "empty": "",
        "sasl.jaas.config": JAAS,
    }


def test_a_kafka_client_properties_file_becomes_client_security(tmp_path: Path) -> None:
    path = tmp_path / "client.properties"
    path.write_text(
        "bootstrap.servers=127.0.0.11:9092\nsecurity.protocol=SASL_SSL\n"
        "sasl.mechanism=SCRAM-SHA-512\nssl.truststore.type=PEM\n"
        f"ssl.truststore.location={tmp_path / 'ca.crt'}\nsasl.jaas.config={JAAS}\n"
    )
    security = read_command_config(path)
    assert security.security_protocol == "SASL_SSL"
    assert security.sasl_mechanism == "SCRAM-SHA-512"
    assert (security.sasl_username, security.sasl_password) == ("admin", "p=ss:word")
    assert security.ssl_ca_location == tmp_path / "ca.crt"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("security.protocol=SASL_SSL\n", "needs ssl.ca.location"),
        ("security.protocol=SSL\nssl.ca.location=/x\nssl.bogus=1\n", "ssl.bogus"),
        ("security.protocol=TLS\n", "security.protocol"),
    ],
)
def test_bad_files_are_named_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.properties"
    path.write_text(text)
    with pytest.raises(CommandConfigError, match=message):
        read_command_config(path)
    with pytest.raises(CommandConfigError, match="No such file"):
        read_command_config(tmp_path / "absent")


def test_the_root_option_and_the_environment_reach_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "client.properties"
    path.write_text(f"security.protocol=SSL\nssl.ca.location={tmp_path / 'ca.crt'}\n")
    seen: list[object] = []
    real = command_config.use_command_config

    def spy(given: Path | None) -> object:
        seen.append(real(given))
        seen.append(command_security())
        return seen[-1]

    monkeypatch.setattr("dataplane.tools.cli.use_command_config", spy)
    runner = CliRunner()
    result = runner.invoke(app, ["--command-config", str(path), "log", "--help"])
    assert result.exit_code == 0, result.output
    assert seen[0] is not None and seen[0] == seen[1]
    result = runner.invoke(app, ["log", "--help"], env={"RAFTLOG_COMMAND_CONFIG": str(path)})
    assert result.exit_code == 0, result.output
    assert seen[2] == seen[0]
    bad = tmp_path / "bad.properties"
    bad.write_text("security.protocol=SASL_SSL\n")
    result = runner.invoke(app, ["--command-config", str(bad), "log", "--help"])
    assert result.exit_code == 2 and "needs ssl.ca.location" in result.output


def test_format_properties_round_trips_through_parse_properties() -> None:
    settings = {
        "ssl.ca.location": "C:\\certs\\ca.pem",  # backslashes are escapes in Java's format
        "sasl.jaas.config": 'org.X required username="a" password="p\\"q=";',
        "odd key=:": "two\nlines",
    }
    text = format_properties(settings, "a comment")
    assert text.startswith("# a comment\n")
    assert parse_properties(text) == settings
