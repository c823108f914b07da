"""The ``raftlog`` PySpark data source: batch and streaming reads and writes of topics.

    from spark.source import register
    register(session)
    df = (session.read.format("raftlog")
          .option("raftlog.bootstrap.servers", "127.0.0.11:9092")
          .option("subscribe", "clicks").load())

Options and rows are those of Spark's Kafka connector (see ``_options``). Each topic-partition
offset range is one Spark input partition (split further for ``minPartitions``); the readers
yield Arrow record batches. A streaming query's offsets are ``{"topic": {"partition": next
offset}}`` in its checkpoint, so a restarted query resumes exactly where its checkpoint says.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from dataplane.client import TopicPartition
from spark._metadata import ClusterMetadata
from spark._offsets import (
    EARLIEST,
    LATEST,
    OffsetRange,
    Offsets,
    OffsetsJson,
    cap_offsets,
    offset_ranges,
    offsets_from_json,
    offsets_to_json,
    rate_limit,
    resolve_spec,
    split_ranges,
    stream_offset_ranges,
)
from spark._options import ReadOptions, parse_read_options, parse_write_options
from spark._reader import read_range
from spark._worker import tune_worker
from spark._writer import BatchWriter, StreamWriter, check_write_schema
from spark.errors import OptionError

__all__ = ["RaftlogDataSource", "register", "row_schema"]

HEADERS_TYPE = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)


def row_schema(include_headers: bool = False) -> StructType:
    """The Kafka connector's row: key, value, topic, partition, offset, timestamp,
    timestampType (+ headers)."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", HEADERS_TYPE))
    return StructType(fields)


class RangePartition(InputPartition):
    """One Spark input partition: one offset range of one topic-partition."""

    def __init__(self, rng: OffsetRange) -> None:
        super().__init__(rng)
        self.range = rng


def _starting_offsets(
    options: ReadOptions, metadata: ClusterMetadata, tps: Sequence[TopicPartition]
) -> Offsets:
    if options.starting_timestamp_ms is not None:
        return metadata.for_timestamp(tps, options.starting_timestamp_ms)
    beginning, end = metadata.beginning(tps), metadata.end(tps)
    return resolve_spec("startingOffsets", options.starting, tps, beginning, end, EARLIEST)


def _read_partition(options: ReadOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    assert isinstance(partition, RangePartition), f"not a raftlog partition: {partition!r}"
    tune_worker()
    return read_range(
        options.bootstrap_servers,
        partition.range,
        to_arrow_schema(row_schema(options.include_headers), timezone="UTC"),
        fail_on_data_loss=options.fail_on_data_loss,
        include_headers=options.include_headers,
        poll_timeout_ms=options.poll_timeout_ms,
        isolation_level=options.isolation_level,
        security=options.security,
    )


class BatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        with ClusterMetadata(
            self.options.bootstrap_servers, self.options.isolation_level, self.options.security
        ) as metadata:
            tps = metadata.partitions(self.options.subscription)
            start = _starting_offsets(self.options, metadata, tps)
            end = metadata.end(tps)
            until = resolve_spec(
                "endingOffsets", self.options.ending, tps, metadata.beginning(tps), end, LATEST
            )
        beyond = [tp for tp in tps if until[tp] > end[tp]]
        if beyond:
            tp = beyond[0]
            raise OptionError(
                f"endingOffsets {tp.topic}-{tp.partition}: {until[tp]} is beyond the high "
                f"watermark {end[tp]}"
            )
        ranges = split_ranges(offset_ranges(start, until), self.options.min_partitions)
        return [RangePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(self.options, partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{"topic": {"partition": offset}}``. New partitions of subscribed topics
    are picked up at each trigger and read from their start."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._metadata: ClusterMetadata | None = None
        self._target: Offsets | None = None  # Trigger.AvailableNow's end

    def __getstate__(self) -> dict[str, Any]:  # the reader is pickled to executors
        return {"options": self.options, "_metadata": None, "_target": self._target}

    @property
    def metadata(self) -> ClusterMetadata:
        if self._metadata is None:
            self._metadata = ClusterMetadata(
                self.options.bootstrap_servers, self.options.isolation_level, self.options.security
            )
        return self._metadata

    def _latest(self) -> Offsets:
        tps = self.metadata.partitions(self.options.subscription)
        return self.metadata.end(tps)

    def initialOffset(self) -> OffsetsJson:
        tps = self.metadata.partitions(self.options.subscription)
        return offsets_to_json(_starting_offsets(self.options, self.metadata, tps))

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()

    def latestOffset(self, start: OffsetsJson, limit: ReadLimit) -> OffsetsJson:
        begin = offsets_from_json(start)
        latest = self._latest()
        if self._target is not None:
            latest = cap_offsets(latest, self._target)
        latest = {tp: max(offset, begin.get(tp, 0)) for tp, offset in latest.items()}
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit(begin, latest, limit.max_rows)
        return offsets_to_json(latest)

    def reportLatestOffset(self) -> OffsetsJson:
        return offsets_to_json(self._latest())

    def partitions(self, start: OffsetsJson, end: OffsetsJson) -> Sequence[InputPartition]:
        ranges = stream_offset_ranges(
            offsets_from_json(start), offsets_from_json(end), self.options.fail_on_data_loss
        )
        return [RangePartition(r) for r in split_ranges(ranges, self.options.min_partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(self.options, partition)

    def commit(self, end: OffsetsJson) -> None:
        """Nothing to do: offsets live in Spark's checkpoint, not in the cluster."""

    def stop(self) -> None:
        if self._metadata is not None:
            self._metadata.close()
            self._metadata = None


class RaftlogDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "raftlog"

    def schema(self) -> StructType:
        given = {str(k).lower(): str(v) for k, v in self.options.items()}
        include = given.get("includeheaders", "false").strip().lower() == "true"
        return row_schema(include_headers=include)

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(parse_read_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(parse_read_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        options = parse_write_options(self.options)
        check_write_schema(schema, options)
        return BatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = parse_write_options(self.options)
        check_write_schema(schema, options)
        return StreamWriter(options)


def register(session: SparkSession) -> None:
    """Make ``format("raftlog")`` available in ``session``."""
    session.dataSource.register(RaftlogDataSource)
