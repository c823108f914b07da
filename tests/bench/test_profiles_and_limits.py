"""The benchmark's helpers that read tools' output: py-spy's folded stacks, the socket table."""

from __future__ import annotations

from pathlib import Path

from bench.limits import _hex_ip
from bench.profiles import summarize

RUN = "thread (1);Thread.run (threading.py:982)"
FOLDED = "\n".join(
    [
        f"{RUN};_serve (grpc/_server.py:1314);"
        "Partition.append (dataplane/broker/partition.py:246) 30",
        f"{RUN};Condition.wait (threading.py:331) 500",
        f"{RUN};decode (dataplane/x.py:1);_decode_records (raftlog/records.py:470) 10",
        f"{RUN};LogSegment.read (raftlog/segment.py:301) 60",
    ]
)


def test_a_profile_summary_counts_busy_samples_and_the_per_record_share(tmp_path: Path) -> None:
    folded = tmp_path / "produce-leader.folded"
    folded.write_text(FOLDED)
    summary = summarize(folded)
    assert summary["busy_samples"] == 100  # the 500 waiting samples are not work
    assert summary["per_record_codec_samples"] == 10
    assert summary["per_record_codec_percent"] == 10.0
    assert summary["top_own"][0] == {
        "function": "LogSegment.read (raftlog/segment.py:301)",
        "percent": 60.0,
    }


def test_a_missing_profile_summarizes_as_empty(tmp_path: Path) -> None:
    summary = summarize(tmp_path / "never-written.folded")
    assert summary["busy_samples"] == 0 and summary["top_own"] == []


def test_addresses_read_as_the_kernel_socket_table_writes_them() -> None:
    assert _hex_ip("127.0.0.11") == "0B00007F"
