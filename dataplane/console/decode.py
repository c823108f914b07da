"""How the console shows a record's key, value and header values: JSON (pretty-printed) when
the bytes are a JSON object or array, else UTF-8 text when they decode and hold no control
characters but line breaks and tabs, else hex. Pure functions of bytes."""

from __future__ import annotations

import json
from typing import Literal, NamedTuple

Format = Literal["null", "json", "utf-8", "hex"]
SHOWN_BYTES_MAX = 4096  # longer payloads are cut (the records page says how long they are)


class Decoded(NamedTuple):
    format: Format
    text: str
    size_bytes: int  # -1 for null
    truncated: bool


def decode(data: bytes | None) -> Decoded:
    if data is None:
        return Decoded("null", "", -1, False)
    shown, truncated = data[:SHOWN_BYTES_MAX], len(data) > SHOWN_BYTES_MAX
    try:
        text = shown.decode("utf-8")
    except UnicodeDecodeError:
        return Decoded("hex", shown.hex(" "), len(data), truncated)
    pretty = None if truncated else _pretty_json(text)
    if pretty is not None:
        return Decoded("json", pretty, len(data), False)
    if any(ord(c) < 32 and c not in "\n\r\t" for c in text):
        return Decoded("hex", shown.hex(" "), len(data), truncated)
    return Decoded("utf-8", text, len(data), truncated)


def _pretty_json(text: str) -> str | None:
    """The JSON object or array ``text`` indented, or None if it is not one."""
    if text.lstrip()[:1] not in ("{", "["):
        return None
    try:
        parsed = json.loads(text)
    except ValueError:  # starts like JSON but is not: the caller shows it as text
        return None
    return json.dumps(parsed, indent=2, ensure_ascii=False)
