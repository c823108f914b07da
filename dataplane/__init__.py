"""raftlog's data plane: brokers, the client library, the node launcher and the CLI."""
