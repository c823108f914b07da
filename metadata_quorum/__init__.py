"""The controller quorum: metadata records, the image, the Raft shell, ControllerService."""

import protos  # noqa: F401 - first, before anything imports grpc (see protos/__init__.py)
