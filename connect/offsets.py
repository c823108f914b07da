"""Source offset bookkeeping: which offsets may be committed. Pure: no IO, no threads.

A source task's records are produced asynchronously and acknowledged out of order (different
topic partitions, retries). An offset may be committed only once **every record the task
submitted before it for the same source partition** was acknowledged; otherwise a crash after the
commit would skip an unacknowledged record. :class:`SubmittedRecords` keeps, per source partition,
the records in submission order and hands out the offset of the last record of the acknowledged
prefix (Kafka Connect's ``SubmittedRecords``). A submission may stand for a run of consecutive
records of one source partition that are acknowledged together (one producer batch's): it carries
the run's last offset and its count, so a thousand records cost one entry, not a thousand. The
bound on what is outstanding is the caller's (the producer's buffer and
``max.outstanding.records``).

Offsets are stored under a key naming the connector and the source partition: the JSON text of
``[connector, partition]`` with sorted keys, as Kafka Connect keys ``connect-offsets``.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

JsonDict = dict[str, Any]


def offset_key(connector: str, partition: Mapping[str, Any]) -> str:
    return json.dumps([connector, dict(partition)], sort_keys=True, separators=(",", ":"))


class OffsetKeys:
    """``offset_key`` of one connector's source partitions, remembered: a source task names the
    same few partitions (a file, a topic partition) on every record, and the JSON text cost more
    than the rest of a record's bookkeeping. Only partitions of str and int values are
    remembered (``True`` and ``1`` are one dict key but two JSON texts); others are encoded each
    time. At most ``MEMO_MAX`` are remembered."""

    MEMO_MAX = 10_000

    def __init__(self, connector: str) -> None:
        self.connector = connector
        self._memo: dict[tuple[tuple[str, Any], ...], str] = {}

    def __call__(self, partition: Mapping[str, Any]) -> str:
        memo_key = tuple(sorted(partition.items()))
        if not all(v.__class__ is str or v.__class__ is int for _, v in memo_key):
            return offset_key(self.connector, partition)
        key = self._memo.get(memo_key)
        if key is None:
            if len(self._memo) >= self.MEMO_MAX:
                self._memo.clear()
            key = self._memo[memo_key] = offset_key(self.connector, partition)
        return key


def parse_offset_key(key: str) -> tuple[str, JsonDict]:
    connector, partition = json.loads(key)
    if not isinstance(connector, str) or not isinstance(partition, dict):
        raise ValueError(f"not an offset key: {key!r}")
    return connector, partition


@dataclass(slots=True)
class SubmittedRecord:
    """A record, or a run of ``count`` consecutive records acknowledged together; ``offset``
    is the (last) record's."""

    partition_key: str
    offset: JsonDict
    count: int = 1
    acked: bool = False


@dataclass
class SubmittedRecords:
    """The records of one task submitted but not yet covered by a committed offset."""

    _by_partition: dict[str, deque[SubmittedRecord]] = field(default_factory=dict)
    outstanding: int = 0  # submitted, not yet acknowledged

    def submit(self, partition_key: str, offset: JsonDict, count: int = 1) -> SubmittedRecord:
        """``count`` consecutive records of the partition, acknowledged together, the last at
        ``offset``."""
        if count < 1:
            raise ValueError(f"a submission is of at least one record, not {count}")
        record = SubmittedRecord(partition_key, offset, count)
        self._by_partition.setdefault(partition_key, deque()).append(record)
        self.outstanding += count
        return record

    def ack(self, record: SubmittedRecord) -> None:
        assert not record.acked, "a record is acknowledged once"
        record.acked = True
        self.outstanding -= record.count

    def committable(self) -> dict[str, JsonDict]:
        """Per source partition, the offset of the last record of its acknowledged prefix
        (only partitions that moved); those records are forgotten."""
        result: dict[str, JsonDict] = {}
        for key, queue in list(self._by_partition.items()):
            while queue and queue[0].acked:
                result[key] = queue.popleft().offset
            if not queue:
                del self._by_partition[key]
        return result

    def pending(self) -> int:
        """Records kept (acknowledged or not) that no committed offset covers yet."""
        return sum(r.count for q in self._by_partition.values() for r in q)
