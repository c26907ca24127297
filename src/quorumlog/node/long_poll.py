"""Long polling of fetches: a fetch at the end of a partition waits for records.

A consumer that reads everything there is asks again at the end. Rather than answer "no
records" at once and have the client ask again every few milliseconds, the replica holds
such a fetch (up to the fetch's `max_wait_ms`, bounded here) and answers it as soon as the
partition applies a new batch. The waiting costs a timer and a callback per held fetch;
held fetches are bounded per partition, and a fetch past the bound is answered at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from quorumlog.errors import QuorumLogError
from quorumlog.stream.partition import PartitionMachine, ProduceOutcome

WAIT_MS_MAX = 5_000
"""The longest a fetch is held, whatever it asks."""
WAITERS_PER_PARTITION_MAX = 1_000


class NotifyingPartitionMachine(PartitionMachine):
    """A partition machine that tells its waiters when records were appended."""

    def __init__(self) -> None:
        super().__init__()
        self.waiters: list[Callable[[], None]] = []

    def apply(self, index: int, data: bytes) -> ProduceOutcome | QuorumLogError:
        before = self.next_offset
        outcome = super().apply(index, data)
        if self.next_offset != before and self.waiters:
            waiters, self.waiters = self.waiters, []
            for wake in waiters:
                wake()
        return outcome


def hold_fetch(
    machine: NotifyingPartitionMachine, wait_ms: int, answer: Callable[[], None]
) -> bool:
    """Call `answer` once records arrive or `wait_ms` passes; False (nothing held) if the
    partition holds too many fetches already or no wait was asked."""
    if wait_ms <= 0 or len(machine.waiters) >= WAITERS_PER_PARTITION_MAX:
        return False
    loop = asyncio.get_running_loop()
    answered = False

    def wake() -> None:
        nonlocal answered
        if answered:
            return
        answered = True
        timer.cancel()
        if wake in machine.waiters:
            machine.waiters.remove(wake)
        answer()

    timer = loop.call_later(min(wait_ms, WAIT_MS_MAX) / 1000, wake)
    machine.waiters.append(wake)
    return True


__all__ = ["WAIT_MS_MAX", "NotifyingPartitionMachine", "hold_fetch"]
