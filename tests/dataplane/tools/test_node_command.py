"""``raftlog node --config FILE`` runs without the rest of the command line (a node's start-up
CPU), and every other use of ``node`` still gets the command line's help and errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dataplane.tools.entry import COMMAND as RAFTLOG
from dataplane.tools.node_command import node_config_argument


def test_only_node_with_an_existing_config_file_takes_the_short_way(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text("")
    assert node_config_argument(["node", "--config", str(config)]) == config
    assert node_config_argument(["node", f"--config={config}"]) == config
    assert node_config_argument(["node", "--config", str(tmp_path / "missing.toml")]) is None
    assert node_config_argument(["node", "--config", str(tmp_path)]) is None  # a directory
    assert node_config_argument(["node", "--help"]) is None
    assert node_config_argument(["node", "--config", str(config), "--help"]) is None
    assert node_config_argument(["topic", "--config", str(config)]) is None


def test_a_node_starts_without_the_command_lines_modules(tmp_path: Path) -> None:
    """The short way imports neither typer, rich nor the other commands; a bad file still
    exits 1 with its error."""
    config = tmp_path / "node.toml"
    config.write_text("node.id = ")  # not TOML
    probe = (
        "import runpy, sys\n"
        f"sys.argv = ['raftlog', 'node', '--config', {str(config)!r}]\n"
        "try:\n"
        "    runpy.run_module('dataplane.tools.entry', run_name='__main__')\n"
        "except SystemExit as exit:\n"
        "    loaded = [m for m in ('typer', 'rich', 'dataplane.tools.cli') if m in sys.modules]\n"
        "    print(exit.code, loaded)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.stdout.strip() == "1 []", done.stdout + done.stderr
    assert "error:" in done.stderr


def test_other_uses_of_node_get_the_command_lines_help_and_errors(tmp_path: Path) -> None:
    helped = subprocess.run([*RAFTLOG, "node", "--help"], capture_output=True, text=True,
                            timeout=120, check=False)  # fmt: skip
    assert helped.returncode == 0 and "--config" in helped.stdout
    missing = subprocess.run([*RAFTLOG, "node", "--config", str(tmp_path / "missing.toml")],
                             capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert missing.returncode == 2 and "does not exist" in missing.stderr
