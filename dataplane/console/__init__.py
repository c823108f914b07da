"""The web console (issue 33): server-rendered HTML pages of a cluster, its topics, their
records and the consumer groups, read only through the client library (AdminClient, Consumer,
Producer for the produce form), served by a node (``console.listener``) or on its own
(``raftlog console``). docs/console.md describes it."""
