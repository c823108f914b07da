"""A share consumer's acknowledgement bookkeeping (KIP-932): pure, no IO.

Each record a share consumer's ``poll`` returns was *acquired* for it by the partition's leader,
under a lock; the consumer owes the leader one acknowledgement per record: ACCEPT (processed),
RELEASE (give it to someone else) or REJECT (never deliver it again). Offsets the leader
acquired that hold no record (a compacted gap, a control batch inside an acquired range) are
acknowledged as GAP without the application seeing them.

Kafka's two acknowledgement modes (``share.acknowledgement.mode``):

- **implicit** (the default): the next ``poll`` (or ``commit_sync`` / ``commit_async``, or
  ``close``) accepts every record the previous ``poll`` returned; ``acknowledge`` is refused.
- **explicit**: the application calls ``acknowledge(record, type)`` for each record; a ``poll``
  while a record of the previous one is still unacknowledged is an error (Kafka's
  IllegalStateException); ``commit_*`` sends what was acknowledged so far.

What is acknowledged is *ready*: sent on the next request to the leader the records came from
(piggybacked on its ShareFetch, or a ShareAcknowledge from ``commit_*`` / ``close``), as runs of
consecutive offsets of one type.

**RENEW** (KIP-1222, Kafka 4.2's ``AcknowledgeType.RENEW``; explicit mode): the application is
still working on a record and asks the leader to restart its lock. The renewal is sent like any
acknowledgement, and the record stays owed: it counts as acknowledged for the next ``poll``'s
check, and stays the application's to acknowledge (ACCEPT, RELEASE, REJECT or RENEW again)
across later polls. Kafka's Java consumer instead hands a renewed record back from a later
``poll``; here the application keeps the record it has, and acknowledges it when done.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from dataplane.client._types import TopicPartition

GAP = 0  # an acquired offset with no record (acknowledged by the client itself)


class AcknowledgeType(enum.IntEnum):
    """Kafka's ``AcknowledgeType`` (its wire ids)."""

    ACCEPT = 1
    RELEASE = 2
    REJECT = 3
    RENEW = 4  # KIP-1222: restart the record's lock (explicit mode; the record stays owed)


class IllegalStateError(RuntimeError):
    """Kafka's IllegalStateException: an acknowledgement the consumer's state does not allow."""


@dataclass(frozen=True)
class AckRun:
    """Consecutive offsets ``first_offset..last_offset`` acknowledged with one type."""

    first_offset: int
    last_offset: int
    type: int


def runs(acks: dict[int, int]) -> list[AckRun]:
    """Offset -> type as runs of consecutive offsets of one type, in offset order."""
    out: list[AckRun] = []
    for offset in sorted(acks):
        kind = acks[offset]
        last = out[-1] if out else None
        if last is not None and last.last_offset == offset - 1 and last.type == kind:
            out[-1] = AckRun(last.first_offset, offset, kind)
        else:
            out.append(AckRun(offset, offset, kind))
    return out


Source = tuple[str, TopicPartition]  # (the leader's address the records came from, partition)


class Acknowledgements:
    """The records of the last ``poll`` and the acknowledgements not sent yet."""

    def __init__(self, explicit: bool) -> None:
        self.explicit = explicit
        # the last poll's records: source -> offset -> type (None: not acknowledged yet)
        self._delivered: dict[Source, dict[int, int | None]] = {}
        self._ready: dict[Source, dict[int, int]] = {}  # acknowledged, to be sent
        # renewed records still owed a final acknowledgement (kept across polls)
        self._renewed: dict[Source, set[int]] = {}

    # -- what the consumer hands out --------------------------------------------------------------
    def delivered(self, address: str, tp: TopicPartition, offsets: Iterable[int]) -> None:
        """``poll`` returns the records at ``offsets`` of ``tp`` fetched from ``address``."""
        pending = self._delivered.setdefault((address, tp), {})
        renewed = self._renewed.get((address, tp), set())
        for offset in offsets:
            pending[offset] = None
            renewed.discard(offset)  # delivered anew (its lock passed): a fresh acquisition

    def gaps(self, address: str, tp: TopicPartition, offsets: Iterable[int]) -> None:
        """Acquired offsets with no record: acknowledged as GAP at once."""
        ready = self._ready.setdefault((address, tp), {})
        for offset in offsets:
            ready[offset] = GAP

    # -- the application ----------------------------------------------------------------------
    def acknowledge(self, tp: TopicPartition, offset: int, kind: AcknowledgeType) -> None:
        """Explicit mode: the record at ``offset`` of ``tp`` (returned by the last poll) is
        acknowledged ``kind``."""
        if not self.explicit:
            raise IllegalStateError(
                "acknowledge() needs acknowledgement_mode='explicit' (implicit mode accepts "
                "every record on the next poll or commit)"
            )
        kind = AcknowledgeType(kind)
        for source, pending in self._delivered.items():
            if source[1] == tp and offset in pending:
                if pending[offset] is not None:
                    raise IllegalStateError(f"{tp.topic}-{tp.partition}@{offset} is acknowledged")
                renewed = self._renewed.setdefault(source, set())
                if kind is AcknowledgeType.RENEW:  # sent now, the record stays owed
                    self._ready.setdefault(source, {})[offset] = int(kind)
                    renewed.add(offset)
                    return
                renewed.discard(offset)
                pending[offset] = kind
                return
        raise IllegalStateError(
            f"{tp.topic}-{tp.partition}@{offset} was not returned by the last poll"
        )

    def unacknowledged(self) -> int:
        """The last poll's records not acknowledged (a renewed one counts as acknowledged)."""
        return sum(
            1
            for source, p in self._delivered.items()
            for offset, t in p.items()
            if t is None and offset not in self._renewed.get(source, ())
        )

    # -- the consumer's steps -----------------------------------------------------------------
    def before_poll(self) -> None:
        """A new poll: the last one's records are settled (implicit: accepted; explicit: each
        must be acknowledged already) and ready to send."""
        if self.explicit and self.unacknowledged():
            raise IllegalStateError(
                f"{self.unacknowledged()} records of the last poll are not acknowledged "
                "(explicit mode: acknowledge each before the next poll)"
            )
        self._settle(accept=True)
        kept: dict[Source, dict[int, int | None]] = {  # renewed ones stay the app's to settle
            source: dict.fromkeys(o for o in self._renewed.get(source, ()) if o in pending)
            for source, pending in self._delivered.items()
        }
        self._delivered = {source: owed for source, owed in kept.items() if owed}

    def before_commit(self) -> None:
        """A commit: implicit mode accepts the last poll's records; explicit mode sends those
        acknowledged so far (the others stay the application's to acknowledge)."""
        self._settle(accept=not self.explicit)

    def _settle(self, accept: bool) -> None:
        for source, pending in self._delivered.items():
            ready = self._ready.setdefault(source, {})
            renewed = self._renewed.get(source, set())
            for offset, kind in list(pending.items()):
                if kind is None and offset in renewed:
                    continue  # renewed: still owed, never accepted on the application's behalf
                settled = AcknowledgeType.ACCEPT if kind is None and accept else kind
                if settled is not None:
                    ready[offset] = int(settled)
                    del pending[offset]

    def addresses(self) -> set[str]:
        """The leaders some ready acknowledgement goes to."""
        return {address for (address, _), ready in self._ready.items() if ready}

    def ready_partitions(self, address: str) -> set[TopicPartition]:
        """The partitions with acknowledgements ready for ``address``."""
        return {tp for (source, tp), ready in self._ready.items() if source == address and ready}

    def take(
        self, address: str, partitions: set[TopicPartition] | None = None
    ) -> dict[TopicPartition, list[AckRun]]:
        """The ready acknowledgements for ``address`` (only of ``partitions`` when given),
        removed: the caller sends them."""
        out: dict[TopicPartition, list[AckRun]] = {}
        for (source, tp), ready in list(self._ready.items()):
            if source == address and (partitions is None or tp in partitions):
                if ready:
                    out[tp] = runs(ready)
                del self._ready[(source, tp)]
        return out

    def forget(self, address: str) -> dict[TopicPartition, list[AckRun]]:
        """The leader's share session is gone: what was owed to it cannot be sent (the broker
        released those records); the last poll's records from it are forgotten too."""
        for source in [s for s in self._delivered if s[0] == address]:
            del self._delivered[source]
            self._renewed.pop(source, None)
        return self.take(address)
