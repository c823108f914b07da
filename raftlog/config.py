"""Per-log (topic) configuration: Kafka's dotted names, Kafka's defaults, bounds on every number.

``LogConfig.parse({"segment.bytes": "1048576", "cleanup.policy": "compact"})`` takes the same
keys and string values as Kafka's topic configs; a bad key or value is a ``ConfigError``
(INVALID_CONFIG) naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from raftlog.errors import ErrorCode, KafkaError

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
DAY_MS = 24 * 60 * 60 * 1000

CleanupPolicy = Literal["delete", "compact"]


class ConfigError(KafkaError):
    """INVALID_CONFIG, with the offending key(s) named."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_CONFIG, message)


class LogConfig(BaseModel):
    """The topic-level configs the storage engine honours."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    segment_bytes: int = Field(1024**3, alias="segment.bytes", ge=1024, le=INT32_MAX)
    segment_ms: int = Field(7 * DAY_MS, alias="segment.ms", ge=1, le=INT64_MAX)
    segment_index_bytes: int = Field(
        10 * 1024 * 1024, alias="segment.index.bytes", ge=12, le=INT32_MAX
    )
    index_interval_bytes: int = Field(4096, alias="index.interval.bytes", ge=0, le=INT32_MAX)
    retention_ms: int = Field(7 * DAY_MS, alias="retention.ms", ge=-1, le=INT64_MAX)
    retention_bytes: int = Field(-1, alias="retention.bytes", ge=-1, le=INT64_MAX)
    cleanup_policy: frozenset[CleanupPolicy] = Field(
        frozenset({"delete"}), alias="cleanup.policy", min_length=1
    )
    delete_retention_ms: int = Field(DAY_MS, alias="delete.retention.ms", ge=0, le=INT64_MAX)
    min_compaction_lag_ms: int = Field(0, alias="min.compaction.lag.ms", ge=0, le=INT64_MAX)
    min_cleanable_dirty_ratio: float = Field(0.5, alias="min.cleanable.dirty.ratio", ge=0.0, le=1.0)
    flush_messages: int = Field(INT64_MAX, alias="flush.messages", ge=1, le=INT64_MAX)
    flush_ms: int = Field(INT64_MAX, alias="flush.ms", ge=0, le=INT64_MAX)
    flush_on_ack: bool = Field(False, alias="flush.on.ack")
    max_message_bytes: int = Field(1024 * 1024 + 12, alias="max.message.bytes", ge=0, le=INT32_MAX)
    message_timestamp_type: Literal["CreateTime", "LogAppendTime"] = Field(
        "CreateTime", alias="message.timestamp.type"
    )
    # CreateTime batches whose timestamps lie further in the past / future are refused
    # (INVALID_TIMESTAMP); Kafka 4.0's defaults (KIP-937, KIP-1030).
    message_timestamp_before_max_ms: int = Field(
        INT64_MAX, alias="message.timestamp.before.max.ms", ge=0, le=INT64_MAX
    )
    message_timestamp_after_max_ms: int = Field(
        60 * 60 * 1000, alias="message.timestamp.after.max.ms", ge=0, le=INT64_MAX
    )
    # The broker's producer state forgets a producer id whose last batch is this old (never one
    # with an open transaction), and the cleaner then drops the empty batch it kept for that
    # producer. A broker config in Kafka (dynamic, cluster-wide); here it
    # rides with each partition's LogConfig, so a cluster-wide AlterConfigs (resource "") sets
    # it for every partition at run time, and a topic may override it.
    producer_id_expiration_ms: int = Field(
        DAY_MS, alias="producer.id.expiration.ms", ge=1, le=INT64_MAX
    )

    @field_validator("cleanup_policy", mode="before")
    @classmethod
    def _split_policy(cls, value: Any) -> Any:
        if isinstance(value, str):
            return frozenset(part.strip() for part in value.split(",") if part.strip())
        return value

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy

    @classmethod
    def parse(cls, values: Mapping[str, Any]) -> LogConfig:
        """Build from Kafka-style keys; raise ConfigError naming each bad key."""
        try:
            return cls.model_validate(dict(values))
        except ValidationError as error:
            raise ConfigError(describe_validation_error(error)) from error

    def with_overrides(self, values: Mapping[str, Any]) -> LogConfig:
        """This config with some keys changed (AlterConfigs), validated like ``parse``."""
        merged = self.model_dump(by_alias=True)
        merged.update(values)
        return LogConfig.parse(merged)

    def to_properties(self) -> dict[str, str]:
        """Kafka-style string values, as DescribeConfigs shows them."""
        out: dict[str, str] = {}
        for key, value in self.model_dump(by_alias=True).items():
            if isinstance(value, frozenset):
                out[key] = ",".join(sorted(value))
            elif isinstance(value, bool):
                out[key] = str(value).lower()
            else:
                out[key] = str(value)
        return out


def describe_validation_error(error: ValidationError) -> str:
    """One line per bad key: ``segment.bytes: Input should be greater than or equal to 1024``."""
    lines = []
    for problem in error.errors():
        key = ".".join(str(part) for part in problem["loc"]) or "(config)"
        if problem["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown configuration key")
        else:
            lines.append(f"{key}: {problem['msg']} (got {problem.get('input')!r})")
    return "; ".join(lines)
