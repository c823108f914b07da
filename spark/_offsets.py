"""Offsets, offset specs and offset ranges: pure functions over plain data, no IO.

The JSON forms are those of Spark's Kafka connector: an offset spec is ``"earliest"``,
``"latest"`` or ``{"topic": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest); ``assign`` is
``{"topic": [0, 1]}``; a streaming offset (what the checkpoint holds) is
``{"topic": {"0": 23, "1": 7}}``, each number the offset of the next record to read.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from dataplane.client import TopicPartition
from spark.errors import DataLossError, OptionError, UnknownTopicError

log = logging.getLogger(__name__)

EARLIEST = -2
LATEST = -1
MAX_SPLITS_PER_RANGE = 10_000  # minPartitions never cuts one range into more pieces

Offsets = dict[TopicPartition, int]
OffsetSpec = Literal["earliest", "latest"] | Mapping[TopicPartition, int]
OffsetsJson = dict[str, dict[str, int]]


@dataclass(frozen=True, order=True)
class OffsetRange:
    """The records of one topic-partition in ``[from_offset, until_offset)``."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int

    def __post_init__(self) -> None:
        if not 0 <= self.from_offset <= self.until_offset:
            raise ValueError(f"bad offset range {self}: need 0 <= from_offset <= until_offset")

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def size(self) -> int:
        return self.until_offset - self.from_offset


def _load_json(name: str, text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise OptionError(f"option {name!r} is not valid JSON ({error}): {text!r}") from error


def parse_offset_spec(name: str, text: str) -> OffsetSpec:
    """``earliest``, ``latest`` or per-partition JSON; raises OptionError with the option's name."""
    stripped = text.strip()
    if stripped.lower() in ("earliest", "latest"):
        return "earliest" if stripped.lower() == "earliest" else "latest"
    loaded = _load_json(name, stripped)
    shape = f'option {name!r} must be earliest, latest or JSON like {{"topic": {{"0": 23}}}}'
    if not isinstance(loaded, dict):
        raise OptionError(f"{shape}, got {text!r}")
    spec: dict[TopicPartition, int] = {}
    for topic, partitions in loaded.items():
        if not isinstance(partitions, dict):
            raise OptionError(f"{shape}; {topic!r} maps to {partitions!r}")
        for partition, offset in partitions.items():
            if not str(partition).isdigit() or type(offset) is not int or offset < EARLIEST:
                raise OptionError(f"{shape}; bad entry {topic!r}: {{{partition!r}: {offset!r}}}")
            spec[TopicPartition(topic, int(partition))] = offset
    return spec


def parse_assign(text: str) -> list[TopicPartition]:
    """``{"topic": [0, 1]}`` as sorted topic-partitions."""
    loaded = _load_json("assign", text)
    shape = "option 'assign' must be JSON like {\"topic\": [0, 1]}"
    if not isinstance(loaded, dict) or not loaded:
        raise OptionError(f"{shape}, got {text!r}")
    result: set[TopicPartition] = set()
    for topic, partitions in loaded.items():
        if not isinstance(partitions, list) or not all(
            type(p) is int and p >= 0 for p in partitions
        ):
            raise OptionError(f"{shape}; {topic!r} maps to {partitions!r}")
        result.update(TopicPartition(topic, p) for p in partitions)
    return sorted(result)


def offsets_to_json(offsets: Mapping[TopicPartition, int]) -> OffsetsJson:
    result: OffsetsJson = {}
    for tp in sorted(offsets):
        result.setdefault(tp.topic, {})[str(tp.partition)] = offsets[tp]
    return result


def offsets_from_json(loaded: Mapping[str, Mapping[str, int]]) -> Offsets:
    return {
        TopicPartition(topic, int(partition)): int(offset)
        for topic, partitions in loaded.items()
        for partition, offset in partitions.items()
    }


def resolve_spec(
    name: str,
    spec: OffsetSpec,
    partitions: Iterable[TopicPartition],
    beginning: Mapping[TopicPartition, int],
    end: Mapping[TopicPartition, int],
    default: int,
) -> Offsets:
    """Concrete offsets of ``partitions``: -2 is the log start offset, -1 the high watermark,
    a partition missing from a JSON spec takes ``default`` (EARLIEST or LATEST)."""
    wanted = sorted(partitions)
    if isinstance(spec, str):
        return {tp: (beginning if spec == "earliest" else end)[tp] for tp in wanted}
    unknown = sorted(set(spec) - set(wanted))
    if unknown:
        names = ", ".join(f"{tp.topic}-{tp.partition}" for tp in unknown)
        raise UnknownTopicError(
            f"option {name!r} names partitions not read or not existing: {names}"
        )
    resolved: Offsets = {}
    for tp in wanted:
        offset = spec.get(tp, default)
        resolved[tp] = (
            beginning[tp] if offset == EARLIEST else end[tp] if offset == LATEST else offset
        )
    return resolved


def offset_ranges(
    start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int]
) -> list[OffsetRange]:
    """One range per partition of ``end`` with records to read; a partition missing from
    ``start`` (new since ``start`` was taken) is read from offset 0."""
    ranges = []
    for tp in sorted(end):
        from_offset = start.get(tp, 0)
        if end[tp] < from_offset:
            raise OptionError(
                f"{tp.topic}-{tp.partition}: start offset {from_offset} is after end offset "
                f"{end[tp]} (check startingOffsets/endingOffsets)"
            )
        if end[tp] > from_offset:
            ranges.append(OffsetRange(tp.topic, tp.partition, from_offset, end[tp]))
    return ranges


def stream_offset_ranges(
    start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int], fail_on_data_loss: bool
) -> list[OffsetRange]:
    """A micro-batch's ranges. A batch's end is logged before it runs; if the query died in
    its first batch, Spark asks the source for its initial offsets again when it restarts, and
    with ``startingOffsets`` earliest those are the log start *now*: when retention deleted
    what the logged batch was to read, the start is past the end. Those records are lost, as
    Kafka's source reports it (``reportDataLoss``): DataLossError, or with
    ``failOnDataLoss=false`` a warning and nothing read from that partition."""
    passed = sorted(tp for tp in end if end[tp] < start.get(tp, 0))
    if not passed:
        return offset_ranges(start, end)
    lost = ", ".join(f"{tp.topic}-{tp.partition} [.., {end[tp]})" for tp in passed)
    message = (
        f"the batch's offsets were deleted (retention) before they were read: {lost}; the "
        f"logs now start past them"
    )
    if fail_on_data_loss:
        raise DataLossError(
            message + ". Some data may have been lost. Set failOnDataLoss=false to skip "
            "deleted records with a warning instead."
        )
    log.warning("%s; skipping them (failOnDataLoss=false)", message)
    return offset_ranges(start, {tp: max(o, start.get(tp, 0)) for tp, o in end.items()})


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Kafka's rule for ``minPartitions``: when there are fewer ranges than it, cut each range
    into pieces in proportion to its share of all records (at least one piece each)."""
    total = sum(r.size for r in ranges)
    if min_partitions is None or len(ranges) >= min_partitions or total == 0:
        return ranges
    result: list[OffsetRange] = []
    for r in ranges:
        pieces = min(max(1, round(r.size / total * min_partitions)), r.size, MAX_SPLITS_PER_RANGE)
        bounds = [r.from_offset + (r.size * n) // pieces for n in range(pieces + 1)]
        result += [
            OffsetRange(r.topic, r.partition, lo, hi) for lo, hi in itertools.pairwise(bounds)
        ]
    return result


def rate_limit(
    start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int], max_records: int
) -> Offsets:
    """End offsets advancing at most ``max_records`` in total past ``start``, shared between
    partitions in proportion to what each has available (largest remainder, so the whole
    budget is used and a small budget still makes progress)."""
    if max_records < 1:
        raise ValueError(f"max_records must be >= 1, got {max_records}")
    available = {tp: max(0, latest[tp] - start.get(tp, 0)) for tp in latest}
    total = sum(available.values())
    if total <= max_records:
        return dict(latest)
    shares = {tp: size * max_records / total for tp, size in available.items()}
    granted = {tp: math.floor(share) for tp, share in shares.items()}
    left = max_records - sum(granted.values())
    by_remainder = sorted(shares, key=lambda tp: (granted[tp] - shares[tp], tp))
    for tp in by_remainder[:left]:
        granted[tp] += 1
    return {tp: start.get(tp, 0) + granted[tp] for tp in latest}


def cap_offsets(
    offsets: Mapping[TopicPartition, int], cap: Mapping[TopicPartition, int]
) -> Offsets:
    """Each offset, lowered to ``cap``'s where ``cap`` has the partition."""
    return {tp: min(offset, cap.get(tp, offset)) for tp, offset in offsets.items()}
