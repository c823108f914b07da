"""raftlog's storage engine: Kafka RecordBatch v2 logs on disk. Pure library, no network."""
