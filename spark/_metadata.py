"""The driver's view of the cluster: which topic-partitions a subscription names and their
offsets (log start offset, high watermark, offsets by time). IO lives here; the decisions it
feeds are in ``_offsets``."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from dataplane.client import AdminClient, Closing, Consumer, TopicPartition
from metadata_quorum.security.channels import ClientSecurity
from raftlog.errors import ErrorCode, KafkaError
from spark._offsets import Offsets
from spark._options import IsolationLevel, Subscription
from spark.errors import UnknownTopicError

REQUEST_TIMEOUT_MS = 30_000


class ClusterMetadata(Closing):
    """Topic-partitions and offsets, from a lazily made AdminClient and Consumer."""

    def __init__(
        self,
        bootstrap_servers: Sequence[str],
        isolation_level: IsolationLevel = "read_uncommitted",
        security: ClientSecurity | None = None,
    ) -> None:
        self._servers = list(bootstrap_servers)
        self._security = security
        self._isolation_level: IsolationLevel = isolation_level  # read_committed: ends are LSOs
        self._admin: AdminClient | None = None
        self._consumer: Consumer | None = None

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(
                self._servers, request_timeout_ms=REQUEST_TIMEOUT_MS, security=self._security
            )
        return self._admin

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(
                self._servers,
                auto_offset_reset="none",
                request_timeout_ms=REQUEST_TIMEOUT_MS,
                isolation_level=self._isolation_level,
                security=self._security,
            )
        return self._consumer

    def _describe(self, topics: Iterable[str], option: str) -> dict[str, list[int]]:
        names = sorted(set(topics))
        if not names:
            return {}
        try:
            described = self.admin.describe_topics(names)
        except KafkaError as error:
            if error.error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                raise UnknownTopicError(
                    f"option {option!r}: {error.message or error.error.name}; known topics: "
                    f"{', '.join(self.admin.list_topics()) or 'none'}"
                ) from error
            raise
        missing = [n for n in names if n not in described]
        if missing:
            raise UnknownTopicError(f"option {option!r}: no topic named {', '.join(missing)}")
        return {name: [p.partition for p in t.partitions] for name, t in described.items()}

    def partitions(self, subscription: Subscription) -> list[TopicPartition]:
        """The topic-partitions to read, sorted; UnknownTopicError for a named topic (or
        assigned partition) that does not exist. A pattern may match nothing."""
        if subscription.topics:
            described = self._describe(subscription.topics, "subscribe")
        elif subscription.pattern is not None:
            pattern = re.compile(subscription.pattern)
            matching = [t for t in self.admin.list_topics() if pattern.fullmatch(t)]
            described = self._describe(matching, "subscribePattern")
        else:
            described = self._describe({tp.topic for tp in subscription.assigned}, "assign")
            missing = [
                tp for tp in subscription.assigned if tp.partition not in described[tp.topic]
            ]
            if missing:
                names = ", ".join(f"{tp.topic}-{tp.partition}" for tp in missing)
                raise UnknownTopicError(f"option 'assign': no partition {names}")
            return sorted(subscription.assigned)
        return sorted(TopicPartition(t, p) for t, ps in described.items() for p in ps)

    def beginning(self, tps: Sequence[TopicPartition]) -> Offsets:
        return dict(self.consumer.beginning_offsets(tps)) if tps else {}

    def end(self, tps: Sequence[TopicPartition]) -> Offsets:
        return dict(self.consumer.end_offsets(tps)) if tps else {}

    def for_timestamp(self, tps: Sequence[TopicPartition], timestamp_ms: int) -> Offsets:
        """Per partition, the first offset whose timestamp is at or after ``timestamp_ms``;
        the high watermark where there is none (nothing that recent yet)."""
        if not tps:
            return {}
        found = self.consumer.offsets_for_times({tp: timestamp_ms for tp in tps})
        end = self.end([tp for tp in tps if found.get(tp) is None])
        result: Offsets = {}
        for tp in tps:
            hit = found.get(tp)
            result[tp] = end[tp] if hit is None else hit[0]
        return result

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._admin is not None:
            self._admin.close()
            self._admin = None
