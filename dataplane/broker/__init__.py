"""What a broker serves: BrokerService, partitions, the replica manager and replica state, the
replica fetcher, producer state and metrics. The lowest room of the data plane: it imports no other
room of ``dataplane`` (the coordinators, the Kafka listener and the server sit on top of it)."""
