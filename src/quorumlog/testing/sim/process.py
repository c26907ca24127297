"""One simulated operating-system process, and the host resources it hands the code it runs.

Everything that enters a process — a network message, a timer, an fsync completion, a
client request — goes through `SimProcess.enter`:

- after a crash (or before a start) it is dropped: the process that was waiting for it is
  gone, and so is every timer and completion it had scheduled (`incarnation` changes);
- while paused (SIGSTOP) it queues; `resume` (SIGCONT) hands the queue over with the links
  interleaved in a seeded order, each link keeping its own order (one TCP connection is
  FIFO; a process reads its sockets in whatever order). The process's own events (timers,
  completions) form the link `LOCAL_LINK`;
- otherwise it runs at once, then whatever it asked to run soon (`call_soon`, as asyncio's
  ready queue: same instant, in order, before the process takes its next input), and then
  the `after_event` hook (the invariant checks).

`SimScheduler` and `SimBackground` are the `runtime.resources` interfaces on top of it: the
production `RaftHost` and services run on them unchanged. Virtual time is in milliseconds;
a delay in seconds rounds to the nearest millisecond (never below one for a positive delay,
so a timer never fires in the same instant as the code that set it).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from typing import Any

from quorumlog.testing.sim.checks import SimulationError
from quorumlog.testing.sim.events import EventQueue, draw_int
from quorumlog.testing.sim.filesystem import SimulatedCrash

LOCAL_LINK = "local"
SOON_STEPS_MAX = 1_000_000
"""More callbacks than this at one instant is a loop that never yields: a bug."""
WALL_CLOCK_EPOCH_MS = 1_700_000_000_000
"""What `wall_time_ms` reads at virtual time 0: a fixed, plausible epoch time."""

Handler = Callable[[Any], None]


class SimProcess:
    def __init__(
        self,
        name: str,
        events: EventQueue,
        resume_random: random.Random,
        after_event: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self.events = events
        self.resume_random = resume_random
        self.after_event = after_event or (lambda: None)
        self.incarnation = 0
        self.up = False
        self.paused = False
        self.inbox: list[tuple[str, Handler, Any]] = []
        self.soon: deque[Callable[[], None]] = deque()
        self.in_event = False
        self.drain_pending = False
        self.pause_count = 0
        self.crash_handler: Callable[[], None] | None = None
        """Called when code in the process dies of `SimulatedCrash` (its disk halted it
        mid-write); the owner crashes the node as a power loss would."""

    # --- life cycle ---------------------------------------------------------------------

    def boot(self) -> None:
        """A new incarnation: nothing scheduled by an earlier one will run."""
        self.new_incarnation(up=True)

    def kill(self) -> None:
        """Gone at once: queued input and every pending timer and completion die with it."""
        self.new_incarnation(up=False)

    def new_incarnation(self, up: bool) -> None:
        self.incarnation += 1
        self.up = up
        self.paused = False
        self.inbox = []
        self.soon = deque()
        self.drain_pending = False

    def pause(self) -> None:
        if self.up and not self.paused:
            self.paused = True
            self.pause_count += 1

    def resume(self) -> None:
        if not self.up or not self.paused:
            return
        self.paused = False
        self.in_event = True
        try:
            self.run_soon()  # what was due before the stop comes first
            queued = interleave_links(self.inbox, self.resume_random)
            self.inbox = []
            for position, (_, handler, argument) in enumerate(queued):
                if not self.up:
                    return
                if self.paused:
                    # Paused again by something a handler did: the rest waits, in order.
                    self.inbox = queued[position:] + self.inbox
                    return
                handler(argument)
                self.run_soon()
        except SimulatedCrash:
            self.in_event = False
            self.died()
            return
        finally:
            self.in_event = False
        if self.up:
            self.after_event()

    @property
    def running(self) -> bool:
        return self.up and not self.paused

    # --- input --------------------------------------------------------------------------

    def enter(self, link: str, handler: Handler, argument: Any = None) -> None:
        """`handler(argument)` runs in this process now, is queued if paused, or is dropped
        if the process is down."""
        if not self.up:
            return
        if self.paused:
            self.inbox.append((link, handler, argument))
            return
        self.in_event = True
        try:
            handler(argument)
            if self.soon:
                self.run_soon()
        except SimulatedCrash:
            self.in_event = False
            self.died()
            return
        finally:
            self.in_event = False
        if self.up:
            self.after_event()

    def died(self) -> None:
        """The disk halted the process in the middle of a change."""
        if self.crash_handler is None:
            raise SimulationError(f"{self.name} was halted by its disk but has no crash handler")
        self.crash_handler()

    def call_soon(self, callback: Callable[[], None]) -> None:
        """Run `callback` in this process at the current instant, after the code running
        now (or, from outside any event, as the process's next event)."""
        if not self.up:
            return
        self.soon.append(callback)
        if not self.in_event and not self.drain_pending:
            self.drain_pending = True
            self.schedule(0, self.drain)

    def drain(self, _: Any) -> None:
        self.drain_pending = False

    def run_soon(self) -> None:
        soon = self.soon
        steps = 0
        while soon and self.up and not self.paused:
            soon.popleft()()
            steps += 1
            if steps > SOON_STEPS_MAX:
                raise SimulationError(f"{self.name}: {steps} callbacks at one instant")

    def schedule(
        self, delay_ms: int, handler: Handler, argument: Any = None, link: str = LOCAL_LINK
    ) -> None:
        """Run `handler(argument)` in this incarnation of the process after `delay_ms`."""
        # A bound method and a tuple rather than a closure: every timer, fsync and local
        # step comes this way.
        self.events.schedule(delay_ms, self.arrive, (self.incarnation, link, handler, argument))

    def arrive(self, scheduled: tuple[int, str, Handler, Any]) -> None:
        incarnation, link, handler, argument = scheduled
        if self.incarnation == incarnation:
            self.enter(link, handler, argument)


def interleave_links(
    inbox: list[tuple[str, Handler, Any]], rng: random.Random
) -> list[tuple[str, Handler, Any]]:
    """`inbox` in a seeded order that keeps each link's items in arrival order: at each
    step the next item of a link drawn uniformly among those with items left."""
    links: dict[str, deque[tuple[str, Handler, Any]]] = {}
    for item in inbox:
        links.setdefault(item[0], deque()).append(item)
    if len(links) <= 1:
        return list(inbox)
    order: list[tuple[str, Handler, Any]] = []
    live = list(links)  # first-arrival order: deterministic
    while live:
        position = rng.randrange(len(live))
        queue = links[live[position]]
        order.append(queue.popleft())
        if not queue:
            live.pop(position)
    return order


def milliseconds(delay_seconds: float) -> int:
    if delay_seconds <= 0:
        return 0
    return max(1, round(delay_seconds * 1000))


class SimTimer:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def fire(self, _: Any) -> None:
        if not self.cancelled:
            self.callback()


class SimScheduler:
    """`runtime.resources.Scheduler` on virtual time, inside one process."""

    def __init__(self, process: SimProcess) -> None:
        self.process = process

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.process.call_soon(callback)

    def call_later(self, delay_seconds: float, callback: Callable[[], None]) -> SimTimer:
        timer = SimTimer(callback)
        self.process.schedule(milliseconds(delay_seconds), timer.fire)
        return timer

    def monotonic_seconds(self) -> float:
        return self.process.events.now_ms / 1000

    def wall_time_ms(self) -> int:
        return WALL_CLOCK_EPOCH_MS + self.process.events.now_ms


class SimBackground:
    """`runtime.resources.Background` on virtual time: a job runs after a seeded delay (the
    fsync's duration), then reports. A crash before then loses it: the job never runs, so
    what it would have made durable is not."""

    def __init__(
        self, process: SimProcess, rng: random.Random, delay_ms_min: int, delay_ms_max: int
    ) -> None:
        self.process = process
        self.rng = rng
        self.delay_ms_min = delay_ms_min
        self.delay_ms_max = delay_ms_max
        self.jobs_run = 0

    def submit(self, job: Callable[[], None], done: Callable[[BaseException | None], None]) -> None:
        def run(_: Any) -> None:
            self.jobs_run += 1
            try:
                job()
            except Exception as error:  # reported to the host, as the thread pool does
                done(error)
                return
            done(None)

        delay_ms = draw_int(self.rng, self.delay_ms_min, self.delay_ms_max)
        self.process.schedule(delay_ms, run)
