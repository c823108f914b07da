"""The optional parts of raftlog and the extras that install them.

``pip install raftlog`` is a broker, the client library and the CLI. Spark, Connect and the chaos
harness need more (PySpark, FastAPI, matplotlib), each behind an extra of the same name. Code
that needs an extra asks here first, so a missing one is a one-line message naming the extra to
install, never an ImportError traceback from deep inside a command. ``EXTRAS`` mirrors
pyproject.toml's ``[project.optional-dependencies]`` (tests/dataplane/tools/test_extras.py holds
the two together).
"""

from __future__ import annotations

from importlib.util import find_spec

# extra -> the top-level modules (import names) its distributions provide
EXTRAS: dict[str, tuple[str, ...]] = {
    "spark": ("pyspark", "pyarrow", "fastavro", "numpy"),
    "connect": ("fastapi", "uvicorn", "httpx"),
    "chaos": ("matplotlib", "numpy", "pyfuse3", "trio"),
}


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here (found on sys.path, not imported:
    the CLI asks on every start, and importing PySpark or FastAPI takes a second)."""
    return [module for module in EXTRAS[extra] if find_spec(module) is None]


def install_command(extra: str) -> str:
    return f"pip install 'raftlog[{extra}]'"


def missing_extra_message(what: str, extra: str, missing: list[str]) -> str:
    """One line: ``what`` needs ``raftlog[extra]``, which modules are absent, how to install."""
    return (
        f"{what} needs raftlog[{extra}] (not installed: {', '.join(missing)}): "
        f"{install_command(extra)}"
    )


def require_extra(extra: str, what: str) -> None:
    """Return if every module of ``extra`` is importable, else exit with the message naming it
    (SystemExit: the interpreter prints it on stderr, without a traceback)."""
    missing = missing_modules(extra)
    if missing:
        raise SystemExit(missing_extra_message(what, extra, missing))
