"""One ledger seed, one run: the same seed gives the same trace byte for byte and the same
counts, in this process and in another with a different string-hash salt (so `--jobs`
replays too); different seeds give different runs."""

from __future__ import annotations

import os
import subprocess
import sys

from quorumlog.testing.sim.ledger.runner import LedgerSeedResult, run_seed
from quorumlog.testing.sim.trace import TraceRecorder

SEED = 6


def traced(seed: int) -> tuple[LedgerSeedResult, int]:
    recorder = TraceRecorder()
    result = run_seed(seed, trace=recorder)
    return result, recorder.line_count


def counts(result: LedgerSeedResult) -> tuple[int, ...]:
    return (
        result.simulated_ms,
        result.invariant_checks,
        result.events,
        result.entries_appended,
        result.entries_acknowledged,
        result.entries_read,
        result.recoveries,
        result.ensemble_changes,
    )


def test_one_seed_twice_gives_the_same_trace_and_counts() -> None:
    first, lines = traced(SEED)
    second, _ = traced(SEED)
    assert first.ok, first.failure
    assert lines > 500
    assert first.trace_digest == second.trace_digest
    assert counts(first) == counts(second)
    assert first.faults == second.faults


def test_different_seeds_give_different_traces() -> None:
    assert traced(SEED)[0].trace_digest != traced(SEED + 1)[0].trace_digest


def test_another_process_with_another_hash_salt_replays_the_seed() -> None:
    script = (
        "from quorumlog.testing.sim.ledger.runner import run_seed\n"
        "from quorumlog.testing.sim.trace import TraceRecorder\n"
        f"print(run_seed({SEED}, trace=TraceRecorder()).trace_digest)\n"
    )
    environment = dict(os.environ, PYTHONHASHSEED="12345")
    output = subprocess.run(
        [sys.executable, "-c", script],
        env=environment,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.strip()
    assert output == traced(SEED)[0].trace_digest
