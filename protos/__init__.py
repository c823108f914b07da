"""Protocol buffer sources and the modules generated from them by ``make protos``.

Importing this package (every raftlog package that speaks gRPC imports it first) sets
``GRPC_ENABLE_FORK_SUPPORT=false`` unless the environment already says otherwise. gRPC reads it
when it is first imported. With its fork support on (the default of grpcio's core), a process
that forks while gRPC threads run — PySpark starting its JVM (``Popen`` with ``preexec_fn``), any
``subprocess`` call that cannot use vfork — runs gRPC's fork handlers, and about one child in ten
dies before its exec with ``epoll_wait error: Bad file descriptor`` (measured here:
``tests/protos/test_fork_safety.py``). raftlog never uses gRPC in a forked child, so it needs none
of that support.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# Channel options for every raftlog channel. gRPC backs off reconnecting to an address that went
# away, up to 120 s, and fails each call meanwhile without trying: a node that restarts stayed
# unreachable long after it was back (seen: brokers fenced because they could not reach the
# restarted controller that had become active). Reconnect within a second instead.
RECONNECT_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)

# gRPC refuses a message over 4 MiB by default, a receive limit per channel. A follower's
# catch-up fetch is answered up to replica.fetch.response.max.bytes (10 MiB), a metadata
# snapshot grows with the partitions: at 10,000 partitions a follower 333 partitions behind its
# restarted leader was refused its 10 MiB answer (RESOURCE_EXHAUSTED) every second, and those
# partitions stayed out of the ISR. Every raftlog channel takes messages this large: these are
# the default of open_channel (metadata_quorum.security.channels), through which all are opened.
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    *RECONNECT_OPTIONS,
)
