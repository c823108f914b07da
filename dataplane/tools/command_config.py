"""``--command-config FILE`` (Kafka tools' option) and ``RAFTLOG_COMMAND_CONFIG``: the client
properties every connecting command passes to its clients, as a `ClientSecurity`.

The file is a Java properties file, the one Kafka's tools and librdkafka read
(``security.protocol=SASL_SSL``, ``sasl.mechanism``, ``sasl.username`` / ``sasl.password`` or
``sasl.jaas.config``, ``ssl.ca.location`` or ``ssl.truststore.location``, ...): ``raftlog cluster
up --secure`` writes one. Keys outside security (``client.id``, ``acks``...) are ignored, as
`ClientSecurity.from_properties` does.

The root command's callback reads it once (`use_command_config`) and keeps it for the command
in a context variable; commands build their clients with ``security=command_security()``.
"""

from __future__ import annotations

import contextvars
import re
from pathlib import Path

from metadata_quorum.security.channels import ClientSecurity

ENVIRONMENT_VARIABLE = "RAFTLOG_COMMAND_CONFIG"
PROPERTIES_BYTES_MAX = 1024 * 1024

_SECURITY: contextvars.ContextVar[ClientSecurity | None] = contextvars.ContextVar(
    "raftlog_command_security", default=None
)
_SEPARATOR = re.compile(r"(?<!\\)[=:]|(?<!\\)\s")
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


class CommandConfigError(ValueError):
    """The file cannot be read, or its properties are not a valid client security setup."""


def parse_properties(text: str) -> dict[str, str]:
    """Java's ``.properties`` format (java.util.Properties.load): ``key=value``, ``key: value``
    or ``key value``; ``#`` and ``!`` comment lines; a trailing backslash continues a line;
    backslash escapes. Later keys win."""
    out: dict[str, str] = {}
    logical: list[str] = []
    for raw in text.splitlines():
        line = raw.lstrip() if logical else raw.strip()
        if not logical and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:  # an odd number of backslashes: the line continues
            logical.append(line[:-1])
            continue
        logical.append(line)
        key, value = _split(("".join(logical)).strip())
        logical = []
        out[key] = value
    if logical:
        key, value = _split("".join(logical).strip())
        out[key] = value
    return out


def format_properties(settings: dict[str, str], comment: str = "") -> str:
    """The inverse of `parse_properties`: ``key=value`` lines with the escapes Java's
    ``Properties.load`` undoes (backslashes, line breaks; separators in keys)."""
    lines = [f"# {comment}"] if comment else []
    for key, value in settings.items():
        lines.append(f"{_escape(key, key=True)}={_escape(value)}")
    return "\n".join(lines) + "\n"


def _escape(text: str, key: bool = False) -> str:
    out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    if key:
        out = re.sub(r"([=:\s#!])", r"\\\1", out)
    return out


def _split(line: str) -> tuple[str, str]:
    match = _SEPARATOR.search(line)
    if match is None:
        return _unescape(line), ""
    key, rest = line[: match.start()], line[match.end() :].lstrip()
    if match.group().isspace() and rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip()
    return _unescape(key), _unescape(rest)


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), text)


def read_command_config(path: Path) -> ClientSecurity:
    """The `ClientSecurity` of a properties file; CommandConfigError says what is wrong."""
    try:
        with path.open("rb") as file:
            data = file.read(PROPERTIES_BYTES_MAX + 1)
    except OSError as error:
        raise CommandConfigError(f"--command-config {path}: {error.strerror or error}") from None
    if len(data) > PROPERTIES_BYTES_MAX:
        raise CommandConfigError(f"--command-config {path}: larger than {PROPERTIES_BYTES_MAX} B")
    try:
        properties = parse_properties(data.decode("utf-8"))
        return ClientSecurity.from_properties(properties)
    except (UnicodeDecodeError, ValueError) as error:
        raise CommandConfigError(f"--command-config {path}: {error}") from None


def use_command_config(path: Path | None) -> ClientSecurity | None:
    """Read ``path`` (None: no file, plaintext) and keep it for this command's clients."""
    security = None if path is None else read_command_config(path)
    _SECURITY.set(security)
    return security


def command_security() -> ClientSecurity | None:
    """The security the running command's clients use (None: PLAINTEXT)."""
    return _SECURITY.get()
