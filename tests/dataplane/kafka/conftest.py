"""Fixtures shared by the Kafka listener's cluster test modules (each module has its own
module-scoped ``cluster``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kafka import KafkaAdminClient

from dataplane.tools.local_cluster import LocalCluster


@pytest.fixture(scope="module")
def kp_admin(cluster: LocalCluster) -> Iterator[KafkaAdminClient]:
    """kafka-python's admin client on the module's cluster."""
    admin = KafkaAdminClient(
        bootstrap_servers=cluster.kafka_bootstrap_servers, request_timeout_ms=30_000
    )
    try:
        yield admin
    finally:
        admin.close()
