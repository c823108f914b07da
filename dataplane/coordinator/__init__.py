"""Coordinators whose state is the replay of an internal compacted topic: the group coordinator
(KIP-848 consumer groups and classic groups, the assignor, the consumer protocol, the gRPC group
service) and the machinery shared with coordinators that sit beside it (Kafka's
``coordinator-common``). Built on ``dataplane.broker``; never imports the Kafka listener."""
