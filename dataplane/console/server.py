"""The console's HTTP server: the standard library's ``http.server``, a thread per request
with at most `REQUESTS_IN_FLIGHT_MAX` at once (one more is answered 503 at once), on
``console.listener`` of a node or on its own (``raftlog console``).

Routes (GET unless said): ``/`` the cluster, ``/topics``, ``/topics/{name}``,
``/topics/{name}/records?partition=&offset=&timestamp=&limit=``, POST ``/topics/{name}/produce``
(form fields partition, key, value, headers), ``/groups``, ``/groups/{id}``, ``/connect``,
``/connect/{name}`` (a Connect worker's connectors and mirrors, with ``connect_url``),
``/chaos``, ``/chaos/{name}`` (chaos reports and one's report.html, with ``chaos_reports``).

Reads go through one admin client, made at the first request (the node's broker may not
serve yet when the node starts) and kept; consumers and the producer of the produce form live
for one request. A KafkaError is a page saying it: 404 for an unknown topic or group, 403 when
the principal may not describe it, else 503.

With ``sessions`` (a cluster whose users log in with SCRAM), every page but ``/login`` needs a
session: GET and POST ``/login``, POST ``/logout``; each user's pages are read with their own
credentials (dataplane/console/sessions.py). Every POST carries the CSRF token of the form it
came from and, when the browser names it, an ``Origin`` of this console; the server answers
over HTTPS when given a TLS context.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import secrets
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from dataplane.client import AdminClient, Producer
from dataplane.console import history, outside, pages, reads
from dataplane.console.sessions import (
    COOKIE,
    LoginFailed,
    Session,
    Sessions,
    same_origin,
    tokens_match,
)
from metadata_quorum.security.channels import ClientSecurity
from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

REQUESTS_IN_FLIGHT_MAX = 8
FORM_BYTES_MAX = 1024 * 1024  # the produce form's body (Kafka's default max.request.size)
PRODUCE_TIMEOUT_S = 10.0
RECORDS_PER_PAGE = 20
HANDSHAKE_TIMEOUT_S = 10.0
_NOT_FOUND = {ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.GROUP_ID_NOT_FOUND}
_FORBIDDEN = {
    ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    ErrorCode.GROUP_AUTHORIZATION_FAILED,
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
}


class ConsoleError(Exception):
    """A request the console answers with ``status`` and a message (a bad parameter, say)."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Console:
    """The pages of one cluster, read with ``security`` from ``bootstrap`` (broker addresses)."""

    def __init__(
        self,
        bootstrap: list[str],
        security: ClientSecurity | None = None,
        sample_interval_s: float = history.SAMPLE_INTERVAL_S,
        connect_url: str | None = None,
        chaos_reports: Path | None = None,
        sessions: Sessions | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.sessions = sessions  # None: nobody logs in, the console reads with ``security``
        self.csrf = secrets.token_urlsafe(32)  # the forms' token when nobody logs in
        self.connect_url = connect_url
        self.chaos_reports = None if chaos_reports is None else outside.ChaosReports(chaos_reports)
        self.security = security
        self._admin: AdminClient | None = None
        self._lock = threading.Lock()
        reader = reads.SampleReader(self.admin, bootstrap, security)
        self.sampler = history.Sampler(reader.read, sample_interval_s, reader.close)

    def start_sampling(self) -> None:
        """Start the charts' sampler once (`close` stops it). The first page served starts it,
        not the server: a node's console nobody opens reads nothing (every node of a cluster
        may serve one), and the charts begin with the first visit."""
        self.sampler.start()

    def admin(self) -> AdminClient:
        with self._lock:
            if self._admin is None:
                self._admin = AdminClient(self.bootstrap, security=self.security)
            return self._admin

    def close(self) -> None:
        self.sampler.stop()
        if self.sessions is not None:
            self.sessions.close()
        with self._lock:
            if self._admin is not None:
                self._admin.close()
                self._admin = None

    # -- pages: (status, html) --------------------------------------------------------------
    def get(self, path: str, query: dict[str, str], session: Session | None = None) -> str:
        """The page at ``path``, read as ``session``'s user (None: the console's own
        credentials)."""
        self.start_sampling()
        admin = self.admin if session is None else lambda: session.admin
        clients = self._clients(session)
        parts = [unquote(p) for p in path.strip("/").split("/")] if path.strip("/") else []
        match parts:
            case []:
                return pages.cluster_page(reads.read_cluster(admin()))
            case ["topics"]:
                return pages.topics_page(reads.read_topics(admin(), *clients))
            case ["topics", name]:
                view = reads.read_topic(admin(), *clients, name)
                return pages.topic_page(view, self.sampler.history.samples())
            case ["topics", name, "records"]:
                return self._records(admin(), clients, name, query)
            case ["groups"]:
                return pages.groups_page(reads.read_groups(admin()))
            case ["groups", group]:
                lag = reads.read_group(admin(), *clients, group)
                return pages.group_page(lag, self.sampler.history.samples())
            case ["connect"]:
                connectors = [] if self.connect_url is None else self._connectors(None)
                return pages.connect_page(self.connect_url, connectors)
            case ["connect", name] if self.connect_url is not None:
                return pages.connector_page(self._connectors(name)[0])
            case ["chaos"]:
                reports = [] if self.chaos_reports is None else self.chaos_reports.list()
                directory = None if self.chaos_reports is None else self.chaos_reports.directory
                return pages.chaos_page(None if directory is None else str(directory), reports)
            case ["chaos", name] if self.chaos_reports is not None:
                try:
                    return self.chaos_reports.html(name)
                except outside.OutsideError as error:
                    raise ConsoleError(HTTPStatus.NOT_FOUND, str(error)) from None
        raise ConsoleError(HTTPStatus.NOT_FOUND, f"no page {path}")

    def _connectors(self, name: str | None) -> list[outside.ConnectorRow]:
        assert self.connect_url is not None
        try:
            return outside.read_connectors(self.connect_url, name)
        except outside.OutsideError as error:
            status = HTTPStatus.NOT_FOUND if "HTTP 404" in str(error) else HTTPStatus.BAD_GATEWAY
            raise ConsoleError(status, f"Connect: {error}") from None

    def _clients(self, session: Session | None) -> tuple[list[str], ClientSecurity | None]:
        return self.bootstrap, self.security if session is None else session.security

    def _records(
        self,
        admin: AdminClient,
        clients: tuple[list[str], ClientSecurity | None],
        topic: str,
        query: dict[str, str],
    ) -> str:
        view = reads.read_records(
            admin, *clients, topic,
            _int(query, "partition") or 0, _int(query, "offset"), _int(query, "timestamp"),
            _int(query, "limit") or RECORDS_PER_PAGE,
        )  # fmt: skip
        produced = query.get("produced")
        return pages.records_page(view, f"Produced at offset {produced}." if produced else None)

    def produce(self, path: str, form: dict[str, str], session: Session | None = None) -> str:
        """Produce the form's record as ``session``'s user; the records page to show it (a
        redirect's target)."""
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if len(parts) != 3 or parts[0] != "topics" or parts[2] != "produce":
            raise ConsoleError(HTTPStatus.NOT_FOUND, f"no form {path}")
        topic = parts[1]
        partition = _int(form, "partition")
        headers = [_header(line) for line in form.get("headers", "").splitlines() if line.strip()]
        key = form.get("key") or None
        bootstrap, security = self._clients(session)
        with Producer(bootstrap, security=security, linger_ms=0) as producer:
            future = producer.send(
                topic, form.get("value", "").encode(), key.encode() if key else None,
                partition=partition, headers=headers,
            )  # fmt: skip
            metadata = future.result(PRODUCE_TIMEOUT_S)
        query = urlencode(
            {"partition": metadata.partition, "offset": metadata.offset,
             "produced": metadata.offset}
        )  # fmt: skip
        return f"/topics/{quote(topic, safe='')}/records?{query}"


def _int(values: dict[str, str], name: str) -> int | None:
    text = values.get(name, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ConsoleError(HTTPStatus.BAD_REQUEST, f"{name} must be a number: {text!r}") from None


def _header(line: str) -> tuple[str, bytes]:
    name, separator, value = line.partition("=")
    if not separator or not name.strip():
        raise ConsoleError(HTTPStatus.BAD_REQUEST, f"a header is name=value: {line!r}")
    return name.strip(), value.rstrip("\r").encode()


def _status_of(error: KafkaError) -> HTTPStatus:
    if error.error in _NOT_FOUND:
        return HTTPStatus.NOT_FOUND
    if error.error in _FORBIDDEN:
        return HTTPStatus.FORBIDDEN
    return HTTPStatus.SERVICE_UNAVAILABLE


def _handler(console: Console, secure: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "raftlog-console"

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            if console.sessions is not None and url.path == "/login":
                target = _local_path(query.get("next"))
                self._send(HTTPStatus.OK, pages.login_page(target))
                return
            session = self._session()
            if console.sessions is not None and session is None:
                self._to_login(self.path)
                return
            with _viewing(console, session):
                self._answer(lambda: (HTTPStatus.OK, console.get(url.path, query, session), None))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 <= length <= FORM_BYTES_MAX:
                self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, pages.error_page(
                    "Too large", f"a form is at most {FORM_BYTES_MAX} bytes"))  # fmt: skip
                return
            body = self.rfile.read(length).decode("utf-8", errors="replace")
            form = {k: v[-1] for k, v in parse_qs(body, keep_blank_values=True).items()}
            path = urlsplit(self.path).path
            origin, referer = self.headers.get("Origin"), self.headers.get("Referer")
            if not same_origin(self.headers.get("Host"), origin, referer):
                self._forbidden(f"a form posted from another site ({origin or referer})")
                return
            if console.sessions is not None and path == "/login":
                self._login(form)
                return
            session = self._session()
            if console.sessions is not None and session is None:
                self._to_login(None)
                return
            expected = console.csrf if session is None else session.csrf
            if not tokens_match(expected, form.get("csrf")):
                self._forbidden("the form's CSRF token is missing or stale: reload the page")
                return
            if session is not None and path == "/logout":
                assert console.sessions is not None
                console.sessions.logout(self._cookie())
                self._send(HTTPStatus.SEE_OTHER, "", "/login", cookie=_cookie_header("", secure))
                return
            with _viewing(console, session):
                self._answer(
                    lambda: (HTTPStatus.SEE_OTHER, "", console.produce(path, form, session))
                )

        def _login(self, form: dict[str, str]) -> None:
            assert console.sessions is not None
            target = _local_path(form.get("next"))
            try:
                token, session = console.sessions.login(
                    form.get("user", ""), form.get("password", "")
                )
            except LoginFailed as error:
                log.info("console login of %r refused: %s", form.get("user", ""), error)
                self._send(HTTPStatus.UNAUTHORIZED, pages.login_page(target, f"{error}"))
                return
            except KafkaError as error:
                message = f"{error.error.name}: {error.message}"
                self._send(_status_of(error), pages.login_page(target, message))
                return
            log.info("console login of %s", session.user)
            self._send(HTTPStatus.SEE_OTHER, "", target, cookie=_cookie_header(token, secure))

        def _cookie(self) -> str | None:
            try:
                morsel = SimpleCookie(self.headers.get("Cookie") or "").get(COOKIE)
            except CookieError:
                return None
            return None if morsel is None else morsel.value

        def _session(self) -> Session | None:
            return None if console.sessions is None else console.sessions.get(self._cookie())

        def _to_login(self, path: str | None) -> None:
            target = "/login" if path is None else f"/login?{urlencode({'next': path})}"
            self._send(HTTPStatus.SEE_OTHER, "", target)

        def _forbidden(self, message: str) -> None:
            log.warning("console %s %s from %s refused: %s", self.command, self.path,
                        self.address_string(), message)  # fmt: skip
            self._send(HTTPStatus.FORBIDDEN, pages.error_page("Forbidden", message))

        def _answer(self, render: Callable[[], tuple[HTTPStatus, str, str | None]]) -> None:
            try:
                status, html, location = render()
            except ConsoleError as error:
                status, html, location = (
                    error.status,
                    pages.error_page("Error", error.message),
                    None,
                )
            except KafkaError as error:
                message = f"{error.error.name}: {error.message}"
                status, html, location = _status_of(error), pages.error_page("Error", message), None
            except Exception as error:  # a bug: logged with its trace, answered 500 (not dropped)
                log.exception("console %s %s failed", self.command, self.path)
                message = f"{type(error).__name__}: {error}"
                status = HTTPStatus.INTERNAL_SERVER_ERROR
                html, location = pages.error_page("Error", message), None
            self._send(status, html, location)

        def _send(
            self,
            status: HTTPStatus,
            html: str,
            location: str | None = None,
            cookie: str | None = None,
        ) -> None:
            data = html.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            # no other site may frame the console (clickjacking the produce form)
            self.send_header("X-Frame-Options", "DENY")
            self.send_header("Content-Security-Policy", "frame-ancestors 'none'")
            if location is not None:
                self.send_header("Location", location)
            if cookie is not None:
                self.send_header("Set-Cookie", cookie)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("console %s: " + format, self.address_string(), *args)

    return Handler


@contextlib.contextmanager
def _viewing(console: Console, session: Session | None) -> Iterator[None]:
    """Renders for ``session``'s user (pages.VIEWER) while the block runs."""
    user = None if session is None else session.user
    token = pages.VIEWER.set(pages.Viewer(user, console.csrf if session is None else session.csrf))
    try:
        yield
    finally:
        pages.VIEWER.reset(token)


def _local_path(target: str | None) -> str:
    """A redirect target of this console only (an absolute path, never //host or a URL)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _cookie_header(token: str, secure: bool) -> str:
    """The session cookie (an empty one that expires at once: logged out)."""
    expiry = "" if token else "; Max-Age=0"
    flags = "; Secure" if secure else ""
    return f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict{flags}{expiry}"


class _BoundedServer(ThreadingHTTPServer):
    daemon_threads = True
    in_flight = threading.BoundedSemaphore(REQUESTS_IN_FLIGHT_MAX)
    tls: ssl.SSLContext | None = None

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.in_flight.acquire(blocking=False):
            if self.tls is None:  # over TLS, nothing can be said before the handshake
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.in_flight.release()

    def finish_request(self, request: Any, client_address: Any) -> None:
        """Over HTTPS, the TLS handshake happens here, in the request's own thread (a slow
        client holds up no other), within the request timeout."""
        if self.tls is not None:
            request.settimeout(HANDSHAKE_TIMEOUT_S)
            try:
                request = self.tls.wrap_socket(request, server_side=True)
            except (OSError, ssl.SSLError) as error:
                log.info("console TLS handshake with %s failed: %s", client_address[0], error)
                return
            request.settimeout(None)
        super().finish_request(request, client_address)


class ConsoleServer:
    """The console on ``host:port`` (port 0: any free one), serving on its own thread; over
    HTTPS with ``tls`` (a server context: the node's keystore)."""

    def __init__(
        self, console: Console, host: str, port: int, tls: ssl.SSLContext | None = None
    ) -> None:
        _warn_if_exposed(host, console.sessions is not None)
        self.console = console
        _BoundedServer.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.http = _BoundedServer((host, port), _handler(console, secure=tls is not None))
        self.http.in_flight = threading.BoundedSemaphore(REQUESTS_IN_FLIGHT_MAX)
        self.http.tls = tls
        self._thread = threading.Thread(
            target=self.http.serve_forever, name="console-http", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self.http.server_address[:2]
        shown = host.decode() if isinstance(host, bytes) else host
        scheme = "http" if self.http.tls is None else "https"
        return f"{scheme}://[{shown}]:{port}" if ":" in shown else f"{scheme}://{shown}:{port}"

    def start(self) -> ConsoleServer:
        self._thread.start()
        log.info("console serves %s", self.url)
        return self

    def stop(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self._thread.join(10)
        self.console.close()


def _warn_if_exposed(host: str, login: bool) -> None:
    """Without a login, beyond loopback anyone who reaches the console reads what its
    credentials may read and produces with them."""
    if login:
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        log.warning(
            "the console listens on %s without a login: anyone who reaches it reads the cluster "
            "and produces records with the console's credentials; restrict access to it",
            host,
        )
