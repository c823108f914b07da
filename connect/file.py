"""The file connectors, as Kafka's FileStreamSource and FileStreamSink.

**FileStreamSource** tails files: every complete line (ended by ``\\n``; a trailing ``\\r`` is
dropped) becomes one record whose value is the line and whose key is null. The source partition
is ``{"filename": path}``, the offset ``{"position": byte position after the line}``; a restarted
task seeks to the committed position, so committed lines are not sent again (lines after it may
be: at-least-once). A partial last line (no newline yet) is not emitted until it is complete. A
missing file is waited for. With ``files`` (comma-separated) the files are spread over up to
``tasks.max`` tasks. Truncated or rotated files are not followed (the position stays where it was).

**FileStreamSink** appends each record's value and a newline to ``file`` (one ``write`` per
``put``, the file opened with O_APPEND, so tasks sharing a file do not tear lines) and fsyncs in
``flush``, before the runtime commits the consumer offsets. Records with a null value are skipped.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import ClassVar

from pydantic import Field, model_validator

from connect.api import (
    ConnectorConfig,
    JsonDict,
    OffsetReader,
    SinkConnector,
    SinkConnectorConfig,
    SinkRecord,
    SinkTask,
    SourceConnector,
    SourceConnectorConfig,
    SourceRecord,
    SourceTask,
)

log = logging.getLogger(__name__)
READ_BYTES = 1024 * 1024
MAX_LINE_BYTES_MAX = 16 * 1024 * 1024


class FileStreamSourceConfig(SourceConnectorConfig):
    file: str | None = Field(None, min_length=1, max_length=4096)
    files: str | None = Field(None, min_length=1, max_length=100_000)
    topic: str = Field(min_length=1, max_length=249)
    batch_size: int = Field(2000, alias="batch.size", ge=1, le=100_000)
    poll_interval_ms: int = Field(100, alias="poll.interval.ms", ge=1, le=60_000)
    max_line_bytes: int = Field(1024 * 1024, alias="max.line.bytes", ge=1, le=MAX_LINE_BYTES_MAX)

    @model_validator(mode="after")
    def _one_of_file_or_files(self) -> FileStreamSourceConfig:
        if (self.file is None) == (self.files is None):
            raise ValueError("set exactly one of file and files")
        return self

    def paths(self) -> list[str]:
        if self.file is not None:
            return [self.file]
        assert self.files is not None
        return [p.strip() for p in self.files.split(",") if p.strip()]


class FileStreamSinkConfig(SinkConnectorConfig):
    file: str = Field(min_length=1, max_length=4096)


def split_round_robin(items: list[str], groups_max: int) -> list[list[str]]:
    """``items`` dealt over at most ``groups_max`` non-empty groups, in order."""
    count = min(groups_max, len(items))
    return [items[i::count] for i in range(count)]


class FileStreamSource(SourceConnector):
    config_model: ClassVar[type[ConnectorConfig]] = FileStreamSourceConfig

    def start(self, config: ConnectorConfig) -> None:
        assert isinstance(config, FileStreamSourceConfig)
        self.config = config

    def task_configs(self, max_tasks: int) -> list[JsonDict]:
        base = {
            "topic": self.config.topic,
            "batch.size": self.config.batch_size,
            "poll.interval.ms": self.config.poll_interval_ms,
            "max.line.bytes": self.config.max_line_bytes,
        }
        return [
            {**base, "files": ",".join(group)}
            for group in split_round_robin(self.config.paths(), max_tasks)
        ]

    @staticmethod
    def task_class() -> type[SourceTask]:
        return FileStreamSourceTask


class FileStreamSourceTask(SourceTask):
    def __init__(self) -> None:
        self._stopping = threading.Event()
        self._positions: dict[str, int] = {}

    def start(self, config: JsonDict, offsets: OffsetReader) -> None:
        self.topic = str(config["topic"])
        self.batch_size = int(config["batch.size"])
        self.poll_interval_s = int(config["poll.interval.ms"]) / 1000
        self.max_line_bytes = int(config["max.line.bytes"])
        for path in str(config["files"]).split(","):
            committed = offsets.offset({"filename": path})
            position = 0 if committed is None else int(committed.get("position", 0))
            self._positions[path] = position
            log.info("%s: reading from position %d", path, position)

    def poll(self) -> list[SourceRecord]:
        records: list[SourceRecord] = []
        for path in self._positions:
            records += self._read(path, self.batch_size - len(records))
            if len(records) >= self.batch_size:
                break
        if not records:
            self._stopping.wait(self.poll_interval_s)
        return records

    def _read(self, path: str, records_max: int) -> list[SourceRecord]:
        position = self._positions[path]
        try:
            with open(path, "rb") as f:
                f.seek(position)
                size = min(READ_BYTES, self.max_line_bytes + 1) if records_max else 0
                data = f.read(size)
                if size and len(data) == size and data.find(b"\n") < 0:
                    # a line longer than one read but maybe within max.line.bytes
                    data += f.read(self.max_line_bytes + 1 - size)
        except FileNotFoundError:
            return []
        # the complete lines, at most records_max: split in one C call, not a find per line
        lines = data.split(b"\n", records_max) if records_max else [data]
        del lines[-1]  # the rest after the last newline taken: a partial line, or more lines
        carriage_returns = b"\r" in data  # rare: strip per line only when there are any
        partition = {"filename": path}  # one for the read's records: one offset key (worker.py)
        topic = self.topic
        records: list[SourceRecord] = []
        append = records.append
        start = position
        for line in lines:
            start += len(line) + 1
            value = line[:-1] if carriage_returns and line.endswith(b"\r") else line
            append(SourceRecord(partition, {"position": start}, topic, value))
        if not records and len(data) > self.max_line_bytes:
            raise ValueError(
                f"{path}: a line at position {position} is longer than max.line.bytes "
                f"({self.max_line_bytes})"
            )
        self._positions[path] = start
        return records

    def stop(self) -> None:
        self._stopping.set()


class FileStreamSink(SinkConnector):
    config_model: ClassVar[type[ConnectorConfig]] = FileStreamSinkConfig

    def start(self, config: ConnectorConfig) -> None:
        assert isinstance(config, FileStreamSinkConfig)
        self.config = config

    def task_configs(self, max_tasks: int) -> list[JsonDict]:
        return [{"file": self.config.file} for _ in range(max_tasks)]

    @staticmethod
    def task_class() -> type[SinkTask]:
        return FileStreamSinkTask


class FileStreamSinkTask(SinkTask):
    def __init__(self) -> None:
        self._fd: int | None = None

    def start(self, config: JsonDict) -> None:
        self.path = str(config["file"])
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def put(self, records: list[SinkRecord]) -> None:
        data = b"".join(r.value + b"\n" for r in records if r.value is not None)
        assert self._fd is not None, "put() before start()"
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]

    def flush(self, offsets: Mapping[tuple[str, int], int]) -> None:
        assert self._fd is not None, "flush() before start()"
        os.fsync(self._fd)

    def stop(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
