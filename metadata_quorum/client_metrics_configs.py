"""Client metrics subscriptions (KIP-714; config resource CLIENT_METRICS, type 16): named sets of
``metrics``, ``interval.ms`` and ``match``, stored as ConfigRecords in the metadata log like
topic and group configs. Setting a subscription's first key creates it; deleting its last
removes it (Kafka has no other create or delete).

Kafka's ``ClientMetricsConfigs`` names, defaults and validation:
``metrics`` (LIST, default empty: the metric name prefixes a matching client pushes; ``*`` all),
``interval.ms`` (INT, default 300000, 100 to 3600000: how often it pushes) and ``match`` (LIST,
default empty: every client; else ``name=regex`` entries over client_instance_id, client_id,
client_software_name, client_software_version, client_source_address and client_source_port).
An unknown key and an interval out of range are INVALID_REQUEST, an interval that is no
integer and a bad match entry INVALID_CONFIG, as Kafka's controller answers.

raftlog stores and describes subscriptions; its brokers have no metrics reporter implementing
ClientTelemetry, so, as a Kafka broker without one, they do not advertise
GetTelemetrySubscriptions or PushTelemetry and no client pushes metrics (docs/compatibility.md).
Pure: the controller validates with it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from raftlog.config import ConfigError
from raftlog.errors import ErrorCode, KafkaError

METRICS = "metrics"
INTERVAL_MS = "interval.ms"
MATCH = "match"
CLIENT_METRICS_KEYS = frozenset({METRICS, INTERVAL_MS, MATCH})
LIST_KEYS = frozenset({METRICS, MATCH})
DEFAULT_INTERVAL_MS = 300_000
MIN_INTERVAL_MS, MAX_INTERVAL_MS = 100, 3_600_000
MATCH_PARAMS = frozenset({
    "client_instance_id", "client_id", "client_software_name", "client_software_version",
    "client_source_address", "client_source_port",
})  # fmt: skip
DEFAULTS = {METRICS: "", INTERVAL_MS: str(DEFAULT_INTERVAL_MS), MATCH: ""}


def _entries(value: str) -> list[str]:
    """Kafka's ConfigDef LIST parsing: comma separated, each trimmed, empty for ''."""
    return [] if not value.strip() else [part.strip() for part in value.split(",")]


def parse_match(value: str) -> dict[str, re.Pattern[str]]:
    """``match``'s entries as {param: compiled regex}; INVALID_CONFIG naming a bad entry
    (Kafka's "Illegal client matching pattern")."""
    out = {}
    for entry in _entries(value):
        parts = entry.split("=")
        param = parts[0].strip()
        if len(parts) != 2 or param not in MATCH_PARAMS:
            raise ConfigError(f"{MATCH}: Illegal client matching pattern: {entry}")
        try:
            out[param] = re.compile(parts[1].strip())
        except re.error as error:
            raise ConfigError(f"{MATCH}: Illegal client matching pattern: {entry}") from error
    return out


def validate_client_metrics_configs(name: str, values: Mapping[str, str]) -> None:
    """Kafka's ClientMetricsConfigs.validate over a subscription's whole new set."""
    if not name:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "Subscription name can't be empty")
    unknown = sorted(set(values) - CLIENT_METRICS_KEYS)
    if unknown:
        raise KafkaError(
            ErrorCode.INVALID_REQUEST, f"Unknown client metrics configuration: {unknown[0]}"
        )
    if INTERVAL_MS in values:
        raw = values[INTERVAL_MS]
        try:
            interval_ms = int(raw.strip())
        except ValueError as error:
            raise ConfigError(
                f"{INTERVAL_MS}: Invalid value {raw} for configuration {INTERVAL_MS}: Not a "
                "number of type INT"
            ) from error
        if not MIN_INTERVAL_MS <= interval_ms <= MAX_INTERVAL_MS:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                f"Invalid value {interval_ms} for {INTERVAL_MS}, interval must be between 100 "
                "and 3600000 (1 hour)",
            )
    if MATCH in values:
        parse_match(values[MATCH])
