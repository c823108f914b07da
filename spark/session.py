"""A local SparkSession on loopback with the ``raftlog`` data source registered.

Spark's Python workers must run this interpreter (it has pyarrow and the project), so
``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` are pointed at it; the driver binds
127.0.0.1 and the UI is off, so nothing listens beyond loopback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from spark.source import register

LOOPBACK = "127.0.0.1"
SHUFFLE_PARTITIONS = 2


def local_session(
    app_name: str, *, cores: int = 2, conf: Mapping[str, str] | None = None
) -> SparkSession:
    """``local[cores]`` with small shuffles; ``conf`` adds or overrides settings."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = LOOPBACK
    settings = {
        "spark.driver.host": LOOPBACK,
        "spark.driver.bindAddress": LOOPBACK,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(SHUFFLE_PARTITIONS),
        "spark.sql.session.timeZone": "UTC",
        "spark.python.worker.reuse": "true",
        **(conf or {}),
    }
    builder = SparkSession.builder.master(f"local[{cores}]").appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    register(session)
    return session
