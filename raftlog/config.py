"""Per-log (topic) configuration: Kafka's dotted names, Kafka's defaults, bounds on every number.

``LogConfig.parse({"segment.bytes": "1048576", "cleanup.policy": "compact"})`` takes the same
keys and string values as Kafka's topic configs; a bad key or value is a ``ConfigError``
(INVALID_CONFIG) naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from raftlog.errors import ErrorCode, KafkaError

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
DAY_MS = 24 * 60 * 60 * 1000

CleanupPolicy = Literal["delete", "compact"]
# Kafka's BrokerCompressionType: ``producer`` keeps each batch's codec, a codec makes the leader
# recompress batches in any other codec (Kafka's LogValidator)
CompressionType = Literal["uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"]
GZIP_LEVEL_DEFAULT = -1  # Kafka's Deflater.DEFAULT_COMPRESSION (zlib's 6); else 1..9
GZIP_LEVEL_MIN, GZIP_LEVEL_MAX = 1, 9
LZ4_LEVEL_MIN, LZ4_LEVEL_MAX = 1, 17
ZSTD_LEVEL_MIN, ZSTD_LEVEL_MAX = -131072, 22  # zstd's ZSTD_minCLevel / ZSTD_MAX_CLEVEL


class ConfigError(KafkaError):
    """INVALID_CONFIG, with the offending key(s) named."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_CONFIG, message)


class LogConfig(BaseModel):
    """The topic-level configs the storage engine honours."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    segment_bytes: int = Field(1024**3, alias="segment.bytes", ge=1024, le=INT32_MAX)
    segment_ms: int = Field(7 * DAY_MS, alias="segment.ms", ge=1, le=INT64_MAX)
    # a log rolls at segment.ms minus a jitter below this (Kafka's randomSegmentJitter): the
    # partitions of one topic do not all roll at once
    segment_jitter_ms: int = Field(0, alias="segment.jitter.ms", ge=0, le=INT64_MAX)
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
    # Accepted, no effect: the cleaner picks a log by min.cleanable.dirty.ratio only (Kafka also
    # cleans a log whose oldest dirty record is older than this, whatever its ratio)
    max_compaction_lag_ms: int = Field(INT64_MAX, alias="max.compaction.lag.ms", ge=1, le=INT64_MAX)
    min_cleanable_dirty_ratio: float = Field(0.5, alias="min.cleanable.dirty.ratio", ge=0.0, le=1.0)
    flush_messages: int = Field(INT64_MAX, alias="flush.messages", ge=1, le=INT64_MAX)
    flush_ms: int = Field(INT64_MAX, alias="flush.ms", ge=0, le=INT64_MAX)
    flush_on_ack: bool = Field(False, alias="flush.on.ack")
    # raftlog's: the partition leader checks that every record's key / value is framed with a
    # schema id its node's schema registry knows (dataplane.broker.schema_validation)
    key_schema_validation: bool = Field(False, alias="key.schema.validation")
    value_schema_validation: bool = Field(False, alias="value.schema.validation")
    # A deleted segment's files are renamed *.deleted, removed this long after (Log.delete_later)
    file_delete_delay_ms: int = Field(60_000, alias="file.delete.delay.ms", ge=0, le=INT64_MAX)
    # A new active segment's file is given segment.bytes of blocks at once, trimmed on roll/close
    preallocate: bool = Field(False, alias="preallocate")
    compression_type: CompressionType = Field("producer", alias="compression.type")
    compression_gzip_level: int = Field(
        GZIP_LEVEL_DEFAULT, alias="compression.gzip.level", ge=GZIP_LEVEL_DEFAULT, le=GZIP_LEVEL_MAX
    )
    compression_lz4_level: int = Field(
        9, alias="compression.lz4.level", ge=LZ4_LEVEL_MIN, le=LZ4_LEVEL_MAX
    )
    compression_zstd_level: int = Field(
        3, alias="compression.zstd.level", ge=ZSTD_LEVEL_MIN, le=ZSTD_LEVEL_MAX
    )
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
    # Accepted, no effect (as in Kafka 4, which serves no message format below v2)
    message_downconversion_enable: bool = Field(True, alias="message.downconversion.enable")
    # Tiered storage (KIP-405). raftlog has no remote storage: the cluster runs as Kafka with
    # remote.log.storage.system.enable=false, so remote.storage.enable=true is refused (see
    # metadata_quorum.configs); the others are accepted and validated, with no effect.
    remote_storage_enable: bool = Field(False, alias="remote.storage.enable")
    local_retention_ms: int = Field(-2, alias="local.retention.ms", ge=-2, le=INT64_MAX)
    local_retention_bytes: int = Field(-2, alias="local.retention.bytes", ge=-2, le=INT64_MAX)
    remote_log_copy_disable: bool = Field(False, alias="remote.log.copy.disable")
    remote_log_delete_on_disable: bool = Field(False, alias="remote.log.delete.on.disable")
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

    @field_validator("compression_gzip_level")
    @classmethod
    def _gzip_level(cls, value: int) -> int:
        if value == 0:  # Kafka's GZIP levelValidator: 1..9 or -1
            raise ValueError(
                f"Input should be {GZIP_LEVEL_DEFAULT} or between {GZIP_LEVEL_MIN} and "
                f"{GZIP_LEVEL_MAX}"
            )
        return value

    @model_validator(mode="after")
    def _compaction_lags(self) -> LogConfig:
        """Kafka's LogConfig.validateValues."""
        if self.min_compaction_lag_ms > self.max_compaction_lag_ms:
            raise ValueError(
                f"conflict topic config setting min.compaction.lag.ms "
                f"({self.min_compaction_lag_ms}) > max.compaction.lag.ms "
                f"({self.max_compaction_lag_ms})"
            )
        return self

    @property
    def compression_level(self) -> int | None:
        """The level of ``compression.type``'s codec (None: it has none, or ``producer``)."""
        return {
            "gzip": self.compression_gzip_level,
            "lz4": self.compression_lz4_level,
            "zstd": self.compression_zstd_level,
        }.get(self.compression_type)

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
        elif not problem["loc"]:  # a check across keys: its message names them
            lines.append(str(problem["msg"]).removeprefix("Value error, "))
        else:
            lines.append(f"{key}: {problem['msg']} (got {problem.get('input')!r})")
    return "; ".join(lines)
