"""The transactions workload's two Kafka clients (raftlog's and librdkafka): which transformer runs
which, how each is started, how the librdkafka transformer sorts a failed transactional call
(librdkafka's error classes), and what the history and the summary say of each client. The
loop itself runs under faults in tests/chaos/test_chaos_transactions.py."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from chaos.checker import check
from chaos.rd_transformer import OutcomeUnknown, RdTransformer, _Abortable
from chaos.runner import RunConfig
from chaos.transactions import (
    TransformerFleet,
    TransformerSettings,
    describe_group,
    read_transactions,
)
from dataplane.client import OffsetAndMetadata, TopicPartition
from dataplane.client.admin import GroupDescription, MemberDescription
from raftlog import errors as raftlog_errors
from tests.chaos.test_txn_checker import clean_story


def settings(tmp_path: Path, clients: tuple[str, ...]) -> TransformerSettings:
    return TransformerSettings(
        bootstrap=["127.0.0.1:9001", "127.0.0.2:9001"], input_topic="in", input_partitions=3,
        output_topic="out", output_partitions=3, group="g", seed=7, directory=tmp_path, t0=1.5,
        kafka_bootstrap=["127.0.0.1:9005", "127.0.0.2:9005"], clients=clients,  # type: ignore[arg-type]
    )  # fmt: skip


def test_clients_are_assigned_round_robin_each_with_its_listener(tmp_path: Path) -> None:
    fleet = TransformerFleet(settings(tmp_path, ("ours", "confluent")), 3, tmp_path)
    assert fleet.clients == {
        "chaos-transformer-1": "ours", "chaos-transformer-2": "confluent",
        "chaos-transformer-3": "ours",
    }  # fmt: skip
    ours, rd = fleet._argv("chaos-transformer-1"), fleet._argv("chaos-transformer-2")
    assert ours[ours.index("--client") + 1] == "ours"
    assert ours[ours.index("--bootstrap") + 1] == "127.0.0.1:9001,127.0.0.2:9001"
    assert rd[rd.index("--client") + 1] == "confluent"
    assert rd[rd.index("--bootstrap") + 1] == "127.0.0.1:9005,127.0.0.2:9005"


def test_both_clients_run_by_default_when_there_are_two_transformers(tmp_path: Path) -> None:
    def config(**extra: object) -> RunConfig:
        return RunConfig(
            seed=1, duration_s=60, faults=[], work_dir=tmp_path, report_dir=tmp_path,
            workload="transactions", **extra,  # type: ignore[arg-type]
        )  # fmt: skip

    assert config(transformers=2).clients == ("ours", "confluent")
    assert config(transformers=1).clients == ("ours",)
    assert config(transformers=3, transformer_clients=("confluent",)).clients == ("confluent",)
    with pytest.raises(ValueError, match="unknown transformer client"):
        config(transformer_clients=("kafka-python",))


def test_the_history_lines_name_the_client_and_older_lines_mean_ours() -> None:
    prepared = {
        "event": "prepared", "transformer": "t1", "incarnation": 0, "serial": 0,
        "start_s": 1.0, "intent": "commit", "outputs": [],
        "inputs": [{"partition": 0, "first_offset": 0, "last_offset": 1}],
    }  # fmt: skip
    rd, old = read_transactions(
        [json.dumps({**prepared, "client": "confluent"}), json.dumps({**prepared, "serial": 1})]
    )
    assert (rd.client, old.client) == ("confluent", "ours")


def test_the_summary_counts_committed_transactions_per_client() -> None:
    story = clean_story()
    story.transactions = [
        t.model_copy(update={"client": "confluent"}) if t.incarnation == 1 else t
        for t in story.transactions
    ]
    summary = check(story.history()).summary.transactions
    assert summary is not None and summary.committed_by_client == {"confluent": 1, "ours": 2}


def failing(*errors: KafkaError) -> tuple[list[int], object]:
    """A call that raises `errors` in turn, then returns; and how often it was called."""
    calls: list[int] = []

    def call() -> None:
        calls.append(1)
        if len(calls) <= len(errors):
            raise KafkaException(errors[len(calls) - 1])

    return calls, call


def repeat(call: object, give_up_s: float = 5.0) -> None:
    owner = SimpleNamespace(
        args=SimpleNamespace(give_up_s=give_up_s), _writing=threading.Lock(), _ending=None
    )
    RdTransformer._repeat(owner, "commit", call)  # type: ignore[arg-type]


def test_a_retriable_error_repeats_the_call_until_it_succeeds() -> None:
    timed_out = KafkaError(KafkaError._TIMED_OUT, "timed out", retriable=True)
    calls, call = failing(timed_out, timed_out)
    repeat(call)
    assert len(calls) == 3


def test_an_abortable_error_aborts_and_a_fatal_one_makes_the_outcome_unknown() -> None:
    abortable = KafkaError(KafkaError.INVALID_PRODUCER_ID_MAPPING, txn_requires_abort=True)
    with pytest.raises(_Abortable):
        repeat(failing(abortable)[1])
    fenced = KafkaError(KafkaError._FENCED, "fenced", fatal=True)
    with pytest.raises(OutcomeUnknown, match="commit"):
        repeat(failing(fenced)[1])
    other = KafkaError(KafkaError._STATE, "wrong state")  # neither: nothing known
    with pytest.raises(OutcomeUnknown):
        repeat(failing(other)[1])


def test_a_retriable_error_past_give_up_makes_the_outcome_unknown() -> None:
    timed_out = KafkaError(KafkaError._TIMED_OUT, "timed out", retriable=True)
    start = time.monotonic()
    with pytest.raises(OutcomeUnknown, match="timed out"):
        repeat(failing(*[timed_out] * 100)[1], give_up_s=0.0)
    assert time.monotonic() - start < 5


WATCHDOG_SCRIPT = """
import sys, time
from pathlib import Path
from chaos import rd_transformer
from chaos.transformer import parse_args

rd_transformer.HUNG_AFTER_S = 0.5
args = parse_args([
    "--client", "confluent", "--bootstrap", "127.0.0.1:9", "--input", "in", "--output", "out",
    "--output-partitions", "1", "--group", "g", "--transactional-id", "t", "--t0", "0",
    "--history", sys.argv[1],
])
with Path(sys.argv[1]).open("a") as history:
    transformer = rd_transformer.RdTransformer(args, history)
    txn = rd_transformer._Open(0, 1.0, time.monotonic())
    transformer._line(event="prepared", transformer="t", incarnation=0, serial=0, start_s=1.0,
                      inputs=[], outputs=[], intent="commit", client="confluent")
    transformer._call = ("send_offsets_to_transaction", time.monotonic(), txn)
    time.sleep(30)  # as if blocked inside librdkafka
sys.exit(0)
"""


def test_a_call_hung_inside_librdkafka_leaves_the_transaction_unknown_and_exits_3(
    tmp_path: Path,
) -> None:
    history = tmp_path / "t.jsonl"
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", WATCHDOG_SCRIPT, str(history)],
        check=False, cwd=repo, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr[-2000:]
    (txn,) = read_transactions(history.read_text().splitlines())
    assert txn.outcome == "unknown" and txn.client == "confluent"
    assert "send_offsets_to_transaction: blocked" in txn.error


def test_a_drain_that_timed_out_prints_each_members_state_ownership_and_target() -> None:
    """What CI's failed runs needed: the member still to revoke and the one waiting for it."""
    events = [TopicPartition("in", p) for p in range(4)]
    members = (
        MemberDescription("m1", "raftlog-consumer", 3, "unrevoked_partitions", ("in",), "",
                          frozenset(events[:2]), frozenset(events[:2])),
        MemberDescription("m2", "rdkafka", 4, "unreleased_partitions", ("in",), "",
                          frozenset(), frozenset(events[2:])),
    )  # fmt: skip
    described = GroupDescription("g", "Reconciling", 4, 4, "uniform", 2, members)
    offsets = {tp: OffsetAndMetadata(10 + tp.partition) for tp in events}
    admin = SimpleNamespace(
        describe_groups=lambda ids: {"g": described}, list_group_offsets=lambda group: offsets
    )
    assert describe_group(admin, "g", "in") == [  # type: ignore[arg-type]
        "group g: Reconciling, epoch 4 (assignment epoch 4), committed offsets of in: "
        "{0: 10, 1: 11, 2: 12, 3: 13}",
        "  member m1 (raftlog-consumer) epoch 3, unrevoked_partitions: owns [0, 1], target [0, 1]",
        "  member m2 (rdkafka) epoch 4, unreleased_partitions: owns [], target [2, 3]",
    ]

    def unreachable(ids: object) -> None:
        code = raftlog_errors.ErrorCode.COORDINATOR_NOT_AVAILABLE
        raise raftlog_errors.KafkaError(code, "no coordinator")

    admin.describe_groups = unreachable
    assert describe_group(admin, "g", "in") == [  # type: ignore[arg-type]
        "group g: not described: COORDINATOR_NOT_AVAILABLE: no coordinator"
    ]
