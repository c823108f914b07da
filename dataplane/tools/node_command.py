"""``raftlog node --config FILE``: run one node (controller and/or broker) until SIGTERM.

Nodes start often (every restart, every local cluster, every chaos fault), so the console
script (`dataplane.tools.entry`) runs this command without loading the rest of the command line:
typer, rich, the clients and every other command's modules cost ~0.4 s of the ~1.9 s of CPU a
node takes to start. Any other use of ``node`` (``--help``, a missing file) goes through the
full command line, which gives its usual help and errors.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from dataplane.server.config import NodeConfig
from dataplane.server.node import run
from raftlog.config import ConfigError


def run_node(config: Path) -> int:
    """Run the node ``config`` describes until SIGTERM; the exit status (1: a bad file, or
    bootstrap servers that lead to no quorum)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        run(NodeConfig.load(config))
    except ConfigError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return 1
    return 0


def node_config_argument(argv: list[str]) -> Path | None:
    """FILE when ``argv`` is exactly ``node --config FILE`` (or ``--config=FILE``) and FILE is
    an existing file; None otherwise."""
    if len(argv) == 3 and argv[:2] == ["node", "--config"]:
        path = argv[2]
    elif len(argv) == 2 and argv[0] == "node" and argv[1].startswith("--config="):
        path = argv[1].removeprefix("--config=")
    else:
        return None
    config = Path(path)
    return config if config.is_file() else None
