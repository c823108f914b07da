"""In-process servers for the fuzz targets: no sockets, the real handlers.

`InProcessBroker` is a broker's serving objects (ReplicaManager over a scratch log directory,
BrokerServicer, GroupCoordinator/GroupServicer, the KAFKA listener, never started) over an image
in which broker 1 leads partition 0 of ``fuzz`` and of ``__consumer_offsets`` alone. `GrpcDoor`
is what a gRPC server holds of a service: each method's request deserializer, handler and
response serializer, collected from the generated ``add_*_to_server`` as the real server is.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from dataplane.broker.metrics import NodeMetrics
from dataplane.broker.partition import IsrChange
from dataplane.broker.replica_manager import ReplicaManager, ReplicaManagerConfig
from dataplane.broker.service import BrokerServicer
from dataplane.coordinator.group_coordinator import GroupConfig, GroupCoordinator, GroupServicer
from dataplane.kafka.listener import KafkaListener
from dataplane.kafka.sasl import KafkaListenerSecurity
from metadata_quorum.features import BOOTSTRAP_FEATURES
from metadata_quorum.image import MetadataImage, PartitionRegistration, TopicImage
from metadata_quorum.security.scram import ScramCredential, ScramMechanism, make_credential

TOPIC = "fuzz"
TOPIC_ID = uuid.UUID(int=0xF022)
OFFSETS_TOPIC_ID = uuid.UUID(int=0x0FF5)
LOG_DIR_BYTES_MAX = 64 * 1024 * 1024  # a fresh broker once the fuzzer's produces reach this
STREAM_RESPONSES_MAX = 4  # a server-streaming RPC is read this far
USER, PASSWORD = "alice", "alice-secret"  # the one SASL user (tests/fuzz/corpus/sasl seeds)
SCRAM_ITERATIONS = 4096


class Aborted(Exception):
    """A handler called ``context.abort``: gRPC answers the status; the server is fine."""


class FakeContext:
    """What the servicers read of a gRPC call context."""

    def abort(self, code: Any, details: str) -> None:
        raise Aborted(f"{code}: {details}")

    def abort_with_status(self, status: Any) -> None:
        raise Aborted(f"{status.code}: {status.details}")

    def time_remaining(self) -> float:
        return 1.0

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False

    def is_active(self) -> bool:
        return True

    def peer(self) -> str:
        return "ipv4:127.0.0.212:40000"

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def set_code(self, code: Any) -> None:
        pass

    def set_details(self, details: str) -> None:
        pass

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}


class StreamContext(FakeContext):
    """A server-streaming call's context: its deadline has come, so a stream (FetchStream)
    sends what it has now and ends instead of waiting for more."""

    def time_remaining(self) -> float:
        return 0.0


class GrpcDoor:
    """A service's method handlers as the generated code registers them with a server."""

    def __init__(self, add_to_server: Callable[[Any], None]) -> None:
        self.service = ""
        self.handlers: dict[str, Any] = {}
        add_to_server(self)
        self.methods = sorted(self.handlers)

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # the same handlers come through add_registered_method_handlers

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.service = service
        self.handlers.update(handlers)

    def call(self, data: bytes, clamp: dict[str, int] | None = None) -> None:
        """The first byte picks the method, the rest is its request message. A message that
        does not parse is gRPC's INTERNAL (``DecodeError``), the handler not called. ``clamp``:
        top-level fields set to these values (waits a client may ask for, the fuzzer may not)."""
        if not data:
            return
        method = self.methods[data[0] % len(self.methods)]
        handler = self.handlers[method]
        try:
            request = handler.request_deserializer(data[1:])
        except DecodeError:
            return
        message = request[0] if isinstance(request, tuple) else request
        for name, value in (clamp or {}).items():
            if name in message.DESCRIPTOR.fields_by_name and getattr(message, name) > value:
                setattr(message, name, value)
        try:
            if handler.unary_unary is not None:
                handler.response_serializer(handler.unary_unary(request, FakeContext()))
            elif handler.unary_stream is not None:
                stream: Iterator[Any] = handler.unary_stream(request, StreamContext())
                for answer in islice(stream, STREAM_RESPONSES_MAX):
                    handler.response_serializer(answer)
        except Aborted:
            return


def fuzz_image() -> MetadataImage:
    """Broker 1 leads ``fuzz``-0 and ``__consumer_offsets``-0 alone; ``fuzz``-1 is broker 2's."""
    fuzz = {
        0: PartitionRegistration((1,), (1,), 1, 0, 0),
        1: PartitionRegistration((2, 1), (2, 1), 2, 0, 0),
    }
    offsets = {0: PartitionRegistration((1,), (1,), 1, 0, 0)}
    return MetadataImage(
        offset=10,
        topics={
            TOPIC_ID: TopicImage(TOPIC, TOPIC_ID, fuzz),
            OFFSETS_TOPIC_ID: TopicImage("__consumer_offsets", OFFSETS_TOPIC_ID, offsets),
        },
        topic_ids={TOPIC: TOPIC_ID, "__consumer_offsets": OFFSETS_TOPIC_ID},
        # a new cluster's levels: below them the KIP-848 and share APIs answer only
        # UNSUPPORTED_VERSION and their handlers would go unfuzzed
        features=dict(BOOTSTRAP_FEATURES),
    )


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now_ms


def _alter(change: IsrChange) -> None:
    pass


def _log_dir_failed(directory: Path, error: OSError) -> None:
    raise AssertionError(f"log directory {directory} failed under the fuzzer: {error}")


def _no_topic_creation(name: str, partitions: int, rf: int, configs: Any) -> None:
    pass


CREDENTIALS = {
    mechanism: make_credential(mechanism, PASSWORD, salt=b"fuzz-salt", iterations=SCRAM_ITERATIONS)
    for mechanism in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512)
}


def scram_credential(user: str, mechanism: ScramMechanism) -> ScramCredential | None:
    return CREDENTIALS.get(mechanism) if user == USER else None


SASL_SECURITY = KafkaListenerSecurity(
    protocol="SASL_PLAINTEXT",
    mechanisms=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
    reauth_ms=60_000,
    credentials=scram_credential,
)


class InProcessBroker:
    """One broker's serving objects in a scratch directory (see the module docstring)."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="raftlog-fuzz-broker-"))
        self.clock = Clock()
        self.replicas = ReplicaManager(
            1, self.directory, ReplicaManagerConfig(), self.clock, _alter, _log_dir_failed
        )
        self.replicas.apply_image(fuzz_image(), caught_up=True)
        self.servicer = BrokerServicer(
            1, self.replicas, NodeMetrics(), "fuzz-cluster", [], lambda c: None, lambda: 7
        )
        self.coordinator = GroupCoordinator(
            1, GroupConfig(), self.replicas, _no_topic_creation, self.clock
        )
        self.groups = GroupServicer(self.coordinator)
        self.listener = KafkaListener(self.servicer, self.groups, "127.0.0.212", 0)
        self.sasl_listener = KafkaListener(
            self.servicer, self.groups, "127.0.0.212", 0, security=SASL_SECURITY
        )

    def log_dir_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.directory.rglob("*") if p.is_file())

    def close(self) -> None:
        self.coordinator.close()
        self.replicas.close()
        shutil.rmtree(self.directory, ignore_errors=True)


class BrokerPool:
    """One `InProcessBroker` per process, replaced by a fresh one when its logs grow past
    `LOG_DIR_BYTES_MAX` (checked every so many inputs), so a long run stays bounded on disk."""

    CHECK_EVERY = 256

    def __init__(self) -> None:
        self._broker: InProcessBroker | None = None
        self._inputs = 0

    def get(self) -> InProcessBroker:
        self._inputs += 1
        broker = self._broker
        checking = broker is not None and self._inputs % self.CHECK_EVERY == 0
        if checking and broker is not None and broker.log_dir_bytes() > LOG_DIR_BYTES_MAX:
            broker.close()
            broker = None
        if broker is None:
            broker = self._broker = InProcessBroker()
        return broker
