"""An RDD reader: each topic-partition offset range is one RDD partition.

    from spark.rdd import offset_ranges_between, topic_rdd
    ranges = offset_ranges_between(servers, "clicks", "earliest", "latest")
    rdd = topic_rdd(session.sparkContext, servers, ranges)

Records are ``(key, value, topic, partition, offset, timestamp_ms)`` tuples. Partitions have no
preferred locations (every broker is on loopback here).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import RDD, SparkContext
from pyspark.sql.pandas.types import to_arrow_schema

from metadata_quorum.security.channels import ClientSecurity
from spark._metadata import ClusterMetadata
from spark._offsets import (
    EARLIEST,
    LATEST,
    OffsetRange,
    offset_ranges,
    parse_offset_spec,
    resolve_spec,
)
from spark._options import POLL_TIMEOUT_MS_DEFAULT, Subscription
from spark._reader import read_range
from spark.source import row_schema

__all__ = ["OffsetRange", "RecordTuple", "offset_ranges_between", "topic_rdd"]

RecordTuple = tuple[bytes | None, bytes | None, str, int, int, int]


def _servers(bootstrap_servers: str | Sequence[str]) -> list[str]:
    if isinstance(bootstrap_servers, str):
        return [s.strip() for s in bootstrap_servers.split(",") if s.strip()]
    return list(bootstrap_servers)


def offset_ranges_between(
    bootstrap_servers: str | Sequence[str],
    topic: str,
    start: str,
    end: str = "latest",
    security: ClientSecurity | None = None,
) -> list[OffsetRange]:
    """The non-empty ranges of ``topic`` between two offset specs (``earliest``, ``latest`` or
    ``{"topic": {"0": 23}}`` JSON with -2/-1, as the data source's startingOffsets and
    endingOffsets)."""
    start_spec = parse_offset_spec("start", start)
    end_spec = parse_offset_spec("end", end)
    with ClusterMetadata(_servers(bootstrap_servers), security=security) as metadata:
        tps = metadata.partitions(Subscription(topics=(topic,)))
        beginning, latest = metadata.beginning(tps), metadata.end(tps)
    return offset_ranges(
        resolve_spec("start", start_spec, tps, beginning, latest, EARLIEST),
        resolve_spec("end", end_spec, tps, beginning, latest, LATEST),
    )


def _read(
    servers: list[str],
    fail_on_data_loss: bool,
    ranges: Iterable[OffsetRange],
    security: ClientSecurity | None = None,
) -> Iterator[RecordTuple]:
    schema = to_arrow_schema(row_schema(), timezone="UTC")
    for rng in ranges:
        for batch in read_range(
            servers,
            rng,
            schema,
            fail_on_data_loss=fail_on_data_loss,
            include_headers=False,
            poll_timeout_ms=POLL_TIMEOUT_MS_DEFAULT,
            security=security,
        ):
            timestamps_ms = pc.divide(batch.column("timestamp").cast(pa.int64()), 1000)
            yield from zip(
                batch.column("key").to_pylist(),
                batch.column("value").to_pylist(),
                batch.column("topic").to_pylist(),
                batch.column("partition").to_pylist(),
                batch.column("offset").to_pylist(),
                timestamps_ms.to_pylist(),
                strict=True,
            )


def topic_rdd(
    sc: SparkContext,
    bootstrap_servers: str | Sequence[str],
    ranges: Sequence[OffsetRange],
    *,
    fail_on_data_loss: bool = True,
    security: ClientSecurity | None = None,
) -> RDD[RecordTuple]:
    """An RDD with one partition per range (empty ranges included, so partition i is range i).
    ``security``: the clients' (None: plaintext), e.g. ``ClientSecurity.from_properties``."""
    servers = _servers(bootstrap_servers)
    source = sc.parallelize(list(ranges), max(1, len(ranges)))
    return source.mapPartitions(lambda part: _read(servers, fail_on_data_loss, part, security))
