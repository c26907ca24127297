"""The leader's lease expiry: by its own clock, one TTL of grace after it took over, one
proposal per expired lease at a time, nothing from a follower."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quorumlog.kv.machine import KVStateMachine
from quorumlog.node.kv_leases import LeaseKeeper


class StubTimer:
    def cancel(self) -> None:
        pass


class StubScheduler:
    def __init__(self) -> None:
        self.now_ms = 0
        self.timers: list[Callable[[], None]] = []

    def call_later(self, delay_seconds: float, callback: Callable[[], None]) -> StubTimer:
        self.timers.append(callback)
        return StubTimer()

    def wall_time_ms(self) -> int:
        return self.now_ms


class StubGroup:
    def __init__(self) -> None:
        self.scheduler = StubScheduler()
        self.is_leader = False


def keeper_with_lease(
    ttl_seconds: int, granted_ms: int
) -> tuple[LeaseKeeper, StubGroup, list[Any]]:
    machine = KVStateMachine()
    machine.store.lease_grant(ttl_seconds, granted_ms)
    group = StubGroup()
    proposed: list[Any] = []
    keeper = LeaseKeeper(
        group,  # type: ignore[arg-type]
        lambda: machine,
        lambda lease_ids, settled: proposed.append((lease_ids, settled)),
    )
    keeper.changed()
    return keeper, group, proposed


def test_a_new_leader_waits_one_ttl_from_its_election() -> None:
    keeper, group, proposed = keeper_with_lease(ttl_seconds=2, granted_ms=1_000)
    group.scheduler.now_ms = 2_500
    keeper.check()  # a follower: nothing
    assert proposed == []
    group.is_leader = True
    keeper.check()  # became leader at 2.5 s: the lease runs to 4.5 s, not 3 s
    group.scheduler.now_ms = 3_500
    keeper.check()
    assert proposed == []
    group.scheduler.now_ms = 4_500
    keeper.check()
    assert [lease_ids for lease_ids, _ in proposed] == [[1]]
    keeper.check()  # still in flight: not proposed again
    assert len(proposed) == 1
    proposed[0][1]()  # settled (say the proposal was lost): the next check retries
    keeper.check()
    assert len(proposed) == 2


def test_no_timer_runs_without_leases() -> None:
    keeper, group, _ = keeper_with_lease(ttl_seconds=2, granted_ms=0)
    keeper.machine().store.leases.clear()
    group.scheduler.timers.clear()
    keeper.timer = None
    keeper.changed()
    assert group.scheduler.timers == []
