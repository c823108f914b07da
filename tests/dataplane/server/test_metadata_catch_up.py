"""A starting broker publishes no metadata image before it has caught up (Kafka's initial
catch-up, dataplane/server/broker_server.py ``Broker._apply_update``).

Found by a 10-minute chaos run: a combined node restarted, its broker followed its own
controller while that was still replaying its journal, and applied the history image by image.
In it, a reassignment had once moved the broker off a partition and back; applying that image
deleted the partition's log, and the broker, still in the partition's ELR, was elected with an
empty log (18,709 acknowledged records gone). The images on the way must reach the replica
manager only once the image holds this incarnation's registration.

The broker's collaborators are recording stand-ins here; what a replica manager does with an
image is tested on real logs elsewhere (tests/dataplane/broker/)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from dataplane.broker.metrics import NodeMetrics
from dataplane.server import broker_server
from dataplane.server.broker_server import Broker, BrokerState
from metadata_quorum.codec import record_to_proto
from metadata_quorum.image import MetadataImage
from metadata_quorum.records import FeatureLevelRecord
from protos import controller_pb2 as cpb

REGISTERED_AT = 5  # the offset of this incarnation's RegisterBroker record: its broker epoch


class Recorder:
    """Any method call is recorded with the image offset it was given, if any."""

    def __init__(self, calls: list[tuple[str, int]], name: str) -> None:
        self.calls, self.name = calls, name

    def __getattr__(self, method: str) -> Any:
        def record(*args: Any, **kwargs: Any) -> Any:
            image = next((a for a in args if isinstance(a, MetadataImage)), None)
            self.calls.append((f"{self.name}.{method}", -1 if image is None else image.offset))
            return {}

        return record


def starting_broker(calls: list[tuple[str, int]]) -> Broker:
    broker = Broker.__new__(Broker)  # only what _apply_update touches
    broker.image = MetadataImage()
    broker.broker_epoch = REGISTERED_AT
    broker.serving = threading.Event()
    broker._state_lock = threading.Lock()
    broker._publish_lock = threading.Lock()
    broker.state = BrokerState.RECOVERY
    broker.incarnation_id = b"\x01" * 16  # type: ignore[assignment]
    broker.settings = type("Settings", (), {"broker_id": 1})()
    for name in ("client", "replicas", "fetchers", "groups", "transactions",
                 "share_coordinator", "share_manager", "health", "metrics"):  # fmt: skip
        setattr(broker, name, Recorder(calls, name))
    return broker


def update(first: int, last: int) -> cpb.MetadataUpdate:
    return cpb.MetadataUpdate(
        records=[
            cpb.OffsetRecord(offset=o, record=record_to_proto(FeatureLevelRecord("f", o)))
            for o in range(first, last + 1)
        ],
        high_offset=last,
    )


def test_history_reaches_no_replica_until_the_image_holds_the_registration() -> None:
    calls: list[tuple[str, int]] = []
    broker = starting_broker(calls)
    broker._apply_update(update(0, 2))
    broker._apply_update(update(3, 4))
    assert broker.image.offset == 4, "the image itself keeps up"
    assert not calls, "an image from before the registration was published"
    assert not broker.serving.is_set()
    broker._apply_update(update(5, 6))
    assert ("replicas.apply_image", 6) in calls
    assert [c for c in calls if c[0] == "replicas.apply_image"] == [("replicas.apply_image", 6)]
    assert broker.serving.is_set()
    broker._apply_update(update(7, 7))  # from now on every update is published
    assert ("replicas.apply_image", 7) in calls


def test_a_serving_broker_that_registers_again_keeps_publishing() -> None:
    calls: list[tuple[str, int]] = []
    broker = starting_broker(calls)
    broker._apply_update(update(0, 5))
    broker.broker_epoch = 50  # registered again at a later offset: it serves on, as before
    broker._apply_update(update(6, 6))
    assert ("replicas.apply_image", 6) in calls


def test_the_heartbeat_reports_no_offset_until_the_broker_serves() -> None:
    """The controller unfences a broker once its heartbeat's offset reaches its registration;
    before the image holding it is published (and the listeners admit clients), the broker
    must not be unfenced, or Metadata answers name a broker that refuses connections."""
    calls: list[tuple[str, int]] = []
    broker = starting_broker(calls)
    reported: list[int] = []

    class Publishing(Recorder):
        def apply_image(self, image: MetadataImage, **_: Any) -> dict[str, Any]:
            reported.append(broker._published_offset())  # a heartbeat while it publishes
            return {}

    broker.replicas = Publishing(calls, "replicas")  # type: ignore[assignment]
    broker._apply_update(update(0, 6))
    assert broker.image.offset == 6
    assert reported == [-1], "the heartbeat reported a registration it has not yet published"
    assert broker._published_offset() == 6


def test_a_registration_streamed_before_its_answer_is_published_at_the_answer(
    tmp_path: Path,
) -> None:
    """The stream may bring the RegisterBroker record before the registration's answer gives the
    broker its epoch. Nothing may be committed after it (an idle cluster), so the answer itself
    publishes the image that already holds it: else the broker neither served nor reported the
    offset that unfences it, and waited for an unrelated record (seen: 27 s)."""
    calls: list[tuple[str, int]] = []
    broker = starting_broker(calls)
    broker.broker_epoch = -1  # registering: the answer has not come
    broker._apply_update(update(0, REGISTERED_AT))
    assert not broker.serving.is_set() and not calls
    broker.previous = type("Previous", (), {"broker_epoch": -1, "proof": "none"})()
    broker.boot_id, broker.log_dir = None, tmp_path  # no boot id: no same-boot note written
    answer = cpb.RegisterBrokerResponse(broker_epoch=REGISTERED_AT)
    broker.client = type("Client", (), {"checked": lambda self, *_: answer})()
    broker._endpoints = lambda: []  # type: ignore[method-assign]
    broker.settings = type(
        "Settings",
        (),
        {"broker_id": 1, "rack": None, "replica": type("R", (), {"static_broker_configs": {}})()},
    )()
    broker._register()
    assert broker.serving.is_set()
    assert ("replicas.apply_image", REGISTERED_AT) in calls
    assert broker._published_offset() == REGISTERED_AT


def errors(metrics: NodeMetrics, name: str) -> float:
    value = metrics.registry.get_sample_value(f"{name}_total")
    return 0.0 if value is None else value


def test_a_publisher_fault_is_counted_and_the_others_and_the_next_image_go_on() -> None:
    """Kafka's metadata publishing fault handler: a publisher that raises is logged and counted
    (``metadata-apply-error-count``), the other publishers still get the image, and the thread
    that follows the metadata goes on. Before, the exception ended that thread: the image (and
    so the Metadata answers) stayed current while every partition kept its last role and ISR."""
    calls: list[tuple[str, int]] = []
    broker = starting_broker(calls)
    broker.metrics = NodeMetrics()
    faults = [RuntimeError("a replica could not be opened")]

    class Faulty(Recorder):
        def apply_image(self, image: MetadataImage, **_: Any) -> dict[str, Any]:
            calls.append(("replicas.apply_image", image.offset))
            if faults:
                raise faults.pop()
            return {}

    broker.replicas = Faulty(calls, "replicas")  # type: ignore[assignment]
    broker._apply_update(update(0, 6))
    assert ("groups.on_image", 6) in calls, "the fault kept the image from the other publishers"
    assert broker.image.offset == 6
    assert errors(broker.metrics, "raftlog_metadata_apply_errors") == 1
    broker._apply_update(update(7, 7))
    assert ("replicas.apply_image", 7) in calls
    assert errors(broker.metrics, "raftlog_metadata_apply_errors") == 1


def test_an_update_that_cannot_be_applied_ends_the_stream_not_the_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fault reading an update into an image (Kafka's metadata loading fault) is counted and
    logged; the stream is asked for again from the image's offset."""
    calls: list[tuple[str, int]] = []
    broker = starting_broker(calls)
    broker.metrics = NodeMetrics()
    broker._stop = threading.Event()
    monkeypatch.setattr(broker_server, "METADATA_FAULT_BACKOFF_S", 0.0)
    streamed = [update(0, 6), update(9, 9)]  # not contiguous: the second cannot be applied

    class Stub:
        def FetchMetadata(self, request: cpb.FetchMetadataRequest, timeout: float) -> Any:
            assert request.from_offset == broker.image.offset + 1
            return iter(streamed)

    broker.client = type("Client", (), {"stub": lambda self, address: Stub()})()
    assert broker._stream_from("127.0.0.1:1") is True, "the first update was applied"
    assert broker.image.offset == 6
    assert errors(broker.metrics, "raftlog_metadata_load_errors") == 1
