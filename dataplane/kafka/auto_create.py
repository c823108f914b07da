"""Auto-created topics: Kafka's ``auto.create.topics.enable`` on the KAFKA listener.

A Metadata request that names a topic the cluster lacks creates it when the broker's
``auto.create.topics.enable`` (default true) and the request's ``allow_auto_topic_creation``
(v4+; versions 0-3 always allow) both say so, and the request names its topics (asking for
every topic never creates one). The topic gets the broker's ``num.partitions`` and
``default.replication.factor`` (both 1 by default); a cluster-wide value set through the
controller (``raftlog configs``, resource BROKER "") wins over the node's file, as Kafka
orders DYNAMIC_DEFAULT_BROKER_CONFIG above STATIC_BROKER_CONFIG. Never created:

- an invalid name (Kafka's ``Topic.validate``: ASCII letters, digits, '.', '_' and '-', at
  most 249 characters, not "." or ".."), answered INVALID_TOPIC_EXCEPTION;
- an internal topic (Kafka's ``Topic.isInternal``: ``__consumer_offsets``,
  ``__transaction_state``, ``__share_group_state``): its coordinator creates it, with its own
  partition count and configs, when first used; answered UNKNOWN_TOPIC_OR_PARTITION.

The creation is a CreateTopics forwarded to the controller under the asker's principal, so it is
authorized as CreateTopics is: CREATE on the cluster or on the topic, else the topic is answered
TOPIC_AUTHORIZATION_FAILED (Kafka's KafkaApis.handleTopicMetadataRequest). Consumers do not
create topics: librdkafka and the Java client send ``allow_auto_topic_creation=false`` from a
consumer unless ``allow.auto.create.topics=true``; producers send true. A Produce to a missing
topic is answered UNKNOWN_TOPIC_OR_PARTITION and creates nothing (Kafka 4's
``handleProduceRequest`` does the same); the producer's Metadata refresh then creates it.

Kafka's KRaft broker sends the CreateTopics in the background and answers
UNKNOWN_TOPIC_OR_PARTITION until its metadata shows the topic. Here the Metadata answer waits for
the controller (at most ``AUTO_CREATE_DEADLINE_S``) and then for this broker's own image to show
the topic, so the asker usually gets the new topic with its leaders at once; while the image
does not show it yet the topic is answered LEADER_NOT_AVAILABLE (retriable: the client asks
again), and a refusal (INVALID_REPLICATION_FACTOR when ``default.replication.factor`` exceeds
the live brokers, TOPIC_AUTHORIZATION_FAILED, ...) is answered as the controller gave it.
A topic already being created for another request is answered UNKNOWN_TOPIC_OR_PARTITION, as
Kafka answers its in-flight creations.

`plan_auto_create` and `answer_for` are the rule (pure); `AutoTopicCreation` is the shell.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from metadata_quorum.client import ControllerClient
from metadata_quorum.configs import cluster_overrides
from metadata_quorum.image import MetadataImage
from metadata_quorum.replication import validate_topic_name
from metadata_quorum.request_authorization import authorized
from metadata_quorum.security.authorization import ALLOW_ALL, AccessControl
from protos import broker_pb2 as pb
from protos import controller_pb2 as cpb
from raftlog.errors import ErrorCode, KafkaError

# Kafka's Topic.INTERNAL_TOPICS
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})
# how long a Metadata answer waits for the controller and then for this broker's image
AUTO_CREATE_DEADLINE_S = 5.0
NUM_PARTITIONS = "num.partitions"
DEFAULT_REPLICATION_FACTOR = "default.replication.factor"


def is_internal(name: str) -> bool:
    return name in INTERNAL_TOPICS


@dataclass(frozen=True)
class AutoCreateSettings:
    """The node config's ``auto.create.topics.enable``, ``num.partitions`` and
    ``default.replication.factor``."""

    enabled: bool = True
    num_partitions: int = 1
    default_replication_factor: int = 1

    def sizes(self, image: MetadataImage) -> tuple[int, int]:
        """(partitions, replication factor) of an auto-created topic: the cluster-wide values
        set through the controller, else this node's."""
        overrides = cluster_overrides(image)
        partitions = overrides.get(NUM_PARTITIONS)
        rf = overrides.get(DEFAULT_REPLICATION_FACTOR)
        return (
            self.num_partitions if partitions is None else int(partitions),
            self.default_replication_factor if rf is None else int(rf),
        )


@dataclass(frozen=True)
class AutoCreatePlan:
    create: tuple[str, ...] = ()  # to create, in the order asked
    refused: Mapping[str, KafkaError] = field(default_factory=dict)  # answered so, not created


def plan_auto_create(
    missing: Sequence[str], allowed_by_request: bool, enabled: bool
) -> AutoCreatePlan:
    """Which of ``missing`` (topics a Metadata request names, each one the principal may
    DESCRIBE, that this broker's image lacks) to create, and the answer for each of the rest."""
    create: list[str] = []
    refused: dict[str, KafkaError] = {}
    for name in dict.fromkeys(missing):
        try:
            validate_topic_name(name)
        except KafkaError as error:
            refused[name] = error
            continue
        if not enabled:
            refused[name] = _unknown(name, "auto.create.topics.enable is false on this broker")
        elif not allowed_by_request:
            refused[name] = _unknown(name, "the request does not allow auto-creation")
        elif is_internal(name):
            refused[name] = _unknown(
                name, "an internal topic is created by its coordinator, never auto-created"
            )
        else:
            create.append(name)
    return AutoCreatePlan(tuple(create), refused)


def answer_for(error: ErrorCode, message: str, whole_request: bool = False) -> KafkaError:
    """The Metadata answer for a topic whose auto-creation the controller answered ``error``,
    while this broker's image does not show the topic. Created (or already there, or timed out
    after the controller may have created it): LEADER_NOT_AVAILABLE, so the client asks again.
    A refusal of the topic is passed on; a failure of the whole request (no controller
    reachable) is UNKNOWN_TOPIC_OR_PARTITION, as Kafka answers until its creation succeeds."""
    if error in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS, ErrorCode.REQUEST_TIMED_OUT):
        return KafkaError(
            ErrorCode.LEADER_NOT_AVAILABLE, "the topic is being created: no leaders known yet"
        )
    if whole_request:
        return KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"auto-creation failed: {message}")
    return KafkaError(error, message)


def _unknown(name: str, why: str) -> KafkaError:
    return KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}: {why}")


WaitForImage = Callable[[Callable[[MetadataImage], bool], float], MetadataImage]


class AutoTopicCreation:
    """Creates the missing topics a Metadata request names, through the controller."""

    def __init__(
        self,
        settings: AutoCreateSettings,
        controller: ControllerClient,
        image: Callable[[], MetadataImage],
        wait_for_image: WaitForImage,
        access: AccessControl = ALLOW_ALL,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.controller = controller
        self.image = image
        self.wait_for_image = wait_for_image
        self.access = access
        self._clock_s = clock_s
        self._lock = threading.Lock()
        self._in_flight: set[str] = set()  # names being created for some request

    def fill_in(
        self,
        response: pb.MetadataResponse,
        allowed_by_request: bool,
        describe: Callable[[list[str]], pb.MetadataResponse],
    ) -> None:
        """Create the topics ``response`` answers UNKNOWN_TOPIC_OR_PARTITION where the rule
        allows; each is then described anew (``describe``) or answered its error."""
        unknown = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code
        missing = [t.name for t in response.topics if t.error_code == unknown]
        if not missing:
            return
        plan = plan_auto_create(missing, allowed_by_request, self.settings.enabled)
        answers: dict[str, KafkaError | None] = {**plan.refused, **self._create(plan.create)}
        shown = [name for name, error in answers.items() if error is None]
        fresh = {t.name: t for t in describe(shown).topics} if shown else {}
        for topic in response.topics:
            if topic.name not in answers:
                continue
            error = answers[topic.name]
            if error is None:
                topic.CopyFrom(fresh[topic.name])
            else:
                topic.error_code = error.error.code
                topic.error_message = error.message

    def _create(self, names: Sequence[str]) -> dict[str, KafkaError | None]:
        """None for each topic this broker's image shows once created, else its answer."""
        if not names:
            return {}
        with self._lock:
            busy = [n for n in names if n in self._in_flight]
            mine = [n for n in names if n not in self._in_flight]
            self._in_flight.update(mine)
        answers: dict[str, KafkaError | None] = {
            n: _unknown(n, "it is being created for another request") for n in busy
        }
        try:
            answers.update(self._create_now(mine))
        finally:
            with self._lock:
                self._in_flight.difference_update(mine)
        return answers

    def _create_now(self, names: list[str]) -> dict[str, KafkaError | None]:
        if not names:
            return {}
        deadline = self._clock_s() + AUTO_CREATE_DEADLINE_S
        partitions, rf = self.settings.sizes(self.image())
        request = cpb.CreateTopicsRequest(
            topics=[
                cpb.CreatableTopic(name=n, num_partitions=partitions, replication_factor=rf)
                for n in names
            ]
        )
        try:
            answer = authorized(
                self.access, "CreateTopics", request,
                lambda allowed: self.controller.checked(
                    "CreateTopics", allowed, deadline_s=AUTO_CREATE_DEADLINE_S
                ),
            )  # fmt: skip
        except KafkaError as error:
            return {n: answer_for(error.error, error.message, whole_request=True) for n in names}
        no_answer = (ErrorCode.UNKNOWN_SERVER_ERROR, "the controller did not answer for it")
        outcomes = {
            t.name: (ErrorCode.from_code(t.error_code), t.error_message) for t in answer.topics
        }
        created = [n for n in names if outcomes.get(n, no_answer)[0] in _MAY_EXIST]
        image = self.wait_for_image(
            lambda image: all(n in image.topic_ids for n in created),
            max(0.0, deadline - self._clock_s()),
        )
        out: dict[str, KafkaError | None] = {}
        for name in names:
            code, message = outcomes.get(name, no_answer)
            out[name] = None if name in image.topic_ids else answer_for(code, message)
        return out


_MAY_EXIST = frozenset({ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS})
