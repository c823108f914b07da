"""Kafka's binary protocol: the listener, the codec built from Kafka's message definitions, and the
admin and group handlers. A second front door to the broker: it reaches the broker core and the
coordinators only through the same service objects the gRPC servicers are."""
