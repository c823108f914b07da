"""The system-wide CPU breakdown of the benchmark (``perf record -a``): reading perf's samples,
and a real recording of this process."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from bench.cpu_profile import (
    SAMPLE_RATE_HZ,
    breakdown,
    category,
    count_samples,
    summarize_counts,
    system_sampling,
)

KERNEL = "[kernel.kallsyms]"
LINES = [
    f"  4242  ffffffff81b6d36d copy_folio_from_iter_atomic ({KERNEL})",
    f"  4242  ffffffff81b6d36d copy_folio_from_iter_atomic ({KERNEL})",
    "  4242  7f3a2b1c0d0e _PyEval_EvalFrameDefault (/usr/lib/libpython3.11.so.1.0)",
    "  4343  7f3a2b1c0d0e [unknown] (/venv/grpc/_cython/cygrpc.cpython-311-x86_64-linux-gnu.so)",
    "  4343  7f3a2b1c0d0e __memmove_avx512_unaligned_erms (/usr/lib/x86_64-linux-gnu/libc.so.6)",
    f"  4343  ffffffff81000000 _copy_to_iter ({KERNEL})",
    f"     0  ffffffff81000001 pv_native_safe_halt ({KERNEL})",
    "  9999  0000000000401000 main (/usr/sbin/nats-server)",
    "not a sample line",
]


def test_samples_are_counted_by_who_ran_and_what_ran() -> None:
    counts = count_samples(LINES, {"leader": [4242], "client": [4343]})
    assert counts == Counter({
        ("leader", "page-cache write"): 2,
        ("leader", "Python"): 1,
        ("client", "gRPC core"): 1,
        ("client", "libc"): 1,
        ("client", "kernel copy"): 1,
        ("idle", "kernel other"): 1,
        ("other", "native other"): 1,
    })  # fmt: skip


def test_categories_come_from_the_symbol_in_the_kernel_and_the_library_elsewhere() -> None:
    assert category("clear_page_erms", KERNEL) == "page clearing"
    assert category("finish_task_switch.isra.0", KERNEL) == "kernel other"
    assert category("crc", "/venv/lib/crc32c/_crc32c.cpython-311-x86_64-linux-gnu.so") == "CRC32C"
    assert category("x", "/usr/lib/libgrpc.so.30") == "gRPC core"


def test_the_summary_is_cpu_time_per_record_and_the_page_cache_copy_rate() -> None:
    counts = Counter({("leader", "page-cache write"): SAMPLE_RATE_HZ, ("leader", "Python"): 999})
    summary = summarize_counts(counts, records=1_000_000, page_cache_bytes=3_000_000_000)
    leader = summary["roles"]["leader"]
    assert leader["cpu_time"] == round(2 * 999 / SAMPLE_RATE_HZ, 3)
    assert leader["us_per_record"] == round(1e6 * 2 * 999 / SAMPLE_RATE_HZ / 1_000_000, 2)
    assert leader["us_per_record_by_category"]["page-cache write"] == 1.0
    assert summary["page_cache_mb_per_cpu_second"] == 3000  # 3 GB in one CPU second


def test_a_real_recording_sees_this_process_compute_and_write(tmp_path: Path) -> None:
    target = tmp_path / "written"
    block = os.urandom(1 << 20)
    with system_sampling(tmp_path / "run.perf") as samples:
        total = sum(n * n for n in range(3_000_000))  # Python work
        with target.open("wb") as out:
            for _ in range(256):  # 256 MiB into the page cache
                out.write(block)
    assert total > 0
    summary = breakdown(samples, {"test": [os.getpid()]}, records=256, page_cache_bytes=256 << 20)
    mine = summary["roles"]["test"]["us_per_record_by_category"]
    assert mine["Python"] > 0
    assert mine["page-cache write"] > 0
    assert summary["page_cache_mb_per_cpu_second"] > 0


def test_roles_come_in_the_given_order_then_idle_and_other() -> None:
    counts = count_samples(LINES, {"leader": [4242], "client": [4343]})
    summary = summarize_counts(counts, 1, 0, order=["client", "leader", "absent"])
    assert list(summary["roles"]) == ["client", "leader", "idle", "other"]
    assert summary["page_cache_mb_per_cpu_second"] == 0
