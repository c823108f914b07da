"""A worker's configuration: Kafka Connect's worker settings (dotted names), each bounded.

Loaded from a JSON file (``worker.json``): ``{"bootstrap.servers": "127.0.0.11:9092",
"listeners": "http://127.0.0.1:8083", ...}``. Standalone mode needs
``offset.storage.file.filename``; distributed mode needs ``group.id``. Client security
(``security.protocol``, ``sasl.*``, ``ssl.*``, also ``producer.``/``consumer.``/``admin.``-prefixed)
as Kafka Connect takes it: see ``connect.client_security``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from connect.client_security import WORKER_PREFIXES, collect_security, securities
from metadata_quorum.security.channels import ClientSecurity

ClientRole = Literal["worker", "producer", "consumer", "admin"]


class WorkerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    bootstrap_servers: list[str] = Field(alias="bootstrap.servers", min_length=1, max_length=100)
    listeners: str = Field("http://127.0.0.1:8083", max_length=255)
    group_id: str | None = Field(None, alias="group.id", min_length=1, max_length=249)
    offset_storage_file_filename: str | None = Field(
        None, alias="offset.storage.file.filename", min_length=1, max_length=4096
    )
    offset_flush_interval_ms: int = Field(
        10_000, alias="offset.flush.interval.ms", ge=10, le=3_600_000
    )
    offset_flush_timeout_ms: int = Field(5_000, alias="offset.flush.timeout.ms", ge=10, le=600_000)
    config_storage_topic: str = Field("connect-configs", alias="config.storage.topic")
    offset_storage_topic: str = Field("connect-offsets", alias="offset.storage.topic")
    status_storage_topic: str = Field("connect-status", alias="status.storage.topic")
    offset_storage_partitions: int = Field(5, alias="offset.storage.partitions", ge=1, le=1000)
    status_storage_partitions: int = Field(5, alias="status.storage.partitions", ge=1, le=1000)
    session_timeout_ms: int = Field(10_000, alias="session.timeout.ms", ge=100, le=3_600_000)
    heartbeat_interval_ms: int = Field(3_000, alias="heartbeat.interval.ms", ge=10, le=600_000)
    rebalance_timeout_ms: int = Field(60_000, alias="rebalance.timeout.ms", ge=100, le=3_600_000)
    request_timeout_ms: int = Field(30_000, alias="request.timeout.ms", ge=100, le=600_000)
    task_shutdown_graceful_timeout_ms: int = Field(
        5_000, alias="task.shutdown.graceful.timeout.ms", ge=0, le=600_000
    )
    max_outstanding_records: int = Field(
        10_000, alias="max.outstanding.records", ge=1, le=10_000_000
    )
    status_metrics_interval_ms: int = Field(
        5_000, alias="status.metrics.interval.ms", ge=100, le=3_600_000
    )
    # KIP-618: every source task of this worker commits its records and offsets in one
    # transaction (connect.exactly_once); distributed mode only, as in Kafka
    exactly_once_source_support: Literal["disabled", "enabled"] = Field(
        "disabled", alias="exactly.once.source.support"
    )
    transaction_timeout_ms: int = Field(
        60_000, alias="producer.transaction.timeout.ms", ge=1_000, le=900_000
    )
    # the security.protocol / ssl.* / sasl.* keys by prefix ("" = the worker's own clients)
    security_properties: dict[str, dict[str, str]] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _collect_security(cls, values: Any) -> Any:
        return collect_security(values, WORKER_PREFIXES)

    def client_security(self, role: ClientRole) -> ClientSecurity | None:
        """The security of a worker's (``worker``), source task's (``producer``), sink task's
        (``consumer``) or connector's admin (``admin``) clients; None: PLAINTEXT."""
        prefix = "" if role == "worker" else f"{role}."
        properties = self.security_properties.get(prefix)
        return None if properties is None else securities({prefix: properties})[prefix]

    @property
    def exactly_once(self) -> bool:
        return self.exactly_once_source_support == "enabled"

    @field_validator("bootstrap_servers", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("listeners")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError("listeners must be one http://host:port URL")
        return value

    @property
    def rest_host(self) -> str:
        host = urlsplit(self.listeners).hostname
        assert host is not None
        return host

    @property
    def rest_port(self) -> int:
        port = urlsplit(self.listeners).port
        assert port is not None
        return port

    @classmethod
    def load(cls, path: Path, **overrides: Any) -> WorkerConfig:
        values = json.loads(path.read_text())
        if not isinstance(values, dict):
            raise ValueError(f"{path}: a worker config is a JSON object")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)
