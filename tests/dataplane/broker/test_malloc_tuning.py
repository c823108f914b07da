"""The broker's malloc settings: applied with mallopt on glibc, the operator's env wins."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from dataplane.broker.malloc_tuning import ARENA_MAX, MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES

GLIBC = platform.libc_ver()[0] == "glibc"
PROBE = (
    "import json; from dataplane.broker.malloc_tuning import tune_malloc; "
    "print(json.dumps(tune_malloc()))"
)


def _applied(env: dict[str, str]) -> dict[str, int]:
    """tune_malloc in a fresh interpreter (mallopt changes the process for good)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return dict(json.loads(done.stdout))


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_the_thresholds_and_the_arena_cap_are_set_on_glibc() -> None:
    assert _applied(_clean_env()) == {
        "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD_BYTES,
        "MALLOC_TRIM_THRESHOLD_": TRIM_THRESHOLD_BYTES,
        "MALLOC_ARENA_MAX": ARENA_MAX,
    }


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_a_threshold_the_operator_set_is_left_alone() -> None:
    env = {**_clean_env(), "MALLOC_TRIM_THRESHOLD_": "1048576", "MALLOC_ARENA_MAX": "8"}
    assert _applied(env) == {"MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD_BYTES}
