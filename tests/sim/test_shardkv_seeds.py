"""Many seeds of the shard KV simulation, each with its own scenario and faults.

Seed N runs scenario N mod 9, so each block below covers every scenario several times.
A failing seed replays with `quorumlog sim shardkv --seeds N-N`.
"""

from __future__ import annotations

import pytest

from quorumlog.testing.sim.shardkv.runner import format_failure, run_shardkv_seeds

BLOCK_SEEDS = 36
BLOCKS = 5


@pytest.mark.parametrize("block", range(BLOCKS))
def test_seed_block(block: int) -> None:
    first = 1000 + block * BLOCK_SEEDS
    run = run_shardkv_seeds(first, first + BLOCK_SEEDS - 1)
    failures = [format_failure(outcome) for outcome in run.outcomes if not outcome.result.ok]
    assert not failures, "\n\n".join(failures)
    assert run.summary.seeds == BLOCK_SEEDS


@pytest.mark.soak
def test_soak_many_seeds(request: pytest.FixtureRequest) -> None:
    if "soak" not in str(request.config.getoption("markexpr")).replace("not soak", ""):
        pytest.skip("a long run: select it with -m soak")
    run = run_shardkv_seeds(10_000, 14_999, jobs=4)
    failures = [format_failure(outcome) for outcome in run.outcomes if not outcome.result.ok]
    assert not failures, "\n\n".join(failures[:5])
