"""A client of ControllerService that finds and follows the active controller.

It starts from any controller address, and on NOT_CONTROLLER (with the active controller's
address as a hint) or an unreachable node it moves on, within a deadline. Only retriable
failures are retried; anything else comes back to the caller as a ``KafkaError``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc

from metadata_quorum.grpc_errors import kafka_error_of
from metadata_quorum.security.channels import ClientSecurity, open_channel
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pb_grpc
from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

R = TypeVar("R")
RPC_TIMEOUT_S = 5.0
RETRY_BACKOFF_S = 0.05
RETRY_BACKOFF_MAX_S = 0.5


class ControllerClient:
    def __init__(
        self,
        bootstrap: Sequence[str],
        deadline_s: float = 15.0,
        rpc_timeout_s: float = RPC_TIMEOUT_S,
        security: ClientSecurity | None = None,
    ) -> None:
        """`security`: how to reach a CONTROLLER listener that uses TLS (None: plaintext)."""
        if not bootstrap:
            raise ValueError("ControllerClient needs at least one controller address")
        self.bootstrap = list(bootstrap)
        self._learned: list[str] = []  # the quorum's voters as the metadata names them
        self.deadline_s = deadline_s
        self.rpc_timeout_s = rpc_timeout_s
        self.security = security
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._active: str | None = None
        self._closed = threading.Event()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()

    def stub(self, address: str) -> pb_grpc.ControllerServiceStub:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = open_channel(address, self.security)
                self._channels[address] = channel
        return pb_grpc.ControllerServiceStub(channel)

    @property
    def active_address(self) -> str | None:
        """The controller that last answered as the active one, if any."""
        with self._lock:
            return self._active

    def learn(self, voters: Sequence[str]) -> None:
        """The controllers the metadata names (its VotersRecord, KIP-853): tried before the
        bootstrap addresses, so a client started with controllers since removed still finds
        the ones added later."""
        with self._lock:
            self._learned = list(voters)

    @property
    def controllers(self) -> list[str]:
        """Every address this client tries: the learned voters, then the bootstrap ones."""
        with self._lock:
            learned = list(self._learned)
        return learned + [a for a in self.bootstrap if a not in learned]

    def _candidates(self) -> list[str]:
        with self._lock:
            first = [self._active] if self._active else []
        return first + [a for a in self.controllers if a not in first]

    def call(
        self,
        method: str,
        request: Any,
        deadline_s: float | None = None,
        any_node: bool = False,
    ) -> Any:
        """Call ``method`` on the active controller (or any live controller for reads when
        ``any_node``), following NOT_CONTROLLER hints and skipping unreachable nodes."""
        deadline = time.monotonic() + (deadline_s or self.deadline_s)
        backoff = RETRY_BACKOFF_S
        last_error = "no controller answered"
        while time.monotonic() < deadline and not self._closed.is_set():
            # One round asks each controller at most once. A NOT_CONTROLLER hint is followed
            # only to a controller not asked yet: a stale hint (the old active controller,
            # named by a standby that has not heard of the election) must not keep the round
            # from reaching the controller that did become active.
            tried: set[str] = set()
            following = True
            while following and time.monotonic() < deadline:
                following = False
                for address in self._candidates():
                    if address in tried:
                        continue
                    tried.add(address)
                    outcome = self._try(method, request, address, deadline)
                    if isinstance(outcome, str):
                        last_error = outcome
                        with self._lock:
                            if self._active == address:
                                self._active = None  # dead, paused or cut off: look elsewhere
                        continue
                    status = outcome.status
                    if status.error_code == ErrorCode.NOT_CONTROLLER.code and not any_node:
                        last_error = f"{address}: NOT_CONTROLLER"
                        hint = status.controller_address
                        if hint and hint not in tried:
                            with self._lock:
                                self._active = hint
                            following = True
                            break
                        continue
                    with self._lock:
                        self._active = address
                    return outcome
            self._closed.wait(backoff)
            backoff = min(backoff * 2, RETRY_BACKOFF_MAX_S)
        raise KafkaError(ErrorCode.NOT_CONTROLLER, f"{method}: {last_error}")

    def _try(self, method: str, request: Any, address: str, deadline: float) -> Any:
        """The response, or a string saying why this address did not answer. A call the
        controller refused with a Kafka error that is not retriable (its trailers:
        metadata_quorum.grpc_errors; an authorization or authentication failure) raises it:
        asking the other controllers would only be refused again."""
        timeout = max(0.05, min(self.rpc_timeout_s, deadline - time.monotonic()))
        rpc: Callable[..., Any] = getattr(self.stub(address), method)
        try:
            return rpc(request, timeout=timeout)
        except grpc.RpcError as error:
            refused = kafka_error_of(error)
            if refused is not None and not refused.retriable:
                details = error.details() if isinstance(error, grpc.Call) else str(error)
                raise KafkaError(refused, f"{method} at {address}: {details}") from error
            code = error.code() if hasattr(error, "code") else None
            return f"{address}: {code}"

    def tell_standbys(self, method: str, request: Any, timeout_s: float) -> list[str]:
        """Send ``request`` to every controller but the active one, each waited for at most
        ``timeout_s``; the addresses that answered. For notices a standby keeps for when it
        becomes active (a broker's heartbeat): an unreachable standby is skipped, since all
        it would miss is the notice."""
        active = self.active_address
        answered = []
        for address in self.controllers:
            if address == active or self._closed.is_set():
                continue
            rpc: Callable[..., Any] = getattr(self.stub(address), method)
            try:
                rpc(request, timeout=timeout_s)
            except grpc.RpcError as error:
                log.debug("%s to standby %s: %s", method, address, error.code())
                continue
            answered.append(address)
        return answered

    def checked(self, method: str, request: Any, **kwargs: Any) -> Any:
        """``call`` and raise the response's top-level error, if any."""
        response = self.call(method, request, **kwargs)
        code = response.status.error_code
        if code != 0:
            raise KafkaError(ErrorCode.from_code(code), response.status.error_message)
        return response

    # -- conveniences used by the CLI, brokers and tests ------------------------------------
    def describe_quorum(self, address: str | None = None) -> pb.DescribeQuorumResponse:
        if address is not None:
            response: pb.DescribeQuorumResponse = self.stub(address).DescribeQuorum(
                pb.DescribeQuorumRequest(), timeout=RPC_TIMEOUT_S
            )
            return response
        return self.call("DescribeQuorum", pb.DescribeQuorumRequest(), any_node=True)  # type: ignore[no-any-return]

    def create_topics(
        self, topics: Sequence[pb.CreatableTopic], validate_only: bool = False
    ) -> pb.CreateTopicsResponse:
        request = pb.CreateTopicsRequest(topics=list(topics), validate_only=validate_only)
        return self.checked("CreateTopics", request)  # type: ignore[no-any-return]
