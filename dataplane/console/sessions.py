"""Who is looking: the console's logins, sessions and the check of every form it posts.

On a cluster whose clients log in (SASL_SSL with SCRAM), the console asks each user for their
SCRAM name and password and reads the cluster as that user: their session holds an admin client
with their credentials, so the cluster's ACLs decide what each page shows, as they decide what
``raftlog --command-config`` shows (a topic they may not describe is absent from the topics
page and forbidden on its own page). A login is tried against the cluster itself: a password the
brokers refuse is refused here, with SASL_AUTHENTICATION_FAILED's message.

A session is a random token (``secrets.token_urlsafe``, 256 bits) in a cookie that scripts cannot
read (``HttpOnly``), that no other site's page sends (``SameSite=Strict``) and, over HTTPS, that
never travels in clear (``Secure``); it ends at logout or after ``idle_timeout_s`` unused.

Every form the console serves carries a CSRF token (the session's, or the console's own when
nobody logs in) and every POST must bring it back, and must come from a page of the console
itself when the browser says where it came from (``Origin``, else ``Referer``): a page elsewhere
cannot make a visitor's browser produce records or log them in or out.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from dataplane.client import AdminClient
from metadata_quorum.security.channels import ClientSecurity
from raftlog.errors import ErrorCode, KafkaError

COOKIE = "raftlog_console"
IDLE_TIMEOUT_S = 30 * 60.0
SESSIONS_MAX = 1000  # at most this many live sessions; the least recently used goes first


class LoginFailed(Exception):
    """The cluster refused the name and password (or they were missing)."""


@dataclass
class Session:
    user: str
    security: ClientSecurity
    admin: AdminClient
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    last_used: float = 0.0


def same_origin(host: str | None, origin: str | None, referer: str | None) -> bool:
    """Whether a POST came from a page of this console: its ``Origin`` (else ``Referer``) names
    the host the request was sent to. A request that names neither (curl, an old browser) is
    judged by its CSRF token alone."""
    source = origin if origin not in (None, "", "null") else referer
    if source is None or source == "":
        return origin != "null"
    return host is not None and urlsplit(source).netloc.lower() == host.lower()


def tokens_match(expected: str, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())


class Sessions:
    """The logged-in users of one console. ``security_for(user, password)`` is how a user
    reaches the cluster (SASL_SSL, its CAs, the SCRAM mechanism, their name and password).
    ``connect`` makes (and so tries) their admin client: it raises what the cluster answered."""

    def __init__(
        self,
        bootstrap: list[str],
        security_for: Callable[[str, str], ClientSecurity],
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        connect: Callable[[list[str], ClientSecurity], AdminClient] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.security_for = security_for
        self.idle_timeout_s = idle_timeout_s
        self._clock = clock
        self._connect = connect or _connect
        self._by_token: dict[str, Session] = {}
        self._lock = threading.Lock()

    def login(self, user: str, password: str) -> tuple[str, Session]:
        """A new session (its token, itself) once the cluster accepted ``user``'s password."""
        if not user or not password:
            raise LoginFailed("a user name and a password are needed")
        security = self.security_for(user, password)
        admin = self._connect(self.bootstrap, security)
        session = Session(user, security, admin, last_used=self._clock())
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._by_token[token] = session
            evicted = self._evict()
        for old in evicted:
            old.admin.close()
        return token, session

    def get(self, token: str | None) -> Session | None:
        """The live session of ``token`` (its idle time starts over), None if there is none."""
        if not token:
            return None
        with self._lock:
            session = self._by_token.get(token)
            if session is None:
                return None
            now = self._clock()
            if now - session.last_used <= self.idle_timeout_s:
                session.last_used = now
                return session
            del self._by_token[token]
        session.admin.close()
        return None

    def logout(self, token: str | None) -> None:
        with self._lock:
            session = self._by_token.pop(token or "", None)
        if session is not None:
            session.admin.close()

    def close(self) -> None:
        with self._lock:
            sessions = list(self._by_token.values())
            self._by_token.clear()
        for session in sessions:
            session.admin.close()

    def _evict(self) -> list[Session]:
        """Idle sessions, and the least recently used beyond SESSIONS_MAX (under the lock)."""
        now = self._clock()
        gone = [t for t, s in self._by_token.items() if now - s.last_used > self.idle_timeout_s]
        by_use = sorted(self._by_token.items(), key=lambda item: item[1].last_used)
        excess = len(self._by_token) - len(gone) - SESSIONS_MAX
        gone += [t for t, _ in by_use if t not in gone][: max(0, excess)]
        return [self._by_token.pop(t) for t in gone]


def _connect(bootstrap: list[str], security: ClientSecurity) -> AdminClient:
    """An admin client as the user, tried with a Metadata request (which any user may make: it
    answers only what they may describe). LoginFailed when the cluster refused the password."""
    try:
        admin = AdminClient(bootstrap, security=security)  # it connects, and so logs in
    except KafkaError as error:
        raise _refused(error) from None
    try:
        admin.list_topics()
    except KafkaError as error:
        admin.close()
        raise _refused(error) from None
    except BaseException:
        admin.close()
        raise
    return admin


def _refused(error: KafkaError) -> Exception:
    """LoginFailed when the cluster refused the password; else the error itself."""
    if error.error in (ErrorCode.SASL_AUTHENTICATION_FAILED, ErrorCode.ILLEGAL_SASL_STATE):
        return LoginFailed(error.message or error.error.name)
    return error
