"""The console's sessions and form checks (dataplane/console/sessions.py): logins tried against
a stand-in cluster here, idle expiry on a fake clock, and a console server that refuses forms
without their CSRF token or from another site before it reads anything (the real login on a
secure cluster: tests/dataplane/tools/test_secure_cluster.py)."""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest

from dataplane.console import sessions as sessions_module
from dataplane.console.server import Console, ConsoleServer
from dataplane.console.sessions import LoginFailed, Sessions, same_origin, tokens_match
from metadata_quorum.security.channels import ClientSecurity


class FakeAdmin:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def security_for(user: str, password: str) -> ClientSecurity:
    return ClientSecurity(
        security_protocol="SASL_PLAINTEXT", sasl_username=user, sasl_password=password
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def sessions(clock: Clock) -> Sessions:
    def connect(bootstrap: list[str], security: ClientSecurity) -> Any:
        if security.sasl_password != "right":
            raise LoginFailed("bad credentials")
        return FakeAdmin()

    return Sessions(["b:1"], security_for, idle_timeout_s=60, clock=clock, connect=connect)


def test_a_login_makes_a_session_that_ends_when_idle_or_logged_out() -> None:
    clock = Clock()
    users = sessions(clock)
    with pytest.raises(LoginFailed):
        users.login("alice", "wrong")
    with pytest.raises(LoginFailed, match="needed"):
        users.login("", "")
    token, session = users.login("alice", "right")
    assert session.security.sasl_username == "alice" and len(token) >= 43
    assert users.get(token) is session and users.get("forged") is None and users.get(None) is None
    clock.now = 59
    assert users.get(token) is session  # used: its idle time starts over
    clock.now = 59 + 61
    assert users.get(token) is None and session.admin.closed  # type: ignore[attr-defined]
    token, session = users.login("alice", "right")
    users.logout(token)
    assert users.get(token) is None and session.admin.closed  # type: ignore[attr-defined]


def test_the_least_recently_used_sessions_go_beyond_the_maximum(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sessions_module, "SESSIONS_MAX", 2)
    clock = Clock()
    users = sessions(clock)
    tokens = []
    for n in range(3):
        clock.now = n
        tokens.append(users.login(f"u{n}", "right")[0])
    assert users.get(tokens[0]) is None
    assert users.get(tokens[1]) is not None and users.get(tokens[2]) is not None


def test_a_form_must_come_from_this_console() -> None:
    assert same_origin("c:1", "http://c:1", None)
    assert same_origin("c:1", None, "http://c:1/topics/t/records")
    assert not same_origin("c:1", "https://evil.example", None)
    assert not same_origin("c:1", None, "https://evil.example/page")
    assert not same_origin("c:1", "null", None)  # a sandboxed or privacy-stripped origin
    assert same_origin("c:1", None, None)  # curl: the CSRF token alone decides
    assert tokens_match("abc", "abc") and not tokens_match("abc", "abd")
    assert not tokens_match("abc", None)


@pytest.fixture
def console() -> Iterator[ConsoleServer]:
    # nothing listens at this broker address: the refusals below come before any read
    server = ConsoleServer(Console(["127.0.0.1:1"]), "127.0.0.1", 0).start()
    try:
        yield server
    finally:
        server.stop()


def post(server: ConsoleServer, form: dict[str, str], origin: str | None) -> tuple[int, str]:
    host, port = server.http.server_address[:2]
    connection = http.client.HTTPConnection(str(host), int(port), timeout=10)
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if origin is not None:
        headers["Origin"] = origin
    try:
        connection.request("POST", "/topics/t/produce", urlencode(form), headers)
        answer = connection.getresponse()
        return answer.status, answer.read().decode()
    finally:
        connection.close()


def test_a_produce_form_without_its_token_or_from_elsewhere_is_refused(
    console: ConsoleServer,
) -> None:
    form = {"value": "v", "key": "", "partition": "", "headers": ""}
    here = console.url
    assert post(console, form, here)[0] == 403
    status, html = post(console, form | {"csrf": "forged"}, here)
    assert status == 403 and "CSRF token" in html
    status, html = post(console, form | {"csrf": console.console.csrf}, "https://evil.example")
    assert status == 403 and "another site" in html
