"""The schema registry every broker serves: Confluent Schema Registry's REST API over the
compacted ``_schemas`` topic (docs/schema-registry.md)."""
