"""Fault injection against real node processes: kills, pauses and network partitions."""

import protos  # noqa: F401 - first, before anything imports grpc (see protos/__init__.py)
