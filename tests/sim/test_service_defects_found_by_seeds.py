"""The simulator runs the shipped KV machine, service and client logic, so breaking them on
purpose must fail seeds: each test patches a defect into production code, finds a seed in
a small block that fails for the reason expected, and checks that seed passes unpatched.

Nearly every seed finds these today (duplicated and dropped client frames make retries
common); the blocks are small so the tests stay fast. If a block stops finding its defect
after a change to the workload or the seed plan, widen it and pick a new one.
"""

from __future__ import annotations

import msgspec
import pytest

from quorumlog.kv import machine
from quorumlog.node.kv_service import KVRequestService
from quorumlog.testing.history import Operation, OperationStatus
from quorumlog.testing.sim import runner
from quorumlog.testing.sim.runner import SeedPlan, SeedResult, plan_seed, run_seed
from quorumlog.testing.sim.workload import appends_applied_twice

SIMULATED_SECONDS = 30
SEEDS = range(1, 11)
"""Three nodes."""


def first_failure(seeds: range) -> SeedResult | None:
    for seed in seeds:
        result = run_seed(seed, 3, SIMULATED_SECONDS, capture_trace=False)
        if not result.ok:
            return result
    return None


def check_found_and_fixed(
    monkeypatch: pytest.MonkeyPatch, expected: str, seeds: range = SEEDS
) -> None:
    found = first_failure(seeds)
    assert found is not None, f"the defect passed seeds {seeds}"
    assert expected in str(found.failure), found.failure
    monkeypatch.undo()
    fixed = run_seed(found.seed, 3, SIMULATED_SECONDS)
    assert fixed.ok, fixed.failure


def no_deduplication(session: object, sequence: int) -> None:
    """`sessions.lookup_duplicate` that never finds the earlier result: every retry of a
    write is applied again."""
    return None


def test_a_machine_that_applies_retries_again_is_not_linearizable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(machine, "lookup_duplicate", no_deduplication)
    check_found_and_fixed(monkeypatch, "not linearizable")


def only_appends(seed: int, node_count: int) -> SeedPlan:
    """The seed's plan with a workload of appends only: no read, so only the end-of-run
    check can see an append applied twice."""
    plan = plan_seed(seed, node_count)
    workload = msgspec.structs.replace(
        plan.options.workload, read_fraction=0.0, cas_fraction=0.0, append_fraction=1.0
    )
    options = msgspec.structs.replace(plan.options, workload=workload)
    return msgspec.structs.replace(plan, options=options)


def test_appends_applied_twice_are_found_without_any_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runner, "plan_seed", only_appends)
    with monkeypatch.context() as broken:
        broken.setattr(machine, "lookup_duplicate", no_deduplication)
        found = first_failure(SEEDS)
    assert found is not None, f"appends applied twice passed seeds {SEEDS}"
    assert "appends applied twice" in str(found.failure), found.failure
    fixed = run_seed(found.seed, 3, SIMULATED_SECONDS)
    assert fixed.ok, fixed.failure


def read_without_the_barrier(service: KVRequestService, request: object, reply: object) -> None:
    """`KVRequestService.read` serving every read from the local state at once: no
    ReadIndex round, on any node."""
    service.answer_read(request, reply)  # type: ignore[arg-type]


def test_reads_served_without_the_read_barrier_are_not_linearizable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(KVRequestService, "read", read_without_the_barrier)
    check_found_and_fixed(monkeypatch, "not linearizable")


def test_an_append_found_twice_is_reported_once_per_operation() -> None:
    def append(operation_id: int, key: str, value: str) -> Operation:
        return Operation(operation_id, "c1", "append", key, value, None, 0, 1, OperationStatus.OK)

    operations = [append(0, "k", "c1.1;"), append(1, "k", "c1.2;"), append(2, "j", "c1.3;")]
    assert appends_applied_twice(operations, {"k": "c1.1;c1.2;", "j": "c1.3;"}) == []
    # A put's value runs into the next append's without a separator: still told apart.
    assert appends_applied_twice(operations, {"k": "c2.9c1.1;c1.2;c1.1;"}) == ["k: 'c1.1;'"]
