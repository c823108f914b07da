"""raftlog Connect: moving data in and out of topics with connectors, in Kafka Connect's shape.

``connect.api`` is what a connector implements; ``connect.file`` holds the file connectors;
``raftlog connect standalone|distributed`` runs workers (``connect.process``), which serve the
REST API (``connect.rest``). The pure parts — assignment, config records, offset bookkeeping —
are ``connect.assignment``, ``connect.config_state`` and ``connect.offsets``.
"""
