"""Client configuration: Kafka's settings (``batch.size`` is ``batch_size``), each bounded."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from raftlog.batch import Compression

MiB = 1024 * 1024
INT32_MAX = 2**31 - 1
TRANSACTIONAL_ID_MAX = 32_767  # Kafka's string length limit on the wire

COMPRESSION_TYPES = {
    "none": Compression.NONE,
    "gzip": Compression.GZIP,
    "snappy": Compression.SNAPPY,
    "lz4": Compression.LZ4,
    "zstd": Compression.ZSTD,
}


# librdkafka's batch.size (Kafka's Java client has 16 KiB): a broker's cost is mostly per
# request; with 16 KiB batches of 1 KiB records acks=all RF 3 produce made 3,207 records/s, with
# this 16,760 (bench.kafka_protocol_bench, same cluster). linger.ms still bounds how long a
# record waits, so a slow producer sends small batches as before.
DEFAULT_BATCH_SIZE = 1_000_000


class ProducerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    acks: Literal[0, 1, -1, "all"] = "all"
    batch_size: int = Field(DEFAULT_BATCH_SIZE, ge=1, le=64 * MiB)
    linger_ms: int = Field(5, ge=0, le=600_000)
    compression_type: Literal["none", "gzip", "snappy", "lz4", "zstd"] = "none"
    retries: int = Field(INT32_MAX, ge=0, le=INT32_MAX)
    delivery_timeout_ms: int = Field(120_000, ge=1, le=3_600_000)
    retry_backoff_ms: int = Field(100, ge=0, le=60_000)
    retry_backoff_max_ms: int = Field(1_000, ge=0, le=600_000)
    request_timeout_ms: int = Field(30_000, ge=1, le=600_000)
    max_in_flight_requests_per_connection: int = Field(5, ge=1, le=100)
    buffer_memory: int = Field(32 * MiB, ge=1, le=4096 * MiB)
    max_block_ms: int = Field(60_000, ge=0, le=3_600_000)
    max_request_size: int = Field(1 * MiB, ge=1, le=100 * MiB)
    metadata_max_age_ms: int = Field(300_000, ge=0, le=3_600_000)
    # None: on when acks=all (Kafka's default since 3.0) or with a transactional.id, else off
    enable_idempotence: bool | None = None
    transactional_id: str | None = Field(None, min_length=1, max_length=TRANSACTIONAL_ID_MAX)
    transaction_timeout_ms: int = Field(60_000, ge=1, le=INT32_MAX)

    @model_validator(mode="after")
    def _idempotence_needs_acks_all(self) -> ProducerConfig:
        if self.idempotent and self.acks_code != -1:
            raise ValueError(
                "enable.idempotence (implied by transactional.id) requires acks=all"
                if self.transactional_id is not None
                else "enable.idempotence requires acks=all"
            )
        return self

    @model_validator(mode="after")
    def _transactions_need_idempotence(self) -> ProducerConfig:
        if self.transactional_id is not None and self.enable_idempotence is False:
            raise ValueError("a transactional.id requires enable.idempotence (Kafka's rule)")
        return self

    @property
    def idempotent(self) -> bool:
        if self.enable_idempotence is not None:
            return self.enable_idempotence
        return self.transactional_id is not None or self.acks_code == -1

    @model_validator(mode="after")
    def _delivery_covers_one_attempt(self) -> ProducerConfig:
        if self.delivery_timeout_ms < self.linger_ms + self.request_timeout_ms:
            raise ValueError(
                "delivery.timeout.ms must be at least linger.ms + request.timeout.ms "
                f"({self.delivery_timeout_ms} < {self.linger_ms} + {self.request_timeout_ms})"
            )
        return self

    @property
    def acks_code(self) -> int:
        """The wire value: 0, 1 or -1 for all."""
        return -1 if self.acks == "all" else int(self.acks)

    @property
    def compression(self) -> Compression:
        return COMPRESSION_TYPES[self.compression_type]


class ConsumerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    fetch_min_bytes: int = Field(1, ge=0, le=100 * MiB)
    fetch_max_wait_ms: int = Field(500, ge=0, le=60_000)
    fetch_max_bytes: int = Field(50 * MiB, ge=1, le=100 * MiB)
    max_partition_fetch_bytes: int = Field(1 * MiB, ge=1, le=100 * MiB)
    max_poll_records: int = Field(500, ge=1, le=1_000_000)
    auto_offset_reset: Literal["latest", "earliest", "none"] = "latest"
    request_timeout_ms: int = Field(30_000, ge=1, le=600_000)
    retry_backoff_ms: int = Field(100, ge=0, le=60_000)
    retry_backoff_max_ms: int = Field(1_000, ge=0, le=600_000)
    metadata_max_age_ms: int = Field(300_000, ge=0, le=3_600_000)
    group_id: str | None = Field(None, min_length=1, max_length=255)
    group_instance_id: str | None = Field(None, min_length=1, max_length=255)  # KIP-345
    client_id: str = Field("raftlog-consumer", max_length=255)
    enable_auto_commit: bool = True
    auto_commit_interval_ms: int = Field(5_000, ge=0, le=3_600_000)
    max_poll_interval_ms: int = Field(300_000, ge=1, le=2**31 - 1)
    isolation_level: Literal["read_uncommitted", "read_committed"] = "read_uncommitted"

    @property
    def isolation_code(self) -> int:
        """The wire value of FetchRequest/ListOffsetsRequest ``isolation_level``."""
        return 1 if self.isolation_level == "read_committed" else 0
