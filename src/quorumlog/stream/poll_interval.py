"""Kafka's `max.poll.interval.ms`: how long a group member's application may spend between
two calls of `poll` before the member gives its partitions up.

Heartbeats run on the client's I/O thread, so a member whose application is stuck between
polls would otherwise keep its membership (and its partitions, and any hand-over waiting
on it) for as long as the process lives. The heartbeat loop asks `PollTimer` before each
heartbeat; once `overdue`, the member leaves the group instead (`membership.Membership`).

Time spent inside `poll` never counts (a poll may wait longer than the interval for
records); the interval runs from the moment the last poll returned, or from the
subscription if there was no poll yet. The clock is injected (monotonic seconds), so the
rule is tested on virtual time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

MAX_POLL_INTERVAL_MS_DEFAULT = 300_000
"""Kafka's default `max.poll.interval.ms` (five minutes)."""
MAX_POLL_INTERVAL_MS_MIN = 1
MAX_POLL_INTERVAL_MS_MAX = 2**31 - 1
"""Kafka's bound (an int of milliseconds, about 24.8 days)."""

Clock = Callable[[], float]
"""Monotonic seconds."""


def check_max_poll_interval_ms(max_poll_interval_ms: int) -> None:
    if not MAX_POLL_INTERVAL_MS_MIN <= max_poll_interval_ms <= MAX_POLL_INTERVAL_MS_MAX:
        raise ValueError(
            f"max_poll_interval_ms is {MAX_POLL_INTERVAL_MS_MIN} to {MAX_POLL_INTERVAL_MS_MAX}, "
            f"got {max_poll_interval_ms}"
        )


class PollTimer:
    """When the application last polled, and whether it is polling now. Any thread."""

    def __init__(self, max_poll_interval_ms: int, clock: Clock = time.monotonic) -> None:
        check_max_poll_interval_ms(max_poll_interval_ms)
        self.max_poll_interval_seconds = max_poll_interval_ms / 1000
        self.clock = clock
        self.lock = threading.Lock()
        self.polling = 0
        """Polls under way (one thread polls a consumer; a count keeps a nested call safe)."""
        self.polled_seconds = clock()

    def restart(self) -> None:
        """The member (re)joined: the interval runs from now."""
        with self.lock:
            self.polled_seconds = self.clock()

    def poll_started(self) -> None:
        with self.lock:
            self.polling += 1
            self.polled_seconds = self.clock()

    def poll_ended(self) -> None:
        with self.lock:
            self.polling = max(self.polling - 1, 0)
            self.polled_seconds = self.clock()

    def seconds_left(self) -> float:
        """Until the member is overdue (infinite while a poll is under way; 0 or less once
        overdue)."""
        with self.lock:
            if self.polling:
                return float("inf")
            return self.polled_seconds + self.max_poll_interval_seconds - self.clock()

    def overdue(self) -> bool:
        """The application has not polled for longer than the interval."""
        return self.seconds_left() <= 0


__all__ = [
    "MAX_POLL_INTERVAL_MS_DEFAULT",
    "PollTimer",
    "check_max_poll_interval_ms",
]
