"""raftlog Connect."""
