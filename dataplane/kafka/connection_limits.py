"""The KAFKA listener's connection and request limits, as Kafka's SocketServer keeps them.

- ``socket.request.max.bytes``: a frame whose size prefix is larger closes its connection
  before anything is allocated for it (Kafka's NetworkReceive: InvalidReceiveException).
- ``queued.max.requests``: Kafka's RequestChannel queue between the network threads and the
  request handlers is bounded; when it is full, the network threads block and stop reading their
  sockets. Here each connection's thread reads and serves its own requests, one at a time in
  order (Kafka mutes a channel while its request is handled), so the bound is on the requests
  read and not yet answered across all connections: `RequestPermits`. A connection whose
  thread finds no permit stops reading its socket until one frees (back-pressure, TCP's window
  does the rest). A request holds its permit while it is served, long polls (Fetch's
  ``max_wait_ms``, JoinGroup) included.
- ``max.connections`` (all the listener's connections) and ``max.connections.per.ip`` with
  ``max.connections.per.ip.overrides``: Kafka's ConnectionQuotas. Over the per-address limit
  a new connection is closed at once; at ``max.connections`` the acceptor waits for a slot
  before it takes the next connection (Kafka's ``waitForConnectionSlot``), so new clients wait
  in the accept backlog. Both are dynamic broker configs (metadata_quorum.connection_configs):
  `DynamicConnectionLimits` reads them from the metadata image, and a change applies to the
  next connection accepted.
- ``connections.max.idle.ms``: a connection that sends and receives nothing for that long is
  closed (Kafka's Selector idle expiry), a client that stalls inside a request (slowloris)
  included; -1 keeps idle connections open.

`ConnectionQuotas` and `RequestPermits` are the accounting; the listener (listener.py) is the
IO shell that calls them.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType

from metadata_quorum import configs
from metadata_quorum.connection_configs import (
    MAX_CONNECTIONS_DEFAULT,
    MAX_CONNECTIONS_PER_IP_DEFAULT,
    parse_per_ip_overrides,
)
from metadata_quorum.image import MetadataImage

log = logging.getLogger(__name__)

SOCKET_REQUEST_MAX_BYTES_DEFAULT = 100 * 1024 * 1024
QUEUED_MAX_REQUESTS_DEFAULT = 500
CONNECTIONS_MAX_IDLE_MS_DEFAULT = 600_000
# how often a waiting acceptor or request looks again at limits that may have changed, or at
# a listener that stopped
RECHECK_S = 0.5
# a socket timeout Python accepts (connections.max.idle.ms is Kafka's LONG: up to 2^63-1 ms)
IDLE_TIMEOUT_S_MAX = 365 * 24 * 3600.0


@dataclass(frozen=True)
class ListenerLimits:
    """The KAFKA listener's static limits (its node config file's)."""

    socket_request_max_bytes: int = SOCKET_REQUEST_MAX_BYTES_DEFAULT
    queued_max_requests: int = QUEUED_MAX_REQUESTS_DEFAULT
    connections_max_idle_ms: int = CONNECTIONS_MAX_IDLE_MS_DEFAULT

    @property
    def idle_timeout_s(self) -> float | None:
        """A socket timeout for connections.max.idle.ms (None: -1, never idle)."""
        if self.connections_max_idle_ms < 0:
            return None
        # 0 closes a connection at its first pause: the shortest wait a socket takes
        return min(max(self.connections_max_idle_ms, 1) / 1000, IDLE_TIMEOUT_S_MAX)


@dataclass(frozen=True)
class ConnectionLimits:
    """max.connections, max.connections.per.ip and its overrides (by address: hostnames are
    resolved when the limits are read, as Kafka's ``InetAddress.getByName``)."""

    max_connections: int = MAX_CONNECTIONS_DEFAULT
    max_connections_per_ip: int = MAX_CONNECTIONS_PER_IP_DEFAULT
    per_ip_overrides: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def max_for(self, address: str) -> int:
        return self.per_ip_overrides.get(address, self.max_connections_per_ip)


def resolve_host(host: str) -> list[str]:
    """The addresses of an override's host: itself when it is an IP address, else what the
    resolver answers (nothing, logged, when it answers nothing)."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError as error:
        log.warning("max.connections.per.ip.overrides: %s does not resolve (%s)", host, error)
        return []
    return sorted({str(info[4][0]) for info in infos})


def connection_limits(
    config: configs.BrokerConfig, resolve: Callable[[str], list[str]] = resolve_host
) -> ConnectionLimits:
    """The limits a broker's effective dynamic configs set."""
    overrides = {
        address: count
        for host, count in parse_per_ip_overrides(config.max_connections_per_ip_overrides).items()
        for address in resolve(host)
    }
    return ConnectionLimits(
        config.max_connections, config.max_connections_per_ip, MappingProxyType(overrides)
    )


class DynamicConnectionLimits:
    """This broker's connection limits in the metadata image of the moment: its own dynamic
    value > the cluster-wide default > its node config file (``static``) > Kafka's default.
    Read again only when the image changes."""

    def __init__(
        self,
        image: Callable[[], MetadataImage],
        broker_id: int,
        static: Mapping[str, str],
        resolve: Callable[[str], list[str]] = resolve_host,
    ) -> None:
        self._image, self._broker_id, self._static = image, broker_id, dict(static)
        self._resolve = resolve
        self._lock = threading.Lock()
        self._read: tuple[MetadataImage, ConnectionLimits] | None = None

    def __call__(self) -> ConnectionLimits:
        image = self._image()
        with self._lock:
            if self._read is not None and self._read[0] is image:
                return self._read[1]
            config = configs.broker_config(image, self._broker_id, self._static)
            limits = connection_limits(config, self._resolve)
            if self._read is not None and self._read[1] != limits:
                log.info("KAFKA listener connection limits: %s", limits)
            self._read = (image, limits)
            return limits


class Admission(Enum):
    ADMIT = "admit"
    WAIT = "wait"  # max.connections reached: the acceptor waits for a slot
    REFUSE = "refuse"  # max.connections.per.ip (or its override) reached: closed at once


def admission(limits: ConnectionLimits, total: int, from_address: int, address: str) -> Admission:
    """Whether a new connection from ``address`` is taken, with ``total`` open on the listener
    and ``from_address`` of them from that address (Kafka's ConnectionQuotas.inc: the slot
    first, then the per-address count)."""
    if total >= limits.max_connections:
        return Admission.WAIT
    if from_address >= limits.max_for(address):
        return Admission.REFUSE
    return Admission.ADMIT


class ConnectionQuotas:
    """Open connections counted in all and per address. The acceptor calls `inc` for each new
    connection (which waits while max.connections is reached), the connection's thread `dec`
    when it closes."""

    def __init__(self, limits: Callable[[], ConnectionLimits]) -> None:
        self._limits = limits
        self._condition = threading.Condition()
        self._counts: dict[str, int] = {}
        self._total = 0

    @property
    def total(self) -> int:
        with self._condition:
            return self._total

    def count(self, address: str) -> int:
        with self._condition:
            return self._counts.get(address, 0)

    def limit_for(self, address: str) -> int:
        """max.connections.per.ip for ``address`` (its override if one names it)."""
        return self._limits().max_for(address)

    def inc(self, address: str, stopped: threading.Event) -> Admission:
        """ADMIT (counted: `dec` it when the connection closes) or REFUSE (not counted); waits
        while the listener is full, looking again at the limits every RECHECK_S (they may have
        been raised); WAIT only when `stopped` is set meanwhile."""
        with self._condition:
            while True:
                verdict = admission(
                    self._limits(), self._total, self._counts.get(address, 0), address
                )
                if verdict is not Admission.WAIT or stopped.is_set():
                    break
                self._condition.wait(RECHECK_S)
            if verdict is Admission.ADMIT:
                self._counts[address] = self._counts.get(address, 0) + 1
                self._total += 1
            return verdict

    def dec(self, address: str) -> None:
        with self._condition:
            count = self._counts.get(address, 0)
            assert count > 0 and self._total > 0, f"no connection from {address} to close"
            if count == 1:
                del self._counts[address]
            else:
                self._counts[address] = count - 1
            self._total -= 1
            self._condition.notify()


class RequestPermits:
    """queued.max.requests: requests read and not yet answered, across the listener's
    connections. A connection's thread takes a permit for each request it has read and gives it
    back once the request is served; with none left it waits, reading nothing more."""

    def __init__(self, queued_max_requests: int) -> None:
        assert queued_max_requests >= 1, queued_max_requests
        self.queued_max_requests = queued_max_requests
        self._condition = threading.Condition()
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        with self._condition:
            return self._in_flight

    def acquire(self, stopped: threading.Event, timeout_s: float | None = None) -> bool:
        """Wait for a permit; False when `stopped` is set (or `timeout_s` passed) first."""
        deadline_s = None if timeout_s is None else time.monotonic() + timeout_s
        with self._condition:
            while self._in_flight >= self.queued_max_requests:
                left_s = RECHECK_S if deadline_s is None else deadline_s - time.monotonic()
                if stopped.is_set() or left_s <= 0:
                    return False
                self._condition.wait(min(left_s, RECHECK_S))
            self._in_flight += 1
            return True

    def release(self) -> None:
        with self._condition:
            assert self._in_flight > 0, "a permit released twice"
            self._in_flight -= 1
            self._condition.notify()
