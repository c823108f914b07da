"""Click events: what the generator produces, as plain data and pure functions (no IO).

An event is ``{"user": "user-7", "page": "/cart", "ts": 1700000012345}`` (``ts``: event time,
epoch milliseconds), produced as the record's value in Avro (``CLICK_SCHEMA``, registered in
the schema registry under the topic's value subject, ``clicks-value``; the registry's wire
format: magic byte, schema id, Avro binary) with the page as its key. Events come
from a seeded generator on a synthetic clock: event ``n`` happens ``n * step_ms`` after the
start, less a random lateness below ``max_lateness_ms`` (so events arrive out of order, but
never by more than that). The generator's log has one JSON line per acknowledged event, with
the partition and offset it was stored at.
"""

from __future__ import annotations

import io
import json
import random
import struct
from dataclasses import dataclass
from typing import Any

import fastavro

PAGES = ("/", "/search", "/product", "/cart", "/checkout", "/help")
PAGE_WEIGHTS = (30, 20, 25, 12, 8, 5)
USERS = 50
FLUSH_PAGE = "__flush__"  # the event that moves the watermark past the last real window
FLUSH_USER = "flush"
CLICK_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "ClickEvent",
    "namespace": "raftlog.pipeline",
    "fields": [
        {"name": "user", "type": "string"},
        {"name": "page", "type": "string"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}
_PARSED = fastavro.parse_schema(CLICK_SCHEMA)
_HEADER = struct.Struct(">bI")  # the wire format: magic byte 0, schema id


def value_subject(topic: str) -> str:
    """The subject of ``topic``'s values (the serializers' default TopicNameStrategy)."""
    return f"{topic}-value"


@dataclass(frozen=True, slots=True)
class ClickEvent:
    user: str
    page: str
    ts: int  # event time, epoch ms

    def as_dict(self) -> dict[str, str | int]:
        return {"user": self.user, "page": self.page, "ts": self.ts}

    def to_json(self) -> bytes:
        return json.dumps(self.as_dict()).encode()

    def to_avro(self, schema_id: int) -> bytes:
        """The value in the registry's wire format, ``CLICK_SCHEMA`` registered as
        ``schema_id`` (what confluent-kafka's AvroSerializer writes)."""
        out = io.BytesIO()
        out.write(_HEADER.pack(0, schema_id))
        fastavro.schemaless_writer(out, _PARSED, self.as_dict())
        return out.getvalue()


@dataclass(frozen=True, slots=True)
class EventTime:
    """The synthetic clock: where event time starts and how it advances and jitters."""

    start_ms: int
    step_ms: int
    max_lateness_ms: int

    def __post_init__(self) -> None:
        if self.step_ms < 1 or not 0 <= self.max_lateness_ms <= self.start_ms:
            raise ValueError(f"bad event time {self}: need step_ms >= 1, 0 <= lateness <= start")


def generate(seed: int, first: int, count: int, clock: EventTime) -> list[ClickEvent]:
    """Events ``first .. first + count - 1`` of the run seeded ``seed``: the same events for
    the same arguments, however the run is cut into calls."""
    events = []
    for n in range(first, first + count):
        rng = random.Random(seed * 1_000_003 + n)
        lateness = rng.randrange(clock.max_lateness_ms + 1)
        page = rng.choices(PAGES, PAGE_WEIGHTS)[0]
        user = f"user-{rng.randrange(USERS)}"
        events.append(ClickEvent(user, page, clock.start_ms + n * clock.step_ms - lateness))
    return events


def flush_event(last_ts: int, ahead_ms: int) -> ClickEvent:
    """An event ``ahead_ms`` after ``last_ts``: once read, the watermark passes every window
    that ends by then (its own window never closes, so it is never emitted)."""
    return ClickEvent(FLUSH_USER, FLUSH_PAGE, last_ts + ahead_ms)


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    """One line of the generator's log: an acknowledged event and where it was stored."""

    event: ClickEvent
    partition: int
    offset: int

    def to_line(self) -> str:
        where = {"partition": self.partition, "offset": self.offset}
        return json.dumps({**self.event.as_dict(), **where})

    @staticmethod
    def from_line(line: str) -> LoggedEvent:
        d = json.loads(line)
        event = ClickEvent(str(d["user"]), str(d["page"]), int(d["ts"]))
        return LoggedEvent(event, int(d["partition"]), int(d["offset"]))
