"""The ``raftlog`` command's entry point (the console script, ``python -m dataplane.tools.entry``).

kio's types import hypothesis for strategies whenever it is installed (a development venv, the
test suite's), which no node or command uses: ~0.5 s of every start-up's CPU. A process that
starts here has imported nothing yet, so hypothesis is kept out before the command line loads
kio; a process that imports ``dataplane.tools.cli`` by name (a test session, which needs
hypothesis) is left alone.

``node --config FILE`` runs without the command line's modules (typer, rich, the clients, the
other commands): nodes start often, and those cost ~0.4 s of a node's start-up CPU
(``dataplane.tools.node_command``).
"""

from __future__ import annotations

import sys

# What runs the command line in a process of its own: the tests', benchmarks' and harnesses'
# way to call ``raftlog`` with this interpreter.
COMMAND = [sys.executable, "-m", "dataplane.tools.entry"]


def keep_hypothesis_out() -> None:
    if "hypothesis" not in sys.modules:
        sys.modules["hypothesis"] = None  # type: ignore[assignment]


def main() -> None:
    keep_hypothesis_out()
    if len(sys.argv) > 1 and sys.argv[1] == "node":  # without the rest of the command line
        from dataplane.tools.node_command import node_config_argument, run_node  # noqa: PLC0415

        config = node_config_argument(sys.argv[1:])
        if config is not None:
            raise SystemExit(run_node(config))
    from dataplane.tools.cli import main as cli_main  # noqa: PLC0415 - after the line above

    cli_main()


if __name__ == "__main__":
    main()
