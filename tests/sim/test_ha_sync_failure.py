"""The controller-mode simulator's "sync-failure" shape: a commit-log sync fails (EIO or a full
disk) at the master or at a slave, or its disk fills so a write fails; the broker steps out,
the group goes on without it, it restarts, and every end check holds. And the shape's checks
catch a broker that, as before, holds its produces after a failed sync until a restart."""

from __future__ import annotations

import msgspec
import pytest

from quorumlog.ha.broker_host import BrokerHost
from quorumlog.testing.sim.ha.runner import SHAPES, plan_seed, run_seed

SEEDS = {
    0: "master write on a full disk",
    1: "slave write on a full disk",
    3: "master sync ENOSPC",
    4: "slave sync EIO",
    23: "master sync EIO",
}
"""Victims and faults (the shape's first nemesis draws pick them); of seeds 0-23 all pass."""


@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_a_failed_sync_steps_the_broker_out_and_the_group_goes_on(seed: int) -> None:
    result = run_seed(seed, capture_trace=False, shape="sync-failure")
    assert result.ok, f"{SEEDS[seed]}: {result.replay_command}\n{result.failure}"
    assert result.acknowledged > 0
    if SEEDS[seed].startswith("master"):
        assert result.elections >= 1, "a failed master's silence must elect another"


def test_the_shape_moves_no_seed_of_the_rotation() -> None:
    for seed in range(20):
        rotation = plan_seed(seed)
        assert rotation.shape in SHAPES
        assert plan_seed(seed, "sync-failure") == msgspec.structs.replace(
            rotation, shape="sync-failure"
        )


def hold_produces_after_a_failed_sync(self: BrokerHost, error: BaseException) -> None:
    """The old behaviour: no more syncs, role and waiting produces kept until a restart. (At
    a slave that was no hang, only a slave that stops acking, which the master shrinks out
    of the SyncStateSet as before: the caught seeds fail a master's sync.)"""
    self.sync_in_flight = self.commit_log.begin_sync()  # never finishes: no sync begins


@pytest.mark.parametrize("seed", [3, 23])
def test_a_broker_that_holds_produces_after_a_failed_sync_is_caught(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    monkeypatch.setattr(BrokerHost, "step_out", hold_produces_after_a_failed_sync)
    result = run_seed(seed, capture_trace=False, shape="sync-failure")
    assert not result.ok
    assert result.failure is not None and "sync failed" in result.failure
