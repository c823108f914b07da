"""The ``raftlog`` command line: the CLI and its client and group commands, cluster status, perf,
the local cluster and the demos. The top room of the data plane."""
