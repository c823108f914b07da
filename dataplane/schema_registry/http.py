"""Confluent Schema Registry's REST API on the node's ``schema.registry.listener``.

The standard library's ThreadingHTTPServer (the broker's base install has no web framework),
JSON bodies, Confluent's answers and error bodies (``{"error_code": 40401, "message": ...}``).
A request body over ``BODY_BYTES_MAX`` is refused with 413 before it is read.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from dataplane.schema_registry import compatibility, errors, protobuf
from dataplane.schema_registry.errors import RegistryError
from dataplane.schema_registry.records import (
    AVRO,
    PROTOBUF,
    SCHEMA_TYPES,
    SchemaValue,
    parse_references,
)
from dataplane.schema_registry.registry import Registry
from dataplane.schema_registry.state import DEFAULT_LEVEL, Record, RegistryState

log = logging.getLogger(__name__)
BODY_BYTES_MAX = 4 * 1024 * 1024
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
Query = dict[str, str]
Handler = Callable[["RegistryApi", list[str], Query, Any], Any]


def _flag(query: Query, name: str) -> bool:
    return query.get(name, "false").lower() == "true"


def _formatted(state: RegistryState, schema: SchemaValue, query: Query) -> str:
    """The schema as stored, or as ``?format=serialized`` asks a Protobuf one: its
    FileDescriptorProto in base64 (what confluent-kafka's ProtobufDeserializer reads)."""
    if schema.schema_type == PROTOBUF and query.get("format") == "serialized":
        return protobuf.serialized(schema.schema, state.resolve(schema.references))
    return schema.schema


def _schema_only(state: RegistryState, schema: SchemaValue, query: Query) -> Any:
    """``.../schema``: the schema itself, JSON for Avro and JSON Schema, a string for Protobuf."""
    if schema.schema_type == PROTOBUF:
        return _formatted(state, schema, query)
    return json.loads(schema.schema)


def _version_json(
    schema: SchemaValue, state: RegistryState | None = None, query: Query | None = None
) -> dict[str, Any]:
    answer: dict[str, Any] = {"subject": schema.subject, "version": schema.version,
                              "id": schema.id}  # fmt: skip
    if schema.schema_type != AVRO:
        answer["schemaType"] = schema.schema_type
    if schema.references:
        answer["references"] = [r.to_json() for r in schema.references]
    answer["schema"] = schema.schema if state is None else _formatted(state, schema, query or {})
    return answer


class RegistryApi:
    """The endpoints, each a method taking the path's parameters, the query and the body."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def _schema_body(self, body: Any) -> tuple[str, str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
            raise errors.invalid_schema('(the body is {"schema": "...", ...})')
        schema_type = body.get("schemaType") or AVRO
        try:
            references = parse_references(body.get("references"))
        except ValueError as error:
            raise errors.invalid_schema(str(error)) from None
        return str(schema_type).upper(), body["schema"], references

    def _canonical(self, state: RegistryState, body: Any) -> tuple[str, str, Any]:
        schema_type, schema, references = self._schema_body(body)
        text = compatibility.canonical(schema_type, schema, state.resolve(references))
        return schema_type, text, references

    def register(self, path: list[str], query: Query, body: Any) -> Any:
        subject = path[0]

        def generate(state: RegistryState) -> tuple[list[Record], int]:
            schema_type, text, references = self._canonical(state, body)
            return state.generate_register(
                subject, schema_type, text, references, compatibility.check
            )

        return {"id": self.registry.write(generate)}

    def lookup(self, path: list[str], query: Query, body: Any) -> Any:
        subject, deleted = path[0], _flag(query, "deleted")

        def find(state: RegistryState) -> SchemaValue:
            state.versions(path[0], deleted)  # 40401 first, as Confluent
            schema_type, text, references = self._canonical(state, body)
            return state.lookup(subject, schema_type, text, references, deleted)

        return _version_json(self.registry.read(find))

    def compatible(self, path: list[str], query: Query, body: Any) -> Any:
        subject, spec = path

        def check(state: RegistryState) -> list[str]:
            schema_type, text, references = self._canonical(state, body)
            against = state.version(subject, spec)
            return state.check(subject, schema_type, text, references, compatibility.check,
                               against)  # fmt: skip

        messages = self.registry.read(check)
        answer: dict[str, Any] = {"is_compatible": not messages}
        if _flag(query, "verbose"):
            answer["messages"] = messages
        return answer

    def delete_subject(self, path: list[str], query: Query, body: Any) -> Any:
        permanent = _flag(query, "permanent")
        return self.registry.write(lambda s: s.generate_delete_subject(path[0], permanent))

    def delete_version(self, path: list[str], query: Query, body: Any) -> Any:
        permanent = _flag(query, "permanent")
        return self.registry.write(lambda s: s.generate_delete_version(path[0], path[1], permanent))

    def put_config(self, path: list[str], query: Query, body: Any) -> Any:
        subject = path[0] if path else None
        level = body.get("compatibility") if isinstance(body, dict) else None
        records = self.registry.write(lambda s: (s.generate_config(subject, level), None))
        assert records is None
        return {"compatibility": str(level).upper()}

    def get_config(self, path: list[str], query: Query, body: Any) -> Any:
        if not path:
            configured = self.registry.read(lambda s: s.compatibility(None))
            return {"compatibilityLevel": configured or DEFAULT_LEVEL}
        subject = path[0]

        def level(state: RegistryState) -> str:
            found = state.compatibility(subject)
            if found is None and _flag(query, "defaultToGlobal"):
                return state.effective_compatibility(subject)
            if found is None:
                raise errors.subject_level_compatibility_not_configured(subject)
            return found

        return {"compatibilityLevel": self.registry.read(level)}

    def delete_config(self, path: list[str], query: Query, body: Any) -> Any:
        level = self.registry.write(lambda s: s.generate_delete_config(path[0]))
        return {"compatibilityLevel": level}

    def get_mode(self, path: list[str], query: Query, body: Any) -> Any:
        subject = path[0] if path else None
        return {"mode": self.registry.read(lambda s: s.effective_mode(subject))}

    def put_mode(self, path: list[str], query: Query, body: Any) -> Any:
        subject = path[0] if path else None
        mode = body.get("mode") if isinstance(body, dict) else None
        self.registry.write(lambda s: (s.generate_mode(subject, mode), None))
        return {"mode": str(mode).upper()}

    def schema_by_id(self, path: list[str], query: Query, body: Any) -> Any:
        answer = self.registry.read(lambda s: _version_json(s.schema_by_id(_id(path[0])), s, query))
        for field in ("subject", "version", "id"):
            del answer[field]
        return answer


def _id(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise errors.schema_not_found() from None


def _reader(query: Callable[[RegistryState, list[str], Query], Any]) -> Handler:
    """A GET endpoint answered from the state (read to the end first if it finds nothing)."""
    return lambda api, path, q, body: api.registry.read(lambda s: query(s, path, q))


_SUBJECT, _VERSION = r"([^/]+)", r"([^/]+)"
ROUTES: list[tuple[str, re.Pattern[str], Handler]] = [
    ("GET", re.compile(r"/schemas/types"), lambda api, p, q, b: list(SCHEMA_TYPES)),
    ("GET", re.compile(r"/schemas/ids/([^/]+)"), RegistryApi.schema_by_id),
    ("GET", re.compile(r"/schemas/ids/([^/]+)/schema"),
     _reader(lambda s, p, q: _schema_only(s, s.schema_by_id(_id(p[0])), q))),
    ("GET", re.compile(r"/schemas/ids/([^/]+)/versions"),
     _reader(lambda s, p, q: [{"subject": subject, "version": version} for subject, version
                              in s.subject_versions_of(_id(p[0]), _flag(q, "deleted"))])),
    ("GET", re.compile(r"/subjects"), _reader(lambda s, p, q: s.subjects(_flag(q, "deleted")))),
    ("GET", re.compile(f"/subjects/{_SUBJECT}/versions"),
     _reader(lambda s, p, q: s.versions(p[0], _flag(q, "deleted")))),
    ("POST", re.compile(f"/subjects/{_SUBJECT}/versions"), RegistryApi.register),
    ("POST", re.compile(f"/subjects/{_SUBJECT}"), RegistryApi.lookup),
    ("DELETE", re.compile(f"/subjects/{_SUBJECT}"), RegistryApi.delete_subject),
    ("GET", re.compile(f"/subjects/{_SUBJECT}/versions/{_VERSION}"),
     _reader(lambda s, p, q: _version_json(s.version(p[0], p[1], _flag(q, "deleted")), s, q))),
    ("GET", re.compile(f"/subjects/{_SUBJECT}/versions/{_VERSION}/schema"),
     _reader(lambda s, p, q: _schema_only(s, s.version(p[0], p[1], _flag(q, "deleted")), q))),
    ("GET", re.compile(f"/subjects/{_SUBJECT}/versions/{_VERSION}/referencedby"),
     _reader(lambda s, p, q: s.referenced_by(s.version(p[0], p[1])))),
    ("DELETE", re.compile(f"/subjects/{_SUBJECT}/versions/{_VERSION}"),
     RegistryApi.delete_version),
    ("GET", re.compile(r"/config"), RegistryApi.get_config),
    ("PUT", re.compile(r"/config"), RegistryApi.put_config),
    ("GET", re.compile(f"/config/{_SUBJECT}"), RegistryApi.get_config),
    ("PUT", re.compile(f"/config/{_SUBJECT}"), RegistryApi.put_config),
    ("DELETE", re.compile(f"/config/{_SUBJECT}"), RegistryApi.delete_config),
    ("POST", re.compile(f"/compatibility/subjects/{_SUBJECT}/versions/{_VERSION}"),
     RegistryApi.compatible),
    ("GET", re.compile(r"/mode"), RegistryApi.get_mode),
    ("PUT", re.compile(r"/mode"), RegistryApi.put_mode),
    ("GET", re.compile(f"/mode/{_SUBJECT}"), RegistryApi.get_mode),
    ("PUT", re.compile(f"/mode/{_SUBJECT}"), RegistryApi.put_mode),
    ("GET", re.compile(r"/"), lambda api, p, q, b: {}),
]  # fmt: skip


def route(method: str, url: str) -> tuple[Handler, list[str], Query]:
    """The handler of ``method url``, the path's parameters (URL-decoded) and the query; 404
    (40400... as Confluent: a bare 404) for a path the API does not have."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/") or "/"
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    allowed = False
    for verb, pattern, handler in ROUTES:
        match = pattern.fullmatch(path)
        if match is None:
            continue
        allowed = True
        if verb == method:
            return handler, [unquote(g) for g in match.groups()], query
    if allowed:
        raise RegistryError(405, f"HTTP {method} is not supported on {path}")
    raise RegistryError(404, "HTTP 404 Not Found")


class _RequestHandler(BaseHTTPRequestHandler):
    server: RegistryHttpServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self) -> None:
        try:
            handler, path, query = route(self.command, self.path)
            body = self._body()
            self._answer(200, handler(self.server.api, path, query, body))
        except RegistryError as error:
            self._answer(error.status, {"error_code": error.error_code, "message": error.message})
        except Exception as error:
            log.exception("schema registry: %s %s", self.command, self.path)
            self._answer(500, {"error_code": 50001, "message": f"Internal error: {error}"})

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if length > BODY_BYTES_MAX:
            self.close_connection = True  # the body is not read: the connection cannot go on
            raise RegistryError(413, f"Request body of {length} bytes exceeds {BODY_BYTES_MAX}")
        if length == 0:
            return None
        try:
            return json.loads(self.rfile.read(length))
        except ValueError as error:
            raise RegistryError(
                400 if self.command != "POST" else 42201, f"Unrecognized JSON body: {error}"
            ) from None

    do_GET = do_POST = do_PUT = do_DELETE = _handle


class RegistryHttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], api: RegistryApi) -> None:
        super().__init__(address, _RequestHandler)
        self.api = api


def serve(registry: Registry, host: str, port: int) -> tuple[RegistryHttpServer, threading.Thread]:
    """Start the registry and its HTTP server on ``host:port``; stop with :func:`shutdown`."""
    server = RegistryHttpServer((host, port), RegistryApi(registry))
    registry.start()
    thread = threading.Thread(target=server.serve_forever, name="schema-registry-http",
                              daemon=True)  # fmt: skip
    thread.start()
    log.info("schema registry on http://%s:%d", host, server.server_address[1])
    return server, thread


def shutdown(server: RegistryHttpServer, thread: threading.Thread) -> None:
    server.shutdown()
    thread.join(10)
    server.server_close()
    server.api.registry.stop()
