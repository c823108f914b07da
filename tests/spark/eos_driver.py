"""A streaming query of the exactly-once tests run as a process of its own, so that its driver
can be killed in the middle of a micro-batch's commit (``raftlog.test.killDriverAfterCommits``
names this process's group). Arguments: one JSON object (servers, source, sink, checkpoint,
prefix, kill_after_commits). Prints ``stopped`` when the query ends without being killed."""

from __future__ import annotations

import json
import os
import sys

from spark.session import local_session


def main(settings: dict[str, object]) -> None:
    session = local_session("tests-eos-driver")
    stream = (
        session.readStream.format("raftlog")
        .option("raftlog.bootstrap.servers", str(settings["servers"]))
        .option("subscribe", str(settings["source"]))
        .option("startingOffsets", "earliest")
        .load()
        .select("key", "value")
    )
    writer = (
        stream.writeStream.format("raftlog")
        .option("raftlog.bootstrap.servers", str(settings["servers"]))
        .option("topic", str(settings["sink"]))
        .option("transactionalIdPrefix", str(settings["prefix"]))
        .option("checkpointLocation", str(settings["checkpoint"]))
    )
    kill = settings.get("kill_after_commits")
    if kill is not None:
        # this process leads its own group (the test starts it in a new session): the driver
        # JVM is in it too, Spark's Python workers are not (their daemon makes its own)
        writer = writer.option("raftlog.test.killDriverAfterCommits", f"{kill}:{os.getpgid(0)}")
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    print("stopped", flush=True)
    session.stop()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
