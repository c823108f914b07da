"""The KAFKA listener's security: TLS on each connection, then SASL, as Kafka's
SaslServerAuthenticator and SslTransportLayer do.

`ConnectionAuthenticator` is one connection's authentication as a state machine with no IO (h11's
style): it is fed each parsed request with the time and answers what to do with it: `SERVE` it
(as `authenticator.session`), answer it itself (`Answer`: a SaslHandshake or SaslAuthenticate
response, perhaps the last before the connection closes), or `Close` the connection without an
answer. Kafka's rules:

- Before authentication only ApiVersions (once, first), SaslHandshake and SaslAuthenticate
  are served; anything else closes the connection ("unexpected request during SASL handshake").
  After SaslHandshake v0 (legacy, before KIP-152) the exchange's tokens come as raw frames, not
  SaslAuthenticate requests (`receive_token`), and a failure closes without an answer. Kafka
  still advertises v0, and librdkafka before 2.1 takes SASL as unsupported without it.
- SaslHandshake naming a mechanism not in ``sasl.enabled.mechanisms`` is answered
  UNSUPPORTED_SASL_MECHANISM with the enabled list, then the connection closes.
- PLAIN checks the password against the user's stored SCRAM credential (either mechanism);
  SCRAM-SHA-256/512 run `ScramServer`'s two rounds. A failure is answered
  SASL_AUTHENTICATION_FAILED with a message, then the connection closes; an unknown user fails
  exactly as a wrong password does.
- KIP-368: with ``connections.max.reauth.ms`` set, a successful SaslAuthenticate (v1+) tells the
  client its session lifetime. Once it has passed, any request other than a re-authentication
  (SaslHandshake, then SaslAuthenticate) closes the connection; a re-authentication must keep
  the mechanism and the principal. A client on SaslAuthenticate v0 does not learn the lifetime
  and is closed at its first request after it, as Kafka closes it.
- Without SASL (PLAINTEXT, SSL) the connection is authenticated from the start, as the
  verified client certificate's subject (mapped by ``ssl.principal.mapping.rules``) or
  ANONYMOUS; SaslHandshake and SaslAuthenticate are answered ILLEGAL_SASL_STATE.

The IO shell (`tls_accept`, `principal_of_certificate`, `audit_failure`) is used by
dataplane/kafka/listener.py on the connection's own thread: a client that never finishes its TLS
handshake or its authentication costs only its own connection.
"""

from __future__ import annotations

import enum
import logging
import secrets
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

from dataplane.kafka import codec as kc
from metadata_quorum.security.principal import (
    ANONYMOUS,
    KafkaPrincipal,
    PrincipalMappingRules,
    Session,
)
from metadata_quorum.security.scram import (
    PLAIN,
    ScramCredential,
    ScramMechanism,
    ScramServer,
    parse_plain,
    password_matches,
)
from metadata_quorum.security.tls import TlsSettings, socket_peer_subject
from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)
audit = logging.getLogger("raftlog.audit")
LISTENER = "KAFKA"
PROTOCOLS = frozenset({"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"})
MECHANISMS = frozenset({PLAIN, "SCRAM-SHA-256", "SCRAM-SHA-512"})
# Kafka's KafkaChannel.MIN_REAUTH_INTERVAL_ONE_SECOND_NANOS: a re-authentication started sooner
# after the last one is refused (answered ILLEGAL_SASL_STATE, as an unexpected SaslHandshake)
MIN_REAUTH_INTERVAL_MS = 1000
# A client has this long to finish its TLS handshake, and then its SASL authentication (each
# read waits at most this long): one that stalls is closed, costing only its own thread.
TLS_HANDSHAKE_TIMEOUT_S = 10.0
AUTHENTICATION_READ_TIMEOUT_S = 30.0

CredentialLookup = Callable[[str, ScramMechanism], ScramCredential | None]


@dataclass(frozen=True)
class KafkaListenerSecurity:
    """The KAFKA listener's security settings (from the node's configuration): its protocol in
    ``listener.security.protocol.map``, TLS (SSL, SASL_SSL), ``sasl.enabled.mechanisms``,
    ``connections.max.reauth.ms`` (0: sessions do not expire), ``ssl.principal.mapping.rules``
    and where SCRAM credentials are read (None: the broker's metadata image)."""

    protocol: str = "PLAINTEXT"
    tls: TlsSettings | None = None
    mechanisms: tuple[str, ...] = ("SCRAM-SHA-256", "SCRAM-SHA-512")
    reauth_ms: int = 0
    mapping_rules: PrincipalMappingRules = field(default_factory=PrincipalMappingRules)
    credentials: CredentialLookup | None = None

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"security protocol {self.protocol!r}: one of {sorted(PROTOCOLS)}")
        if self.uses_tls and self.tls is None:
            raise ValueError(f"{self.protocol} needs TLS settings (ssl.keystore.location ...)")
        if self.uses_sasl and (not self.mechanisms or not set(self.mechanisms) <= MECHANISMS):
            raise ValueError(f"sasl.enabled.mechanisms {self.mechanisms}: some of {MECHANISMS}")
        if self.reauth_ms < 0:
            raise ValueError("connections.max.reauth.ms must be >= 0")

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol.startswith("SASL_")


PLAINTEXT = KafkaListenerSecurity()


# -- the state machine ---------------------------------------------------------------------------
class SaslState(enum.Enum):
    HANDSHAKE_OR_VERSIONS = "handshake_or_versions"  # a new SASL connection
    HANDSHAKE = "handshake"  # ApiVersions answered: SaslHandshake next
    AUTHENTICATE = "authenticate"  # the mechanism chosen: SaslAuthenticate rounds
    AUTHENTICATED = "authenticated"  # requests are served as `session`
    REAUTHENTICATE = "reauthenticate"  # KIP-368: SaslAuthenticate rounds again
    CLOSED = "closed"


_TRANSITIONS: dict[SaslState, frozenset[SaslState]] = {
    SaslState.HANDSHAKE_OR_VERSIONS: frozenset(
        {SaslState.HANDSHAKE, SaslState.AUTHENTICATE, SaslState.CLOSED}
    ),
    SaslState.HANDSHAKE: frozenset({SaslState.AUTHENTICATE, SaslState.CLOSED}),
    SaslState.AUTHENTICATE: frozenset({SaslState.AUTHENTICATED, SaslState.CLOSED}),
    SaslState.AUTHENTICATED: frozenset({SaslState.REAUTHENTICATE, SaslState.CLOSED}),
    SaslState.REAUTHENTICATE: frozenset({SaslState.AUTHENTICATED, SaslState.CLOSED}),
    SaslState.CLOSED: frozenset(),
}


@dataclass(frozen=True)
class AuthenticationFailure:
    """A failed authentication, for the audit log."""

    client_host: str
    mechanism: str
    user: str | None
    reason: str


@dataclass(frozen=True)
class Serve:
    """Hand the request to the listener's handlers, as the authenticator's session."""


SERVE = Serve()


@dataclass(frozen=True)
class Answer:
    """Answer the request with `data` (its API's response); `close`: then close the connection.
    `failure`: an authentication failed (write it to the audit log)."""

    data: kc.Data
    close: bool = False
    failure: AuthenticationFailure | None = None


@dataclass(frozen=True)
class RawToken:
    """SaslHandshake v0: write `token` as a bare size-prefixed frame."""

    token: bytes


@dataclass(frozen=True)
class _Failed:
    error: ErrorCode
    message: str
    user: str | None


@dataclass(frozen=True)
class Close:
    """Close the connection without an answer."""

    reason: str
    failure: AuthenticationFailure | None = None


Step = Serve | Answer | RawToken | Close


def _new_nonce() -> str:
    """Letters and digits only, as Kafka's ScramFormatter makes them (librdkafka 2.0 misreads a
    nonce with punctuation)."""
    return secrets.token_hex(16)


class ConnectionAuthenticator:
    """One connection's authentication (see the module's docstring). `receive` is the only
    entry; the clock is the caller's (`now_ms`, monotonic), the nonce source injectable."""

    def __init__(
        self,
        security: KafkaListenerSecurity,
        credentials: CredentialLookup,
        client_host: str,
        principal: KafkaPrincipal = ANONYMOUS,
        nonce: Callable[[], str] = _new_nonce,
    ) -> None:
        self._security = security
        self._credentials = credentials
        self._nonce = nonce
        self.client_host = client_host
        self.principal = principal  # until SASL succeeds: ANONYMOUS (nothing is served as it)
        self.state = (
            SaslState.HANDSHAKE_OR_VERSIONS if security.uses_sasl else SaslState.AUTHENTICATED
        )
        self.mechanism: str | None = None
        self._scram: ScramServer | None = None
        self._expiry_ms: int | None = None  # KIP-368: the session's end (None: never)
        self._reauth_started_ms: int | None = None
        self._raw_tokens = False  # SaslHandshake v0: tokens without SaslAuthenticate framing

    @property
    def session(self) -> Session:
        return Session(self.principal, self.client_host, LISTENER)

    @property
    def authenticated(self) -> bool:
        return self.state is SaslState.AUTHENTICATED

    @property
    def session_expiry_ms(self) -> int | None:
        return self._expiry_ms

    @property
    def expects_raw_token(self) -> bool:
        """The next frame is a bare SASL token (after SaslHandshake v0), not a request."""
        authenticating = self.state in (SaslState.AUTHENTICATE, SaslState.REAUTHENTICATE)
        return authenticating and self._raw_tokens

    def _transition_to(self, state: SaslState) -> None:
        if state not in _TRANSITIONS[self.state]:
            raise AssertionError(f"SASL state {self.state.name} cannot move to {state.name}")
        self.state = state

    def receive(self, request: kc.Request, now_ms: int) -> Step:
        """What to do with the connection's next request."""
        key = request.api_key
        if self.state is SaslState.CLOSED:
            return Close("the connection is closed")
        if self.state is SaslState.AUTHENTICATED:
            return self._authenticated(request, now_ms)
        if self.state is SaslState.HANDSHAKE_OR_VERSIONS and key == kc.API_VERSIONS:
            self._transition_to(SaslState.HANDSHAKE)
            return SERVE
        if self.state in (SaslState.HANDSHAKE_OR_VERSIONS, SaslState.HANDSHAKE):
            if key == kc.API_SASL_HANDSHAKE:
                return self._handshake(request, SaslState.AUTHENTICATE)
        elif key == kc.API_SASL_AUTHENTICATE:  # AUTHENTICATE, REAUTHENTICATE
            return self._authenticate(request, now_ms)
        self._transition_to(SaslState.CLOSED)
        return Close(f"unexpected request (api key {key}) during SASL handshake")

    def _authenticated(self, request: kc.Request, now_ms: int) -> Step:
        key = request.api_key
        if key == kc.API_SASL_HANDSHAKE and self._may_reauthenticate(now_ms):
            self._reauth_started_ms = now_ms
            return self._handshake(request, SaslState.REAUTHENTICATE)
        if self._expiry_ms is not None and now_ms > self._expiry_ms:
            self._transition_to(SaslState.CLOSED)
            return Close(
                f"the session of {self.principal} expired {now_ms - self._expiry_ms} ms ago "
                "(connections.max.reauth.ms) and the client did not re-authenticate"
            )
        if key == kc.API_SASL_HANDSHAKE:
            return Answer({"error_code": ErrorCode.ILLEGAL_SASL_STATE.code, "mechanisms": []})
        if key == kc.API_SASL_AUTHENTICATE:
            return Answer(_authenticate_response(
                ErrorCode.ILLEGAL_SASL_STATE,
                "SaslAuthenticate request received after successful authentication",
            ))  # fmt: skip
        return SERVE

    def _may_reauthenticate(self, now_ms: int) -> bool:
        return self._expiry_ms is not None and (
            self._reauth_started_ms is None
            or now_ms - self._reauth_started_ms >= MIN_REAUTH_INTERVAL_MS
        )

    def _handshake(self, request: kc.Request, next_state: SaslState) -> Step:
        mechanism = str(request.body.mechanism)
        enabled = list(self._security.mechanisms)
        reauthenticating = next_state is SaslState.REAUTHENTICATE
        if mechanism not in enabled or (reauthenticating and mechanism != self.mechanism):
            reason = (
                f"SASL mechanism change from {self.mechanism} to {mechanism} during "
                "re-authentication is not allowed"
                if mechanism in enabled
                else f"unsupported SASL mechanism {mechanism!r}"
            )
            self._transition_to(SaslState.CLOSED)
            return Answer(
                {"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM.code, "mechanisms": enabled},
                close=True,
                failure=self._failure(mechanism, None, reason),
            )
        self.mechanism = mechanism
        self._raw_tokens = request.api_version == 0
        self._scram = None
        if mechanism != PLAIN:
            scram = ScramMechanism.from_name(mechanism)
            self._scram = ScramServer(
                scram, lambda user: self._credentials(user, scram), self._nonce()
            )
        self._transition_to(next_state)
        return Answer({"error_code": ErrorCode.NONE.code, "mechanisms": enabled})

    def _authenticate(self, request: kc.Request, now_ms: int) -> Step:
        outcome = self._exchange(bytes(request.body.auth_bytes or b""), now_ms)
        if isinstance(outcome, _Failed):
            return self._fail(outcome)
        reply, lifetime_ms = outcome
        return Answer(_authenticate_response(ErrorCode.NONE, None, reply, lifetime_ms))

    def receive_token(self, token: bytes, now_ms: int) -> Step:
        """A bare SASL token after SaslHandshake v0: the reply to write as a bare frame, or
        Close (Kafka answers nothing to a failed legacy exchange)."""
        assert self.expects_raw_token, "a raw SASL token outside a SaslHandshake v0 exchange"
        outcome = self._exchange(token, now_ms)
        if isinstance(outcome, _Failed):
            failed = self._fail(outcome)
            return Close(outcome.message, failed.failure)
        return RawToken(outcome[0])

    def _exchange(self, token: bytes, now_ms: int) -> tuple[bytes, int] | _Failed:
        """One token of the exchange: (the reply, the session lifetime once authenticated)."""
        assert self.mechanism is not None, "SaslAuthenticate state without a mechanism"
        user: str | None = None
        try:
            if self._scram is None:
                user, password = parse_plain(token)
                if not self._plain_matches(user, password):
                    raise KafkaError(
                        ErrorCode.SASL_AUTHENTICATION_FAILED,
                        f"authentication failed for {user!r}: bad credentials",
                    )
                reply = b""
            elif self._scram.username is None:
                return self._scram.first(token), 0
            else:
                user = self._scram.username
                reply = self._scram.final(token)
        except KafkaError as error:
            if user is None and self._scram is not None:
                user = self._scram.username
            return _Failed(error.error, error.message, user)
        principal = KafkaPrincipal.user(user)
        if self.state is SaslState.REAUTHENTICATE and principal != self.principal:
            return _Failed(
                ErrorCode.SASL_AUTHENTICATION_FAILED,
                f"cannot change principals during re-authentication from {self.principal} "
                f"to {principal}",
                user,
            )
        self.principal = principal
        lifetime_ms = self._security.reauth_ms
        self._expiry_ms = now_ms + lifetime_ms if lifetime_ms > 0 else None
        self._transition_to(SaslState.AUTHENTICATED)
        return reply, lifetime_ms

    def _plain_matches(self, user: str, password: str) -> bool:
        stored = (
            self._credentials(user, mechanism)
            for mechanism in (ScramMechanism.SCRAM_SHA_512, ScramMechanism.SCRAM_SHA_256)
        )
        return any(c is not None and password_matches(c, password) for c in stored)

    def _fail(self, failed: _Failed) -> Answer:
        self._transition_to(SaslState.CLOSED)
        mechanism = self.mechanism or ""
        message = f"Authentication failed with SASL mechanism {mechanism}: {failed.message}"
        return Answer(
            _authenticate_response(failed.error, message),
            close=True,
            failure=self._failure(mechanism, failed.user, failed.message),
        )

    def _failure(self, mechanism: str, user: str | None, reason: str) -> AuthenticationFailure:
        return AuthenticationFailure(self.client_host, mechanism, user, reason)


def _authenticate_response(
    error: ErrorCode, message: str | None, auth_bytes: bytes = b"", lifetime_ms: int = 0
) -> kc.Data:
    return {
        "error_code": error.code,
        "error_message": message,
        "auth_bytes": auth_bytes,
        "session_lifetime": lifetime_ms,
    }


# -- the IO shell --------------------------------------------------------------------------------
class ClosingAnswer(kc.FrameError):
    """The last answer on a connection (a failed authentication, an unsupported mechanism): the
    listener writes it, then closes the connection, as Kafka does."""

    def __init__(self, answer: bytes, reason: str) -> None:
        super().__init__(reason)
        self.answer = answer


class CertificateRefused(ConnectionError):
    """A verified client certificate whose subject no ``ssl.principal.mapping.rules`` maps."""


def tls_accept(
    connection: socket.socket, context: ssl.SSLContext, timeout_s: float = TLS_HANDSHAKE_TIMEOUT_S
) -> ssl.SSLSocket:
    """The server side of the TLS handshake on an accepted socket, within `timeout_s`: a client
    that sends plaintext, garbage or an untrusted certificate, or stalls, raises ssl.SSLError or
    TimeoutError (both OSError), and its socket is closed here. The returned socket blocks again
    (the caller sets its own read deadlines)."""
    connection.settimeout(timeout_s)
    secured = context.wrap_socket(connection, server_side=True, do_handshake_on_connect=False)
    try:
        secured.do_handshake()
    except BaseException:
        secured.close()
        raise
    secured.settimeout(None)
    return secured


def principal_of_certificate(
    connection: ssl.SSLSocket, rules: PrincipalMappingRules
) -> KafkaPrincipal:
    """The verified client certificate's principal, ANONYMOUS without a certificate (client
    auth none or requested); CertificateRefused when no mapping rule matches its subject."""
    subject = socket_peer_subject(connection)
    if subject is None:
        return ANONYMOUS
    try:
        return rules.principal_of(subject)
    except ValueError as error:
        raise CertificateRefused(str(error)) from None


def audit_failure(failure: AuthenticationFailure) -> None:
    """One line per failed authentication on the ``raftlog.audit`` logger."""
    audit.warning(
        "AUTHENTICATION_FAILED address=%s listener=%s mechanism=%s user=%s reason=%s",
        failure.client_host, LISTENER, failure.mechanism or "-",
        "-" if failure.user is None else repr(failure.user), failure.reason,
    )  # fmt: skip
