"""A deleted topic's per-topic series go with it (Kafka's ``maybeRemoveTopicMetrics``)."""

from __future__ import annotations

from prometheus_client import generate_latest

from dataplane.broker.metrics import NodeMetrics


def test_series_of_topics_no_longer_hosted_are_removed() -> None:
    metrics = NodeMetrics()
    for topic in ("kept", "deleted"):
        metrics.bytes_in.labels(topic).inc(10)
        metrics.messages_in.labels(topic).inc(1)
        metrics.bytes_out.labels(topic).inc(10)
    metrics.follower_bytes_out.labels("deleted").inc(5)

    assert metrics.forget_topics({"kept", "hosted-without-traffic"}) == ["deleted"]

    text = generate_latest(metrics.registry).decode()
    assert 'topic="deleted"' not in text
    assert 'raftlog_bytes_in_total{topic="kept"} 10.0' in text
    assert 'raftlog_messages_in_total{topic="kept"} 1.0' in text
    assert metrics.forget_topics({"kept"}) == []
