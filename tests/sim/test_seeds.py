"""The seed sweep: many whole runs under the nemesis, every invariant after every event.

By default 500 seeds of 30 simulated seconds, odd seeds on 3 nodes and even seeds on 5,
in chunks so `pytest -n 2` spreads them. More seeds are one variable away:

    QUORUMLOG_SIM_SEEDS=5000 QUORUMLOG_SIM_SECONDS=60 pytest tests/sim/test_seeds.py -n 2

and `pytest -m soak` runs a long sweep on every core. A failing seed prints the command
that replays it (`quorumlog sim raft --seeds N-N --nodes K`) and its trace tail.

Failures whose message matches a bug listed in KNOWN_CORE_BUGS.md (reported, not yet
fixed in the Raft core) make the chunk xfail with the seeds listed; any other failure fails
the test. Remove a signature once its bug is fixed, so a regression fails loudly again.
"""

from __future__ import annotations

import os
import re

import pytest

from quorumlog.testing.sim.runner import SeedResult, format_failure, run_seed, run_seeds

SEED_COUNT = int(os.environ.get("QUORUMLOG_SIM_SEEDS", "500"))
SEED_START = int(os.environ.get("QUORUMLOG_SIM_SEED_START", "1"))
SIMULATED_SECONDS = float(os.environ.get("QUORUMLOG_SIM_SECONDS", "30"))
CHUNK_SEEDS = 25

KNOWN_CORE_BUG_SIGNATURES: dict[str, str] = {
    # Regex on the first line of a failure -> its entry in KNOWN_CORE_BUGS.md, for bugs
    # reported and not yet fixed. Empty: every failure fails the sweep.
}


def node_count_of(seed: int) -> int:
    return 3 if seed % 2 else 5


def chunks() -> list[range]:
    end = SEED_START + SEED_COUNT
    return [
        range(start, min(start + CHUNK_SEEDS, end)) for start in range(SEED_START, end, CHUNK_SEEDS)
    ]


def known_bug(result: SeedResult) -> str | None:
    first_line = (result.failure or "").splitlines()[0] if result.failure else ""
    for pattern, bug in KNOWN_CORE_BUG_SIGNATURES.items():
        if re.search(pattern, first_line):
            return bug
    return None


def judge(results: list[SeedResult]) -> None:
    failed = [result for result in results if not result.ok]
    unknown = [result for result in failed if known_bug(result) is None]
    if unknown:
        details = "\n\n".join(format_failure(result) for result in unknown[:3])
        pytest.fail(
            f"{len(unknown)} seeds failed: {[result.seed for result in unknown]}\n\n{details}",
            pytrace=False,
        )
    undecided = [result.seed for result in results if result.ok and result.linearizable is None]
    assert not undecided, f"linearizability check gave up on seeds {undecided}"
    if failed:
        listed = ", ".join(f"{result.seed} ({known_bug(result)})" for result in failed)
        pytest.xfail(f"known core bugs (tests/sim/KNOWN_CORE_BUGS.md): seeds {listed}")


@pytest.mark.parametrize("seeds", chunks(), ids=lambda seeds: f"{seeds.start}-{seeds.stop - 1}")
def test_seed_chunk(seeds: range) -> None:
    results = [
        run_seed(seed, node_count_of(seed), SIMULATED_SECONDS, capture_trace=True) for seed in seeds
    ]
    judge(results)


@pytest.mark.soak
def test_soak(request: pytest.FixtureRequest) -> None:
    if "soak" not in str(request.config.getoption("markexpr")).replace("not soak", ""):
        pytest.skip("a long run: select it with -m soak")
    seed_count = int(os.environ.get("QUORUMLOG_SIM_SOAK_SEEDS", "2000"))
    seconds = float(os.environ.get("QUORUMLOG_SIM_SOAK_SECONDS", "60"))
    jobs = os.cpu_count() or 1
    results: list[SeedResult] = []
    for node_count in (3, 5):
        start = 100_000 + node_count * 1_000_000
        summary = run_seeds(range(start, start + seed_count // 2), node_count, seconds, jobs)
        results.extend(summary.results)
    judge(results)
