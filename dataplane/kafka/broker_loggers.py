"""A broker's BROKER_LOGGER config resource (type 8, named by the broker id): its log levels,
described and changed at run time as Kafka's broker does (ConfigHelper, RuntimeLoggerManager,
Log4jController).

The loggers are the node's Python ``logging`` loggers of raftlog's packages (``dataplane.kafka
.listener``, ``metadata_quorum.controller``, ..., a package's own logger too) plus Kafka's
``root`` (Python's root logger). Each is described with its effective level in log4j's names:
TRACE (Python level 5, which raftlog's code logs below DEBUG), DEBUG, INFO, WARN (WARNING),
ERROR, FATAL (CRITICAL), OFF (above CRITICAL), source DYNAMIC_BROKER_LOGGER_CONFIG, no
synonyms. IncrementalAlterConfigs SETs a level (one of Kafka's six: TRACE DEBUG INFO WARN
ERROR FATAL) or DELETEs it: the logger then takes its nearest ancestor's level, the root's
unless a package level is set (log4j's ``setLevel(null)``); the root's cannot be deleted.
APPEND and SUBTRACT are INVALID_REQUEST, an unknown logger or level INVALID_CONFIG, all
validated before any level changes. Nothing is persisted: a restarted node starts at its
configured levels, as Kafka's does. Both need the cluster's DESCRIBE_CONFIGS / ALTER_CONFIGS
(CLUSTER_AUTHORIZATION_FAILED otherwise), checked by the caller.

``log4j_level`` and ``validate`` are pure; ``BrokerLoggers`` reads and sets a ``logging``
manager's loggers (the process's by default).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)
ROOT_LOGGER = "root"
TRACE = 5  # Python has no TRACE: the level below DEBUG
OFF = logging.CRITICAL + 10
LOG4J_LEVELS = {
    "TRACE": TRACE, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
    "ERROR": logging.ERROR, "FATAL": logging.CRITICAL, "OFF": OFF,
}  # fmt: skip
VALID_LOG_LEVELS = frozenset(LOG4J_LEVELS) - {"OFF"}  # Kafka's LogLevelConfig.VALID_LOG_LEVELS
PACKAGES = frozenset({"raftlog", "metadata_quorum", "dataplane", "protos", "chaos", "spark",
                      "connect"})  # fmt: skip
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
OP_NAMES = {OP_APPEND: "APPEND", OP_SUBTRACT: "SUBTRACT"}


def log4j_level(level: int) -> str:
    """The log4j name of a Python level: the highest log4j level at or below it."""
    return max(
        ((value, name) for name, value in LOG4J_LEVELS.items() if value <= level),
        default=(TRACE, "TRACE"),
    )[1]


def check_own_logger_resource(name: str, broker_id: int) -> None:
    """Kafka's checks of a BROKER_LOGGER resource's name: this broker's id."""
    if not name:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "Broker id must not be empty")
    try:
        asked = int(name)
    except ValueError as error:
        raise KafkaError(
            ErrorCode.INVALID_REQUEST, f"Node id must be an integer, but it is: {name}"
        ) from error
    if asked != broker_id:
        raise KafkaError(
            ErrorCode.INVALID_REQUEST,
            f"Unexpected broker id, expected {broker_id} but received {name}",
        )


def validate(ops: Iterable[tuple[int, str, str | None]], existing: frozenset[str]) -> None:
    """Kafka's RuntimeLoggerManager.validateLogLevelConfigs over (operation, logger, level)."""
    names = [name for _, name, _ in ops]
    if len(names) != len(set(names)):
        raise KafkaError(ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys")
    for op, name, level in ops:
        if op in OP_NAMES:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                f"{OP_NAMES[op]} operation is not allowed for the BROKER_LOGGER resource",
            )
        if op not in (OP_SET, OP_DELETE):
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                f"Unknown operation type {op} is not allowed for the BROKER_LOGGER resource",
            )
        if op == OP_SET and level is None:
            raise KafkaError(ErrorCode.INVALID_REQUEST, f"Null value not supported for : {name}")
        if name not in existing:
            raise KafkaError(ErrorCode.INVALID_CONFIG, f"Logger {name} does not exist!")
        if op == OP_SET and level not in VALID_LOG_LEVELS:
            raise KafkaError(
                ErrorCode.INVALID_CONFIG,
                f"Cannot set the log level of {name} to {level} as it is not a supported log "
                f"level. Valid log levels are {', '.join(sorted(VALID_LOG_LEVELS))}",
            )
        if op == OP_DELETE and name == ROOT_LOGGER:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                f"Removing the log level of the {ROOT_LOGGER} logger is not allowed",
            )


class BrokerLoggers:
    """The node's loggers as Kafka's BROKER_LOGGER resource (a ``logging`` manager's)."""

    def __init__(self, root: logging.Logger = logging.root) -> None:
        self.root = root
        self.manager = root.manager

    def _logger(self, name: str) -> logging.Logger:
        return self.root if name == ROOT_LOGGER else self.manager.getLogger(name)

    def names(self) -> frozenset[str]:
        """raftlog's loggers (a package's too, made if only its modules' exist) and root."""
        ours = [n for n in list(self.manager.loggerDict) if n.split(".")[0] in PACKAGES]
        return frozenset(ours) | {ROOT_LOGGER}

    def levels(self) -> dict[str, str]:
        """Every logger with its effective level's log4j name, sorted by name."""
        return {
            name: log4j_level(self._logger(name).getEffectiveLevel())
            for name in sorted(self.names())
        }

    def alter(self, resource: Any, validate_only: bool) -> None:
        """An IncrementalAlterConfigs BROKER_LOGGER resource's operations, validated whole
        then applied (unless ``validate_only``); raises its KafkaError."""
        ops = [(c.config_operation, c.name, c.value) for c in resource.configs]
        validate(ops, self.names())
        if validate_only:
            return
        for op, name, level in ops:
            if op == OP_SET:
                assert level is not None, "validate refuses a null level to set"
                self._logger(name).setLevel(LOG4J_LEVELS[level])
                log.warning("Updated the log level of %s to %s", name, level)
            else:
                self._logger(name).setLevel(logging.NOTSET)
                log.warning("Unset the log level of %s", name)
