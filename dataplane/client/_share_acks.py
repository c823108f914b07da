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

    # -- what the consumer hands out --------------------------------------------------------------
    def delivered(self, address: str, tp: TopicPartition, offsets: Iterable[int]) -> None:
        """``poll`` returns the records at ``offsets`` of ``tp`` fetched from ``address``."""
        pending = self._delivered.setdefault((address, tp), {})
        for offset in offsets:
            pending[offset] = None

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
        for (_, source_tp), pending in self._delivered.items():
            if source_tp == tp and offset in pending:
                if pending[offset] is not None:
                    raise IllegalStateError(f"{tp.topic}-{tp.partition}@{offset} is acknowledged")
                pending[offset] = kind
                return
        raise IllegalStateError(
            f"{tp.topic}-{tp.partition}@{offset} was not returned by the last poll"
        )

    def unacknowledged(self) -> int:
        return sum(1 for p in self._delivered.values() for t in p.values() if t is None)

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
        self._delivered.clear()

    def before_commit(self) -> None:
        """A commit: implicit mode accepts the last poll's records; explicit mode sends those
        acknowledged so far (the others stay the application's to acknowledge)."""
        self._settle(accept=not self.explicit)

    def _settle(self, accept: bool) -> None:
        for source, pending in self._delivered.items():
            ready = self._ready.setdefault(source, {})
            for offset, kind in list(pending.items()):
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
        return self.take(address)
