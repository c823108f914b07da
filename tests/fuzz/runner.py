"""Running a fuzz target under atheris (libFuzzer), and the list of targets.

A target module calls :func:`main` with its ``fuzz_one``; the flags are libFuzzer's
(``-max_total_time``, ``-rss_limit_mb``, ``-timeout``, ``-artifact_prefix``, corpus
directories). ``python -m tests.fuzz.runner --seconds N`` runs every target in turn for N
seconds each on a scratch copy of its seed corpus (what ``make fuzz`` does), and
prints each one's executions per second.

A target's seconds are its whole run, its interpreter's start and its instrumented imports
included: libFuzzer's ``-max_total_time`` clock starts once they are done (12 s into a gRPC
target's 32 s run for 19 s of fuzzing, measured alone), so the fuzzing process gets the
deadline and gives libFuzzer what is left of it (at least ``MIN_FUZZ_SECONDS``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

FUZZ_DIR = Path(__file__).resolve().parent
CORPUS_DIR = FUZZ_DIR / "corpus"
REGRESSIONS_DIR = FUZZ_DIR / "regressions"
REPO = FUZZ_DIR.parent.parent
# Every target, by name: tests/fuzz/fuzz_<name>.py, seeds in corpus/<name>/.
TARGETS = (
    "kafka_request",
    "record_batch",
    "broker_grpc",
    "controller_grpc",
    "group_grpc",
    "sasl",
    "connect_rest",
)
# A frame may claim 2 GiB: a target that allocates what an input claims dies at this limit.
RSS_LIMIT_MB = 2048
DEADLINE_ENV = "RAFTLOG_FUZZ_DEADLINE"  # the run's end, as time.time(), for `fuzz`
MIN_FUZZ_SECONDS = 5
INPUT_TIMEOUT_S = 10  # one input taking longer is a hang
MAX_INPUT_BYTES = 64 * 1024


INSTRUMENTED = ["raftlog", "dataplane", "metadata_quorum", "connect", "kio", "tests.fuzz"]


def main(fuzz_one: Callable[[bytes], None]) -> None:
    """Fuzz ``fuzz_one`` with the command line's libFuzzer flags (a target run as a script:
    coverage of whatever it imported, every loaded function instrumented, which is slow)."""
    import atheris  # noqa: PLC0415  (only the fuzzing process needs it)

    atheris.instrument_all()
    atheris.Setup(sys.argv, fuzz_one)
    atheris.Fuzz()


def fuzz(target: str, flags: list[str]) -> None:
    """Fuzz ``target`` with libFuzzer ``flags``, only the project's modules and kio (imported
    here, under atheris's import hook) instrumented for coverage."""
    import atheris  # noqa: PLC0415

    with atheris.instrument_imports(include=INSTRUMENTED):
        module = importlib.import_module(f"tests.fuzz.fuzz_{target}")
    deadline = os.environ.get(DEADLINE_ENV)
    if deadline is not None:  # what is left of the run after the start (module docstring)
        left = max(MIN_FUZZ_SECONDS, int(float(deadline) - time.time()))
        flags = [f for f in flags if not f.startswith("-max_total_time=")]
        flags.append(f"-max_total_time={left}")
    atheris.Setup([sys.argv[0], *flags], module.fuzz_one)
    atheris.Fuzz()


@dataclass(frozen=True)
class FuzzRun:
    target: str
    returncode: int
    executions: int
    seconds: float
    crash: Path | None  # the crashing (or hanging, or memory-hungry) input libFuzzer saved
    output: str

    @property
    def execs_per_s(self) -> float:
        return self.executions / self.seconds if self.seconds > 0 else 0.0


def run_target(target: str, seconds: int, work_dir: Path) -> FuzzRun:
    """Run one target for ``seconds`` (its start included) in a subprocess: new inputs go to a
    scratch corpus in ``work_dir`` (the committed seeds are read, never written), a crash to
    ``work_dir``."""
    scratch = work_dir / f"corpus-{target}"
    scratch.mkdir(parents=True, exist_ok=True)
    artifacts = work_dir / f"artifacts-{target}"
    artifacts.mkdir(exist_ok=True)
    command = [
        sys.executable, "-m", "tests.fuzz.runner", "fuzz", target,
        f"-max_total_time={seconds}", f"-rss_limit_mb={RSS_LIMIT_MB}",
        f"-timeout={INPUT_TIMEOUT_S}", f"-max_len={MAX_INPUT_BYTES}",
        f"-artifact_prefix={artifacts}/", "-print_final_stats=1",
        str(scratch), str(CORPUS_DIR / target),
    ]  # fmt: skip
    started = time.monotonic()
    env = {**os.environ, DEADLINE_ENV: str(time.time() + seconds)}
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, errors="replace",
        check=False, timeout=seconds + 300,  # a slow start, the seeds' first pass, the merge
    )  # fmt: skip
    elapsed = time.monotonic() - started
    output = done.stdout + done.stderr
    runs = re.search(r"stat::number_of_executed_units:\s*(\d+)", output)
    crashes = sorted(artifacts.iterdir())
    return FuzzRun(
        target, done.returncode, int(runs.group(1)) if runs else 0, elapsed,
        crashes[0] if crashes else None, output,
    )  # fmt: skip


def replay(target: str, cases: list[Path]) -> None:
    """Run ``target`` on each of ``cases`` in this process, printing ``ok <name>`` or ``FAIL
    <name>`` and the traceback after each: a case that aborts the process (what a native
    decoder's failed allocation does) leaves no line, and the parent names it (see
    tests/fuzz/test_regressions.py)."""
    import traceback  # noqa: PLC0415

    module = importlib.import_module(f"tests.fuzz.fuzz_{target}")
    for case in cases:
        print(f"start {case.name}", flush=True)
        try:
            module.fuzz_one(case.read_bytes())
        except Exception:  # noqa: BLE001  (a crash of the target: reported, the next case runs)
            print(f"FAIL {case.name}\n{traceback.format_exc()}", flush=True)
        else:
            print(f"ok {case.name}", flush=True)


def _main() -> int:
    parser = argparse.ArgumentParser(description="Run every fuzz target in turn.")
    parser.add_argument("--seconds", type=int, default=600, help="per target")
    parser.add_argument("--targets", nargs="*", default=list(TARGETS))
    parser.add_argument("--out", type=Path, default=None, help="keep crashes and corpora here")
    args = parser.parse_args()
    work = args.out or Path(tempfile.mkdtemp(prefix="raftlog-fuzz-"))
    failed = 0
    for target in args.targets:
        result = run_target(target, args.seconds, work)
        verdict = "ok" if result.returncode == 0 and result.crash is None else "CRASH"
        print(
            f"{target:16} {verdict:5} {result.executions:>10} execs "
            f"{result.execs_per_s:>8.0f}/s  {result.crash or ''}",
            flush=True,
        )
        if verdict != "ok":
            failed += 1
            print(result.output[-4000:], file=sys.stderr)
    if args.out is None and not failed:
        shutil.rmtree(work)
    else:
        print(f"corpora and crashes: {work}")
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["fuzz"]:  # one target: python -m tests.fuzz.runner fuzz <target> [flags]
        fuzz(sys.argv[2], sys.argv[3:])
    if sys.argv[1:2] == ["replay"]:  # python -m tests.fuzz.runner replay <target> <files>
        replay(sys.argv[2], [Path(name) for name in sys.argv[3:]])
        sys.exit(0)
    sys.exit(_main())
