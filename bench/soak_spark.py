"""The soak run's Spark streaming job, in a process of its own (the soak restarts it if it dies).

``python -m bench.soak_spark --bootstrap H:P,... --schema-registry-url URL,... --checkpoint DIR``:
the reference pipeline's job (spark/pipeline/job.py: ``soak-clicks``, Avro with the schema the
soak registered, -> 10-second event-time windows per page -> ``soak-page-counts``, exactly-once
sink) on ``local[1]``, resumed from ``DIR`` when it holds a
checkpoint. It runs until SIGTERM or SIGINT, then stops the query between two micro-batches and
exits 0; a query that fails exits 1 with the error on stderr. The driver JVM is this process's
child and exits when this process does (PySpark's gateway leaves when its stdin closes).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from pyspark.errors import StreamingQueryException

from spark.pipeline import job
from spark.session import local_session

CLICKS = "soak-clicks"
PAGE_COUNTS = "soak-page-counts"
WINDOW_S = 10
WATERMARK_DELAY_S = 5
TRIGGER_MS = 5_000  # a micro-batch every 5 s: the job runs for hours beside the rest
WATCH_S = 1  # seconds (awaitTermination takes whole seconds)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak_spark", description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--schema-registry-url", required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    args = parser.parse_args(argv)
    stopped = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    settings = job.JobSettings(
        bootstrap_servers=args.bootstrap,
        schema_registry_url=args.schema_registry_url,
        source_topic=CLICKS,
        sink_topic=PAGE_COUNTS,
        checkpoint=args.checkpoint,
        window_s=WINDOW_S,
        watermark_delay_s=WATERMARK_DELAY_S,
        trigger_ms=TRIGGER_MS,
    )
    session = local_session("raftlog-soak", cores=1)
    try:
        query = job.start(session, settings)
        print("soak spark job: started", flush=True)
        while not stopped.is_set():
            if query.awaitTermination(WATCH_S):
                job.raise_if_failed(query)
                print("soak spark job: the query ended on its own", file=sys.stderr)
                return 1
        job.stop_between_batches(query)
        print("soak spark job: stopped", flush=True)
        return 0
    except (RuntimeError, StreamingQueryException) as error:  # failed: the soak restarts it
        print(f"soak spark job: {error}", file=sys.stderr, flush=True)
        return 1
    finally:
        session.stop()


if __name__ == "__main__":
    sys.exit(main())
