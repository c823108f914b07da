"""Replication throttles: the quota a broker's leader side and follower side each keep (Kafka's
ReplicationQuotaManager, KIP-73).

A replica is throttled when the topic's ``leader.replication.throttled.replicas`` (on the
leader) or ``follower.replication.throttled.replicas`` (on the follower) names it, and it is not
in the ISR: a caught-up follower is never slowed, so acks=all produce is not. While the side's
quota is exceeded, the leader answers a throttled replica's fetch with no records and the
follower leaves its throttled partitions out of its fetch requests; the bytes they do move are
recorded against the quota. The rates are the broker configs ``leader.replication.throttled.rate``
and ``follower.replication.throttled.rate`` (bytes/s; Kafka's default, 2^63-1, is unthrottled).

The measure: ``QuotaBucket`` is a token bucket (Kafka's own ``TokenBucket`` of KIP-599), pure, on
an injected clock: it fills at the rate up to ``burst_ms`` of it, each byte moved spends one
token, and the quota is exceeded while the bucket is in debt. A read is allowed whole once the
bucket is not in debt (its size is known only after it), so over any span T the bytes moved are
at most one burst + rate x T + one read per reader. (Kafka's ReplicationQuotaManager measures a
sampled rate over 11 windows of a second and so lets a throttled replica take ten seconds of its
rate at once before holding it back; the bucket holds the rate from the first second.)
``ReplicationQuota`` is the shell: the bucket under a lock, on the broker's clock, shared by the
threads of one side.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

UNTHROTTLED_BYTES_PER_S = 2**63 - 1  # Kafka's Long.MAX_VALUE: no quota
BURST_MS = 1000
DELAY_MS_MAX = 1000  # a reader held back looks again at least this often (a rate may change)


@dataclass
class QuotaBucket:
    """Counted in byte-milliseconds (bytes x 1000), so the arithmetic is exact integers."""

    rate_bytes_per_s: int
    now_ms: int  # when the credit was last brought up to date
    burst_ms: int = BURST_MS
    credit: int = field(init=False)  # byte-ms that may move now; negative: in debt

    def __post_init__(self) -> None:
        if self.rate_bytes_per_s < 0 or self.burst_ms <= 0:
            raise ValueError(f"a quota needs a rate >= 0 and a burst > 0: {self}")
        self.credit = self._capacity

    @property
    def unthrottled(self) -> bool:
        return self.rate_bytes_per_s >= UNTHROTTLED_BYTES_PER_S

    @property
    def _capacity(self) -> int:
        return self.rate_bytes_per_s * self.burst_ms

    @property
    def capacity(self) -> float:
        """The burst, in bytes."""
        return self._capacity / 1000

    @property
    def tokens(self) -> float:
        """Bytes that may move now; negative: the debt."""
        return self.credit / 1000

    def _refill(self, now_ms: int) -> None:
        elapsed_ms = now_ms - self.now_ms
        if elapsed_ms > 0:  # a clock that steps back adds nothing
            self.credit = min(self._capacity, self.credit + self.rate_bytes_per_s * elapsed_ms)
            self.now_ms = now_ms

    def exceeded(self, now_ms: int) -> bool:
        """True while the bucket is in debt: throttled replicas must wait."""
        if self.unthrottled:
            return False
        self._refill(now_ms)
        return self.credit < 0

    def record(self, size_bytes: int, now_ms: int) -> None:
        """``size_bytes`` of throttled replicas moved at ``now_ms``."""
        if size_bytes < 0:
            raise ValueError(f"a recorded size is >= 0, not {size_bytes}")
        self._refill(now_ms)
        if not self.unthrottled:
            self.credit -= size_bytes * 1000

    def delay_ms(self, now_ms: int) -> int:
        """How long until the bucket is out of debt (0: it is), at most ``DELAY_MS_MAX``."""
        if not self.exceeded(now_ms):
            return 0
        if self.rate_bytes_per_s == 0:
            return DELAY_MS_MAX
        return min(DELAY_MS_MAX, -(self.credit // self.rate_bytes_per_s))  # ceil(debt / rate)

    def set_rate(self, rate_bytes_per_s: int, now_ms: int) -> None:
        """A new rate from now on; the debt stays, the credit is cut to the new burst."""
        if rate_bytes_per_s < 0:
            raise ValueError(f"a rate is >= 0, not {rate_bytes_per_s}")
        self._refill(now_ms)
        self.now_ms = max(self.now_ms, now_ms)
        self.rate_bytes_per_s = rate_bytes_per_s
        self.credit = min(self.credit, self._capacity)


@dataclass(frozen=True)
class QuotaGauge:
    """A side's quota as the metrics show it."""

    side: str  # "leader" or "follower"
    rate_bytes_per_s: int
    throttled_bytes: int  # bytes of throttled replicas recorded against the quota
    held_back: int  # times a throttled replica was held back (answered empty, or left out)


class ReplicationQuota:
    """One side's quota on one broker, shared by that side's threads (the fetch handlers of a
    leader, the fetcher threads of a follower)."""

    def __init__(self, side: str, clock_ms: Callable[[], int]) -> None:
        self.side = side
        self.clock_ms = clock_ms
        self._lock = threading.Lock()
        self._bucket = QuotaBucket(UNTHROTTLED_BYTES_PER_S, clock_ms())
        self._throttled_bytes = 0
        self._held_back = 0

    @property
    def rate_bytes_per_s(self) -> int:
        return self._bucket.rate_bytes_per_s

    def set_rate(self, rate_bytes_per_s: int) -> bool:
        """True if the rate changed."""
        with self._lock:
            if rate_bytes_per_s == self._bucket.rate_bytes_per_s:
                return False
            self._bucket.set_rate(rate_bytes_per_s, self.clock_ms())
            return True

    def exceeded(self) -> bool:
        """Hold back the throttled replicas now? (Counted as held back when True.)"""
        if self._bucket.unthrottled:  # the common case: no lock on every fetch
            return False
        with self._lock:
            exceeded = self._bucket.exceeded(self.clock_ms())
            self._held_back += exceeded
            return exceeded

    def record(self, size_bytes: int) -> None:
        with self._lock:
            self._bucket.record(size_bytes, self.clock_ms())
            self._throttled_bytes += size_bytes

    def delay_ms(self) -> int:
        with self._lock:
            return self._bucket.delay_ms(self.clock_ms())

    def gauge(self) -> QuotaGauge:
        with self._lock:
            return QuotaGauge(
                self.side, self._bucket.rate_bytes_per_s, self._throttled_bytes, self._held_back
            )
