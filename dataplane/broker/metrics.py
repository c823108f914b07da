"""Prometheus metrics of a node, served over HTTP (or HTTPS) on its METRICS listener.

Each node owns its registry (no process-global one): counters and histograms are updated on the
request paths; per-partition gauges (high watermark, log end offset, under-replicated) and the
controller's state are read at scrape time from callables, so nothing is kept twice.

`MetricsServer` is prometheus_client's threaded WSGI server with TLS done per connection (the
METRICS:SSL listener, docs/security.md) and a bound on the connections served at once.
"""

from __future__ import annotations

import logging
import math
import socket
import ssl
import sys
import threading
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from dataplane.broker.replication_quota import UNTHROTTLED_BYTES_PER_S, QuotaGauge

log = logging.getLogger(__name__)
audit = logging.getLogger("raftlog.audit")

METRICS_CONNECTIONS_MAX = 64  # scrapes served at once; a connection beyond is closed at once
METRICS_TIMEOUT_S = 10.0  # a connection's TLS handshake, and each read or write after it

LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0
)  # fmt: skip


@dataclass(frozen=True)
class PartitionGauge:
    topic: str
    partition: int
    high_watermark: int
    log_end_offset: int
    log_start_offset: int


@dataclass(frozen=True)
class ControllerGauge:
    active: bool
    metadata_offset: int
    term: int
    has_quorum: bool
    tick_gap_max_s: float = 0.0


@dataclass(frozen=True)
class PartitionCounts:
    hosted: int
    leaders: int
    under_replicated: int  # led here, with an ISR smaller than the replica set


PARTITION_FAMILIES = (
    ("raftlog_partition_high_watermark", "high watermark"),
    ("raftlog_partition_log_end_offset", "log end offset"),
    ("raftlog_partition_log_start_offset", "log start offset"),
)
_PARTITION_LABELS = ["topic", "partition"]


class _PartitionCollector(Collector):
    """The per-partition series: three for each replica hosted, the most of a scrape (at 10,000
    partitions 30,000 series, ~0.5 s of this process's CPU). A scrape restricted by name
    (``/metrics?name[]=...``) to other series does not build them: ``describe`` names them."""

    def __init__(self, partitions: Callable[[], list[PartitionGauge]]) -> None:
        self.partitions = partitions

    def describe(self) -> Iterator[Any]:
        for name, documentation in PARTITION_FAMILIES:
            yield GaugeMetricFamily(name, documentation, labels=_PARTITION_LABELS)

    def collect(self) -> Iterator[Any]:
        hw, leo, start = self.describe()
        for p in self.partitions():
            values = [p.topic, str(p.partition)]
            hw.add_metric(values, p.high_watermark)
            leo.add_metric(values, p.log_end_offset)
            start.add_metric(values, p.log_start_offset)
        yield from (hw, leo, start)


class _StateCollector(Collector):
    """The broker's partition counts and the controller's state: a few series, whatever the
    partition count (``describe`` names them, so a restricted scrape builds only these)."""

    def __init__(
        self,
        counts: Callable[[], PartitionCounts],
        controller: Callable[[], ControllerGauge | None],
    ) -> None:
        self.counts = counts
        self.controller = controller

    def describe(self) -> Iterator[Any]:
        yield from self._families(PartitionCounts(0, 0, 0), ControllerGauge(False, 0, 0, False))

    def collect(self) -> Iterator[Any]:
        yield from self._families(self.counts(), self.controller())

    def _families(self, counts: PartitionCounts, state: ControllerGauge | None) -> Iterator[Any]:
        yield _gauge(
            "raftlog_under_replicated_partitions",
            "partitions led here whose ISR is smaller than the replica set",
            counts.under_replicated,
        )
        yield _gauge("raftlog_leader_partitions", "partitions led by this broker", counts.leaders)
        yield _gauge(
            "raftlog_partitions", "partition replicas hosted by this broker", counts.hosted
        )
        if state is not None:
            yield _gauge("raftlog_controller_active", "1 on the active controller", state.active)
            yield _gauge(
                "raftlog_controller_metadata_offset", "last applied metadata offset",
                state.metadata_offset,
            )  # fmt: skip
            yield _gauge("raftlog_controller_raft_term", "current Raft term", state.term)
            yield _gauge(
                "raftlog_controller_has_quorum", "1 if a quorum is reachable", state.has_quorum
            )
            yield _gauge(
                "raftlog_controller_raft_tick_gap_max_seconds",
                "longest time between two Raft ticks in the last 10 s window",
                state.tick_gap_max_s,
            )


class _QuotaCollector(Collector):
    def __init__(self, quotas: Callable[[], list[QuotaGauge]]) -> None:
        self.quotas = quotas

    def collect(self) -> Iterator[Any]:
        labels = ["side"]
        rate = GaugeMetricFamily(
            "raftlog_replication_throttled_rate_bytes",
            "leader/follower.replication.throttled.rate in bytes/s (+Inf: unthrottled)",
            labels=labels,
        )
        moved = CounterMetricFamily(
            "raftlog_replication_throttled_bytes",
            "bytes of throttled replicas recorded against the replication quota",
            labels=labels,
        )
        held = CounterMetricFamily(
            "raftlog_replication_throttled_held_back",
            "times the replication quota held throttled replicas back",
            labels=labels,
        )
        for quota in self.quotas():
            unthrottled = quota.rate_bytes_per_s >= UNTHROTTLED_BYTES_PER_S
            rate.add_metric([quota.side], math.inf if unthrottled else quota.rate_bytes_per_s)
            moved.add_metric([quota.side], quota.throttled_bytes)
            held.add_metric([quota.side], quota.held_back)
        yield from (rate, moved, held)


@dataclass(frozen=True)
class FetchSessionGauge:
    sessions: int
    partitions: int
    evictions: int


class _FetchSessionCollector(Collector):
    def __init__(self, state: Callable[[], FetchSessionGauge], prefix: str) -> None:
        self._state = state
        self._prefix = prefix

    def collect(self) -> Iterator[Any]:
        state, prefix = self._state(), self._prefix
        yield _gauge(f"{prefix}_fetch_sessions", "fetch sessions cached", state.sessions)
        yield _gauge(
            f"{prefix}_fetch_session_partitions", "partitions of the cached fetch sessions",
            state.partitions,
        )  # fmt: skip
        yield CounterMetricFamily(
            f"{prefix}_fetch_session_evictions", "fetch sessions evicted for new ones",
            value=state.evictions,
        )  # fmt: skip


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=float(value))


class NodeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.bytes_in = Counter(
            "raftlog_bytes_in", "record bytes appended by producers", ["topic"],
            registry=self.registry,
        )  # fmt: skip
        self.bytes_out = Counter(
            "raftlog_bytes_out", "record bytes returned to consumers and followers", ["topic"],
            registry=self.registry,
        )  # fmt: skip
        self.messages_in = Counter(
            "raftlog_messages_in", "records appended by producers", ["topic"],
            registry=self.registry,
        )  # fmt: skip
        self.request_latency = Histogram(
            "raftlog_request_latency_seconds", "time to answer a request", ["request"],
            buckets=LATENCY_BUCKETS_S, registry=self.registry,
        )  # fmt: skip
        self.request_errors = Counter(
            "raftlog_request_errors", "partition-level errors answered", ["request", "error"],
            registry=self.registry,
        )  # fmt: skip
        self.isr_shrinks = Counter(
            "raftlog_isr_shrinks", "ISR shrinks proposed by this leader", registry=self.registry
        )
        self.isr_expands = Counter(
            "raftlog_isr_expands", "ISR expansions proposed by this leader", registry=self.registry
        )
        self.page_cache_released = Counter(
            "raftlog_page_cache_released_bytes",
            "log bytes advised out of the page cache behind log.cache.tail.bytes",
            registry=self.registry,
        )

        self.metadata_load_errors = Counter(
            "raftlog_metadata_load_errors",
            "metadata updates this broker could not read into an image (Kafka's "
            "metadata-load-error-count)",
            registry=self.registry,
        )
        self.metadata_apply_errors = Counter(
            "raftlog_metadata_apply_errors",
            "faults of a publisher applying a metadata image: replicas, coordinators (Kafka's "
            "metadata-apply-error-count)",
            registry=self.registry,
        )
        self.gc_pauses = Histogram(
            "raftlog_gc_pause_seconds",
            "CPython garbage collections by generation: how long each held every thread",
            ["generation"], buckets=LATENCY_BUCKETS_S, registry=self.registry,
        )  # fmt: skip
        self.follower_bytes_out = Counter(
            "raftlog_follower_bytes_out",
            "record bytes returned to consumers by this broker as a follower (KIP-392)",
            ["topic"], registry=self.registry,
        )  # fmt: skip
        self.replica_fetches = Counter(
            "raftlog_replica_fetch_requests",
            "followers' fetches this leader served, by fetch session context (KIP-227): full, "
            "incremental, sessionless, error",
            ["context"], registry=self.registry,
        )  # fmt: skip
        self.kafka_fetches = Counter(
            "raftlog_kafka_fetch_requests",
            "Kafka listener fetches by fetch session context (KIP-227): full, incremental, "
            "sessionless, error",
            ["context"], registry=self.registry,
        )  # fmt: skip

    def forget_topics(self, hosted: Collection[str]) -> list[str]:
        """Remove the per-topic series of every topic no longer in `hosted` (the topics this
        broker hosts a partition of); returns the topics removed. Kafka's ReplicaManager does
        the same (``maybeRemoveTopicMetrics``) when it stops a topic's last partition here:
        without it every topic that ever carried traffic keeps its series for the life of the
        process, a few hundred bytes each, and a workload that churns topics grows them."""
        gone: set[str] = set()
        for counter in (self.bytes_in, self.bytes_out, self.messages_in, self.follower_bytes_out):
            topics = {
                sample.labels["topic"] for family in counter.collect() for sample in family.samples
            }
            for topic in topics.difference(hosted):
                counter.remove(topic)
                gone.add(topic)
        return sorted(gone)

    def watch_fetch_sessions(
        self, state: Callable[[], FetchSessionGauge], prefix: str = "raftlog_kafka"
    ) -> None:
        """A fetch session cache (Kafka's NumIncrementalFetchSessions,
        NumIncrementalFetchPartitionsCached, IncrementalFetchSessionEvictionsPerSec): the
        Kafka listener's (``raftlog_kafka_*``) or the followers' (``raftlog_replica_*``)."""
        self.registry.register(_FetchSessionCollector(state, prefix))

    def watch(
        self,
        partitions: Callable[[], list[PartitionGauge]],
        counts: Callable[[], PartitionCounts],
        controller: Callable[[], ControllerGauge | None],
    ) -> None:
        """The per-partition series (`partitions`), the broker's partition counts and the
        controller's state, read at scrape time."""
        self.registry.register(_PartitionCollector(partitions))
        self.registry.register(_StateCollector(counts, controller))

    def watch_replication_quotas(self, quotas: Callable[[], list[QuotaGauge]]) -> None:
        self.registry.register(_QuotaCollector(quotas))

    def serve(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> MetricsServer:
        """Serve /metrics on ``host:port`` from a daemon thread, over HTTPS with `tls` (the
        METRICS listener's server context); returns the server (``shutdown()`` stops it)."""
        server = MetricsServer((host, port), make_wsgi_app(self.registry), tls)
        threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
        return server


class _QuietHandler(WSGIRequestHandler):
    """prometheus_client's request handler: no log line per scrape; reads and writes time out."""

    timeout = METRICS_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        """A scrape every few seconds is not worth a line."""


class MetricsServer(ThreadingWSGIServer):
    """/metrics over HTTP, or over HTTPS with `tls`. The TLS handshake runs in each connection's
    own thread within METRICS_TIMEOUT_S, not in the accept loop (as ``ssl`` would do on a wrapped
    listening socket), so a client that stalls, or speaks plain HTTP to the HTTPS port, holds up
    only itself; its failure is one line on the ``raftlog.audit`` logger, as on the KAFKA
    listener. At most METRICS_CONNECTIONS_MAX connections are served at once."""

    def __init__(
        self, address: tuple[str, int], app: Callable[..., Any], tls: ssl.SSLContext | None
    ) -> None:
        family = socket.getaddrinfo(address[0], address[1], type=socket.SOCK_STREAM)[0][0]
        self.address_family = family  # read by TCPServer.__init__ (IPv4 or IPv6 listener)
        self.tls = tls
        self._slots = threading.BoundedSemaphore(METRICS_CONNECTIONS_MAX)
        super().__init__(address, _QuietHandler)
        self.set_app(app)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            log.warning("metrics: %d connections open; closing one from %s",
                        METRICS_CONNECTIONS_MAX, client_address[0])  # fmt: skip
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)  # a thread serves it
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(METRICS_TIMEOUT_S)
        secured = self.tls.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        try:
            try:
                secured.do_handshake()
            except OSError as error:  # ssl.SSLError, a timeout, a reset
                audit.warning(
                    "AUTHENTICATION_FAILED address=%s listener=METRICS mechanism=SSL user=- "
                    "reason=TLS handshake failed: %s", client_address[0], error,
                )  # fmt: skip
                return
            super().finish_request(secured, client_address)
        finally:
            secured.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that broke mid-request: one line, not socketserver's traceback."""
        error = sys.exc_info()[1]
        log.warning("metrics: connection from %s failed: %r", client_address[0], error)
