"""raftlog's data plane: brokers, the client library, the node launcher and the CLI."""

import protos  # noqa: F401 - first, before anything imports grpc (see protos/__init__.py)
