"""What every gRPC server of a node serves the way gRPC tools expect (docs/api.md):

- **server reflection** (``grpc.reflection.v1alpha.ServerReflection``), so ``grpcurl``, grpcui
  and Postman list the services and methods and read their message types;
- the **health service** (``grpc.health.v1.Health``): one status per service name and one for
  ``""`` (the whole server), all following the node's state (`NodeHealth`), Check and Watch;
- **keepalive** (`Keepalive`): the server's pings to find dead clients, and how often a client
  may ping it before it is answered GOAWAY ``too_many_pings``;
- `RichErrors`: a request that does not parse is INVALID_ARGUMENT and a `KafkaError` that
  escapes a handler ends the call with its rich status (metadata_quorum.grpc_errors), never as
  gRPC's UNKNOWN "Exception calling application".

Reflection and health answer without authentication (`is_standard_method`): a load balancer's
or an orchestrator's probe has no credentials, and what they tell (schemas that are public, a
serving status) is no secret. TLS, where the listener has it, still applies.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from metadata_quorum.grpc_errors import abort
from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)
HEALTH_SERVICE = health.SERVICE_NAME
REFLECTION_SERVICE = reflection.SERVICE_NAME
STANDARD_SERVICES = (HEALTH_SERVICE, REFLECTION_SERVICE)
_STANDARD_PREFIXES = tuple(f"/{name}/" for name in STANDARD_SERVICES)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def is_standard_method(method: str) -> bool:
    """``/grpc.health.v1.Health/Check`` and the like: served before and without the node's
    own interceptors' conditions (readiness, authentication)."""
    return method.startswith(_STANDARD_PREFIXES)


@dataclass(frozen=True)
class Keepalive:
    """A gRPC server's keepalive (``grpc.keepalive_*``, ``grpc.http2.*``): it pings a client
    after ``time_ms`` without activity and closes the connection when no answer comes within
    ``timeout_ms`` (a client gone without closing: a long poll would otherwise hold its thread
    until its own deadline); a client's ping sooner than ``min_ping_interval_without_data_ms``
    after the last one while no data flows is a strike, and past ``max_ping_strikes`` strikes
    the server answers GOAWAY ENHANCE_YOUR_CALM "too_many_pings" and closes the connection;
    ``permit_without_calls``: clients may ping a connection with no call open."""

    time_ms: int = 60_000
    timeout_ms: int = 20_000
    min_ping_interval_without_data_ms: int = 10_000
    permit_without_calls: bool = True
    max_ping_strikes: int = 2

    def options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.keepalive_time_ms", self.time_ms),
            ("grpc.keepalive_timeout_ms", self.timeout_ms),
            (
                "grpc.http2.min_ping_interval_without_data_ms",
                self.min_ping_interval_without_data_ms,
            ),
            ("grpc.keepalive_permit_without_calls", int(self.permit_without_calls)),
            ("grpc.http2.max_ping_strikes", self.max_ping_strikes),
        ]


DEFAULT_KEEPALIVE = Keepalive()


class NodeHealth:
    """The health service's statuses: every service a server serves, and ``""``, NOT_SERVING
    until the node says it serves. Watch streams do not hold a server thread
    (``experimental_non_blocking``), so watchers cannot starve calls. After `shut_down` the
    statuses stay NOT_SERVING whatever the node says."""

    def __init__(self, services: Sequence[str] = ()) -> None:
        self.servicer = health.HealthServicer(experimental_non_blocking=True)
        self._lock = threading.Lock()
        self._services = ["", *services]
        self._serving: bool | None = None
        self._shut_down = False
        self.set_serving(False)

    def add_services(self, services: Sequence[str]) -> None:
        with self._lock:
            self._services += [name for name in services if name not in self._services]
            serving = bool(self._serving)
            self._serving = None
        self.set_serving(serving)

    def set_serving(self, serving: bool) -> None:
        """Idempotent: a Watch sees a status only when it changes."""
        with self._lock:
            if serving is self._serving or self._shut_down:
                return
            self._serving = serving
            for name in self._services:
                self.servicer.set(name, SERVING if serving else NOT_SERVING)

    @property
    def serving(self) -> bool:
        return bool(self._serving)

    def shut_down(self) -> None:
        self.set_serving(False)
        with self._lock:
            self._shut_down = True


def add_standard_services(server: grpc.Server, services: Sequence[str], node: NodeHealth) -> None:
    """Serve reflection over ``services`` (full names, from the generated descriptors) and the
    two standard services themselves, and ``node``'s health for them."""
    node.add_services(services)
    health_pb2_grpc.add_HealthServicer_to_server(node.servicer, server)
    reflection.enable_server_reflection((*services, *STANDARD_SERVICES), server)


Behaviour = Callable[[Any, grpc.ServicerContext], Any]


class RichErrors(grpc.ServerInterceptor):  # type: ignore[misc]
    """The outermost interceptor of a node's server. It deserializes the request inside the
    call (grpc's own deserialization failure is INTERNAL "Exception deserializing request!",
    which reads as the server's fault) and turns a `KafkaError` raised out of a handler, or out
    of an inner interceptor, into the call's rich status."""

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = continuation(details)
        if handler is None or is_standard_method(details.method):
            return handler
        decode = handler.request_deserializer
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _unary(handler.unary_unary, decode, details.method),
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _streaming(handler.unary_stream, decode, details.method),
                response_serializer=handler.response_serializer,
            )
        return handler  # no client-streaming method outside the standard services


def _parse(decode: Callable[[bytes], Any] | None, data: bytes, method: str, context: Any) -> Any:
    if decode is None:
        return data
    try:
        return decode(data)
    except (DecodeError, ValueError) as error:  # protobuf's, and protos.wire's for Produce
        log.info("%s: a request that does not parse: %s", method, error)
        abort(
            context,
            KafkaError(ErrorCode.INVALID_REQUEST, f"{method}: the request does not parse: {error}"),
        )


def _unary(behaviour: Behaviour, decode: Any, method: str) -> Behaviour:
    def run(data: bytes, context: grpc.ServicerContext) -> Any:
        request = _parse(decode, data, method, context)
        try:
            return behaviour(request, context)
        except KafkaError as error:
            abort(context, error)

    return run


def _streaming(
    behaviour: Callable[[Any, grpc.ServicerContext], Any], decode: Any, method: str
) -> Callable[[bytes, grpc.ServicerContext], Iterator[Any]]:
    def run(data: bytes, context: grpc.ServicerContext) -> Iterator[Any]:
        request = _parse(decode, data, method, context)
        try:
            yield from behaviour(request, context)
        except KafkaError as error:
            abort(context, error)

    return run
