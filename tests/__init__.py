"""The test suite: unit tests of the pure core, real clusters, real Spark."""

import protos  # noqa: F401 - first, before anything imports grpc (see protos/__init__.py)
