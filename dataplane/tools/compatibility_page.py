"""docs/compatibility.md, generated: every Kafka API key with the versions the KAFKA listener
serves, and every config key raftlog takes with its default.

``python -m dataplane.tools.compatibility_page [--out FILE] [--check]``

The page is rendered from the code that decides, so it cannot drift from it: the API table from
kio's message definitions (every key and version Kafka defines) and the listener's `SUPPORTED`
map, the config tables from the pydantic models that validate each key (their aliases are Kafka's
names, their defaults the ones applied). ``make docs`` writes it before building the manual; with
``--check`` (CI) it writes nothing and fails when the committed page is stale.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from kio import __version__ as KIO_VERSION
from kio.schema.index import api_key_map, schema_name_map
from pydantic import BaseModel

from dataplane.kafka.codec import SUPPORTED
from dataplane.server.config import NodeConfig
from metadata_quorum.configs import BrokerConfig, ClusterConfig, ReplicationConfig
from metadata_quorum.topic_config_defs import DYNAMIC_BROKER_SYNONYMS, TOPIC_CONFIG_DEFS
from raftlog.config import INT64_MAX, LogConfig

REPO = Path(__file__).resolve().parents[2]
PAGE_PATH = REPO / "docs" / "compatibility.md"

# Kafka's names for APIs whose snake_case name does not title-case into them
API_NAMES = {"sasl_handshake": "SaslHandshake", "k_raft_version_record": "KRaftVersionRecord"}

# What the listener does not serve, and why (keys not listed here and not served are gaps:
# the check below fails until a reason or the API is added)
INTER_NODE = "between Kafka's own nodes; raftlog's nodes speak gRPC to each other"
SHARE_GROUPS = "share groups (KIP-932): not yet"
NOT_SERVED: dict[int, str] = {
    38: "delegation tokens: out of scope",
    39: "delegation tokens: out of scope",
    40: "delegation tokens: out of scope",
    41: "delegation tokens: out of scope",
    48: "client quotas: not yet",
    49: "client quotas: not yet",
    52: INTER_NODE,
    53: INTER_NODE,
    54: INTER_NODE,
    56: INTER_NODE,
    58: INTER_NODE,
    59: INTER_NODE,
    62: INTER_NODE,
    63: INTER_NODE,
    67: INTER_NODE,
    70: INTER_NODE,
    71: "client telemetry (KIP-714): not advertised, so clients send none",
    72: "client telemetry (KIP-714): not advertised, so clients send none",
    73: INTER_NODE,
    82: INTER_NODE,
    83: INTER_NODE,
    84: INTER_NODE,
    85: INTER_NODE,
    86: INTER_NODE,
    87: INTER_NODE,
    88: "streams groups (KIP-1071, early access in Kafka): not yet",
    89: "streams groups (KIP-1071, early access in Kafka): not yet",
    90: SHARE_GROUPS,
    91: SHARE_GROUPS,
    92: SHARE_GROUPS,
}


def api_name(snake: str) -> str:
    return API_NAMES.get(snake) or "".join(part.title() for part in snake.split("_"))


def _versions(low: int, high: int) -> str:
    return str(low) if low == high else f"{low}\N{EN DASH}{high}"


def api_rows() -> list[str]:
    rows = ["| Key | API | Kafka defines | raftlog serves |", "| ---: | --- | --- | --- |"]
    for key, snake in sorted(api_key_map.items()):
        defined = sorted(schema_name_map[snake])
        served = SUPPORTED.get(key)
        if served is not None:
            answer = _versions(*served)
        elif key in NOT_SERVED:
            answer = f"no: {NOT_SERVED[key]}"
        else:
            raise ValueError(f"API key {key} ({snake}) is neither served nor explained")
        rows.append(
            f"| {key} | {api_name(snake)} | {_versions(defined[0], defined[-1])} | {answer} |"
        )
    return rows


def _default(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "(none)"
    if isinstance(value, frozenset | set | tuple | list):
        return ",".join(sorted(str(v) for v in value)) or '""'
    if value == INT64_MAX:
        return f"{INT64_MAX} (Long.MAX_VALUE)"
    return '""' if value == "" else str(value)


def config_rows(models: Iterable[type[BaseModel]]) -> list[str]:
    fields = {
        (f.alias or name): f.get_default(call_default_factory=True)
        for model in models
        for name, f in model.model_fields.items()
    }
    rows = ["| Key | Default |", "| --- | --- |"]
    rows += [f"| `{key}` | {_default(fields[key])} |" for key in sorted(fields)]
    return rows


def topic_config_rows() -> list[str]:
    """Every topic config: its type, default, the broker configs that set its default, and
    whether raftlog honours it (metadata_quorum/topic_config_defs.py)."""
    defaults = {
        (f.alias or name): f.get_default(call_default_factory=True)
        for model in (LogConfig, ReplicationConfig)
        for name, f in model.model_fields.items()
    }
    missing = sorted(set(defaults) ^ set(TOPIC_CONFIG_DEFS))
    if missing:
        raise ValueError(f"topic configs without a definition or a model field: {missing}")
    rows = [
        "| Topic config | Type | Default | Broker synonyms (`log.*` defaults) | Here |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, spec in sorted(TOPIC_CONFIG_DEFS.items()):
        synonyms = ", ".join(f"`{s.name}`" for s in spec.synonyms) or "—"
        here = "honoured" if spec.no_effect is None else f"accepted, no effect: {spec.no_effect}"
        default = _default(defaults[name])
        rows.append(f"| `{name}` | {spec.type.name} | {default} | {synonyms} | {here} |")
    return rows


def node_rows() -> list[str]:
    rows = ["| Key | Default |", "| --- | --- |"]
    for name, f in sorted(NodeConfig.model_fields.items(), key=lambda i: i[1].alias or i[0]):
        default = "(required)" if f.is_required() else _default(f.get_default())
        rows.append(f"| `{f.alias or name}` | {default} |")
    return rows


def render_page() -> str:
    served = len(SUPPORTED)
    out = [
        "# Kafka compatibility",
        "",
        "<!-- generated by `python -m dataplane.tools.compatibility_page`: do not edit -->",
        "",
        "What a Kafka client meets on raftlog's KAFKA listener ([The Kafka protocol]"
        "(kafka-protocol.md)), and which config keys raftlog takes. Generated from the code "
        f"that decides: kio {KIO_VERSION}'s copy of Kafka's message definitions and the "
        "listener's supported versions; the config models that validate each key.",
        "",
        f"## API keys ({served} served) {{#apis}}",
        "",
        "A client asks ApiVersions first and uses only what is advertised; an API or version "
        "not served closes the connection (ApiVersions itself answers UNSUPPORTED_VERSION).",
        "",
        *api_rows(),
        "",
        "## Topic configs {#topic-configs}",
        "",
        "Kafka 4's topic config set, per topic (CreateTopics, AlterConfigs, "
        "IncrementalAlterConfigs, `raftlog topic create --config`); each one's default for a "
        "broker or the cluster is set by its broker synonyms ([Every topic config]"
        "(storage.md#topic-configs) explains the precedence). Any other key is refused with "
        "INVALID_CONFIG naming it.",
        "",
        *topic_config_rows(),
        "",
        "## Cluster-wide and dynamic broker configs {#broker-configs}",
        "",
        'Set cluster-wide (resource BROKER, name "") or, for the replication throttles, per '
        "broker (name = its id); applied without a restart. Besides these, each topic config's "
        "first broker synonym may be set the same way as a default for the topics: "
        + ", ".join(f"`{name}`" for name in sorted(DYNAMIC_BROKER_SYNONYMS))
        + ".",
        "",
        *config_rows([ClusterConfig, BrokerConfig]),
        "",
        "## Node configs {#node-configs}",
        "",
        "Read from each node's properties file at start ([Operations](operations.md)).",
        "",
        *node_rows(),
    ]
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=PAGE_PATH)
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if --out is not up to date"
    )
    args = parser.parse_args(argv)
    page = render_page()
    current = args.out.read_text(encoding="utf-8") if args.out.exists() else None
    if args.check:
        if current != page:
            print(
                f"{args.out} is stale: run `python -m dataplane.tools.compatibility_page` "
                "(or `make docs`) and commit the page",
                file=sys.stderr,
            )
            return 1
        return 0
    if current != page:
        args.out.write_text(page, encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
