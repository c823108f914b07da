"""Our clients' side of security: `ClientSecurity` (librdkafka's property names) and
`open_channel`, the one place a raftlog gRPC channel is made.

PLAINTEXT is today's insecure channel. SSL and SASL_SSL wrap it in TLS; the server's certificate
must chain to ``ssl.ca.location`` and name the address dialled (an IP SAN for an IP address).
gRPC always checks that name: ``ssl.endpoint.identification.algorithm=none`` is accepted for
compatibility with librdkafka configurations but does not turn the check off for gRPC (it does
for the KAFKA listener's Python ``ssl`` clients). Give nodes certificates that carry their
addresses instead (`dataplane.tools.certificates.make_cert` does).

SASL_* adds authentication per call: before the first call the channel runs a SCRAM (or PLAIN)
exchange over the Authentication service on the same connection, receives a session token and
sends it with every call as the metadata ``raftlog-session-token``. It exchanges again before the
token expires (at 90 % of ``session_lifetime_ms``, as Kafka clients re-authenticate, KIP-368) and
after a call is answered UNAUTHENTICATED (the server restarted, or forgot the token). A failed
exchange raises KafkaError(SASL_AUTHENTICATION_FAILED) to the caller: not retriable.

``sasl.mechanism=RAFTLOG-NODE-CERT`` (raftlog's own, gRPC listeners only; see
`metadata_quorum.security.node_cert`) authenticates with the client's certificate instead of a
password: the exchange proves the keystore's key by signing the server's challenge. Nodes use it
on SASL_SSL gRPC listeners, and on SSL ones whose ``ssl.client.auth`` is ``requested``, because
grpcio cannot ask for an optional certificate in the TLS handshake. It runs over SSL too.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import grpc
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from metadata_quorum.security import node_cert
from metadata_quorum.security.node_cert import NODE_CERT_MECHANISM
from metadata_quorum.security.scram import (
    PLAIN,
    ScramClient,
    ScramMechanism,
    plain_message,
)
from metadata_quorum.security.tls import TlsError, TlsSettings, _blocks, _decrypt_key, _read
from protos import CHANNEL_OPTIONS
from protos import auth_pb2 as apb
from protos import auth_pb2_grpc as apb_grpc
from raftlog.errors import ErrorCode, KafkaError

SESSION_TOKEN_KEY = "raftlog-session-token"
AUTH_TIMEOUT_S = 30.0  # deadline of each Authentication call
REAUTH_FRACTION = 0.9  # exchange again when this share of the token's lifetime has passed

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN", "RAFTLOG-NODE-CERT"]

# librdkafka's names → fields, plus Java's PEM store names
_PROPERTY_FIELDS = {
    "security.protocol": "security_protocol",
    "ssl.ca.location": "ssl_ca_location",
    "ssl.truststore.location": "ssl_ca_location",
    "ssl.certificate.location": "ssl_certificate_location",
    "ssl.key.location": "ssl_key_location",
    "ssl.key.password": "ssl_key_password",
    "ssl.endpoint.identification.algorithm": "ssl_endpoint_identification_algorithm",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",  # librdkafka's older spelling
    "sasl.username": "sasl_username",
    "sasl.password": "sasl_password",
}
_IGNORED_PROPERTIES = frozenset({"ssl.truststore.type", "ssl.keystore.type"})
_JAAS = re.compile(
    r"^\s*org\.apache\.kafka\.common\.security\.(scram\.ScramLoginModule|plain\.PlainLoginModule)"
    r"\s+required\b(?P<options>.*?);?\s*$",
    re.DOTALL,
)
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


class ClientSecurity(BaseModel):
    """How a client reaches a secure listener; field names are librdkafka's with underscores."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    security_protocol: SecurityProtocol = "PLAINTEXT"
    ssl_ca_location: Path | None = None
    ssl_certificate_location: Path | None = None
    ssl_key_location: Path | None = None
    ssl_key_password: str | None = Field(None, min_length=1)
    ssl_endpoint_identification_algorithm: Literal["https", "none"] = "https"
    sasl_mechanism: SaslMechanism = "SCRAM-SHA-512"
    sasl_username: str | None = Field(None, min_length=1)
    sasl_password: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _complete(self) -> ClientSecurity:
        if self.uses_tls and self.ssl_ca_location is None:
            raise ValueError(
                f"security.protocol {self.security_protocol} needs ssl.ca.location "
                "(the CA certificates that sign the brokers' certificates)"
            )
        if self.sasl_mechanism == NODE_CERT_MECHANISM:
            if not self.uses_tls or self.ssl_certificate_location is None:
                raise ValueError(
                    f"sasl.mechanism {NODE_CERT_MECHANISM} needs security.protocol SSL or "
                    "SASL_SSL and ssl.certificate.location (the certificate it proves)"
                )
        elif self.uses_sasl and (self.sasl_username is None or self.sasl_password is None):
            raise ValueError(
                f"security.protocol {self.security_protocol} needs sasl.username and sasl.password"
            )
        if (self.ssl_certificate_location is None) != (self.ssl_key_location is None):
            raise ValueError(
                "ssl.certificate.location and ssl.key.location go together (they may name the "
                "same PEM keystore)"
            )
        return self

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def exchanges(self) -> bool:
        """Whether calls carry a session token from an Authentication exchange."""
        return self.uses_sasl or (self.uses_tls and self.sasl_mechanism == NODE_CERT_MECHANISM)

    @classmethod
    def from_properties(cls, properties: Mapping[str, Any]) -> ClientSecurity:
        """From dotted client properties (librdkafka's, or Java's PEM ``ssl.truststore.location``
        / ``ssl.keystore.location`` and ``sasl.jaas.config``). Keys outside security are ignored,
        so a whole client configuration may be passed; an unknown ``ssl.``/``sasl.`` key is an
        error naming it. ValueError explains what is wrong."""
        fields: dict[str, Any] = {}
        for key, value in properties.items():
            if key in _PROPERTY_FIELDS:
                fields[_PROPERTY_FIELDS[key]] = value
            elif key == "ssl.keystore.location":
                fields["ssl_certificate_location"] = value
                fields["ssl_key_location"] = value
            elif key == "sasl.jaas.config":
                mechanism, username, password = _parse_jaas(str(value))
                fields.setdefault("sasl_username", username)
                fields.setdefault("sasl_password", password)
                if mechanism == PLAIN:
                    fields.setdefault("sasl_mechanism", PLAIN)
            elif key in _IGNORED_PROPERTIES and str(value).upper() == "PEM":
                continue
            elif key.startswith(("ssl.", "sasl.")) or key == "security.protocol":
                raise ValueError(f"{key}: not a supported client security property")
        if isinstance(fields.get("security_protocol"), str):
            fields["security_protocol"] = fields["security_protocol"].upper()
        if isinstance(fields.get("sasl_mechanism"), str):
            fields["sasl_mechanism"] = fields["sasl_mechanism"].upper()
        try:
            return cls(**fields)
        except ValidationError as error:
            raise ValueError(_describe(error)) from None

    def tls_settings(self) -> TlsSettings:
        """The TLS side as `TlsSettings` (for Python ``ssl`` clients, whose ``load_cert_chain``
        reads the key from the keystore file; a separate key file is read by `grpc_credentials`)."""
        return TlsSettings(
            self.ssl_certificate_location, self.ssl_ca_location, self.ssl_key_password
        )

    def grpc_credentials(self) -> grpc.ChannelCredentials:
        """gRPC's TLS credentials: the truststore, and the client's certificate when it has one.
        The certificate and key may be one PEM keystore or two files (librdkafka's layout)."""
        settings = self.tls_settings()
        if self.ssl_certificate_location is None:
            return settings.grpc_channel_credentials()
        key, chain = self.key_and_chain()
        return grpc.ssl_channel_credentials(
            root_certificates=settings.trusted(), private_key=key, certificate_chain=chain
        )

    def key_and_chain(self) -> tuple[bytes, bytes]:
        """(unencrypted private key PEM, certificate chain PEM) from one PEM keystore or from
        ssl.key.location and ssl.certificate.location."""
        key_file, certificate_file = self.ssl_key_location, self.ssl_certificate_location
        if key_file is None or certificate_file is None:
            raise TlsError("no client certificate: ssl.certificate.location is needed")
        if key_file == certificate_file:
            return self.tls_settings().key_and_chain()
        key = _blocks(_read(key_file, "ssl.key.location"), "PRIVATE KEY")
        chain = _blocks(_read(certificate_file, "ssl.certificate.location"), "CERTIFICATE")
        if not key or not chain:
            raise TlsError(
                f"ssl.key.location {key_file} needs a private key and ssl.certificate.location "
                f"{certificate_file} a certificate"
            )
        if self.ssl_key_password is not None:
            key = _decrypt_key(key, self.ssl_key_password)
        return key, chain


def _describe(error: ValidationError) -> str:
    reverse = {field: key for key, field in _PROPERTY_FIELDS.items()}
    parts = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        parts.append(f"{reverse.get(where, where)}: {message}" if where else message)
    return "; ".join(parts)


def _parse_jaas(text: str) -> tuple[str, str, str]:
    """``sasl.jaas.config`` of Scram/PlainLoginModule → (mechanism family, username, password)."""
    match = _JAAS.match(text)
    if match is None:
        raise ValueError(
            "sasl.jaas.config: expected org.apache.kafka.common.security.scram.ScramLoginModule "
            'or ...plain.PlainLoginModule required username="..." password="...";'
        )
    options = {k: re.sub(r"\\(.)", r"\1", v) for k, v in _JAAS_OPTION.findall(match["options"])}
    if "username" not in options or "password" not in options:
        raise ValueError('sasl.jaas.config: needs username="..." and password="..."')
    family = PLAIN if match.group(1).startswith("plain") else "SCRAM"
    return family, options["username"], options["password"]


# -- channels -------------------------------------------------------------------------------------
def open_channel(
    address: str,
    security: ClientSecurity | None,
    options: Sequence[tuple[str, Any]] = CHANNEL_OPTIONS,
) -> grpc.Channel:
    """A channel to a BROKER or CONTROLLER listener at ``host:port`` secured as `security` says
    (None or PLAINTEXT: insecure), with raftlog's channel options unless told otherwise
    (``protos.CHANNEL_OPTIONS``: messages up to 128 MiB, a reconnect within a second)."""
    if security is None or security.security_protocol == "PLAINTEXT":
        return grpc.insecure_channel(address, options=list(options))
    if security.uses_tls:
        credentials = security.grpc_credentials()
        channel = grpc.secure_channel(address, credentials, options=list(options))
    else:
        channel = grpc.insecure_channel(address, options=list(options))
    if not security.exchanges:
        return channel
    session = SaslSession(channel, security)
    return grpc.intercept_channel(channel, _TokenInterceptor(session))


class SaslSession:
    """The session token of one channel: obtained by a SASL exchange on first use, renewed before
    it expires or when the server no longer knows it. Thread-safe: one exchange at a time, and
    callers waiting meanwhile use its result."""

    def __init__(
        self,
        channel: grpc.Channel,
        security: ClientSecurity,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stub = apb_grpc.AuthenticationServiceStub(channel)
        self._security = security
        self._clock = clock
        self._lock = threading.Lock()
        self._token: str | None = None
        self._renew_at = 0.0

    def token(self, timeout_s: float | None = None) -> str:
        with self._lock:
            if self._token is None or self._clock() >= self._renew_at:
                self._authenticate(min(timeout_s or AUTH_TIMEOUT_S, AUTH_TIMEOUT_S))
            assert self._token is not None
            return self._token

    def forget(self, token: str) -> None:
        """The server refused `token`: the next call exchanges again."""
        with self._lock:
            if self._token == token:
                self._token = None

    def _authenticate(self, timeout_s: float) -> None:
        security = self._security
        mechanism = security.sasl_mechanism
        handshake = self._stub.SaslHandshake(
            apb.SaslHandshakeRequest(mechanism=mechanism), timeout=timeout_s
        )
        if handshake.error_code:
            raise KafkaError(
                ErrorCode.from_code(handshake.error_code),
                f"the server does not enable {mechanism}; it enables {list(handshake.mechanisms)}",
            )
        if mechanism == NODE_CERT_MECHANISM:
            key, chain = security.key_and_chain()
            challenge = self._send(mechanism, "", b"", timeout_s)
            message = node_cert.answer(challenge.auth_bytes, chain, key)
            answer = self._send(mechanism, challenge.exchange_id, message, timeout_s)
        elif mechanism == PLAIN:
            assert security.sasl_username is not None and security.sasl_password is not None
            message = plain_message(security.sasl_username, security.sasl_password)
            answer = self._send(mechanism, "", message, timeout_s)
        else:
            assert security.sasl_username is not None and security.sasl_password is not None
            client = ScramClient(
                ScramMechanism.from_name(mechanism),
                security.sasl_username,
                security.sasl_password,
                secrets.token_urlsafe(24),
            )
            first = self._send(mechanism, "", client.first(), timeout_s)
            answer = self._send(
                mechanism, first.exchange_id, client.final(first.auth_bytes), timeout_s
            )
            client.verify(answer.auth_bytes)
        if not answer.session_token:
            raise KafkaError(ErrorCode.ILLEGAL_SASL_STATE, "the exchange ended without a token")
        started = self._clock()
        self._token = answer.session_token
        self._renew_at = started + answer.session_lifetime_ms / 1000 * REAUTH_FRACTION

    def _send(
        self, mechanism: str, exchange_id: str, auth_bytes: bytes, timeout_s: float
    ) -> apb.SaslAuthenticateResponse:
        response: apb.SaslAuthenticateResponse = self._stub.SaslAuthenticate(
            apb.SaslAuthenticateRequest(
                mechanism=mechanism, exchange_id=exchange_id, auth_bytes=auth_bytes
            ),
            timeout=timeout_s,
        )
        if response.error_code:
            raise KafkaError(ErrorCode.from_code(response.error_code), response.error_message)
        return response


class _CallDetails(grpc.ClientCallDetails):  # type: ignore[misc]
    def __init__(self, details: grpc.ClientCallDetails, metadata: list[tuple[str, str]]) -> None:
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = metadata
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)


class _TokenInterceptor(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[misc]
    grpc.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    """Adds the session token to every call; an UNAUTHENTICATED answer drops the token (a unary
    call that was answered at once is retried once with a fresh one)."""

    def __init__(self, session: SaslSession) -> None:
        self._session = session

    def _details(self, details: grpc.ClientCallDetails) -> tuple[_CallDetails, str]:
        token = self._session.token(details.timeout)
        metadata = [(k, v) for k, v in (details.metadata or ()) if k != SESSION_TOKEN_KEY]
        metadata.append((SESSION_TOKEN_KEY, token))
        return _CallDetails(details, metadata), token

    def _watch(self, call: Any, token: str) -> Any:
        def done(finished: Any) -> None:
            if finished.code() == grpc.StatusCode.UNAUTHENTICATED:
                self._session.forget(token)

        call.add_done_callback(done)
        return call

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        call_details, token = self._details(details)
        outcome = continuation(call_details, request)
        if outcome.done() and outcome.code() == grpc.StatusCode.UNAUTHENTICATED:
            self._session.forget(token)
            call_details, token = self._details(details)
            outcome = continuation(call_details, request)
        return self._watch(outcome, token)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        call_details, token = self._details(details)
        return self._watch(continuation(call_details, request), token)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        call_details, token = self._details(details)
        return self._watch(continuation(call_details, requests), token)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        call_details, token = self._details(details)
        return self._watch(continuation(call_details, requests), token)
