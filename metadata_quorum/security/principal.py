"""Who is asking: Kafka's principal (``User:alice``), the session a request runs in, and the
mapping of a certificate's subject to a principal name (``ssl.principal.mapping.rules``).

Authentication happens once, at the listener (the Kafka connection's SASL exchange or TLS
handshake, the gRPC interceptor), and yields a `Session`. The listener runs each request inside
`acting_as(session)`; handlers read it with `current_session()` and ask the authorizer before
touching state. A request with no session (security off, or a call made inside the node) acts as
the node itself: `current_session()` returns None and the authorizer allows it.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterator
from dataclasses import dataclass

USER_TYPE = "User"


@dataclass(frozen=True, order=True)
class KafkaPrincipal:
    """``type:name`` as Kafka writes it; the type is ``User`` for every authenticated client."""

    type: str
    name: str

    def __str__(self) -> str:
        return f"{self.type}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> KafkaPrincipal:
        """``"User:alice"`` → KafkaPrincipal("User", "alice"); ValueError names the problem."""
        kind, colon, name = text.partition(":")
        if not colon or not kind or not name:
            raise ValueError(f"principal {text!r} is not type:name (e.g. User:alice)")
        return cls(kind, name)

    @classmethod
    def user(cls, name: str) -> KafkaPrincipal:
        return cls(USER_TYPE, name)


ANONYMOUS = KafkaPrincipal(USER_TYPE, "ANONYMOUS")


@dataclass(frozen=True)
class Session:
    """An authenticated connection or call: the principal, the client's host (no port) and the
    listener it came through (``KAFKA``, ``BROKER``, ``CONTROLLER``)."""

    principal: KafkaPrincipal
    client_host: str
    listener: str


_SESSION: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "raftlog_session", default=None
)


def current_session() -> Session | None:
    """The session of the request being served on this thread; None inside the node."""
    return _SESSION.get()


@contextlib.contextmanager
def acting_as(session: Session | None) -> Iterator[None]:
    """Serve the body as `session` (None: as the node itself)."""
    token = _SESSION.set(session)
    try:
        yield
    finally:
        _SESSION.reset(token)


# -- ssl.principal.mapping.rules ----------------------------------------------------------------
_RULE = re.compile(r"RULE:((?:\\/|[^/])*)/((?:\\/|[^/])*)/([LU])?")


@dataclass(frozen=True)
class _MappingRule:
    pattern: re.Pattern[str] | None  # None: DEFAULT, the whole subject
    replacement: str
    case: str  # "", "L" or "U"

    def apply(self, subject: str) -> str | None:
        if self.pattern is None:
            return subject
        match = self.pattern.fullmatch(subject)
        if match is None:
            return None
        # Kafka's replacement uses $1; Python's expand uses \1
        name = match.expand(re.sub(r"\$(\d+)", r"\\\1", self.replacement))
        return name.lower() if self.case == "L" else name.upper() if self.case == "U" else name


class PrincipalMappingRules:
    """Kafka's ``ssl.principal.mapping.rules``: a comma-separated list of
    ``RULE:pattern/replacement/[LU]`` and ``DEFAULT`` tried in order against the certificate
    subject (RFC 2253, most specific first, ``CN=alice,OU=eng,O=acme``); the first that matches
    names the user. DEFAULT keeps the whole subject. No rule matching is an error: the
    connection is refused, as Kafka refuses it."""

    def __init__(self, text: str = "DEFAULT") -> None:
        self.text = text
        self._rules = self._parse(text)

    @staticmethod
    def _parse(text: str) -> tuple[_MappingRule, ...]:
        rules: list[_MappingRule] = []
        rest = text.strip()
        while rest:
            if rest.startswith("DEFAULT"):
                rules.append(_MappingRule(None, "", ""))
                rest = rest[len("DEFAULT") :]
            else:
                match = _RULE.match(rest)
                if match is None:
                    raise ValueError(f"ssl.principal.mapping.rules: cannot read {rest!r}")
                pattern, replacement, case = match.groups()
                try:
                    compiled = re.compile(pattern.replace("\\/", "/"))
                except re.error as error:
                    raise ValueError(f"ssl.principal.mapping.rules: {pattern!r}: {error}") from None
                rules.append(_MappingRule(compiled, replacement.replace("\\/", "/"), case or ""))
                rest = rest[match.end() :]
            rest = rest.strip()
            if rest.startswith(","):
                rest = rest[1:].strip()
            elif rest:
                raise ValueError(f"ssl.principal.mapping.rules: expected ',' before {rest!r}")
        if not rules:
            raise ValueError("ssl.principal.mapping.rules: no rule given (use DEFAULT)")
        return tuple(rules)

    def principal_of(self, subject: str) -> KafkaPrincipal:
        """The principal of a certificate's subject; ValueError when no rule matches."""
        for rule in self._rules:
            name = rule.apply(subject)
            if name is not None:
                return KafkaPrincipal.user(name)
        raise ValueError(f"no ssl.principal.mapping.rules rule matches subject {subject!r}")
