"""The extras: `EXTRAS` against pyproject.toml, and what a command of a missing extra does.

The base install itself (no extras, a real node) is tests/test_install.py.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from importlib.metadata import entry_points, packages_distributions
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from dataplane.tools import cli, extras

REPO = Path(__file__).resolve().parents[3]


def requirement_names(requirements: list[str]) -> set[str]:
    names = set()
    for requirement in requirements:
        match = re.match(r"[A-Za-z0-9._-]+", requirement)
        assert match is not None, requirement
        names.add(re.sub(r"[-_.]+", "-", match.group(0)).lower())
    return names


def test_extras_are_pyprojects_optional_dependencies() -> None:
    """Each extra's modules are exactly what its distributions provide, the base dependencies
    hold none of them, and dev is all of them (so `make test` installs every extra)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    optional: dict[str, list[str]] = project["optional-dependencies"]
    assert set(extras.EXTRAS) == set(optional) - {"dev", "docs"}
    providers = packages_distributions()
    base = requirement_names(project["dependencies"])
    for extra, modules in extras.EXTRAS.items():
        provided = {re.sub(r"[-_.]+", "-", d).lower() for m in modules for d in providers[m]}
        assert provided == requirement_names(optional[extra]), extra
        assert not provided & base, f"{extra}'s {provided & base} are base dependencies"
    own = next(r for r in optional["dev"] if r.startswith("raftlog["))
    assert set(own.removeprefix("raftlog[").rstrip("]").split(",")) == {*extras.EXTRAS, "docs"}


def test_every_plugin_names_its_extra() -> None:
    plugins = {entry.name for entry in entry_points(group=cli.PLUGIN_GROUP)}
    assert plugins == set(cli.PLUGIN_EXTRAS)
    assert set(cli.PLUGIN_EXTRAS.values()) <= set(extras.EXTRAS)


def test_require_extra_exits_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    extras.require_extra("spark", "Spark")  # installed here: returns
    monkeypatch.setitem(extras.EXTRAS, "spark", ("pyspark", "no_such_module_of_spark"))
    with pytest.raises(SystemExit) as exited:
        extras.require_extra("spark", "raftlog's Spark support")
    assert str(exited.value) == (
        "raftlog's Spark support needs raftlog[spark] (not installed: no_such_module_of_spark): "
        "pip install 'raftlog[spark]'"
    )


@dataclass(frozen=True)
class MissingModuleEntry:
    """An entry point whose module imports a module that is not installed."""

    name: str
    value: str
    missing: str

    def load(self) -> object:
        raise ModuleNotFoundError(f"No module named {self.missing!r}", name=self.missing)


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> typer.Typer:
    """A fresh CLI app for add_plugin_commands to fill (the module's own stays as it is)."""
    fresh = typer.Typer(no_args_is_help=True)
    # A second command, so typer keeps a group (a lone command would become the app itself).
    fresh.command("node")(lambda: None)
    monkeypatch.setattr(cli, "app", fresh)
    return fresh


def invoke(app: typer.Typer, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200", "NO_COLOR": "1"})
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("args", [("connect", "list"), ("connect", "--help"), ("connect",)])
def test_a_plugin_whose_extra_is_missing_is_a_stand_in(
    app: typer.Typer, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    """The real connect entry point (it loads: its runtime is imported on use), with fastapi
    and httpx reported missing: the stand-in keeps connect's help and names the extra."""
    real = [e for e in entry_points(group=cli.PLUGIN_GROUP) if e.name == "connect"]
    monkeypatch.setattr(cli, "entry_points", lambda group: real)
    monkeypatch.setattr(cli, "missing_modules", lambda extra: ["fastapi", "httpx"])
    cli.add_plugin_commands()
    code, _, stderr = invoke(app, *args)
    assert (code, stderr) == (
        2,
        "raftlog connect needs raftlog[connect] (not installed: fastapi, httpx): "
        "pip install 'raftlog[connect]'\n",
    )
    code, listed, _ = invoke(app, "--help")
    assert code == 0
    assert "Kafka Connect-style connectors" in listed
    assert "Needs pip install 'raftlog[connect]'." in listed


def test_a_plugin_failing_on_a_module_of_its_extra_is_a_stand_in(
    app: typer.Typer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    entry = MissingModuleEntry("mirror", "connect.mirror_cli:mirror_app", "uvicorn.config")
    monkeypatch.setattr(cli, "entry_points", lambda group: [entry])
    cli.add_plugin_commands()
    assert capsys.readouterr().err == ""
    code, _, stderr = invoke(app, "mirror", "run")
    assert code == 2
    assert stderr.startswith("raftlog mirror needs raftlog[connect] (not installed: uvicorn)")


def test_a_plugin_failing_on_another_module_is_reported_and_left_out(
    app: typer.Typer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A module outside the extra (a bug, not a missing extra) is no reason to install one."""
    entry = MissingModuleEntry("chaos", "chaos.cli:chaos_app", "chaos.no_such_module")
    monkeypatch.setattr(cli, "entry_points", lambda group: [entry])
    cli.add_plugin_commands()
    assert "'chaos' commands (chaos.cli:chaos_app) did not load" in capsys.readouterr().err
    assert [c.name for c in app.registered_commands] == ["node"]
    assert not app.registered_groups


def test_a_plugin_with_its_extra_is_added_as_it_is(app: typer.Typer) -> None:
    cli.add_plugin_commands()
    assert {group.name for group in app.registered_groups} == set(cli.PLUGIN_EXTRAS)
    assert [c.name for c in app.registered_commands] == ["node"]
