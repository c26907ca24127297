"""The shard KV lab's scenarios on the simulated deployment, each on a few seeds; the same
seed gives the same run; and deliberately broken shard code is caught by the checks."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

import quorumlog.shard.group_machine as group_machine
from quorumlog.shard.group_commands import PullResponse, PullStatus
from quorumlog.shard.group_machine import ShardGroupMachine, ShardState
from quorumlog.testing.sim.shardkv import group_member
from quorumlog.testing.sim.shardkv.checks import ShardChecker
from quorumlog.testing.sim.shardkv.runner import plan_options, run_shardkv_seed
from quorumlog.testing.sim.shardkv.scenarios import SCENARIOS
from quorumlog.testing.sim.trace import TraceRecorder

SEEDS = [1, 2, 3]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenario_passes(scenario: str, seed: int) -> None:
    outcome = run_shardkv_seed(seed, scenario)
    result = outcome.result
    assert result.ok, result.failure
    assert result.linearizable is True
    assert result.operations_ok > 0
    assert result.invariant_checks > 1000


def test_snapshots_are_restored_in_the_snapshot_scenario() -> None:
    outcome = run_shardkv_seed(1, "snapshots")
    assert outcome.result.ok, outcome.result.failure
    assert outcome.snapshots_restored > 0


def test_chunked_pulls_move_a_shard_in_many_entries() -> None:
    seed = next(seed for seed in range(100) if 0 < plan_options(seed).server.pull_bytes_max < 200)
    outcome = run_shardkv_seed(seed, "deleted_shards")
    assert outcome.result.ok, outcome.result.failure
    # Six leave/join moves of ~200-byte values with a chunk bound below one value: every
    # key is its own chunk, far more chunks than shards moved.
    assert outcome.chunks_applied >= 30


def trace_of(seed: int, scenario: str) -> bytes:
    recorder = TraceRecorder()
    run_shardkv_seed(seed, scenario, trace=recorder)
    return recorder.to_bytes()


def test_one_seed_twice_gives_the_same_trace_and_summary() -> None:
    first = trace_of(5, "unreliable_network")
    assert first.count(b"\n") > 1000
    assert first == trace_of(5, "unreliable_network")
    one = run_shardkv_seed(5).result
    two = run_shardkv_seed(5).result
    assert (one.simulated_ms, one.events, one.operations, one.invariant_checks) == (
        two.simulated_ms,
        two.events,
        two.operations,
        two.invariant_checks,
    )


def test_different_seeds_give_different_traces() -> None:
    assert trace_of(5, "concurrent_changes") != trace_of(6, "concurrent_changes")


def test_the_trace_does_not_depend_on_the_string_hash_salt() -> None:
    script = (
        "import hashlib\n"
        "from quorumlog.testing.sim.shardkv.runner import run_shardkv_seed\n"
        "from quorumlog.testing.sim.trace import TraceRecorder\n"
        "recorder = TraceRecorder()\n"
        "run_shardkv_seed(4, 'concurrent_changes', trace=recorder)\n"
        "print(hashlib.sha256(recorder.to_bytes()).hexdigest())\n"
    )
    digests = set()
    for salt in ("1", "2"):
        completed = subprocess.run(
            [sys.executable, "-c", script],
            env=dict(os.environ, PYTHONHASHSEED=salt),
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        digests.add(completed.stdout.strip())
    assert digests == {hashlib.sha256(trace_of(4, "concurrent_changes")).hexdigest()}


# --- the checks can fail ------------------------------------------------------------------


def failures_over_seeds(scenario: str, seeds: range) -> list[str]:
    failures: list[str] = []
    for seed in seeds:
        result = run_shardkv_seed(seed, scenario, capture_trace=False).result
        if not result.ok:
            failures.append(str(result.failure))
    return failures


def test_serving_a_pulling_shard_is_caught_by_the_serving_invariant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broken = frozenset({ShardState.SERVING, ShardState.GARBAGE_COLLECTING, ShardState.PULLING})
    monkeypatch.setattr(group_machine, "SERVABLE_STATES", broken)
    failures = failures_over_seeds("join_then_leave", range(1, 3))
    assert len(failures) == 2
    assert all("while it is pulling" in failure for failure in failures)


def test_serving_a_pulling_shard_is_caught_by_the_history_checks_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With the state invariant switched off, what clients saw must still give it away:
    # writes to the empty PULLING copy are overwritten by the insert, reads see nothing.
    broken = frozenset({ShardState.SERVING, ShardState.GARBAGE_COLLECTING, ShardState.PULLING})
    monkeypatch.setattr(group_machine, "SERVABLE_STATES", broken)
    monkeypatch.setattr(ShardChecker, "check_serving", lambda self: None)
    failures = failures_over_seeds("concurrent_changes", range(1, 4))
    assert failures
    assert any(
        "linearizable" in failure or "append" in failure or "expected" in failure
        for failure in failures
    )


def test_a_pull_that_loses_data_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def lossy_pull(machine: ShardGroupMachine, request: object) -> PullResponse:
        response = machine.pull_request_for(
            request.configuration_number,  # type: ignore[attr-defined]
            request.shards,  # type: ignore[attr-defined]
        )
        if response.status is not PullStatus.OK or response.insert is None:
            return response
        emptied = {shard: {} for shard in response.insert.shards}
        insert = type(response.insert)(response.insert.configuration_number, emptied, {})
        return PullResponse(
            response.source_gid, response.configuration_number, response.status, insert
        )

    monkeypatch.setattr(group_member, "handle_pull_request", lossy_pull)
    failures = failures_over_seeds("join_then_leave", range(1, 3))
    assert len(failures) == 2
    assert all("expected" in failure for failure in failures)
