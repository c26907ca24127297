"""The manual scheduler and inline background: nothing runs until the test says so, and
then in a fixed order; and the shipped `RaftHost` runs on them."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import Configuration
from quorumlog.runtime.host import HostSettings, RaftHost
from quorumlog.testing import InlineBackground, ManualScheduler
from quorumlog.testing.sim.checks import SimulationError
from quorumlog.testing.sim.disk import SimDisk


def recorder(log: list[str], name: str) -> Callable[[], None]:
    return lambda: log.append(name)


def test_soon_callbacks_wait_for_the_test_and_run_first_in_first_out() -> None:
    scheduler = ManualScheduler()
    ran: list[str] = []
    scheduler.call_soon(recorder(ran, "a"))
    scheduler.call_soon(lambda: scheduler.call_soon(recorder(ran, "c")))
    scheduler.call_soon(recorder(ran, "b"))
    assert ran == [] and scheduler.soon_count == 3 and not scheduler.idle
    assert scheduler.run_until_idle() == 4
    assert ran == ["a", "b", "c"]  # what a callback made ready runs after what was queued
    assert scheduler.idle and scheduler.run_until_idle() == 0
    assert scheduler.now_seconds == 0


def test_run_next_runs_one_callback_at_a_time() -> None:
    scheduler = ManualScheduler()
    ran: list[str] = []
    scheduler.call_soon(recorder(ran, "a"))
    scheduler.call_soon(recorder(ran, "b"))
    assert scheduler.run_next() and ran == ["a"]
    assert scheduler.run_next() and ran == ["a", "b"]
    assert not scheduler.run_next()


def test_timers_fire_only_when_time_reaches_them_each_at_its_own_instant() -> None:
    scheduler = ManualScheduler()
    fired: list[tuple[str, float]] = []

    def at(name: str) -> Callable[[], None]:
        return lambda: fired.append((name, scheduler.monotonic_seconds()))

    scheduler.call_later(2.0, at("late"))
    scheduler.call_later(1.0, at("early"))
    scheduler.call_later(1.0, at("early-second"))  # equal times: in the order set
    scheduler.run_until_idle()
    assert fired == [] and scheduler.timer_count == 3
    assert scheduler.next_timer_seconds() == 1.0
    scheduler.advance(0.5)
    assert fired == [] and scheduler.now_seconds == 0.5
    scheduler.advance(2.0)
    assert fired == [("early", 1.0), ("early-second", 1.0), ("late", 2.0)]
    assert scheduler.now_seconds == 2.5 and scheduler.timer_count == 0


def test_what_a_timer_makes_ready_runs_before_the_next_timer() -> None:
    scheduler = ManualScheduler()
    ran: list[str] = []

    def first() -> None:
        ran.append("first")
        scheduler.call_soon(recorder(ran, "made ready by first"))
        scheduler.call_later(0.5, recorder(ran, "set by first"))

    scheduler.call_later(1.0, first)
    scheduler.call_later(2.0, recorder(ran, "second"))
    scheduler.advance(3.0)
    assert ran == ["first", "made ready by first", "set by first", "second"]


def test_a_cancelled_timer_never_fires() -> None:
    scheduler = ManualScheduler()
    ran: list[str] = []
    timer = scheduler.call_later(1.0, recorder(ran, "cancelled"))
    scheduler.call_later(2.0, recorder(ran, "kept"))
    timer.cancel()
    assert scheduler.timer_count == 1 and scheduler.next_timer_seconds() == 2.0
    scheduler.advance(5.0)
    assert ran == ["kept"]


def test_a_timer_due_now_is_ready_without_time_moving() -> None:
    scheduler = ManualScheduler(start_seconds=10.0)
    ran: list[str] = []
    scheduler.call_later(0.0, recorder(ran, "zero"))
    scheduler.call_later(-1.0, recorder(ran, "negative is now"))
    assert not scheduler.idle
    scheduler.run_until_idle()
    assert ran == ["zero", "negative is now"] and scheduler.now_seconds == 10.0


def test_a_periodic_timer_keeps_its_phase_whatever_steps_time_moves_in() -> None:
    """Time is whole nanoseconds, so a deadline the host computes by adding up intervals
    in floating point (0.05 + 0.05 + 0.05 > 0.15) still falls on the instant the test
    advances to."""
    scheduler = ManualScheduler()
    interval = 0.05
    fired: list[float] = []
    state = {"next": interval}

    def tick() -> None:  # as RaftHost.on_tick keeps its phase
        now = scheduler.monotonic_seconds()
        fired.append(now)
        state["next"] = max(state["next"] + interval, now)
        scheduler.call_later(state["next"] - now, tick)

    scheduler.call_later(interval, tick)
    scheduler.advance(3 * interval)
    assert len(fired) == 3
    for step in range(1, 201):
        scheduler.advance(interval)
        assert len(fired) == 3 + step, f"step {step}: {len(fired)} ticks"
    scheduler.advance(0.35)
    assert len(fired) == 210


def test_wall_time_moves_with_the_manual_clock() -> None:
    scheduler = ManualScheduler(wall_clock_epoch_ms=1_000)
    scheduler.advance(1.5)
    assert scheduler.wall_time_ms() == 2_500


def test_time_never_goes_back() -> None:
    scheduler = ManualScheduler()
    with pytest.raises(SimulationError):
        scheduler.advance(-1.0)


def test_a_callback_loop_that_never_goes_idle_is_reported() -> None:
    scheduler = ManualScheduler(callbacks_per_run_max=100)

    def again() -> None:
        scheduler.call_soon(again)

    scheduler.call_soon(again)
    with pytest.raises(SimulationError, match="without going idle"):
        scheduler.run_until_idle()


def test_a_callback_that_raises_leaves_the_rest_queued() -> None:
    scheduler = ManualScheduler()
    ran: list[str] = []

    def fails() -> None:
        raise ValueError("boom")

    scheduler.call_soon(fails)
    scheduler.call_soon(recorder(ran, "after"))
    with pytest.raises(ValueError, match="boom"):
        scheduler.run_until_idle()
    assert scheduler.soon_count == 1
    scheduler.run_until_idle()
    assert ran == ["after"]


def test_inline_background_without_a_scheduler_runs_at_once() -> None:
    background = InlineBackground()
    reports: list[BaseException | None] = []
    background.submit(lambda: None, reports.append)
    assert reports == [None] and background.jobs_pending == 0


def test_inline_background_with_a_scheduler_runs_when_the_test_drains() -> None:
    scheduler = ManualScheduler()
    background = InlineBackground(scheduler)
    order: list[str] = []
    reports: list[BaseException | None] = []

    def failing_job() -> None:
        order.append("failing job")
        raise OSError("disk gone")

    background.submit(lambda: order.append("job"), reports.append)
    scheduler.call_soon(recorder(order, "callback"))
    background.submit(failing_job, reports.append)
    assert order == [] and background.jobs_pending == 2
    scheduler.run_until_idle()
    assert order == ["job", "callback", "failing job"]
    assert reports[0] is None and isinstance(reports[1], OSError)
    assert background.jobs_pending == 0


class ListMachine:
    """A user's state machine: a list of strings."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def apply(self, index: int, data: bytes) -> int:
        self.items.append(data.decode())
        return len(self.items)

    def mark_applied(self, index: int) -> None:
        pass

    def snapshot(self) -> bytes:
        return "\n".join(self.items).encode()

    def restore(self, data: bytes) -> None:
        self.items = data.decode().split("\n") if data else []


def test_a_one_node_group_runs_the_shipped_host_on_manual_time() -> None:
    """How a user tests a state machine on the real Ready loop, with no threads or sleeps."""
    scheduler = ManualScheduler()
    disk = SimDisk()
    machine = ListMachine()
    sent: list[Any] = []
    host = RaftHost(
        "list",
        RaftConfig(node_id="n1"),
        store=disk.store,
        hard_state=disk.hard_state,
        snapshots=disk.snapshots,
        machine=machine,
        send=sent.append,
        bootstrap=Configuration(voters=("n1",)),
        scheduler=scheduler,
        background=InlineBackground(scheduler),
        random_source=random.Random(1),
        settings=HostSettings(tick_seconds=1.0),
    )
    host.start()
    ticks_max = 2 * host.core.config.election_ticks + 1
    for _ in range(ticks_max):
        if host.is_leader:
            break
        scheduler.advance(host.settings.tick_seconds)
    assert host.is_leader
    completion = host.propose(b"first")
    assert not completion.done()  # nothing runs until the test drains
    scheduler.run_until_idle()
    assert completion.done() and completion.result() == 1
    assert machine.items == ["first"]
    assert disk.file_system.durable_file_contents() == disk.file_system.file_contents()
    assert disk.durable_hard_state.term == host.core.term
    assert sent == []
