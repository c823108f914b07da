"""Fault injection against real node processes: kills, pauses and network partitions."""
