"""Authentication on the gRPC listeners (BROKER, CONTROLLER): the server side of
``protos/auth.proto`` and the interceptor that gives every other call its `Session`.

A call's principal, in order:
1. the session token in the metadata ``raftlog-session-token`` (from a SCRAM or PLAIN exchange
   over the Authentication service, or a RAFTLOG-NODE-CERT one: `node_cert`) → the user who
   authenticated; an expired or unknown token is UNAUTHENTICATED (the client exchanges again);
2. else a verified client certificate → its subject through ``ssl.principal.mapping.rules``;
3. else ANONYMOUS, which a SASL_SSL listener refuses (UNAUTHENTICATED, "authenticate first").

Tokens live ``connections.max.reauth.ms`` (one hour when that is 0; clients renew them before
they expire, as Kafka clients re-authenticate). Exchanges in progress and live tokens are bounded
in number; exchanges also in age. Every failed authentication is written to the
``raftlog.audit`` logger with the user tried, the client's address and the reason.
"""

from __future__ import annotations

import datetime
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from cryptography import x509

from metadata_quorum.grpc_errors import abort
from metadata_quorum.grpc_standard import is_standard_method
from metadata_quorum.security import node_cert
from metadata_quorum.security.channels import SESSION_TOKEN_KEY
from metadata_quorum.security.node_cert import NODE_CERT_MECHANISM
from metadata_quorum.security.principal import (
    ANONYMOUS,
    KafkaPrincipal,
    PrincipalMappingRules,
    Session,
    acting_as,
)
from metadata_quorum.security.scram import (
    PLAIN,
    ScramCredential,
    ScramMechanism,
    ScramServer,
    parse_plain,
    password_matches,
)
from metadata_quorum.security.tls import TlsSettings, grpc_peer_subject
from protos import auth_pb2 as apb
from protos import auth_pb2_grpc as apb_grpc
from raftlog.errors import ErrorCode, KafkaError

audit = logging.getLogger("raftlog.audit")

# The calls every client may make before it has a session: the service's full name comes from
# the generated descriptor, so a renamed or re-versioned package cannot leave it behind.
AUTHENTICATION_SERVICE = apb.DESCRIPTOR.services_by_name["AuthenticationService"].full_name
AUTH_SERVICE_PREFIX = f"/{AUTHENTICATION_SERVICE}/"
DEFAULT_SESSION_LIFETIME_MS = 3_600_000  # when connections.max.reauth.ms is 0
MAX_EXCHANGES = 1024  # SCRAM exchanges between their first and final message
EXCHANGE_TIMEOUT_S = 30.0  # an exchange whose final message does not come is dropped
MAX_SESSIONS = 100_000  # live session tokens on one listener

CredentialLookup = Callable[[str, ScramMechanism], ScramCredential | None]


@dataclass(frozen=True)
class _Exchange:
    server: ScramServer | None  # None: a RAFTLOG-NODE-CERT exchange, which sent `challenge`
    peer: str
    started_s: float
    challenge: bytes = b""


@dataclass(frozen=True)
class _Token:
    principal: KafkaPrincipal
    expires_s: float


def client_host(peer: str) -> str:
    """gRPC's peer (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``) → the host without its port."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer
    host = rest.rpartition(":")[0]
    return host.removeprefix("[").removesuffix("]") or peer


class GrpcAuthenticator:
    """The authentication of one gRPC listener. `credentials(user, mechanism)` reads the node's
    current metadata image. With `certificate_authorities` (the truststore's PEM) the listener
    also offers RAFTLOG-NODE-CERT (`node_cert`): clients prove a certificate in the exchange.
    `clock` (monotonic, token expiry) and `wall_clock` (certificate validity) are injected."""

    def __init__(
        self,
        listener: str,
        security_protocol: str,
        mechanisms: Sequence[str],
        reauth_ms: int,
        rules: PrincipalMappingRules,
        credentials: CredentialLookup,
        clock: Callable[[], float] = time.monotonic,
        certificate_authorities: bytes | None = None,
        wall_clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self.listener = listener
        self.security_protocol = security_protocol
        sasl = security_protocol in ("SASL_SSL", "SASL_PLAINTEXT")
        self.mechanisms = tuple(mechanisms) if sasl else ()
        self._authorities: list[x509.Certificate] = []
        if certificate_authorities is not None:
            self._authorities = x509.load_pem_x509_certificates(certificate_authorities)
            self.mechanisms += (NODE_CERT_MECHANISM,)
        self._wall_clock = wall_clock
        self.session_lifetime_ms = reauth_ms if reauth_ms > 0 else DEFAULT_SESSION_LIFETIME_MS
        self.rules = rules
        self._credentials = credentials
        self._clock = clock
        self._lock = threading.Lock()
        self._exchanges: OrderedDict[str, _Exchange] = OrderedDict()
        self._tokens: OrderedDict[str, _Token] = OrderedDict()

    # -- the Authentication service --------------------------------------------------------------
    def servicer(self) -> apb_grpc.AuthenticationServiceServicer:
        return _AuthenticationServicer(self)

    def interceptor(self) -> grpc.ServerInterceptor:
        return _SessionInterceptor(self)

    def handshake(self, mechanism: str) -> apb.SaslHandshakeResponse:
        error = ErrorCode.NONE if mechanism in self.mechanisms else _UNSUPPORTED
        return apb.SaslHandshakeResponse(error_code=error.code, mechanisms=list(self.mechanisms))

    def authenticate(
        self, request: apb.SaslAuthenticateRequest, peer: str
    ) -> apb.SaslAuthenticateResponse:
        user = ""
        try:
            if request.mechanism not in self.mechanisms:
                raise KafkaError(
                    _UNSUPPORTED,
                    f"{request.mechanism or 'no mechanism'} is not enabled on listener "
                    f"{self.listener}; enabled: {list(self.mechanisms)}",
                )
            if request.mechanism == PLAIN:
                user = parse_plain(request.auth_bytes)[0]
                return self._plain(request.auth_bytes)
            if not request.exchange_id:
                if request.mechanism == NODE_CERT_MECHANISM:
                    return self._node_cert_challenge(peer)
                return self._scram_first(request, peer)
            exchange = self._take_exchange(request.exchange_id)
            if exchange.server is None:
                user = node_cert.claimed_subject(request.auth_bytes)
                return self._node_cert_final(exchange, request)
            user = exchange.server.username or ""
            return self._scram_final(exchange, request)
        except KafkaError as error:
            audit.warning(
                "AUTHENTICATION FAILED user=%s host=%s listener=%s mechanism=%s reason=%s",
                user or "-", client_host(peer), self.listener, request.mechanism, error.message,
            )  # fmt: skip
            return apb.SaslAuthenticateResponse(
                error_code=error.error.code, error_message=error.message
            )

    def _plain(self, auth_bytes: bytes) -> apb.SaslAuthenticateResponse:
        user, password = parse_plain(auth_bytes)
        stored = [
            c
            for m in (ScramMechanism.SCRAM_SHA_512, ScramMechanism.SCRAM_SHA_256)
            if (c := self._credentials(user, m)) is not None
        ]
        if not stored or not password_matches(stored[0], password):
            raise KafkaError(
                ErrorCode.SASL_AUTHENTICATION_FAILED,
                f"authentication failed for {user!r}: bad credentials",
            )
        return self._issue(KafkaPrincipal.user(user), b"")

    def _scram_first(
        self, request: apb.SaslAuthenticateRequest, peer: str
    ) -> apb.SaslAuthenticateResponse:
        mechanism = ScramMechanism.from_name(request.mechanism)
        server = ScramServer(
            mechanism,
            lambda user: self._credentials(user, mechanism),
            secrets.token_urlsafe(18),
        )
        server_first = server.first(request.auth_bytes)
        exchange_id = self._remember(_Exchange(server, peer, self._clock()))
        return apb.SaslAuthenticateResponse(auth_bytes=server_first, exchange_id=exchange_id)

    def _node_cert_challenge(self, peer: str) -> apb.SaslAuthenticateResponse:
        challenge = node_cert.challenge(self.listener, secrets.token_urlsafe(24))
        exchange_id = self._remember(_Exchange(None, peer, self._clock(), challenge))
        return apb.SaslAuthenticateResponse(auth_bytes=challenge, exchange_id=exchange_id)

    def _node_cert_final(
        self, exchange: _Exchange, request: apb.SaslAuthenticateRequest
    ) -> apb.SaslAuthenticateResponse:
        if request.mechanism != NODE_CERT_MECHANISM:
            raise KafkaError(ErrorCode.ILLEGAL_SASL_STATE, "the mechanism changed mid-exchange")
        subject = node_cert.verify(
            request.auth_bytes, exchange.challenge, self._authorities, self._wall_clock()
        )
        try:
            principal = self.rules.principal_of(subject)
        except ValueError as error:
            raise KafkaError(ErrorCode.SASL_AUTHENTICATION_FAILED, str(error)) from None
        return self._issue(principal, b"")

    def _remember(self, exchange: _Exchange) -> str:
        exchange_id = secrets.token_urlsafe(16)
        with self._lock:
            self._expire_exchanges()
            while len(self._exchanges) >= MAX_EXCHANGES:
                self._exchanges.popitem(last=False)
            self._exchanges[exchange_id] = exchange
        return exchange_id

    def _take_exchange(self, exchange_id: str) -> _Exchange:
        with self._lock:
            self._expire_exchanges()
            exchange = self._exchanges.pop(exchange_id, None)
        if exchange is None:
            raise KafkaError(
                ErrorCode.ILLEGAL_SASL_STATE,
                "unknown or expired exchange_id: start the exchange again",
            )
        return exchange

    def _scram_final(
        self, exchange: _Exchange, request: apb.SaslAuthenticateRequest
    ) -> apb.SaslAuthenticateResponse:
        assert exchange.server is not None
        if request.mechanism != exchange.server.mechanism.mechanism_name:
            raise KafkaError(ErrorCode.ILLEGAL_SASL_STATE, "the mechanism changed mid-exchange")
        server_final = exchange.server.final(request.auth_bytes)
        assert exchange.server.complete and exchange.server.username is not None
        return self._issue(KafkaPrincipal.user(exchange.server.username), server_final)

    def _issue(self, principal: KafkaPrincipal, auth_bytes: bytes) -> apb.SaslAuthenticateResponse:
        token = secrets.token_urlsafe(32)
        now = self._clock()
        with self._lock:
            self._expire_tokens(now)
            while len(self._tokens) >= MAX_SESSIONS:
                self._tokens.popitem(last=False)
            expires = now + self.session_lifetime_ms / 1000
            self._tokens[token] = _Token(principal, expires)
        return apb.SaslAuthenticateResponse(
            auth_bytes=auth_bytes,
            session_token=token,
            session_lifetime_ms=self.session_lifetime_ms,
        )

    def _expire_exchanges(self) -> None:
        oldest = self._clock() - EXCHANGE_TIMEOUT_S
        while self._exchanges:
            first = next(iter(self._exchanges.values()))
            if first.started_s > oldest:
                break
            self._exchanges.popitem(last=False)

    def _expire_tokens(self, now: float) -> None:
        """Tokens are issued with one lifetime, so they expire in insertion order."""
        while self._tokens:
            first = next(iter(self._tokens.values()))
            if first.expires_s > now:
                break
            self._tokens.popitem(last=False)

    # -- the session of a call -------------------------------------------------------------------
    def session(self, context: grpc.ServicerContext) -> Session:
        """The call's Session, or abort it UNAUTHENTICATED (with an audit line)."""
        peer = context.peer()
        host = client_host(peer)
        token = _metadata_token(context.invocation_metadata())
        if token is not None:
            with self._lock:
                known = self._tokens.get(token)
            if known is not None and known.expires_s > self._clock():
                return Session(known.principal, host, self.listener)
            self._refuse(context, "-", host, "session token expired or unknown: authenticate again")
        subject = grpc_peer_subject(context)
        if subject is not None:
            try:
                return Session(self.rules.principal_of(subject), host, self.listener)
            except ValueError as error:
                self._refuse(context, subject, host, str(error))
        if self.security_protocol in ("SASL_SSL", "SASL_PLAINTEXT"):
            self._refuse(
                context,
                str(ANONYMOUS),
                host,
                f"listener {self.listener} is {self.security_protocol}: authenticate first "
                f"(SASL {'/'.join(self.mechanisms)} or a client certificate)",
            )
        return Session(ANONYMOUS, host, self.listener)

    def _refuse(self, context: grpc.ServicerContext, who: str, host: str, reason: str) -> None:
        audit.warning(
            "AUTHENTICATION FAILED user=%s host=%s listener=%s reason=%s",
            who, host, self.listener, reason,
        )  # fmt: skip
        abort(context, KafkaError(ErrorCode.SASL_AUTHENTICATION_FAILED, reason))


_UNSUPPORTED = ErrorCode.UNSUPPORTED_SASL_MECHANISM


def _metadata_token(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    for key, value in metadata or ():
        if key == SESSION_TOKEN_KEY:
            return value if isinstance(value, str) else bytes(value).decode()
    return None


class _AuthenticationServicer(apb_grpc.AuthenticationServiceServicer):
    def __init__(self, authenticator: GrpcAuthenticator) -> None:
        self._authenticator = authenticator

    def SaslHandshake(
        self, request: apb.SaslHandshakeRequest, context: grpc.ServicerContext
    ) -> apb.SaslHandshakeResponse:
        return self._authenticator.handshake(request.mechanism)

    def SaslAuthenticate(
        self, request: apb.SaslAuthenticateRequest, context: grpc.ServicerContext
    ) -> apb.SaslAuthenticateResponse:
        return self._authenticator.authenticate(request, context.peer())


class _SessionInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Runs every call but the Authentication service's inside ``acting_as(session)``.
    `intercept_service` sees no context, so it wraps the handler's behaviour instead. Health
    and reflection pass unauthenticated (metadata_quorum.grpc_standard: a probe has no
    credentials) and unwrapped (Watch must stay a non-blocking handler)."""

    def __init__(self, authenticator: GrpcAuthenticator) -> None:
        self._authenticator = authenticator

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = continuation(details)
        if (
            handler is None
            or details.method.startswith(AUTH_SERVICE_PREFIX)
            or is_standard_method(details.method)
        ):
            return handler
        session_of = self._authenticator.session
        serialization = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _single(handler.unary_unary, session_of), **serialization
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                _single(handler.stream_unary, session_of), **serialization
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _streaming(handler.unary_stream, session_of), **serialization
            )
        return grpc.stream_stream_rpc_method_handler(
            _streaming(handler.stream_stream, session_of), **serialization
        )


SessionOf = Callable[[grpc.ServicerContext], Session]


def _single(behaviour: Callable[[Any, Any], Any], session_of: SessionOf) -> Callable[..., Any]:
    def run(request: Any, context: grpc.ServicerContext) -> Any:
        session = session_of(context)
        with acting_as(session):
            return behaviour(request, context)

    return run


def _streaming(
    behaviour: Callable[[Any, Any], Iterable[Any]], session_of: SessionOf
) -> Callable[..., Iterator[Any]]:
    def run(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        session = session_of(context)
        with acting_as(session):
            responses = iter(behaviour(request, context))
        while True:
            with acting_as(session):  # each step of the handler's generator runs as the session
                try:
                    response = next(responses)
                except StopIteration:
                    return
            yield response

    return run


@dataclass(frozen=True)
class ServerSecurity:
    """What a gRPC server of a listener needs: TLS (None on a PLAINTEXT listener) and the
    listener's authenticator (its interceptor and the Authentication service)."""

    tls: TlsSettings | None
    authenticator: GrpcAuthenticator

    def interceptors(self) -> list[grpc.ServerInterceptor]:
        return [self.authenticator.interceptor()]

    def add_port(self, server: grpc.Server, address: str) -> int:
        """Serve the Authentication service and listen on `address`; 0 when it cannot."""
        apb_grpc.add_AuthenticationServiceServicer_to_server(self.authenticator.servicer(), server)
        if self.tls is None:
            return int(server.add_insecure_port(address))
        return int(server.add_secure_port(address, self.tls.grpc_server_credentials()))
