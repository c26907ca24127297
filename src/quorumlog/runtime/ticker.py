"""One timer per node ticks the node's awake Raft groups, all in one pass.

Without it every group would keep a timer of its own, and a node hosting a thousand
partitions would run twenty thousand timer callbacks a second doing nothing. Here:

- a group that is quiet (raft/core.py: an idle group whose leader told it to rest) is not
  in the awake set, so a tick costs it nothing; the host puts itself back the moment its
  core wakes (`RaftHost.process`);
- the awake groups tick in the same event-loop turn, so the heartbeats they send to one
  peer leave together in one `PeerBatch` frame (the transport coalesces per turn);
- node-level work that runs once per tick (the peer liveness of runtime/liveness.py) hangs
  on the same timer (`every_tick`).

The ticker reads time only through its `Scheduler`, so the simulator runs it unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from quorumlog.runtime.resources import Scheduler, Timer


class Tickable(Protocol):
    def tick(self) -> bool:
        """Advance one tick; False once it wants no more ticks (quiet, stopped or failed)."""
        ...


class GroupTicker:
    def __init__(self, scheduler: Scheduler, tick_seconds: float) -> None:
        self.scheduler = scheduler
        self.tick_seconds = tick_seconds
        self.awake: dict[Tickable, None] = {}
        """The groups ticked each tick, in the order they woke (a dict: ordered, and O(1)
        to add and remove)."""
        self.every_tick: list[Callable[[], None]] = []
        self.timer: Timer | None = None
        self.next_tick_seconds = 0.0
        self.stopped = False
        self.ticks = 0

    def start(self, first_tick_delay_seconds: float | None = None) -> None:
        """Begin ticking (the first tick after `first_tick_delay_seconds`, default one tick)."""
        if self.timer is not None or self.stopped:
            return
        delay = self.tick_seconds if first_tick_delay_seconds is None else first_tick_delay_seconds
        self.next_tick_seconds = self.scheduler.monotonic_seconds() + delay
        self.timer = self.scheduler.call_later(delay, self.on_tick)

    def stop(self) -> None:
        self.stopped = True
        if self.timer is not None:
            self.timer.cancel()

    def wake(self, group: Tickable) -> None:
        self.awake[group] = None

    def remove(self, group: Tickable) -> None:
        self.awake.pop(group, None)

    def on_tick(self) -> None:
        if self.stopped:
            return
        # Ticks keep their phase: the next one is due a tick after this one was due.
        now = self.scheduler.monotonic_seconds()
        self.next_tick_seconds = max(self.next_tick_seconds + self.tick_seconds, now)
        self.timer = self.scheduler.call_later(self.next_tick_seconds - now, self.on_tick)
        self.ticks += 1
        awake = self.awake
        for group in list(awake):
            if not group.tick():
                awake.pop(group, None)
        for work in self.every_tick:
            work()
