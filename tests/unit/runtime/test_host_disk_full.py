"""A full disk holds writes back; it never fails the group (and nothing is acknowledged
that is not durable)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from quorumlog.errors import DiskFullError
from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import Configuration
from quorumlog.runtime.host import HostSettings, RaftHost
from quorumlog.testing.manual import InlineBackground, ManualScheduler
from quorumlog.testing.sim.disk import SimDisk
from tests.unit.runtime.test_group import ListMachine


class FullDiskBackground:
    """Disk jobs that meet a full disk while `full` is set (as saving the hard state does:
    it writes a new file)."""

    def __init__(self, inner: InlineBackground) -> None:
        self.inner = inner
        self.full = False
        self.refused = 0

    def submit(self, job: Callable[[], None], done: Callable[[BaseException | None], None]) -> None:
        def maybe_full() -> None:
            if self.full:
                self.refused += 1
                raise DiskFullError("no space left (test)")
            job()

        self.inner.submit(maybe_full, done)


def one_node(background: Any, scheduler: ManualScheduler, machine: ListMachine) -> RaftHost:
    disk = SimDisk()
    host = RaftHost(
        "g",
        RaftConfig(node_id="n1"),
        store=disk.store,
        hard_state=disk.hard_state,
        snapshots=disk.snapshots,
        machine=machine,
        send=lambda message: None,
        bootstrap=Configuration(voters=("n1",)),
        scheduler=scheduler,
        background=background,
        random_source=random.Random(1),
        settings=HostSettings(tick_seconds=1.0, disk_full_retry_seconds=0.5),
    )
    host.start()
    for _ in range(2 * host.core.config.election_ticks + 1):
        if host.is_leader:
            break
        scheduler.advance(1.0)
    scheduler.run_until_idle()
    return host


def test_a_sync_that_meets_a_full_disk_is_retried_and_nothing_is_acknowledged_meanwhile() -> None:
    scheduler = ManualScheduler()
    background = FullDiskBackground(InlineBackground(scheduler))
    machine = ListMachine()
    host = one_node(background, scheduler, machine)
    assert host.is_leader
    background.full = True
    completion = host.propose(b"during")
    for _ in range(6):
        scheduler.advance(0.5)
        scheduler.run_until_idle()
    assert background.refused >= 3
    assert not completion.done()  # not durable, so not acknowledged
    assert host.failure is None  # the group waits; it does not stop
    background.full = False
    scheduler.advance(0.5)
    scheduler.run_until_idle()
    assert completion.done() and completion.result() == 1
    assert machine.items == [b"during"]
