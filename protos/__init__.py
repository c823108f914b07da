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
#
# gRPC's core takes ``grpc.min_reconnect_backoff_ms`` as its *minimum connect timeout* (each
# attempt's deadline is the larger of it and the current backoff; grpc's subchannel.cc), not as
# a backoff. It was 100 ms, and a new connection across zones (20 ms one way: TCP's handshake and
# HTTP/2's SETTINGS are two round trips, 80 ms before any TLS) failed its first call outright (3
# of 8 fresh clients, bench.netem). 2 s is Kafka's idea of the same bound
# (``socket.connection.setup.timeout.ms``, 10 s, with its backoff kept short) scaled to what a
# call here waits: a call queued behind an attempt to a node that answers no SYN (a partition) or
# no SETTINGS (a paused process) now fails after 2 s instead of 100 ms, still well inside every
# call's own deadline.
CONNECT_TIMEOUT_MS = 2000
RECONNECT_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_MS),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
