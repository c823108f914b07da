"""The composition roots: the node process, its configuration, and the broker's lifecycle that
wires the broker core, the coordinators and the Kafka listener together. Nothing below imports
it."""
