"""One seed, one run: the same seed gives the same trace byte for byte, in this process
and in others with a different string-hash salt; different seeds give different runs."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

from quorumlog.testing.sim.runner import run_seed
from quorumlog.testing.sim.trace import TraceRecorder

SIMULATED_SECONDS = 8


def trace_of(seed: int, node_count: int = 3) -> bytes:
    recorder = TraceRecorder()
    run_seed(seed, node_count, SIMULATED_SECONDS, trace=recorder)
    return recorder.to_bytes()


def test_one_seed_twice_gives_the_same_trace_bytes() -> None:
    first = trace_of(11, 5)
    second = trace_of(11, 5)
    assert first.count(b"\n") > 1000
    assert first == second


def test_different_seeds_give_different_traces() -> None:
    assert trace_of(11) != trace_of(12)


def test_the_trace_does_not_depend_on_the_string_hash_salt() -> None:
    # Iterating a set of node ids would follow PYTHONHASHSEED; a run must not.
    script = (
        "import hashlib, sys\n"
        "from quorumlog.testing.sim.runner import run_seed\n"
        "from quorumlog.testing.sim.trace import TraceRecorder\n"
        "recorder = TraceRecorder()\n"
        f"run_seed(11, 5, {SIMULATED_SECONDS}, trace=recorder)\n"
        "print(hashlib.sha256(recorder.to_bytes()).hexdigest())\n"
    )
    digests = set()
    for salt in ("1", "2"):
        environment = dict(os.environ, PYTHONHASHSEED=salt)
        completed = subprocess.run(
            [sys.executable, "-c", script],
            env=environment,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        digests.add(completed.stdout.strip())
    assert digests == {hashlib.sha256(trace_of(11, 5)).hexdigest()}
