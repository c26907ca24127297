"""Virtual time: an event heap in milliseconds, and seeded random streams.

Nothing here reads a clock or the global `random`: a simulation is a pure function of its
seed. Events at the same millisecond run in the order they were scheduled (a sequence
number breaks ties), so two runs of one seed interleave identically.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from typing import Any

from quorumlog.testing.sim.checks import SimulationError

Callback = Callable[[Any], None]


def derive_random(seed: int, name: str) -> random.Random:
    """An independent random stream for one component, fixed by (seed, name).

    Seeding with a string hashes it with SHA-512 (not Python's salted `hash`), so streams
    are the same in every process. One stream per component means adding a draw in one
    component does not shift every other component's faults.
    """
    return random.Random(f"quorumlog-sim:{seed}:{name}")


def draw_int(rng: random.Random, low: int, high: int) -> int:
    """A uniform integer in [low, high]: one `random()` call, where `randint` costs three
    Python calls; it matters on the per-message and per-request paths."""
    return low + int(rng.random() * (high - low + 1))


class EventQueue:
    """A min-heap of (time_ms, sequence, callback, argument), run in time order."""

    def __init__(self) -> None:
        self.now_ms = 0
        self.events_run = 0
        self._heap: list[tuple[int, int, Callback, Any]] = []
        self._sequence = 0

    def schedule(self, delay_ms: int, callback: Callback, argument: Any = None) -> None:
        """Run `callback(argument)` `delay_ms` from now (0: after everything due now)."""
        if delay_ms < 0:
            raise SimulationError(f"cannot schedule {delay_ms} ms in the past")
        self._sequence += 1
        heapq.heappush(self._heap, (self.now_ms + delay_ms, self._sequence, callback, argument))

    def schedule_at(self, time_ms: int, callback: Callback, argument: Any = None) -> None:
        """Run `callback(argument)` at `time_ms` (now, if that is past). Pushed here rather
        than through `schedule`: every message arrival comes this way."""
        self._sequence += 1
        now_ms = self.now_ms
        heapq.heappush(
            self._heap,
            (time_ms if time_ms > now_ms else now_ms, self._sequence, callback, argument),
        )

    def next_time_ms(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def run_until(self, deadline_ms: int) -> None:
        """Run every event due at or before `deadline_ms`, then set the clock to it.

        The loop is written out (not run_next in a loop): it is the simulator's inner
        loop, and a call per event is a measurable share of a run."""
        heap = self._heap
        heappop = heapq.heappop
        run = 0
        try:
            while heap and heap[0][0] <= deadline_ms:
                time_ms, _, callback, argument = heappop(heap)
                self.now_ms = time_ms
                run += 1
                callback(argument)
        finally:
            self.events_run += run
        if deadline_ms > self.now_ms:
            self.now_ms = deadline_ms

    def run_next(self) -> bool:
        """Run the earliest event; False if there is none."""
        if not self._heap:
            return False
        time_ms, _, callback, argument = heapq.heappop(self._heap)
        self.now_ms = time_ms
        self.events_run += 1
        callback(argument)
        return True

    def __len__(self) -> int:
        return len(self._heap)
