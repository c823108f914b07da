"""raftlog for Apache Spark (PySpark only, no JVM connector).

Import names from the modules, never the bare package (it would shadow the customary
``spark = SparkSession...`` variable)::

    from spark.source import register
    register(session)
    df = session.read.format("raftlog").option("subscribe", "clicks").load()

``spark.source``: the ``raftlog`` Python data source (batch and streaming, read and write) with
the option names and row schema of Spark's Kafka connector. ``spark.rdd``: an RDD reader of
offset ranges. ``spark.pipeline``: the reference click-count pipeline.

PySpark and PyArrow come with the ``spark`` extra (``pip install 'raftlog[spark]'``); without
them, importing this package (``python -m spark.pipeline`` too) exits with a message naming it.
"""

import protos  # noqa: F401 - first, before anything imports grpc (see protos/__init__.py)
from dataplane.tools.extras import require_extra

require_extra("spark", "raftlog's Spark support")
