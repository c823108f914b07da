"""``local_session`` keeps Spark quiet: a process that builds a session and runs a job prints
nothing of Spark's on stderr (no log4j profile notice, no WARN lines, not the JVM's notice),
while Spark's errors still get through."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import spark.session as session_module
from spark.session import bundled_zip, worker_python

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("spark-session"), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
from pyspark.sql.functions import udf

from spark.session import local_session

session = local_session("quiet")
print(session.range(1000).count())
session.stop()
session = local_session("second")  # the same JVM, a new context
print(session.range(10).count())

@udf("int")
def fail(value):
    raise ValueError("a worker failed on purpose")

try:
    session.range(1).select(fail("id")).collect()
except Exception as error:
    print(type(error).__name__)
session.stop()
"""


def test_a_session_prints_only_spark_errors() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1000", "10", "PythonException"]
    assert " ERROR " in done.stderr and "a worker failed on purpose" in done.stderr
    noise = [
        line
        for line in done.stderr.splitlines()
        if " WARN " in line or line.startswith("WARNING:") or "log4j" in line or "log level" in line
    ]
    assert noise == [], "\n".join(noise)


def test_workers_start_from_the_installed_pyspark_not_its_bytecode_less_zip() -> None:
    """Spark puts the pip-installed pyspark's ``pyspark.zip`` first on its workers' path; the
    launcher takes it off (only that zip), so a worker imports PySpark's cached bytecode, and
    runs this interpreter with the rest of the path as Spark gave it."""
    launcher = worker_python()
    assert worker_python() == launcher, "one launcher per interpreter"
    other = "/opt/spark-elsewhere/python/lib/pyspark.zip"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([bundled_zip(), other, str(REPO)])}
    probe = (
        "import os, sys, pyspark\n"
        "print(sys.executable, pyspark.__file__, os.environ['PYTHONPATH'], sep='\\n')"
    )
    done = subprocess.run(
        [launcher, "-c", probe], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    executable, imported, path = done.stdout.splitlines()
    assert executable == sys.executable
    assert not imported.startswith(bundled_zip())
    assert path == os.pathsep.join([other, str(REPO)])


def test_where_the_launcher_cannot_run_the_workers_run_this_interpreter(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A temporary directory on a noexec mount (Linux refuses ``X_OK`` there): Spark could not
    start a worker through the launcher, so the workers run this interpreter as before."""
    monkeypatch.setattr(session_module, "_launchers", {})
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    assert worker_python() == sys.executable
