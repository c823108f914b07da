"""Client security settings in Connect's and MirrorMaker 2's configurations: Kafka's names
(``security.protocol``, ``sasl.*``, ``ssl.*``), under the prefixes Kafka Connect gives them.

A worker (``WorkerConfig``): unprefixed keys secure the worker's own clients (group membership,
the config/offset/status topics); ``producer.``-prefixed ones the source tasks' producers,
``consumer.``-prefixed ones the sink tasks' consumers, ``admin.``-prefixed ones the admin
clients made for connectors. As in Kafka Connect, a prefix does not inherit the unprefixed
settings: a secured cluster needs both (``raftlog cluster up --secure`` prints them).

Mirroring (``MirrorConfig``): ``source.cluster.``- and ``target.cluster.``-prefixed keys secure
the clients of each cluster, as MirrorMaker 2's ``<alias>.`` settings do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from metadata_quorum.security.channels import ClientSecurity

WORKER_PREFIXES = ("producer.", "consumer.", "admin.", "")
MIRROR_PREFIXES = ("source.cluster.", "target.cluster.")
_SECURITY_KEY = re.compile(r"^(security\.protocol|ssl\.[a-z0-9.]+|sasl\.[a-z0-9.]+)$")


def is_security_key(key: str) -> bool:
    return _SECURITY_KEY.match(key) is not None


def split_security(
    values: Mapping[str, Any], prefixes: tuple[str, ...]
) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    """``values`` without its security keys, and those keys per prefix (the prefix removed).
    A prefix of ``prefixes`` that precedes a security key claims it; the first one wins."""
    rest: dict[str, Any] = {}
    found: dict[str, dict[str, str]] = {}
    for key, value in values.items():
        prefix = next(
            (p for p in prefixes if key.startswith(p) and is_security_key(key[len(p) :])), None
        )
        if prefix is None:
            rest[key] = value
        else:
            found.setdefault(prefix, {})[key[len(prefix) :]] = str(value)
    return rest, found


def securities(
    found: Mapping[str, Mapping[str, str]],
) -> dict[str, ClientSecurity]:
    """Each prefix's `ClientSecurity`; ValueError names the prefix and what is wrong."""
    out: dict[str, ClientSecurity] = {}
    for prefix, properties in found.items():
        try:
            out[prefix] = ClientSecurity.from_properties(properties)
        except ValueError as error:
            raise ValueError(f"{prefix}security settings: {error}") from None
    return out


def collect_security(values: Any, prefixes: tuple[str, ...]) -> Any:
    """A config model's ``mode="before"`` step: the security keys of `values` move into
    ``security_properties`` by prefix, checked now (an error names the prefix) rather than when
    a client starts."""
    if not isinstance(values, dict) or "security_properties" in values:
        return values
    rest, found = split_security(values, prefixes)
    securities(found)
    return {**rest, "security_properties": found}


def flatten(securities_by_prefix: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """The prefixed keys again (what a task's configuration carries)."""
    return {
        prefix + key: value
        for prefix, properties in securities_by_prefix.items()
        for key, value in properties.items()
    }
