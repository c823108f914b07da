"""Transaction benchmark: transactional produce against idempotent produce, the time of a commit,
and read_committed consume against read_uncommitted, on one real 3-node cluster.

``python -m bench.txn_bench --out bench/results/latest.json [--quick]``

A LocalCluster of 3 combined nodes on 127.0.0.47-49 (reserved for this benchmark), data in a
temporary directory removed afterwards. Every produce run writes 1 KiB records with acks=all and
the producer's defaults (``batch.size`` 1 MB, ``linger.ms`` 5, five requests in flight; see
``MAX_IN_FLIGHT``) to its own topic of the same layout: 6 partitions, replication
factor 3, ``min.insync.replicas`` 2 (the topic is deleted after the run, so the disk holds one
run's data at a time).

1. Produce, three variants: the idempotent producer (no transactions), and a transactional
   producer committing every 100 and every 10,000 records (``begin_transaction``, the sends,
   ``commit_transaction``). Each first as a burst of ``burst_records`` (as the data-plane
   benchmark's saturated run), then sustained for ``sustained_s`` (transactions begun until then;
   the idempotent producer sends until then and flushes). Records/s and MB/s of acknowledged
   (committed) records, from the first send to the last commit (flush); transactions/s; the
   partitions a transaction touched; the CPU seconds of the nodes and of this process (and the
   nodes' CPU at rest, measured first for ``idle_s``: the floor under those figures).
2. Commit latency: the time of each ``commit_transaction`` call as the application sees it (the
   flush of the transaction's last records, then EndTxn, which answers once PrepareCommit is
   replicated; the markers are written after it): p50, p99, p999, max.
3. Consume: a topic filled by two transactional producers at once (transactions of 1,000 records,
   every 10th aborted after its records were written) is read from the beginning to its end by
   new consumers, read_uncommitted and read_committed passes alternating until each level has
   read for ``consume_s`` (and at least ``consume_passes_min`` passes): records/s returned (a
   read_committed pass returns only the committed records, and the benchmark checks it returns
   exactly them), log offsets/s walked (the same log for both), MB/s of values returned.

MB is 10**6 bytes of values. Every wait polls a condition with a deadline; the nodes are stopped
by their pids at the end, also on failure or SIGTERM.
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from rich.console import Console
from rich.table import Table

from bench import RECORD_BYTES, bench_main
from bench.dataplane_bench import cluster_in, cpu_seconds, create_topic
from dataplane.client import AdminClient, Consumer, Producer, RecordFuture, TopicPartition
from dataplane.client._record_future import BatchResult
from dataplane.tools.local_cluster import LocalCluster, wait_for
from dataplane.tools.perf import latency_summary

FIRST_HOST = 47  # 127.0.0.47-49 are this benchmark's
PARTITIONS = 6
RECORDS_PER_TRANSACTION = (100, 10_000)
MIXED_PRODUCERS = 2  # transactional producers filling the consume topic at once
MIXED_RECORDS_PER_TRANSACTION = 1_000
ABORT_EVERY = 10  # every 10th transaction of the consume topic is aborted
# Every producer here keeps the default five batches in flight per connection. (A first run with
# five found two first batches of a transaction, verified (KIP-890) at once, refused: the broker
# kept only the last verification where Kafka's ``maybeCreateVerificationStateEntry`` shares it;
# ``ProducerStates.start_verification`` now shares it too.)
MAX_IN_FLIGHT = 5
CHECK_EVERY_RECORDS = 1_000  # the idempotent run looks at the clock once per this many sends
MAX_POLL_RECORDS = 5_000
POLL_TIMEOUT_MS = 200
WAIT_S = 300.0  # the bound of every call and wait (a loaded 2-core machine)
MB = 1_000_000
Isolation = Literal["read_uncommitted", "read_committed"]
ISOLATION_LEVELS: tuple[Isolation, Isolation] = ("read_uncommitted", "read_committed")


@dataclass(frozen=True)
class Sizes:
    burst_records: int
    sustained_s: float
    mixed_records: int  # a multiple of MIXED_PRODUCERS * MIXED_RECORDS_PER_TRANSACTION
    consume_s: float  # per isolation level
    consume_passes_min: int
    idle_s: float  # the nodes' CPU at rest is measured over this long


FULL = Sizes(
    burst_records=100_000, sustained_s=30.0, mixed_records=300_000, consume_s=30.0,
    consume_passes_min=3, idle_s=10.0,
)  # fmt: skip
QUICK = Sizes(
    burst_records=20_000, sustained_s=2.0, mixed_records=20_000, consume_s=1.0,
    consume_passes_min=1, idle_s=1.0,
)  # fmt: skip


# -- produce -------------------------------------------------------------------------------------
class BatchWatch:
    """The batches a run's records went to, with one callback per batch (not per record, which
    would cost the sending thread more than the send): the partitions each transaction touched,
    and the first failure, which makes the run fail. A benchmark of a failing producer measures
    nothing."""

    def __init__(self) -> None:
        self._last: BatchResult | None = None
        self.partitions: set[TopicPartition] = set()  # of the current transaction
        self.failures: list[BaseException] = []  # appended by the sender thread

    def note(self, future: RecordFuture) -> None:
        batch = future.batch
        if batch is not self._last:
            self._last = batch
            self.partitions.add(batch.tp)
            batch.add_batch_callback(self._done)

    def _done(self, batch: BatchResult) -> None:
        if batch.error is not None:
            self.failures.append(batch.error)

    def check(self) -> None:
        if self.failures:
            raise RuntimeError(f"{len(self.failures)} batches failed, first: {self.failures[0]}")


@dataclass(frozen=True)
class Run:
    """What one produce run is: a variant (None records per transaction: idempotent, no
    transactions) and a size (a number of records, or a number of seconds)."""

    records_per_transaction: int | None
    records: int | None = None
    seconds: float | None = None

    @property
    def name(self) -> str:
        per = self.records_per_transaction
        return "idempotent" if per is None else f"transactions_of_{per}"


def _cpu(cluster: LocalCluster) -> tuple[float, float]:
    nodes = sum(cpu_seconds(cluster.pid(n) or 0) for n in (1, 2, 3))
    return nodes, time.process_time()


def _rates(records: int, transactions: int, seconds: float) -> dict[str, Any]:
    return {
        "records": records,
        "seconds": round(seconds, 3),
        "records_per_s": round(records / seconds, 1),
        "mb_per_s": round(records * RECORD_BYTES / seconds / MB, 1),
        "transactions": transactions,
        "transactions_per_s": round(transactions / seconds, 1) if transactions else 0.0,
    }


def produce_idempotent(bootstrap: list[str], topic: str, run: Run) -> dict[str, Any]:
    """Idempotent sends (``run.records`` of them, or for ``run.seconds``), then a flush."""
    payload, watch, sent = os.urandom(RECORD_BYTES), BatchWatch(), 0
    with Producer(
        bootstrap, acks="all", enable_idempotence=True,
        max_in_flight_requests_per_connection=MAX_IN_FLIGHT,
    ) as producer:  # fmt: skip
        start = time.perf_counter()
        if run.records is not None:
            for _ in range(run.records):
                watch.note(producer.send(topic, payload))
            sent = run.records
        else:
            assert run.seconds is not None, "a run has a number of records or of seconds"
            while time.perf_counter() - start < run.seconds:
                for _ in range(CHECK_EVERY_RECORDS):
                    watch.note(producer.send(topic, payload))
                sent += CHECK_EVERY_RECORDS
        producer.flush(timeout=WAIT_S)
        seconds = time.perf_counter() - start
    watch.check()
    return _rates(sent, 0, seconds)


def produce_transactional(bootstrap: list[str], topic: str, run: Run) -> dict[str, Any]:
    """Transactions of ``run.records_per_transaction`` records, committed one after the other
    (``run.records`` in all, or begun for ``run.seconds``); each commit timed."""
    per = run.records_per_transaction
    assert per is not None, "a transactional run has a transaction size"
    payload, watch = os.urandom(RECORD_BYTES), BatchWatch()
    commit_ms: list[float] = []
    partitions_touched = 0
    with Producer(
        bootstrap, acks="all", transactional_id=f"bench-{topic}",
        max_in_flight_requests_per_connection=MAX_IN_FLIGHT,
    ) as producer:  # fmt: skip
        producer.init_transactions(timeout_s=WAIT_S)
        start = time.perf_counter()
        while (
            len(commit_ms) * per < run.records
            if run.records is not None
            else time.perf_counter() - start < (run.seconds or 0.0)
        ):
            producer.begin_transaction()
            watch.partitions.clear()
            for _ in range(per):
                watch.note(producer.send(topic, payload))
            before = time.perf_counter()
            producer.commit_transaction(timeout_s=WAIT_S)
            commit_ms.append((time.perf_counter() - before) * 1000)
            partitions_touched += len(watch.partitions)
        seconds = time.perf_counter() - start
    watch.check()
    transactions = len(commit_ms)
    return {
        **_rates(transactions * per, transactions, seconds),
        "partitions_per_transaction": round(partitions_touched / transactions, 2),
        "commit_latency_ms": {
            key: round(value, 2)
            for key, value in asdict(
                latency_summary(commit_ms, sum(commit_ms), transactions, max(commit_ms))
            ).items()
        },
    }


def produce_run(cluster: LocalCluster, run: Run, console: Console, topic: str) -> dict[str, Any]:
    """One run on a topic of its own (created before, deleted after), with the CPU it took."""
    create_topic(cluster, topic, PARTITIONS)
    size = f"{run.records:,} records" if run.records else f"{run.seconds:.0f} s"
    console.log(f"produce {run.name}: {size}")
    nodes_before, client_before = _cpu(cluster)
    produce = produce_idempotent if run.records_per_transaction is None else produce_transactional
    figures = produce(cluster.bootstrap_servers, topic, run)
    nodes_after, client_after = _cpu(cluster)
    figures["node_cpu_s"] = round(nodes_after - nodes_before, 2)
    figures["client_cpu_s"] = round(client_after - client_before, 2)
    figures["node_cpu_us_per_record"] = round(
        (nodes_after - nodes_before) / figures["records"] * 1e6, 1
    )
    with AdminClient(cluster.bootstrap_servers) as admin:
        deleted = admin.delete_topics([topic])[topic]
        if deleted is not None:
            raise deleted
    return figures


def produce_section(cluster: LocalCluster, sizes: Sizes, console: Console) -> dict[str, Any]:
    """The bursts, then the sustained runs; each in the order idempotent, 100, 10,000."""
    variants: tuple[int | None, ...] = (None, *RECORDS_PER_TRANSACTION)
    bursts = [Run(per, records=sizes.burst_records) for per in variants]
    sustained = [Run(per, seconds=sizes.sustained_s) for per in variants]
    return {
        "burst": {
            run.name: produce_run(cluster, run, console, f"burst-{run.name.replace('_', '-')}")
            for run in bursts
        },
        "sustained": {
            run.name: produce_run(cluster, run, console, f"sustained-{run.name.replace('_', '-')}")
            for run in sustained
        },
    }


# -- consume -------------------------------------------------------------------------------------
def fill_mixed(bootstrap: list[str], topic: str, records: int) -> tuple[int, int]:
    """``records`` records from MIXED_PRODUCERS transactional producers at once, every
    ABORT_EVERY-th transaction of each aborted (flushed first, so its records are in the log).
    Returns the records committed and aborted."""
    per_producer = records // MIXED_PRODUCERS
    transactions = per_producer // MIXED_RECORDS_PER_TRANSACTION
    assert transactions * MIXED_RECORDS_PER_TRANSACTION * MIXED_PRODUCERS == records, (
        f"{records} records are not whole transactions of {MIXED_RECORDS_PER_TRANSACTION}"
    )

    def fill(index: int) -> None:
        payload = os.urandom(RECORD_BYTES)
        with Producer(
            bootstrap, transactional_id=f"bench-mixed-{index}",
            max_in_flight_requests_per_connection=MAX_IN_FLIGHT,
        ) as producer:  # fmt: skip
            producer.init_transactions(timeout_s=WAIT_S)
            for number in range(transactions):
                producer.begin_transaction()
                for _ in range(MIXED_RECORDS_PER_TRANSACTION):
                    producer.send(topic, payload)
                if number % ABORT_EVERY == ABORT_EVERY - 1:
                    producer.flush(timeout=WAIT_S)
                    producer.abort_transaction(timeout_s=WAIT_S)
                else:
                    producer.commit_transaction(timeout_s=WAIT_S)

    with ThreadPoolExecutor(MIXED_PRODUCERS, thread_name_prefix="fill") as pool:
        for done in [pool.submit(fill, n) for n in range(MIXED_PRODUCERS)]:
            done.result(timeout=WAIT_S * 2)  # raises what the producer raised
    aborted = (transactions // ABORT_EVERY) * MIXED_RECORDS_PER_TRANSACTION * MIXED_PRODUCERS
    return records - aborted, aborted


def stable_ends(bootstrap: list[str], topic: str) -> dict[TopicPartition, int]:
    """The topic's end offsets once the last stable offset reached the high watermark on every
    partition (every marker written): both isolation levels then read the same log to its end."""
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    with (
        Consumer(bootstrap) as uncommitted,
        Consumer(bootstrap, isolation_level="read_committed") as committed,
    ):

        def settled() -> dict[TopicPartition, int] | None:
            ends = uncommitted.end_offsets(partitions)
            return ends if committed.end_offsets(partitions) == ends else None

        return wait_for(f"the last stable offsets of {topic}", settled, WAIT_S)


def consume_pass(
    bootstrap: list[str], topic: str, isolation: Isolation, ends: dict[TopicPartition, int]
) -> tuple[int, int, float]:
    """Every partition from the beginning to ``ends`` with a new consumer: the records and
    value bytes returned, and the seconds from the first poll to the end."""
    records = value_bytes = 0
    consumer = Consumer(
        bootstrap, isolation_level=isolation, auto_offset_reset="earliest",
        max_poll_records=MAX_POLL_RECORDS,
    )  # fmt: skip
    try:
        consumer.assign(list(ends))
        consumer.seek_to_beginning()
        start = time.perf_counter()
        while any(consumer.position(tp) < end for tp, end in ends.items()):
            if time.perf_counter() - start > WAIT_S:
                raise TimeoutError(f"a {isolation} pass of {topic} did not reach its end")
            for batch in consumer.poll(timeout_ms=POLL_TIMEOUT_MS).values():
                records += len(batch)
                value_bytes += sum(len(record.value or b"") for record in batch)
        seconds = time.perf_counter() - start
    finally:
        consumer.close()
    return records, value_bytes, seconds


def consume_section(cluster: LocalCluster, sizes: Sizes, console: Console) -> dict[str, Any]:
    topic, bootstrap = "mixed", cluster.bootstrap_servers
    create_topic(cluster, topic, PARTITIONS)
    console.log(f"filling {topic}: {sizes.mixed_records:,} records, every {ABORT_EVERY}th "
                "transaction aborted")  # fmt: skip
    committed, aborted = fill_mixed(bootstrap, topic, sizes.mixed_records)
    ends = stable_ends(bootstrap, topic)
    offsets = sum(ends.values())
    expected = {"read_uncommitted": committed + aborted, "read_committed": committed}
    passes: dict[Isolation, list[tuple[int, int, float]]] = {i: [] for i in ISOLATION_LEVELS}

    def read_enough(level: Isolation) -> bool:
        runs = passes[level]
        return (
            len(runs) >= sizes.consume_passes_min and sum(s for _, _, s in runs) >= sizes.consume_s
        )

    while not all(read_enough(level) for level in ISOLATION_LEVELS):
        for level in ISOLATION_LEVELS:  # alternating, so both see the same machine
            if read_enough(level):
                continue
            records, value_bytes, seconds = consume_pass(bootstrap, topic, level, ends)
            if records != expected[level]:
                raise RuntimeError(
                    f"a {level} pass returned {records:,} records, not {expected[level]:,}"
                )
            passes[level].append((records, value_bytes, seconds))
            console.log(f"consume {level}: {records:,} records in {seconds:.2f} s")
    return {
        "records_committed": committed,
        "records_aborted": aborted,
        "log_offsets": offsets,  # records, aborted ones and markers
        "transactions": sizes.mixed_records // MIXED_RECORDS_PER_TRANSACTION,
        **{level: _consume_figures(passes[level], offsets) for level in ISOLATION_LEVELS},
    }


def _consume_figures(runs: list[tuple[int, int, float]], offsets: int) -> dict[str, Any]:
    seconds = sum(s for _, _, s in runs)
    records = sum(n for n, _, _ in runs)
    return {
        "passes": len(runs),
        "seconds": round(seconds, 2),
        "records_per_s": round(records / seconds, 1),
        "offsets_per_s": round(offsets * len(runs) / seconds, 1),
        "mb_per_s": round(sum(b for _, b, _ in runs) / seconds / MB, 1),
        "pass_records_per_s_median": round(statistics.median(n / s for n, _, s in runs), 1),
    }


# -- the run -------------------------------------------------------------------------------------
def idle_cpu(cluster: LocalCluster, seconds: float, console: Console) -> float:
    """The nodes' CPU seconds a second with no client at all (replica fetches, coordinators'
    timers): the floor under every run's CPU figures."""
    console.log(f"the nodes' CPU at rest, {seconds:.0f} s")
    before, _ = _cpu(cluster)
    time.sleep(seconds)  # measuring a rate over an interval, not waiting for a condition
    after, _ = _cpu(cluster)
    return round((after - before) / seconds, 3)


def run_benchmark(
    workdir: Path, sizes: Sizes, console: Console, first_host: int = FIRST_HOST
) -> dict[str, Any]:
    load_start = os.getloadavg()
    with cluster_in(workdir, console, first_host) as cluster:
        # __transaction_state is created by the first transactional FindCoordinator: not timed
        console.log("a first transaction (creates __transaction_state)")
        produce_run(cluster, Run(RECORDS_PER_TRANSACTION[0], records=1), console, "warm-up")
        idle = idle_cpu(cluster, sizes.idle_s, console)
        produce = produce_section(cluster, sizes, console)
        consume = consume_section(cluster, sizes, console)
    return {
        "nodes": 3,
        "partitions": PARTITIONS,
        "replication_factor": 3,
        "record_bytes": RECORD_BYTES,
        "acks": "all",
        "max_in_flight": MAX_IN_FLIGHT,
        "sustained_s": sizes.sustained_s,
        "burst_records": sizes.burst_records,
        "node_cpu_s_per_s_idle": idle,
        "produce": produce,
        "consume": consume,
        "load_avg_start": [round(x, 2) for x in load_start],
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
    }


VARIANT_LABELS = (
    ("idempotent", "idempotent, no transactions"),
    ("transactions_of_100", "transactions of 100"),
    ("transactions_of_10000", "transactions of 10,000"),
)


def print_report(console: Console, figures: dict[str, Any]) -> None:
    table = Table(title="transactional produce: 1 KiB, acks=all, RF 3, 6 partitions")
    for column in ("run", "producer", "records/s", "MB/s", "txn/s", "commit p50 / p99 ms",
                   "partitions a txn", "nodes' CPU µs a record"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("run", "producer") else "right")
    for kind in ("burst", "sustained"):
        for key, label in VARIANT_LABELS:
            row = figures["produce"][kind][key]
            latency = row.get("commit_latency_ms")
            table.add_row(
                f"{kind}, {row['records']:,} records" if kind == "burst" else
                f"{kind}, {row['seconds']:.0f} s",
                label, f"{row['records_per_s']:,.0f}", f"{row['mb_per_s']:.1f}",
                f"{row['transactions_per_s']:,.1f}" if latency else "",
                f"{latency['p50']:.1f} / {latency['p99']:.1f}" if latency else "",
                f"{row['partitions_per_transaction']:.2f}" if latency else "",
                f"{row['node_cpu_us_per_record']:,.0f}",
            )  # fmt: skip
    console.print(table)
    consume = figures["consume"]
    table = Table(
        title=f"consume: {consume['records_committed']:,} committed and "
        f"{consume['records_aborted']:,} aborted records, {consume['log_offsets']:,} offsets"
    )
    for column in ("isolation", "passes", "records/s", "offsets/s", "MB/s"):
        table.add_column(column, justify="left" if column == "isolation" else "right")
    for level in ISOLATION_LEVELS:
        row = consume[level]
        table.add_row(
            level, str(row["passes"]), f"{row['records_per_s']:,.0f}",
            f"{row['offsets_per_s']:,.0f}", f"{row['mb_per_s']:.1f}",
        )  # fmt: skip
    console.print(table)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through the finally that stops nodes


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt)

    def figures(workdir: Path, quick: bool, progress: Console) -> dict[str, Any]:
        return run_benchmark(workdir, QUICK if quick else FULL, progress)

    run: Callable[[Path, bool, Console], dict[str, Any]] = figures
    return bench_main(argv, __doc__.splitlines()[0], "transactions", run, print_report)


if __name__ == "__main__":
    sys.exit(main())
