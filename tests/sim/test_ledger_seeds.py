"""The ledger seed sweep: 200 seeds by default, in chunks so `pytest -n 2` spreads them.
Each seed runs writers, recoverers and readers on shipped bookies under the nemesis and
checks every invariant of testing/sim/ledger/checks.py. More seeds are one variable away:

    QUORUMLOG_LEDGER_SIM_SEEDS=5000 pytest tests/sim/test_ledger_seeds.py

A failing seed prints the command that replays it (`quorumlog sim ledger --seeds N-N`)
and its trace tail.
"""

from __future__ import annotations

import os

import pytest

from quorumlog.testing.sim.ledger.runner import format_failure, run_seeds
from quorumlog.testing.sim.runner import silence_simulated_nodes

SEED_COUNT = int(os.environ.get("QUORUMLOG_LEDGER_SIM_SEEDS", "200"))
SEED_START = int(os.environ.get("QUORUMLOG_LEDGER_SIM_SEED_START", "1"))
CHUNK_SEEDS = 50


def chunks() -> list[range]:
    end = SEED_START + SEED_COUNT
    return [
        range(start, min(start + CHUNK_SEEDS, end)) for start in range(SEED_START, end, CHUNK_SEEDS)
    ]


@pytest.mark.parametrize("seeds", chunks(), ids=lambda seeds: f"{seeds.start}-{seeds.stop - 1}")
def test_ledger_seeds(seeds: range) -> None:
    silence_simulated_nodes()
    summary = run_seeds(seeds)
    failed = [result for result in summary.results if not result.ok]
    if failed:
        details = "\n\n".join(format_failure(result) for result in failed[:3])
        pytest.fail(f"seeds {summary.failures} failed:\n{details}")
    results = summary.results
    # The sweep exercised what it claims to: recoveries, fenced writers, ensemble changes.
    assert sum(result.recoveries for result in results) >= len(seeds)
    assert sum(result.fenced_writers for result in results) > 0
    assert sum(result.ensemble_changes for result in results) > 0
    assert sum(result.entries_acknowledged for result in results) > 100 * len(seeds)
