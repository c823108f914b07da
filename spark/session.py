"""A local SparkSession on loopback with the ``raftlog`` data source registered.

Spark's Python workers must run this interpreter (it has pyarrow and the project), so
``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` are pointed at it; the driver binds
127.0.0.1 and the UI is off, so nothing listens beyond loopback.

The workers start through a launcher (`worker_python`) that takes the pip-installed
pyspark's own ``pyspark.zip`` off their ``PYTHONPATH``. Spark puts it first, and the zip holds
no bytecode: every worker compiled PySpark's modules again, 1.7-2.2 s of CPU for the streaming
source's runner on this machine against 0.6 s from the installed package's cached bytecode.
A data source's runners start a new worker per plan, read, write and commit, and one that has
not connected back to the JVM within Spark's fixed 10 s fails the query (seen in CI under
load: ``Python worker failed to connect back``). The package and the zip are the same files
(pip's pyspark is its own ``SPARK_HOME``); a zip of another Spark installation is left alone.

Spark logs errors only (``log_level``): its warnings are about Spark's own choices (no
native-hadoop library, AQE off in streaming, a micro-batch longer than its trigger, ...) and
would drown a run's own progress. The level is set by a log4j2 configuration the driver JVM
reads when it starts, so what Spark prints while starting is quiet too, and the notice the JVM
itself prints at every start is filtered out of its stderr. Later sessions of the process share
that JVM and get their level through ``setLogLevel``.
"""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO

import pyspark
from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession

from spark.source import register

LOOPBACK = "127.0.0.1"
SHUFFLE_PARTITIONS = 2
LOG_LEVEL = "ERROR"
# Spark's own console layout (its log4j2-defaults.properties), one level for every logger.
# PySpark's gateway starts logging as a shell does, at the level of its own logger (WARN unless
# configured): at the root's level, Spark neither changes the level nor prints "Setting default
# log level to ...".
LOG4J2_PROPERTIES = """\
status = error
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = {level}
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
"""
DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
# Printed by the JVM itself at every start (Spark's launcher always adds
# --add-modules=jdk.incubator.vector) and silenced by no option: dropped from the driver's stderr.
JVM_START_NOTICES = (b"WARNING: Using incubator modules: ",)
STDERR_LINE_MAX_BYTES = 64 * 1024
STDERR_FD = 2
# POSIX sh: every PYTHONPATH entry but the bundled zip, then this interpreter
WORKER_LAUNCHER = """\
#!/bin/sh
zip={zip}
kept=
set -f
old_ifs=$IFS
IFS=:
for entry in ${{PYTHONPATH-}}; do
    [ "$entry" = "$zip" ] || kept="${{kept:+$kept:}}$entry"
done
IFS=$old_ifs
if [ -n "$kept" ]; then export PYTHONPATH="$kept"; else unset PYTHONPATH; fi
exec {python} "$@"
"""
_launchers: dict[str, str] = {}  # by interpreter
_launcher_lock = threading.Lock()


def local_session(
    app_name: str,
    *,
    cores: int = 2,
    conf: Mapping[str, str] | None = None,
    log_level: str = LOG_LEVEL,
) -> SparkSession:
    """``local[cores]`` with small shuffles, Spark logging at ``log_level`` (log4j's names:
    ERROR, WARN, INFO, ...); ``conf`` adds or overrides settings."""
    os.environ["PYSPARK_PYTHON"] = worker_python()
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = LOOPBACK
    settings = {
        "spark.master": f"local[{cores}]",
        "spark.app.name": app_name,
        "spark.driver.host": LOOPBACK,
        "spark.driver.bindAddress": LOOPBACK,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(SHUFFLE_PARTITIONS),
        "spark.sql.session.timeZone": "UTC",
        "spark.python.worker.reuse": "true",
        **(conf or {}),
    }
    # log4j reads the file once, while the driver JVM starts.
    with tempfile.TemporaryDirectory(prefix="raftlog-spark-") as directory:
        log4j2 = Path(directory) / "log4j2.properties"
        log4j2.write_text(LOG4J2_PROPERTIES.format(level=log_level.lower()))
        # The caller's own options come last: a -Dlog4j2.configurationFile of theirs wins.
        java_options = f"-Dlog4j2.configurationFile=file:{log4j2}"
        if settings.get(DRIVER_JAVA_OPTIONS):
            java_options = f"{java_options} {settings[DRIVER_JAVA_OPTIONS]}"
        settings[DRIVER_JAVA_OPTIONS] = java_options
        _start_driver(settings)
        builder = SparkSession.builder
        for key, value in settings.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel(log_level)
    register(session)
    return session


def bundled_zip() -> str:
    """The ``pyspark.zip`` that Spark puts on its workers' path for the installed pyspark."""
    return str(Path(pyspark.__file__).parent / "python" / "lib" / "pyspark.zip")


def worker_python() -> str:
    """A launcher for Spark's Python workers (see the module's docstring): this interpreter,
    with `bundled_zip` taken off ``PYTHONPATH``. Written once per process, removed at exit;
    this interpreter itself where the temporary directory allows no execution (noexec)."""
    with _launcher_lock:
        launcher = _launchers.get(sys.executable)
        if launcher is None or not os.path.exists(launcher):
            directory = tempfile.mkdtemp(prefix="raftlog-spark-python-")
            atexit.register(shutil.rmtree, directory, ignore_errors=True)
            path = Path(directory) / "python"
            zip_path, python = shlex.quote(bundled_zip()), shlex.quote(sys.executable)
            path.write_text(WORKER_LAUNCHER.format(zip=zip_path, python=python))
            path.chmod(0o700)
            # Linux refuses X_OK on a noexec mount: Spark could not start the workers there
            usable = os.access(path, os.X_OK)
            launcher = _launchers[sys.executable] = str(path) if usable else sys.executable
        return launcher


def _start_driver(settings: Mapping[str, str]) -> None:
    """Start the driver JVM and its SparkContext as ``getOrCreate`` would, but with the JVM's
    stderr read through a pipe (PySpark's ``popen_kwargs``, meant for this) and copied to ours
    without the JVM's start notices. Nothing to do if this process already has its JVM."""
    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    conf = SparkConf().setAll(list(settings.items()))
    gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})  # type: ignore[no-untyped-call]
    target_fd = os.dup(STDERR_FD)  # where the JVM's stderr would have gone
    threading.Thread(
        target=_copy_stderr,
        args=(gateway.proc.stderr, target_fd),
        name="spark-driver-stderr",
        daemon=True,
    ).start()
    SparkContext(conf=conf, gateway=gateway)


def _copy_stderr(source: IO[bytes], target_fd: int) -> None:
    """Copy the driver's stderr line by line to ``target_fd`` until the JVM exits, leaving out
    the JVM's start notices (a line longer than STDERR_LINE_MAX_BYTES goes in pieces)."""
    try:
        with source:
            for line in iter(lambda: source.readline(STDERR_LINE_MAX_BYTES), b""):
                if line.startswith(JVM_START_NOTICES):
                    continue
                view = memoryview(line)
                while view:
                    view = view[os.write(target_fd, view) :]
    finally:
        os.close(target_fd)
