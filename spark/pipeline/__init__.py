"""The reference data pipeline: click events in, per-page window counts out, checked.

- ``events``: the click events and their seeded generator (pure);
- ``job``: the Structured Streaming job, ``clicks`` → 10-second event-time windows per page
  with a watermark → ``page-counts``, through the ``raftlog`` source and sink, append mode;
- ``checker``: ground truth from the generator's log against what ``page-counts`` holds;
  names every duplicated, missing, wrong, unexpected or malformed window;
- ``run``: one run: produce, stop the job mid-stream, produce while it is down, restart it
  from its checkpoint, finish, check; ``python -m spark.pipeline`` runs it on a local cluster.

How the run is made deterministic and short:

- **Event time is synthetic and runs faster than wall time.** Event ``n`` happens at
  ``start + n * 25 ms`` less a seeded lateness below 1 s, and events are produced 50 per
  100 ms: 12.5 s of event time per second, so ten 10-second windows pass in about 8 s.
  Which events exist, and so every window's count, depends only on the seed.
- **No event is ever late**, so the output does not depend on how Spark cuts micro-batches.
  The generator waits for each chunk of 50 events to be acknowledged (and logs them) before
  sending the next, so no partition lags another by more than a chunk (1.25 s of event time);
  with the 1 s lateness that is 2.25 s, inside the 5 s watermark delay. ``PipelineSettings``
  refuses settings that break this.
- **A flush event closes the last windows.** After the last real event the generator sends
  one event an hour of event time later; the watermark moves past every real window, which
  are all written in the next (no-data) micro-batch. The flush event's own window never
  closes, so it is never written, and it is not in the log.
- **The sink is exactly once and the checker reads committed.** Each micro-batch's windows
  commit in transactions with the batch (``spark/_writer.py``): a batch interrupted after some
  of its tasks wrote is run again on restart without writing those windows twice, so a window
  written twice is a failure the checker reports. The run still stops the query when no
  trigger is active (a clean stop: nothing is left prepared); the restarted query resumes from
  the checkpoint's next batch, with the windows' state.
"""
