"""The v3 KV's txns and ranges under the simulator's faults, checked for linearizability
against the whole-map model (`testing.txn_model`), and proof that the check can fail.

A bounded sweep: SEED_COUNT seeds of SIMULATED_SECONDS each (the plans of the main sweep,
with the v3 workload); more seeds with QUORUMLOG_SIM_TXN_SEEDS.
"""

from __future__ import annotations

import os

import msgspec
import pytest

from quorumlog.codec.kv_v3 import Txn, TxnResponse
from quorumlog.kv import mvcc
from quorumlog.testing.history import History
from quorumlog.testing.linearizability import check_linearizable
from quorumlog.testing.sim import runner
from quorumlog.testing.sim.runner import SeedPlan, plan_seed, run_seed
from quorumlog.testing.txn_model import TXN_MODEL

SEED_COUNT = int(os.environ.get("QUORUMLOG_SIM_TXN_SEEDS", "24"))
SIMULATED_SECONDS = 10.0


def v3_plan(seed: int, node_count: int) -> SeedPlan:
    plan = plan_seed(seed, node_count)
    workload = msgspec.structs.replace(plan.options.workload, v3=True, read_fraction=0.3)
    options = msgspec.structs.replace(plan.options, workload=workload)
    return msgspec.structs.replace(plan, options=options)


def test_txn_and_range_histories_are_linearizable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "plan_seed", v3_plan)
    for seed in range(1, SEED_COUNT + 1):
        result = run_seed(seed, 3 if seed % 2 else 5, SIMULATED_SECONDS)
        assert result.ok, f"seed {seed}: {result.failure}"
        assert result.linearizable is True, f"seed {seed}: undecided"
        assert result.operations_ok > 10, f"seed {seed}: only {result.operations_ok} operations"


def test_a_txn_that_writes_half_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """A store whose txn drops every write after the first (not atomic) fails the sweep."""
    monkeypatch.setattr(runner, "plan_seed", v3_plan)
    original = mvcc.MVCCStore.txn

    def half_txn(store: mvcc.MVCCStore, command: Txn) -> TxnResponse:
        puts = [operation for operation in command.success if operation.kind == "put"]
        kept = [operation for operation in command.success if operation not in puts[1:]]
        return original(store, Txn(command.compares, kept, command.failure))

    monkeypatch.setattr(mvcc.MVCCStore, "txn", half_txn)
    failures = []
    for seed in range(1, SEED_COUNT + 1):
        result = run_seed(seed, 3, SIMULATED_SECONDS, capture_trace=False)
        if not result.ok:
            failures.append(result.failure or "")
            break
    assert failures and "not linearizable" in failures[0], failures


def test_two_ranges_that_see_two_puts_in_opposite_orders_are_not_linearizable() -> None:
    """A per-key check would pass this: each key alone has a valid order."""
    history = History()
    put_a = history.invoke("w1", "txn", "*", ((), (("put", "a", "1"),), ()), 0)
    put_b = history.invoke("w2", "txn", "*", ((), (("put", "b", "1"),), ()), 0)
    first = history.invoke("r1", "range", "*", ("a", "c"), 1)
    second = history.invoke("r2", "range", "*", ("a", "c"), 1)
    history.complete(first, (("a", "1"),), 2)
    history.complete(second, (("b", "1"),), 2)
    history.complete(put_a, (True, ()), 3)
    history.complete(put_b, (True, ()), 3)
    assert check_linearizable(history.operations(), TXN_MODEL).ok is False
    # Reading both, or one then both, is fine.
    history = History()
    put_a = history.invoke("w1", "txn", "*", ((), (("put", "a", "1"),), ()), 0)
    put_b = history.invoke("w2", "txn", "*", ((), (("put", "b", "1"),), ()), 0)
    first = history.invoke("r1", "range", "*", ("a", "c"), 1)
    second = history.invoke("r2", "range", "*", ("a", "c"), 1)
    history.complete(first, (("a", "1"),), 2)
    history.complete(second, (("a", "1"), ("b", "1")), 2)
    history.complete(put_a, (True, ()), 3)
    history.complete(put_b, (True, ()), 3)
    assert check_linearizable(history.operations(), TXN_MODEL).ok is True
