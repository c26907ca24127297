"""A scheduler and a background worker that do nothing until the test says so.

`RaftHost` (runtime/host.py) takes its world as small interfaces (runtime/resources.py).
The simulator gives it virtual time driven by a seeded event queue; these give it time that
moves only when a scripted test moves it, so a test decides exactly what runs and when:

    scheduler = ManualScheduler()
    background = InlineBackground(scheduler)    # fsyncs run when the test drains
    host = RaftHost(..., scheduler=scheduler, background=background, ...)
    host.start()
    scheduler.run_until_idle()                  # everything ready now, nothing later
    scheduler.advance(host.settings.tick_seconds)   # one tick, and what it set off

`ManualScheduler` keeps a FIFO of callbacks to run soon (asyncio's ready queue) and timers
that fire only when `advance` moves time past them, each at its own instant and followed by
whatever it made ready. Time is kept in whole nanoseconds, so a host that computes its next
deadline as `next - now` in floating point still lands on the instant the test advances to.

`InlineBackground` runs blocking jobs on the test's thread: at once, or, given a scheduler,
as that scheduler's soon callbacks (so `run_until_idle` drains disk work in order with
everything else, and dropping the scheduler at a simulated crash drops the unrun jobs and
what they would have made durable).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable

from quorumlog.testing.sim.checks import require

NANOSECONDS_PER_SECOND = 1_000_000_000
WALL_CLOCK_EPOCH_MS = 1_700_000_000_000
"""What `wall_time_ms` reads at time 0: a fixed, plausible epoch time (as the simulator)."""
CALLBACKS_PER_RUN_MAX = 1_000_000
"""More callbacks than this in one run is a loop that never goes idle: a bug."""


def nanoseconds(seconds: float) -> int:
    return round(seconds * NANOSECONDS_PER_SECOND)


class ManualTimer:
    """A timer of a `ManualScheduler` (`runtime.resources.Timer`)."""

    __slots__ = ("callback", "cancelled", "due_nanoseconds", "sequence")

    def __init__(self, due_nanoseconds: int, sequence: int, callback: Callable[[], None]) -> None:
        self.due_nanoseconds = due_nanoseconds
        self.sequence = sequence
        self.callback = callback
        self.cancelled = False

    @property
    def due_seconds(self) -> float:
        return self.due_nanoseconds / NANOSECONDS_PER_SECOND

    def cancel(self) -> None:
        self.cancelled = True

    def __lt__(self, other: ManualTimer) -> bool:
        # Equal times fire in the order they were set, as the Scheduler interface promises.
        return (self.due_nanoseconds, self.sequence) < (other.due_nanoseconds, other.sequence)


class ManualScheduler:
    """`runtime.resources.Scheduler` for scripted tests: deterministic, and still until run.

    `call_soon` callbacks run, first in first out, when the test calls `run_next`,
    `run_until_idle` or `advance`. A timer fires only once time has reached it, and time moves
    only through `advance`. A callback that raises leaves the rest queued as they were.
    """

    def __init__(
        self,
        start_seconds: float = 0.0,
        *,
        wall_clock_epoch_ms: int = WALL_CLOCK_EPOCH_MS,
        callbacks_per_run_max: int = CALLBACKS_PER_RUN_MAX,
    ) -> None:
        require(start_seconds >= 0, f"start time {start_seconds} is negative")
        require(callbacks_per_run_max > 0, "callbacks_per_run_max must be positive")
        self.now_nanoseconds = nanoseconds(start_seconds)
        self.wall_clock_epoch_ms = wall_clock_epoch_ms
        self.callbacks_per_run_max = callbacks_per_run_max
        self.soon: deque[Callable[[], None]] = deque()
        self.timers: list[ManualTimer] = []
        """A heap by (due time, sequence); cancelled timers leave it when they reach the top."""
        self.timer_sequence = 0
        self.callbacks_run = 0
        """Every callback and timer run so far (a test can see whether anything happened)."""

    # --- runtime.resources.Scheduler ----------------------------------------------------

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.soon.append(callback)

    def call_later(self, delay_seconds: float, callback: Callable[[], None]) -> ManualTimer:
        # A negative delay means now, as asyncio's call_later takes it.
        due = self.now_nanoseconds + max(0, nanoseconds(delay_seconds))
        self.timer_sequence += 1
        timer = ManualTimer(due, self.timer_sequence, callback)
        heapq.heappush(self.timers, timer)
        return timer

    def monotonic_seconds(self) -> float:
        return self.now_nanoseconds / NANOSECONDS_PER_SECOND

    def wall_time_ms(self) -> int:
        return self.wall_clock_epoch_ms + self.now_nanoseconds // 1_000_000

    # --- views --------------------------------------------------------------------------

    @property
    def now_seconds(self) -> float:
        return self.monotonic_seconds()

    @property
    def soon_count(self) -> int:
        return len(self.soon)

    @property
    def timer_count(self) -> int:
        """Timers set and neither fired nor cancelled."""
        return sum(1 for timer in self.timers if not timer.cancelled)

    def next_timer_seconds(self) -> float | None:
        """When the next live timer is due (None if there is none)."""
        timer = self.first_live_timer()
        return None if timer is None else timer.due_seconds

    @property
    def idle(self) -> bool:
        """Nothing would run without time moving."""
        timer = self.first_live_timer()
        return not self.soon and (timer is None or timer.due_nanoseconds > self.now_nanoseconds)

    # --- running ------------------------------------------------------------------------

    def run_next(self) -> bool:
        """Run the first soon callback, else the first timer due now. False if none is."""
        if self.soon:
            callback = self.soon.popleft()
        else:
            timer = self.first_live_timer()
            if timer is None or timer.due_nanoseconds > self.now_nanoseconds:
                return False
            heapq.heappop(self.timers)
            callback = timer.callback
        self.callbacks_run += 1
        callback()
        return True

    def run_until_idle(self) -> int:
        """Run everything ready now, and what that makes ready now; how many ran."""
        count = 0
        while self.run_next():
            count += 1
            require(
                count <= self.callbacks_per_run_max,
                f"more than {self.callbacks_per_run_max} callbacks without going idle",
            )
        return count

    def advance(self, seconds: float) -> int:
        """Move time forward by `seconds`. Each timer due on the way fires at its own
        instant, after what was ready before it; how many callbacks ran."""
        require(seconds >= 0, f"time cannot go back ({seconds} seconds)")
        target = self.now_nanoseconds + nanoseconds(seconds)
        count = self.run_until_idle()
        while True:
            timer = self.first_live_timer()
            if timer is None or timer.due_nanoseconds > target:
                break
            self.now_nanoseconds = max(self.now_nanoseconds, timer.due_nanoseconds)
            count += self.run_until_idle()
        self.now_nanoseconds = target
        return count + self.run_until_idle()

    def first_live_timer(self) -> ManualTimer | None:
        timers = self.timers
        while timers and timers[0].cancelled:
            heapq.heappop(timers)
        return timers[0] if timers else None


class InlineBackground:
    """`runtime.resources.Background` on the test's thread.

    Without a scheduler a job runs inside `submit`, and `done` is called at once. With one,
    the job and its report run together as one soon callback of that scheduler: in order
    with everything else, when the test drains it. A job whose callback never runs (the
    scheduler was dropped at a simulated crash) made nothing durable, as the interface says.
    """

    def __init__(self, scheduler: ManualScheduler | None = None) -> None:
        self.scheduler = scheduler
        self.jobs_submitted = 0
        self.jobs_run = 0

    def submit(self, job: Callable[[], None], done: Callable[[BaseException | None], None]) -> None:
        self.jobs_submitted += 1
        if self.scheduler is None:
            self.run(job, done)
        else:
            self.scheduler.call_soon(lambda: self.run(job, done))

    @property
    def jobs_pending(self) -> int:
        return self.jobs_submitted - self.jobs_run

    def run(self, job: Callable[[], None], done: Callable[[BaseException | None], None]) -> None:
        self.jobs_run += 1
        try:
            job()
        except Exception as error:  # reported to the submitter, as a thread pool does
            done(error)
            return
        done(None)
