"""The METRICS listener's server (`MetricsServer`) in process, on 127.0.0.150 (the last address
of tests/dataplane/server/test_rogue_node.py's range): plain HTTP as before, and HTTPS with the
server context a node builds for METRICS:SSL (`dataplane.server.node.metrics_tls`) under each
``ssl.client.auth``. A plain-HTTP client, an untrusted certificate or a missing one where it is
required is refused by the handshake, audited, and the server keeps serving the others."""

from __future__ import annotations

import http.client
import logging
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dataplane.broker.metrics import NodeMetrics, PartitionCounts, PartitionGauge
from dataplane.tools.certificates import make_ca, make_cert
from dataplane.tools.local_cluster import free_port
from metadata_quorum.security.tls import ClientAuth, TlsSettings

HOST = "127.0.0.150"
TIMEOUT_S = 10.0
# what a refused client sees: the handshake fails, or the server closes the connection
REFUSED = (ssl.SSLError, ConnectionError, urllib.error.URLError, http.client.HTTPException)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("metrics-pki")
    ca = make_ca(directory)
    other = make_ca(directory / "other", name="other-ca")
    return {
        "ca": ca.cert,
        "node": make_cert(ca, directory, "node-1", ips=(HOST,)),
        "scraper": make_cert(ca, directory, "prometheus", server=False),
        "stranger": make_cert(other, directory / "other", "prometheus", server=False),
        "other_ca": other.cert,
    }


@pytest.fixture
def metrics() -> NodeMetrics:
    metrics = NodeMetrics()
    metrics.bytes_in.labels(topic="orders").inc(42)
    return metrics


@contextmanager
def _serve(metrics: NodeMetrics, tls: ssl.SSLContext | None) -> Iterator[str]:
    server = metrics.serve(HOST, free_port(HOST), tls=tls)
    try:
        yield f"{HOST}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _server_tls(pki: dict[str, Path], client_auth: ClientAuth) -> ssl.SSLContext:
    return TlsSettings(pki["node"], pki["ca"], None, client_auth).server_context()


def _get(url: str, keystore: Path | None = None, ca: Path | None = None) -> str:
    context = None
    if url.startswith("https:"):
        assert ca is not None
        context = TlsSettings(keystore, ca).client_context()
    with urllib.request.urlopen(url, timeout=TIMEOUT_S, context=context) as answer:
        assert answer.status == 200
        return str(answer.read().decode())


def test_plain_http_as_before(metrics: NodeMetrics) -> None:
    with _serve(metrics, None) as address:
        assert 'raftlog_bytes_in_total{topic="orders"} 42.0' in _get(f"http://{address}/metrics")


@pytest.mark.parametrize("client_auth", ["none", "requested"])
def test_https_needs_only_the_ca_unless_required(
    metrics: NodeMetrics,
    pki: dict[str, Path],
    client_auth: ClientAuth,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with _serve(metrics, _server_tls(pki, client_auth)) as address:
        url = f"https://{address}/metrics"
        assert "raftlog_bytes_in_total" in _get(url, ca=pki["ca"])
        assert "raftlog_bytes_in_total" in _get(url, pki["scraper"], pki["ca"])
        audit = caplog.at_level(logging.WARNING, logger="raftlog.audit")
        with audit, pytest.raises(REFUSED):
            _get(f"http://{address}/metrics")  # plain HTTP to the HTTPS port
        assert "listener=METRICS mechanism=SSL" in caplog.text
        assert "TLS handshake failed" in caplog.text
        if client_auth == "requested":  # a certificate offered must be trusted
            with pytest.raises(REFUSED):
                _get(url, pki["stranger"], pki["ca"])
        assert "raftlog_bytes_in_total" in _get(url, ca=pki["ca"])  # still serving


def test_required_client_certificates(metrics: NodeMetrics, pki: dict[str, Path]) -> None:
    with _serve(metrics, _server_tls(pki, "required")) as address:
        url = f"https://{address}/metrics"
        assert "raftlog_bytes_in_total" in _get(url, pki["scraper"], pki["ca"])
        with pytest.raises(REFUSED):
            _get(url, ca=pki["ca"])  # no certificate
        with pytest.raises(REFUSED):
            _get(url, pki["stranger"], pki["ca"])  # another CA's
        with pytest.raises(REFUSED):
            _get(f"http://{address}/metrics")
        assert "raftlog_bytes_in_total" in _get(url, pki["scraper"], pki["ca"])


def test_the_client_must_trust_the_node(metrics: NodeMetrics, pki: dict[str, Path]) -> None:
    """A scraper that trusts another CA does not talk to the node (nothing is sent to it)."""
    with _serve(metrics, _server_tls(pki, "none")) as address, pytest.raises(REFUSED):
        _get(f"https://{address}/metrics", ca=pki["other_ca"])


def test_a_scrape_restricted_by_name_does_not_build_the_per_partition_series() -> None:
    """At 10,000 partitions the per-partition series took ~0.5 s of a broker's CPU per scrape,
    and the metadata benchmark's poll of two counts scraped every broker all the time: their
    Raft ticks came a second late and the controllers changed every few seconds. A scrape of
    named series (prometheus_client's ``name[]``) builds only what it names."""
    built: list[int] = []

    def partitions() -> list[PartitionGauge]:
        built.append(1)
        return [PartitionGauge("orders", n, 10 + n, 12 + n, 0) for n in range(3)]

    metrics = NodeMetrics()
    metrics.watch(partitions, lambda: PartitionCounts(3, 2, 1), lambda: None)
    with _serve(metrics, None) as address:
        url = f"http://{address}/metrics"
        counts = _get(f"{url}?name[]=raftlog_partitions&name[]=raftlog_under_replicated_partitions")
        assert "raftlog_partitions 3.0" in counts
        assert "raftlog_under_replicated_partitions 1.0" in counts
        assert "raftlog_partition_high_watermark" not in counts and built == []
        full = _get(url)
        assert built == [1]
        assert 'raftlog_partition_high_watermark{partition="2",topic="orders"} 12.0' in full
        assert 'raftlog_partition_log_end_offset{partition="0",topic="orders"} 12.0' in full
        assert "raftlog_leader_partitions 2.0" in full and "raftlog_partitions 3.0" in full
