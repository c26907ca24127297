"""Runs one Raft group for real: the `RaftHost` (runtime/host.py) on asyncio, files and threads.

The host holds the whole Ready loop; this module only hands it real resources:

- `AsyncioScheduler`: the running event loop (callbacks, timers, `loop.time()`);
- `ExecutorBackground`: fsync and snapshot writes on a thread pool, so the loop keeps taking
  messages and proposals meanwhile; their reports come back on the loop thread;
- the data directory: the log store (segment files by default, or the DLedger-style mmap
  store, chosen by `GroupSettings.store`), the hard state file and the snapshot files.

`GroupRunner` adds the life cycle an asyncio program wants (`start`, `await stop()`), and
`completion_future` turns the host's `Completion` into an awaitable asyncio future.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any, TypeVar

from quorumlog.errors import QuorumLogError
from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import Configuration, MembershipChange
from quorumlog.raft.core import RaftCore
from quorumlog.raft.messages import Message, SnapshotMeta
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.host import HostHooks, HostSettings, RaftHost
from quorumlog.runtime.resources import Background, StateMachine, Timer
from quorumlog.runtime.stable import HardStateFile, SnapshotStore
from quorumlog.runtime.ticker import GroupTicker
from quorumlog.storage import MmapLogStore, SegmentLogStore, SyncPolicy
from quorumlog.storage.base import LogStore

__all__ = [
    "AsyncioScheduler",
    "ExecutorBackground",
    "GroupRunner",
    "GroupSettings",
    "StateMachine",
    "StoreKind",
    "completion_future",
]

log = logging.getLogger("quorumlog.group")

ResultType = TypeVar("ResultType")


class AsyncioScheduler:
    """The host's scheduler on an asyncio event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.loop.call_soon(callback)

    def call_later(self, delay_seconds: float, callback: Callable[[], None]) -> Timer:
        return self.loop.call_later(max(0.0, delay_seconds), callback)

    def monotonic_seconds(self) -> float:
        return self.loop.time()

    def wall_time_ms(self) -> int:
        return int(time.time() * 1000)


class ExecutorBackground:
    """Blocking disk work on an executor; the report comes back on the loop thread."""

    def __init__(self, executor: Executor, loop: asyncio.AbstractEventLoop) -> None:
        self.executor = executor
        self.loop = loop

    def submit(self, job: Callable[[], None], done: Callable[[BaseException | None], None]) -> None:
        def report(finished: Future[None]) -> None:
            self.loop.call_soon_threadsafe(done, finished.exception())

        self.executor.submit(job).add_done_callback(report)


def completion_future(completion: Completion[ResultType]) -> asyncio.Future[ResultType]:
    """An asyncio future that settles with `completion` (for code that awaits)."""
    future: asyncio.Future[ResultType] = asyncio.get_running_loop().create_future()

    def settle(done: Completion[ResultType]) -> None:
        if future.done():
            return
        error = done.exception()
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(done.result())

    completion.add_done_callback(settle)
    return future


class StoreKind(enum.Enum):
    SEGMENT = "segment"
    """braft-style segment files (reference 004): the default."""
    MMAP = "mmap"
    """DLedger-style data and index files (reference 000 §1)."""


class GroupSettings:
    def __init__(
        self,
        tick_seconds: float = 0.05,
        snapshot_entries: int = 20_000,
        snapshot_trailing_entries: int = 5_000,
        segment_bytes_max: int = 64 * 1024 * 1024,
        fsync: bool = True,
        store: StoreKind = StoreKind.SEGMENT,
    ) -> None:
        self.tick_seconds = tick_seconds
        self.snapshot_entries = snapshot_entries
        """Snapshot the state machine every this many applied entries (bounds the log)."""
        self.snapshot_trailing_entries = snapshot_trailing_entries
        """Entries kept behind a snapshot, so a follower a little behind needs no snapshot."""
        self.segment_bytes_max = segment_bytes_max
        self.fsync = fsync
        self.store = store

    def host_settings(self) -> HostSettings:
        return HostSettings(
            tick_seconds=self.tick_seconds,
            snapshot_entries=self.snapshot_entries,
            snapshot_trailing_entries=self.snapshot_trailing_entries,
        )


def open_log_store(directory: Path, settings: GroupSettings) -> LogStore:
    sync_policy = SyncPolicy.EXPLICIT if settings.fsync else SyncPolicy.NEVER
    store: LogStore
    if settings.store is StoreKind.MMAP:
        store = MmapLogStore.open(directory / "mmap_log", sync_policy=sync_policy)
    else:
        store = SegmentLogStore.open(
            directory / "log",
            segment_bytes_max=settings.segment_bytes_max,
            sync_policy=sync_policy,
        )
    if isinstance(store, SegmentLogStore):
        # Now, not at the first append: creating the open segment syncs the directory, and
        # the first append runs on the event loop (open runs off it when a node hosts many
        # groups at once, see `open_log_stores`).
        try:
            store.prepare_open_segment()
        except BaseException:
            store.close()
            raise
    recovery = store.recovery
    if recovery.torn_bytes_dropped:
        log.warning(
            "log in %s: dropped a torn tail of %d bytes in %s",
            directory,
            recovery.torn_bytes_dropped,
            recovery.torn_file,
        )
    return store


def open_log_stores(directories: list[Path], settings: GroupSettings) -> list[LogStore]:
    """Open the stores of many groups, for a worker thread: each open creates and syncs
    files (directories, meta, the open segment), which for a thousand new groups would hold
    the event loop for seconds. All or nothing: what was opened is closed on a failure."""
    stores: list[LogStore] = []
    try:
        for directory in directories:
            stores.append(open_log_store(directory, settings))
    except BaseException:
        for store in stores:
            store.close()
        raise
    return stores


class GroupRunner:
    """One group's host on the running event loop, its files in `data_dir`."""

    def __init__(
        self,
        group_id: str,
        raft_config: RaftConfig,
        data_dir: Path,
        machine: StateMachine,
        send: Callable[[str, str, Message], None],
        bootstrap: Configuration,
        executor: Executor,
        settings: GroupSettings | None = None,
        ticker: GroupTicker | None = None,
        hooks: HostHooks | None = None,
        store: LogStore | None = None,
        background: Background | None = None,
    ) -> None:
        """`ticker`: the node's shared ticker (None: the group ticks on a timer of its own);
        `hooks`: what observes the host (the node's events and metrics); `background`: where
        its syncs run (the node's shared `BatchedBackground`; None: on `executor`)."""
        self.settings = settings or GroupSettings()
        data_dir.mkdir(parents=True, exist_ok=True)
        loop = asyncio.get_running_loop()
        self.store = open_log_store(data_dir, self.settings) if store is None else store
        """Opened here, or by the caller (off the event loop) and owned from here on."""
        try:
            self.host = RaftHost(
                group_id,
                raft_config,
                store=self.store,
                hard_state=HardStateFile(data_dir),
                snapshots=SnapshotStore(data_dir / "snapshots"),
                machine=machine,
                send=lambda message: send(group_id, message.target, message),
                bootstrap=bootstrap,
                scheduler=AsyncioScheduler(loop),
                background=background or ExecutorBackground(executor, loop),
                random_source=random.Random(),
                settings=self.settings.host_settings(),
                ticker=ticker,
                hooks=hooks,
            )
        except BaseException:
            self.store.close()
            raise
        self.group_id = group_id
        self.node_id = raft_config.node_id
        self.machine = machine
        self.host.on_failed = self.group_failed
        self.on_storage_failure: Callable[[str], None] | None = None
        """Told the group id when a storage failure stopped this group (the node then tells
        the group's other members, whose quiet followers would otherwise wait on it)."""

    def group_failed(self, group_id: str, error: BaseException) -> None:
        """A storage failure stops this group only (the process serves its other groups);
        anything else (a violated invariant, a bug) goes to the event loop's exception
        handler, which a node turns into stopping the whole process (fail-stop)."""
        if isinstance(error, QuorumLogError):
            if self.on_storage_failure is not None:
                self.on_storage_failure(group_id)
            return
        asyncio.get_running_loop().call_exception_handler(
            {"message": f"group {group_id} failed", "exception": error}
        )

    # --- views the node and its services read -------------------------------------------

    @property
    def core(self) -> RaftCore:
        return self.host.core

    @property
    def failure(self) -> str | None:
        return self.host.failure

    @property
    def stopped(self) -> bool:
        return self.host.stopped

    @property
    def on_configuration(self) -> Callable[[Configuration], None] | None:
        return self.host.on_configuration

    @on_configuration.setter
    def on_configuration(self, callback: Callable[[Configuration], None] | None) -> None:
        self.host.on_configuration = callback

    @property
    def on_snapshot_saved(self) -> Callable[[SnapshotMeta], None] | None:
        return self.host.on_snapshot_saved

    @on_snapshot_saved.setter
    def on_snapshot_saved(self, callback: Callable[[SnapshotMeta], None] | None) -> None:
        self.host.on_snapshot_saved = callback

    # --- life cycle ---------------------------------------------------------------------

    def start(self) -> None:
        self.host.start()

    async def stop(self) -> None:
        self.host.stop()
        idle: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def settle() -> None:
            if not idle.done():
                idle.set_result(None)

        self.host.when_sync_idle(settle)
        await idle  # let the fsync in flight land before closing files
        self.store.close()

    # --- requests -----------------------------------------------------------------------

    def step(self, message: Message) -> None:
        self.host.step(message)

    def propose(self, data: bytes) -> asyncio.Future[Any]:
        return completion_future(self.host.propose(data))

    def change_membership(self, change: MembershipChange) -> asyncio.Future[Any]:
        return completion_future(self.host.change_membership(change))

    def linearizable_read(self) -> asyncio.Future[int]:
        return completion_future(self.host.linearizable_read())

    def transfer_leadership(self, target: str) -> None:
        self.host.transfer_leadership(target)

    def campaign(self) -> None:
        """Start an election now (a new group's first replica, so as not to wait out an
        election timeout)."""
        self.host.campaign()

    def snapshot_at(self, index: int, data: bytes | None) -> None:
        self.host.snapshot_at(index, data)

    def take_snapshot(self) -> None:
        self.host.take_snapshot()

    def schedule(self) -> None:
        self.host.schedule()
