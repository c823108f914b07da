"""Group configs (Kafka 4's config resource GROUP, type 32): per-group overrides of the
broker's group coordinator settings, stored as ConfigRecords in the metadata log.

Kafka's ``GroupConfig`` names and validators: ``consumer.session.timeout.ms`` and
``consumer.heartbeat.interval.ms`` (KIP-848 consumer groups), ``share.session.timeout.ms``,
``share.heartbeat.interval.ms``, ``share.record.lock.duration.ms``, ``share.auto.offset.reset``
and ``share.isolation.level`` (share groups, KIP-932; the last Kafka 4.1's: ``read_committed``
share fetches read up to the last stable offset and never deliver aborted transactions'
records). A group without an override of a key takes the broker's value of its synonym
(``group.consumer.session.timeout.ms``, ...); the two share strings have none (Kafka's
defaults ``latest`` and ``read_uncommitted``). ``streams.*`` (KIP-1071) is not listed: raftlog
has no streams groups.

Validation (Kafka's ``GroupConfig.validate``): each value parses as its type and is at least
Kafka's floor (1 ms; 1000 ms for the lock duration), each timeout lies within the broker's
``group.*.min/max.*`` bounds, and a session timeout must exceed its heartbeat interval once the
group's overrides are laid over the broker's defaults. Only the keys a group overrides are
held to the bounds: a broker default outside them (a test cluster's short session) does not
make every other override of the group invalid.

Everything here is pure: the controller validates with its node's defaults and bounds, and a
broker resolves a group's effective values from its metadata image and its own defaults.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raftlog.config import ConfigError

CONSUMER_SESSION_TIMEOUT_MS = "consumer.session.timeout.ms"
CONSUMER_HEARTBEAT_INTERVAL_MS = "consumer.heartbeat.interval.ms"
SHARE_SESSION_TIMEOUT_MS = "share.session.timeout.ms"
SHARE_HEARTBEAT_INTERVAL_MS = "share.heartbeat.interval.ms"
SHARE_RECORD_LOCK_DURATION_MS = "share.record.lock.duration.ms"
SHARE_AUTO_OFFSET_RESET = "share.auto.offset.reset"
SHARE_ISOLATION_LEVEL = "share.isolation.level"
READ_UNCOMMITTED, READ_COMMITTED = "read_uncommitted", "read_committed"
EARLIEST, LATEST, BY_DURATION = "earliest", "latest", "by_duration:"
INT32_MAX = 2**31 - 1

# group config -> (the GroupConfigs field, the broker config it overrides, Kafka's floor);
# share.auto.offset.reset has no broker synonym (Kafka's default is latest)
_INT_KEYS: dict[str, tuple[str, str, int]] = {
    CONSUMER_SESSION_TIMEOUT_MS: (
        "consumer_session_timeout_ms", "group.consumer.session.timeout.ms", 1
    ),
    CONSUMER_HEARTBEAT_INTERVAL_MS: (
        "consumer_heartbeat_interval_ms", "group.consumer.heartbeat.interval.ms", 1
    ),
    SHARE_SESSION_TIMEOUT_MS: ("share_session_timeout_ms", "group.share.session.timeout.ms", 1),
    SHARE_HEARTBEAT_INTERVAL_MS: (
        "share_heartbeat_interval_ms", "group.share.heartbeat.interval.ms", 1
    ),
    SHARE_RECORD_LOCK_DURATION_MS: (
        "share_record_lock_duration_ms", "group.share.record.lock.duration.ms", 1000
    ),
}  # fmt: skip
GROUP_KEYS = frozenset(_INT_KEYS) | {SHARE_AUTO_OFFSET_RESET, SHARE_ISOLATION_LEVEL}
BROKER_SYNONYMS: dict[str, str] = {key: broker for key, (_, broker, _) in _INT_KEYS.items()}
# the (min, max) broker configs that bound each timeout (Kafka's GroupCoordinatorConfig and
# ShareGroupConfig names)
BOUND_NAMES: dict[str, tuple[str, str]] = {
    key: (f"group.{kind}.min.{rest}", f"group.{kind}.max.{rest}")
    for key, (_, kind, rest) in ((k, b.split(".", 2)) for k, b in BROKER_SYNONYMS.items())
}
# Kafka's ISO-8601 durations for by_duration: PnDTnHnMn.nS (no years or months)
_DURATION = re.compile(
    r"^P(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?$"
)


@dataclass(frozen=True)
class GroupConfigs:
    """A group's effective values: the broker's defaults, or the group's overrides of them."""

    consumer_session_timeout_ms: int = 45_000
    consumer_heartbeat_interval_ms: int = 5_000
    share_session_timeout_ms: int = 45_000
    share_heartbeat_interval_ms: int = 5_000
    share_record_lock_duration_ms: int = 30_000
    share_auto_offset_reset: str = LATEST
    share_isolation_level: str = READ_UNCOMMITTED

    def values(self) -> dict[str, str]:
        """Every group config key with its value, as DescribeConfigs shows it."""
        out = {key: str(getattr(self, field)) for key, (field, _, _) in _INT_KEYS.items()}
        out[SHARE_AUTO_OFFSET_RESET] = self.share_auto_offset_reset
        out[SHARE_ISOLATION_LEVEL] = self.share_isolation_level
        return out

    def with_overrides(self, overrides: Mapping[str, str]) -> GroupConfigs:
        """These defaults with a group's stored overrides laid over them (stored values were
        validated by the controller; a key this version does not know is ignored)."""
        changes: dict[str, Any] = {}
        for key, value in overrides.items():
            if key in _INT_KEYS:
                changes[_INT_KEYS[key][0]] = int(value)
            elif key == SHARE_AUTO_OFFSET_RESET:
                changes["share_auto_offset_reset"] = value.strip().lower()
            elif key == SHARE_ISOLATION_LEVEL:
                changes["share_isolation_level"] = value.strip()
        return dataclasses.replace(self, **changes) if changes else self


@dataclass(frozen=True)
class GroupConfigBounds:
    """The broker's bounds on per-group timeouts (Kafka's defaults), each (min, max) ms."""

    consumer_session_timeout_ms: tuple[int, int] = (45_000, 60_000)
    consumer_heartbeat_interval_ms: tuple[int, int] = (5_000, 15_000)
    share_session_timeout_ms: tuple[int, int] = (45_000, 60_000)
    share_heartbeat_interval_ms: tuple[int, int] = (5_000, 15_000)
    share_record_lock_duration_ms: tuple[int, int] = (15_000, 60_000)


def reset_duration_ms(value: str) -> int | None:
    """The look-back of ``by_duration:<ISO-8601 duration>`` in ms; None for another value or
    an unparsable duration."""
    if not value.startswith(BY_DURATION):
        return None
    match = _DURATION.match(value[len(BY_DURATION) :].strip().upper())
    if match is None or not any(match.groupdict().values()) or value.endswith("T"):
        return None
    parts = {k: float(v) if v else 0.0 for k, v in match.groupdict().items()}
    delta = datetime.timedelta(
        days=parts["d"], hours=parts["h"], minutes=parts["m"], seconds=parts["s"]
    )
    return int(delta.total_seconds() * 1000)


def _int_value(key: str, value: str) -> int:
    floor = _INT_KEYS[key][2]
    try:
        parsed = int(value.strip())
    except ValueError as error:
        raise ConfigError(
            f"{key}: Invalid value {value} for configuration {key}: Not a number of type INT"
        ) from error
    if not floor <= parsed <= INT32_MAX:
        raise ConfigError(
            f"{key}: Invalid value {parsed} for configuration {key}: Value must be at least {floor}"
        )
    return parsed


def _reset_value(value: str) -> str:
    normalized = value.strip().lower()
    if normalized in (EARLIEST, LATEST) or reset_duration_ms(normalized) is not None:
        return normalized
    raise ConfigError(
        f"{SHARE_AUTO_OFFSET_RESET}: Invalid value {value} for configuration "
        f"{SHARE_AUTO_OFFSET_RESET}: must be one of earliest, latest or by_duration:<ISO-8601 "
        "duration> (PnDTnHnMn.nS, not negative)"
    )


def _isolation_value(value: str) -> str:
    """Kafka's ``ConfigDef.ValidString.in`` (case-sensitive, as Kafka's)."""
    if value.strip() in (READ_COMMITTED, READ_UNCOMMITTED):
        return value.strip()
    raise ConfigError(
        f"{SHARE_ISOLATION_LEVEL}: Invalid value {value} for configuration "
        f"{SHARE_ISOLATION_LEVEL}: String must be one of: {READ_COMMITTED}, {READ_UNCOMMITTED}"
    )


def validate_group_configs(
    overrides: Mapping[str, str], defaults: GroupConfigs, bounds: GroupConfigBounds
) -> None:
    """Raise ConfigError (INVALID_CONFIG) naming the first bad key of a group's whole set of
    overrides: an unknown key, a value that does not parse, one below Kafka's floor or outside
    the broker's bounds, a session timeout not above its heartbeat interval."""
    unknown = sorted(set(overrides) - GROUP_KEYS)
    if unknown:
        raise ConfigError("; ".join(f"{key}: Unknown group config name: {key}" for key in unknown))
    for key, value in sorted(overrides.items()):
        if key == SHARE_AUTO_OFFSET_RESET:
            _reset_value(value)
            continue
        if key == SHARE_ISOLATION_LEVEL:
            _isolation_value(value)
            continue
        parsed = _int_value(key, value)
        low, high = getattr(bounds, _INT_KEYS[key][0])
        low_name, high_name = BOUND_NAMES[key]
        if parsed < low:
            raise ConfigError(f"{key}: {key} must be greater than or equal to {low_name} ({low})")
        if parsed > high:
            raise ConfigError(f"{key}: {key} must be less than or equal to {high_name} ({high})")
    effective = defaults.with_overrides(overrides)
    pairs = (
        (CONSUMER_SESSION_TIMEOUT_MS, CONSUMER_HEARTBEAT_INTERVAL_MS,
         effective.consumer_session_timeout_ms, effective.consumer_heartbeat_interval_ms),
        (SHARE_SESSION_TIMEOUT_MS, SHARE_HEARTBEAT_INTERVAL_MS,
         effective.share_session_timeout_ms, effective.share_heartbeat_interval_ms),
    )  # fmt: skip
    for session_key, heartbeat_key, session_ms, heartbeat_ms in pairs:
        if session_ms <= heartbeat_ms and (session_key in overrides or heartbeat_key in overrides):
            raise ConfigError(
                f"{session_key}: {session_key} ({session_ms}) must be greater than "
                f"{heartbeat_key} ({heartbeat_ms})"
            )


@dataclass(frozen=True)
class GroupConfigRow:
    """One row of a group's DescribeConfigs: its value and where the value comes from
    (``group``: the group's override, Kafka's GROUP_CONFIG; ``static``: the broker's node
    config file; ``default``: Kafka's default), with the broker config it stands for."""

    name: str
    value: str
    origin: str  # "group", "static" or "default"
    synonym: str | None  # the broker config a group override overrides


def describe_group(
    overrides: Mapping[str, str], defaults: GroupConfigs, static_keys: frozenset[str]
) -> list[GroupConfigRow]:
    """Every group config key of a group (``overrides``: its stored ones), with its effective
    value. ``static_keys``: the broker configs (``group.consumer.session.timeout.ms``, ...)
    the describing node's config file sets."""
    effective = defaults.with_overrides(overrides).values()
    rows = []
    for key in sorted(GROUP_KEYS):
        synonym = BROKER_SYNONYMS.get(key)
        if key in overrides:
            origin = "group"
        elif synonym is not None and synonym in static_keys:
            origin = "static"
        else:
            origin = "default"
        rows.append(GroupConfigRow(key, effective[key], origin, synonym))
    return rows


@dataclass(frozen=True)
class GroupRules:
    """What a node validates group configs with: its group coordinator defaults (the broker
    configs each group config overrides) and its bounds."""

    defaults: GroupConfigs = GroupConfigs()
    bounds: GroupConfigBounds = GroupConfigBounds()
    # the broker configs (group.consumer.session.timeout.ms, ...) the node's file sets
    static_keys: frozenset[str] = frozenset()

    def validate(self, overrides: Mapping[str, str]) -> None:
        validate_group_configs(overrides, self.defaults, self.bounds)

    def describe(self, overrides: Mapping[str, str]) -> list[GroupConfigRow]:
        return describe_group(overrides, self.defaults, self.static_keys)


KAFKA_GROUP_RULES = GroupRules()  # Kafka's defaults and bounds
