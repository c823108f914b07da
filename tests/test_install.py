"""The base install, as a broker host gets it: ``pip install raftlog`` without extras into a fresh
virtual environment, then a node, a topic, produce and consume through the installed ``raftlog``.

The package is built from a copy of the working tree (pip would otherwise write ``build/`` and
``*.egg-info`` into the repository while other tests run), as a regular, non-editable install.
Its dependencies come from the configured index, or pip's cache. The node listens on 127.0.0.221
(the address reserved for this module) on ephemeral ports, is stopped by its pid, and dies with
the test run if that is killed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from dataplane.tools.extras import EXTRAS
from dataplane.tools.local_cluster import LocalCluster, pick_cluster_port, wait_for
from dataplane.tools.owned_process import popen_owned

REPO = Path(__file__).resolve().parents[1]
HOST = "127.0.0.221"
TOPIC = "installed"
# The base install's packages; spark, connect and chaos are installed too, their extras are not.
BASE_PACKAGES = ("raftlog", "metadata_quorum", "protos", "dataplane")
# One worker builds the environment once for every test here (the build is most of the time).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.xdist_group("install")]

# Run in the fresh environment: which optional modules it has, where the project comes from,
# and that every module of the base packages imports without an extra.
PROBE = """
import importlib, importlib.util, json, pkgutil, sys
optional, packages = json.loads(sys.argv[1]), json.loads(sys.argv[2])
failed = {}
for name in packages:
    package = importlib.import_module(name)
    for module in pkgutil.walk_packages(package.__path__, name + "."):
        try:
            importlib.import_module(module.name)
        except ImportError as error:
            failed[module.name] = repr(error)
print(json.dumps({
    "found": [m for m in optional if importlib.util.find_spec(m) is not None],
    "dataplane": importlib.import_module("dataplane").__file__,
    "failed": failed,
}))
"""


def copy_source(destination: Path) -> Path:
    """The files ``pip install`` needs, copied from the working tree (uncommitted edits too)."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]:
        package = pattern.rstrip("*")
        shutil.copytree(REPO / package, destination / package, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, destination / name)
    return destination


def clean_env() -> dict[str, str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("PYTHONPATH", None)  # nothing of the repository's tree may leak in
    env.pop("VIRTUAL_ENV", None)
    return env


def run(argv: list[str], cwd: Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=clean_env(), input=stdin, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with the base package installed from a copy of the tree."""
    root = tmp_path_factory.mktemp("install")
    source = copy_source(root / "source")
    venv = root / "venv"
    ok(run([sys.executable, "-m", "venv", str(venv)], cwd=root))
    ok(run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(source)], root))
    return venv


@pytest.fixture
def node(venv: Path, tmp_path: Path) -> Iterator[LocalCluster]:
    """One combined node run by the installed ``raftlog node``; stopped by its pid."""

    def launcher(node_id: int, argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        node_args = argv[argv.index("node") :]  # LocalCluster runs its own interpreter
        with log_path.open("ab") as out:
            return popen_owned(  # dies with this process if the test run is killed
                [str(venv / "bin" / "raftlog"), *node_args], cwd=tmp_path, env=clean_env(),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip

    cluster = LocalCluster(
        tmp_path / "cluster", nodes=1, first_host=int(HOST.rsplit(".", 1)[1]),
        port=pick_cluster_port([HOST]), launcher=launcher,
    )  # fmt: skip
    try:
        cluster.up()
        yield cluster
    except BaseException:
        log_path = cluster.specs[0].log_path
        if log_path.exists():
            print(f"---- {log_path}\n{log_path.read_text()[-4000:]}")
        raise
    finally:
        cluster.down()


def test_the_base_install_has_no_extra_and_its_modules_import(venv: Path, tmp_path: Path) -> None:
    optional = sorted(m for modules in EXTRAS.values() for m in modules)
    python = str(venv / "bin" / "python")
    probe = run([python, "-c", PROBE, json.dumps(optional), json.dumps(BASE_PACKAGES)], tmp_path)
    found = json.loads(ok(probe))
    assert found["found"] == [], f"the base install pulled in {found['found']}"
    assert found["dataplane"].startswith(str(venv)), "the installed package, not the tree"
    assert found["failed"] == {}, "base modules must not import an extra's modules"


def test_a_node_produce_and_consume_with_the_installed_cli(
    venv: Path, node: LocalCluster, tmp_path: Path
) -> None:
    raftlog = [str(venv / "bin" / "raftlog")]
    bootstrap = ["--bootstrap-server", node.bootstrap_servers[0]]
    created = ok(
        run([*raftlog, "topic", "create", TOPIC, "--partitions", "2", "--replication-factor",
             "1", "--json", *bootstrap], cwd=tmp_path)
    )  # fmt: skip
    assert json.loads(created) == {"topic": TOPIC, "created": True}

    def led() -> bool:
        described = run([*raftlog, "topic", "describe", TOPIC, "--json", *bootstrap], tmp_path)
        partitions = json.loads(ok(described))[0]["partitions"]
        return len(partitions) == 2 and all(p["leader"] in p["isr"] for p in partitions)

    wait_for(f"leaders of {TOPIC}", led)
    lines = [f"key-{n}:value {n}" for n in range(20)]
    produced = run(
        [*raftlog, "produce", TOPIC, "--key-separator", ":", "--json", *bootstrap],
        cwd=tmp_path, stdin="\n".join(lines),
    )  # fmt: skip
    assert json.loads(ok(produced)) == {"acknowledged": 20, "errors": 0}
    consumed = run(
        [*raftlog, "consume", TOPIC, "--from-beginning", "--max", "20", "--timeout-ms", "20000",
         "--json", *bootstrap], cwd=tmp_path,
    )  # fmt: skip
    records = [json.loads(line) for line in ok(consumed).splitlines()]
    assert sorted((r["key"], r["value"]) for r in records) == sorted(
        (f"key-{n}", f"value {n}") for n in range(20)
    )


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (["connect", "--help"], "connect"),
        (["connect", "list"], "connect"),
        (["mirror", "run"], "connect"),
        (["chaos", "run", "--seed", "1"], "chaos"),
    ],
)
def test_a_command_of_a_missing_extra_names_it(
    venv: Path, tmp_path: Path, args: list[str], extra: str
) -> None:
    result = run([str(venv / "bin" / "raftlog"), *args], cwd=tmp_path)
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"needs raftlog[{extra}]" in lines[0]
    assert f"pip install 'raftlog[{extra}]'" in lines[0]


def test_help_lists_the_missing_extras_and_spark_says_which_to_install(
    venv: Path, tmp_path: Path
) -> None:
    listed = ok(run([str(venv / "bin" / "raftlog"), "--help"], cwd=tmp_path))
    assert "pip install 'raftlog[connect]'" in listed
    assert "pip install 'raftlog[chaos]'" in listed
    pipeline = run([str(venv / "bin" / "python"), "-m", "spark.pipeline"], cwd=tmp_path)
    assert pipeline.returncode == 1
    assert "Traceback" not in pipeline.stderr, pipeline.stderr
    assert "needs raftlog[spark]" in pipeline.stderr
    assert "pip install 'raftlog[spark]'" in pipeline.stderr
