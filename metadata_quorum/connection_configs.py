"""Kafka's connection limits as broker configs: ``max.connections``, ``max.connections.per.ip``
and ``max.connections.per.ip.overrides`` (SocketServerConfigs). They are dynamic in Kafka (per
broker or cluster-wide), so the controller validates them with the other dynamic broker configs
(metadata_quorum.configs.BrokerConfig); the KAFKA listener applies them
(dataplane/kafka/connection_limits.py).
"""

from __future__ import annotations

import re

INT32_MAX = 2**31 - 1
MAX_CONNECTIONS_DEFAULT = INT32_MAX
MAX_CONNECTIONS_PER_IP_DEFAULT = INT32_MAX
PER_IP_OVERRIDES_MAX_CHARS = 100_000
# Kafka's Utils.validHostPattern: the characters an override's host may have
_VALID_HOST = re.compile(r"[0-9a-zA-Z\-%._:]*")


def parse_per_ip_overrides(value: str) -> dict[str, int]:
    """``"hostName:100,127.0.0.1:200"`` → {host: count}, as Kafka's ``getMap`` reads it: entries
    separated by commas, each split at its last colon (an IPv6 address keeps its own), blanks
    around them trimmed; a host with characters Kafka refuses, a count that is not an int32 ≥ 0
    or a host given twice is a ValueError naming the entry."""
    overrides: dict[str, int] = {}
    for entry in filter(None, (part.strip() for part in value.split(","))):
        host, colon, count = (part.strip() for part in entry.rpartition(":"))
        if not colon or not host or not _VALID_HOST.fullmatch(host):
            raise ValueError(f"{entry!r} is not host:count (max.connections.per.ip.overrides)")
        if not (count.isascii() and count.isdigit() and int(count) <= INT32_MAX):
            raise ValueError(f"{entry!r}: the count must be an integer from 0 to {INT32_MAX}")
        if host in overrides:
            raise ValueError(f"{host} is given twice in max.connections.per.ip.overrides")
        overrides[host] = int(count)
    return overrides


def check_per_ip_limits(max_connections_per_ip: int, overrides: str) -> None:
    """Kafka's KafkaConfig check: ``max.connections.per.ip`` may be 0 only with overrides (the
    hosts that may connect at all)."""
    if max_connections_per_ip == 0 and not parse_per_ip_overrides(overrides):
        raise ValueError(
            "max.connections.per.ip can be set to zero only if "
            "max.connections.per.ip.overrides property is set."
        )
