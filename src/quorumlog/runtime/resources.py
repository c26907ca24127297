"""What the Ready-loop host needs from its world, as small interfaces.

The host (`runtime/host.py`) drives a Raft core and never touches asyncio, threads, sockets
or a clock itself. It is handed:

- a `Scheduler`: run a callback soon, or after a delay, on the one thread the host lives on,
  and read the time (asyncio's loop for real; the simulator's virtual clock);
- a `Background` worker: run blocking disk work (fsync, snapshot writes) off that thread and
  report back on it (a thread pool for real; a seeded virtual delay in the simulator, where a
  crash before the report loses what was not yet synced);
- durable stores: the `LogStore` (storage/base.py), a `HardStateStore` and a `SnapshotStore`;
- a state machine (`StateMachine`) and a send function.

The simulator implements every one of these; nothing in the host knows which world it is in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from quorumlog.raft.messages import SnapshotMeta
from quorumlog.raft.ready import HardState


class Timer(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    """Callbacks on the host's one thread, in the order they were scheduled (for equal
    times), and the clocks. Nothing here blocks."""

    def call_soon(self, callback: Callable[[], None]) -> None: ...

    def call_later(self, delay_seconds: float, callback: Callable[[], None]) -> Timer: ...

    def monotonic_seconds(self) -> float:
        """A clock that never goes back, for deadlines and rates."""
        ...

    def wall_time_ms(self) -> int:
        """Milliseconds since the epoch, for timestamps that enter the log (session expiry,
        record times): every replica then decides from the log alone, never its own clock."""
        ...


class Background(Protocol):
    """Runs blocking work away from the host's thread."""

    def submit(self, job: Callable[[], None], done: Callable[[BaseException | None], None]) -> None:
        """Run `job`; then call `done(error or None)` on the host's thread. If the process
        dies first (or, in the simulator, crashes), `done` is never called."""
        ...


class SavedSnapshot(Protocol):
    """A snapshot as stored: its metadata and the state machine's bytes."""

    @property
    def meta(self) -> SnapshotMeta: ...

    @property
    def data(self) -> bytes: ...


class HardStateStore(Protocol):
    @property
    def saved(self) -> HardState:
        """The hard state last made durable (what a restart reads)."""
        ...

    def needs_save(self, state: HardState) -> bool:
        """Must `state` be written before anything that depends on it goes out? (Term and
        vote must be; the commit index may lag, as it is only a lower bound.)"""
        ...

    def save(self, state: HardState) -> None:
        """Durable when it returns (atomic: after a crash the old or the new, never a mix)."""
        ...


class SnapshotStore(Protocol):
    def latest(self) -> SavedSnapshot | None: ...

    def save(self, meta: SnapshotMeta, data: bytes) -> None:
        """Durable when it returns (atomic)."""
        ...


class StateMachine(Protocol):
    def apply(self, index: int, data: bytes) -> Any: ...

    def mark_applied(self, index: int) -> None:
        """An entry with nothing for the machine (no-op, configuration) was applied."""
        ...

    def snapshot(self) -> bytes: ...

    def restore(self, data: bytes) -> None: ...
