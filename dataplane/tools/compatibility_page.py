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
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from kio import __version__ as KIO_VERSION
from kio.schema.index import api_key_map, schema_name_map
from pydantic import BaseModel

from dataplane.kafka.codec import SUPPORTED
from dataplane.server.config import NodeConfig
from dataplane.tools.kafka_broker_configs import BY_NAME as KAFKA_BY_NAME
from dataplane.tools.kafka_broker_configs import (
    KAFKA_BROKER_CONFIGS,
    KAFKA_RELEASE,
    KafkaBrokerConfig,
)
from metadata_quorum.configs import (
    BROKER_KEYS,
    CLUSTER_KEYS,
    BrokerConfig,
    ClusterConfig,
    ReplicationConfig,
)
from metadata_quorum.topic_config_defs import (
    BROKER_SYNONYMS,
    DYNAMIC_BROKER_SYNONYMS,
    NOT_KAFKA_TOPIC_CONFIGS,
    TOPIC_CONFIG_DEFS,
)
from raftlog.config import INT64_MAX, LogConfig

REPO = Path(__file__).resolve().parents[2]
PAGE_PATH = REPO / "docs" / "compatibility.md"

# Kafka's names for APIs whose snake_case name does not title-case into them
API_NAMES = {"sasl_handshake": "SaslHandshake", "k_raft_version_record": "KRaftVersionRecord"}

# What the listener does not serve, and why (keys not listed here and not served are gaps:
# the check below fails until a reason or the API is added)
INTER_NODE = "between Kafka's own nodes; raftlog's nodes speak gRPC to each other"
SHARE_GROUPS = "share groups (KIP-932): not yet"
# as a Kafka broker whose metrics reporters include none implementing ClientTelemetry
_TELEMETRY = (
    "client telemetry (KIP-714): no metrics reporter implements ClientTelemetry, so, as Kafka, "
    "not advertised and clients push none (subscriptions are stored: CLIENT_METRICS configs)"
)
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
    71: _TELEMETRY,
    72: _TELEMETRY,
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
        if name in NOT_KAFKA_TOPIC_CONFIGS:
            here += f" (not a Kafka {KAFKA_RELEASE} topic config: {NOT_KAFKA_TOPIC_CONFIGS[name]})"
        default = _default(defaults[name])
        rows.append(f"| `{name}` | {spec.type.name} | {default} | {synonyms} | {here} |")
    return rows


def node_rows() -> list[str]:
    rows = ["| Key | Default |", "| --- | --- |"]
    for name, f in sorted(NodeConfig.model_fields.items(), key=lambda i: i[1].alias or i[0]):
        default = "(required)" if f.is_required() else _default(f.get_default())
        rows.append(f"| `{f.alias or name}` | {default} |")
    return rows


# -- Kafka's broker configs, each classified for raftlog -----------------------------------------
# What raftlog takes is derived from the code (NodeConfig's aliases, the topic configs' broker
# synonyms, the controller's cluster-wide keys); only the texts saying why not are written here.

HONOURED = "honoured"
RENAMED_CLASS = "honoured under another name"
TOPIC_DEFAULT = "topic-config default"
NO_EFFECT = "accepted, no effect"
REFUSED = "not accepted"
CLASSES = (HONOURED, RENAMED_CLASS, TOPIC_DEFAULT, NO_EFFECT, REFUSED)

# Kafka's name -> the NodeConfig key that sets the same thing
RENAMED: dict[str, str] = {"log.dir": "log.dirs"}

# NodeConfig keys Kafka's broker has no config of that name for (a typo of a Kafka name fails
# the check in `broker_config_classes` instead of passing as raftlog's own)
RAFTLOG_ONLY: dict[str, str] = {
    "cluster.id": "Kafka takes it from `kafka-storage format`'s meta.properties",
    "console.listener": "the web console's HTTP address (docs/console.md)",
    "console.sample.interval.ms": "how often the web console samples its charts' data",
    "console.connect.url": "the Connect worker whose connectors the web console shows",
    "schema.registry.listener": (
        "the schema registry's HTTP address (docs/schema-registry.md; Redpanda serves it on 8081)"
    ),
    "schema.registry.timeout.ms": "how long a registry write waits for the cluster",
    "controller.quorum.raft.port.offset": "the Raft transport's port beside CONTROLLER",
    "controller.quorum.raft.secret.file": "protects the Raft transport (docs/security.md)",
    "controller.quorum.raft.transport.security": "protects the Raft transport",
    "controlled.shutdown.timeout.ms": "bounds a broker's controlled shutdown",
    "fault.produce.drop.response.every": "fault injection for chaos tests",
    "log.cache.tail.bytes": "page cache kept per partition",
    "gil.switch.interval.us": "CPython's thread switch interval (docs/operations.md)",
    "gc.full.scan.interval.ms": "CPython's full garbage collections (docs/operations.md)",
    **{
        key: "gRPC keepalive of the BROKER and CONTROLLER listeners (docs/api.md)"
        for key in (
            "grpc.keepalive.time.ms",
            "grpc.keepalive.timeout.ms",
            "grpc.http2.min.ping.interval.without.data.ms",
            "grpc.http2.max.ping.strikes",
            "grpc.keepalive.permit.without.calls",
        )
    },
    "topic.config.defaults": "internal: the `log.*` keys a file sets, gathered",
    "allow.everyone.if.no.acl.found": "StandardAuthorizer's own config (not in KafkaConfig)",
    "super.users": "StandardAuthorizer's own config (not in KafkaConfig)",
    **{
        f"listener.name.{listener}.ssl.client.auth": "Kafka's per-listener prefix form"
        for listener in ("controller", "broker", "kafka", "metrics")
    },
}

_TIERED = "no tiered storage"
_THREADS = "asyncio and gRPC: no thread pools to size"
_SOCKETS = "not among the listeners' limits (docs/operations.md#connection-limits)"
_SASL = "SASL mechanisms here: PLAIN and SCRAM; no Kerberos, no OAUTHBEARER, no JAAS"
_QUORUM = "the metadata log is pysyncobj's Raft: its own timing and snapshots"
_INTER = "nodes speak gRPC on the BROKER and CONTROLLER listeners"
_METRICS = "metrics are served by the METRICS listener (Prometheus)"
_ZK_ERA = "a ZooKeeper-era setting Kafka 4 ignores"
_ONE_DIR = "one log directory per node"
_DEADLINES = "calls between nodes are gRPC with fixed deadlines and retries"
# why a Kafka config raftlog refuses at start: the first whose prefix it starts with (or, for a
# part starting with a dot, that contains it) wins
REFUSED_WHY: tuple[tuple[str, str], ...] = (
    ("remote.", _TIERED), ("log.local.", _TIERED),
    ("sasl.kerberos", _SASL), ("sasl.oauthbearer", _SASL), ("sasl.login", _SASL),
    ("sasl.jaas", _SASL), ("sasl.client.callback", _SASL), ("sasl.server", _SASL),
    ("sasl.mechanism.", "nodes authenticate to each other by certificate"),
    ("ssl.keystore.password", "PEM files: the key's password is ssl.key.password"),
    ("ssl.truststore.password", "PEM files: a truststore has no password"),
    ("ssl.keystore.", "PEM files named by ssl.keystore.location"),
    ("ssl.truststore.", "PEM files named by ssl.truststore.location"),
    ("ssl.", "TLS is Python's ssl module with its defaults (TLS 1.2+)"),
    ("security.providers", "no JCA providers"), ("principal.builder", "no pluggable classes"),
    ("delegation.token", "delegation tokens: out of scope"),
    ("metadata.", _QUORUM), ("controller.quorum.", _QUORUM),
    ("inter.broker.", _INTER), ("security.inter.broker", _INTER),
    ("controller.listener.names", "the CONTROLLER listener is named so"),
    ("advertised.listeners", "each listener's address is the one it binds"),
    ("early.start.listeners", "listeners start when the node is ready"),
    ("num.", _THREADS), ("background.threads", _THREADS), ("group.coordinator.threads", _THREADS),
    ("share.coordinator.threads", _THREADS), ("log.cleaner.threads", _THREADS),
    ("socket.", _SOCKETS), ("queued.max.", _SOCKETS), ("max.connection", _SOCKETS),
    ("connections.max.idle", _SOCKETS), ("connection.failed", _SOCKETS),
    ("metric", _METRICS), ("kafka.metrics", _METRICS), ("telemetry", "no client telemetry"),
    ("broker.id", "node.id names every node"), ("controlled.shutdown.", _ZK_ERA),
    ("delete.topic.enable", "topics may always be deleted (with ACLs to restrict it)"),
    ("log.cleaner.", "compaction runs per partition with fixed buffers"),
    ("create.topic.policy", "no pluggable policies"),
    ("alter.config.policy", "no pluggable policies"),
    ("client.quota.callback", "no pluggable classes"),
    ("quota.", "client quotas: not yet"), ("controller.quota.", "client quotas: not yet"),
    ("replication.quota.", "the replication throttles' window is fixed"),
    ("alter.log.dirs", _ONE_DIR), ("replica.alter.log.dirs", _ONE_DIR),
    ("log.dir.failure", _ONE_DIR), ("metadata.log.dir", _ONE_DIR),
    ("group.streams.", "streams groups (KIP-1071): not yet"),
    (".purgatory.", "delayed requests wait on asyncio futures: no purgatory to purge"),
    ("initial.broker.registration", _DEADLINES), ("controller.socket", _DEADLINES),
    ("replica.socket.", _DEADLINES), ("request.timeout.ms", _DEADLINES),
    ("replica.fetch.backoff", _DEADLINES),
    ("", "not configurable here"),
)  # fmt: skip


class BrokerConfigClass(NamedTuple):
    config: KafkaBrokerConfig
    cls: str
    note: str


def node_keys() -> dict[str, str]:
    """NodeConfig's keys (its aliases) -> field name."""
    return {f.alias or name: name for name, f in NodeConfig.model_fields.items()}


def _refused_why(name: str) -> str:
    return next(
        why for part, why in REFUSED_WHY
        if name.startswith(part) or (part.startswith(".") and part in name)
    )  # fmt: skip


def classify(config: KafkaBrokerConfig) -> BrokerConfigClass:
    name = config.name
    if name in node_keys():
        dynamic = name in BROKER_KEYS  # also a dynamic broker config, as in Kafka
        where = "node config file" + (", and through the controller (AlterConfigs)" * dynamic)
        return BrokerConfigClass(config, HONOURED, where)
    if name in RENAMED:
        return BrokerConfigClass(config, RENAMED_CLASS, f"as `{RENAMED[name]}`")
    if name in BROKER_SYNONYMS:
        topic = BROKER_SYNONYMS[name][0]
        no_effect = TOPIC_CONFIG_DEFS[topic].no_effect
        if no_effect is not None:
            return BrokerConfigClass(config, NO_EFFECT, f"default of `{topic}`: {no_effect}")
        return BrokerConfigClass(config, TOPIC_DEFAULT, f"default of `{topic}`")
    if name in CLUSTER_KEYS | BROKER_KEYS:
        return BrokerConfigClass(config, HONOURED, "set through the controller (AlterConfigs)")
    return BrokerConfigClass(config, REFUSED, _refused_why(name))


def broker_config_classes() -> list[BrokerConfigClass]:
    """Every Kafka broker config classified; raises when a NodeConfig key is neither Kafka's
    nor listed as raftlog's own, or the lists name keys that are not there."""
    kafka, node = set(KAFKA_BY_NAME), set(node_keys())
    unexplained = sorted(node - kafka - RAFTLOG_ONLY.keys())
    if unexplained:
        raise ValueError(
            f"NodeConfig keys Kafka does not define, not in RAFTLOG_ONLY: {unexplained}"
        )
    stale = sorted((RAFTLOG_ONLY.keys() - node) | (RAFTLOG_ONLY.keys() & kafka))
    stale += sorted((RENAMED.keys() - kafka) | (set(RENAMED.values()) - node))
    if stale:
        raise ValueError(f"RAFTLOG_ONLY / RENAMED name keys that are not so: {stale}")
    return [classify(c) for c in KAFKA_BROKER_CONFIGS]


def broker_config_heading() -> str:
    counts = Counter(c.cls for c in broker_config_classes())
    return ", ".join(f"{counts[c]} {c}" for c in CLASSES)


def kafka_broker_config_rows() -> list[str]:
    rows: list[str] = []
    classes = broker_config_classes()
    for area in sorted({c.config.area for c in classes}):
        rows += [
            "", f"### {area}", "",
            "| Config | Type | Kafka default | Kafka updates | Here |",
            "| --- | --- | --- | --- | --- |",
        ]  # fmt: skip
        for c in (c for c in classes if c.config.area == area):
            k = c.config
            default = k.default.replace("|", "\\|")
            rows.append(
                f"| `{k.name}` | {k.type} | {default} | {k.update_mode} | {c.cls}: {c.note} |"
            )
    return rows


def raftlog_only_rows() -> list[str]:
    rows = ["| Key | Why raftlog has it |", "| --- | --- |"]
    rows += [f"| `{key}` | {why} |" for key, why in sorted(RAFTLOG_ONLY.items())]
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
        "listener's supported versions; the config models that validate each key. The lists "
        f"of Kafka's topic, group and broker configs are Kafka {KAFKA_RELEASE}'s, from its "
        "released documentation.",
        "",
        f"## API keys ({served} served) {{#apis}}",
        "",
        "A client asks ApiVersions first and uses only what is advertised; an API or version "
        "not served closes the connection (ApiVersions itself answers UNSUPPORTED_VERSION). "
        "*Kafka defines* is kio's copy of Kafka's message definitions, taken from Kafka's "
        f"development branch after {KAFKA_RELEASE}: for some APIs its newest version is later "
        f"than Kafka {KAFKA_RELEASE}'s.",
        "",
        *api_rows(),
        "",
        "## Topic configs {#topic-configs}",
        "",
        f"Kafka {KAFKA_RELEASE}'s topic config set (from its released documentation), per "
        "topic (CreateTopics, AlterConfigs, "
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
        "",
        f"## Kafka's broker configs ({broker_config_heading()}) {{#kafka-broker-configs}}",
        "",
        f"Every broker config Kafka {KAFKA_RELEASE} defines, from its released documentation "
        "(metadata_quorum/kafka_broker_configs.py), with the three dynamic-only broker quotas "
        "it leaves out of that list, grouped by the Kafka class that defines it, with Kafka's "
        "default "
        "and update mode (read-only: the properties file only; per-broker, cluster-wide: "
        "AlterConfigs without a restart). *Here*: honoured (a node config key of that name, or "
        "a setting the controller takes); honoured under another name; a topic-config default "
        "(a `log.*` synonym a node file or AlterConfigs sets, [Topic configs](#topic-configs)); "
        "accepted with no effect; or not accepted: a node config file naming it is refused at "
        "start as an unknown key, and AlterConfigs refuses it.",
        *kafka_broker_config_rows(),
        "",
        "### raftlog's own node configs {#raftlog-only-configs}",
        "",
        "Node config keys Kafka's broker has no config of that name for.",
        "",
        *raftlog_only_rows(),
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
