"""Every broker config Kafka 4.1 defines: the data lives in
metadata_quorum/kafka_broker_configs.py (a broker's DescribeConfigs reads it too); the
compatibility page imports it from here."""

from metadata_quorum.kafka_broker_configs import (
    BY_NAME,
    KAFKA_BROKER_CONFIGS,
    KAFKA_RELEASE,
    KafkaBrokerConfig,
    UpdateMode,
)

__all__ = ["BY_NAME", "KAFKA_BROKER_CONFIGS", "KAFKA_RELEASE", "KafkaBrokerConfig", "UpdateMode"]
