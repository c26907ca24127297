"""Runs one Raft group for real: a RaftCore, its log on disk, its state machine, its peers.

Everything happens on the event loop thread except fsync, which runs on an executor so
the loop keeps taking messages and proposals meanwhile. Readies keep being taken during a
sync and their messages sent at once (the leader replicates while it writes); their
durable parts queue up, and when the sync lands one write and one fsync cover them all —
that is the group commit. The store is only mutated on the loop thread and never while a
sync is in flight.

Order per Ready (see raft/ready.py): send `messages` (the leader replicates while it
writes); install a snapshot; truncate; append; fsync (then hard state); send
`messages_after_persist`; `persisted`; apply; answer reads.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Protocol

from quorumlog.errors import (
    DiskFullError,
    LeadershipLostError,
    NotLeaderError,
    ProposalDroppedError,
    QuorumLogError,
)
from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import Configuration, MembershipChange
from quorumlog.raft.core import RaftCore, Role
from quorumlog.raft.messages import Message, SnapshotMeta
from quorumlog.raft.ready import HardState, Ready
from quorumlog.runtime.stable import HardStateFile, SnapshotStore
from quorumlog.storage import EntryType, LogEntry, SegmentLogStore, SyncPolicy

log = logging.getLogger("quorumlog.group")

DISK_FULL_RETRY_SECONDS = 0.5
READIES_QUEUED_MAX = 256
"""Readies taken while a sync is in flight; past this the core holds the rest."""


class StateMachine(Protocol):
    def apply(self, index: int, data: bytes) -> Any: ...

    def mark_applied(self, index: int) -> None:
        """An entry with nothing for the machine (no-op, configuration) was applied."""
        ...

    def snapshot(self) -> bytes: ...

    def restore(self, data: bytes) -> None: ...


class GroupSettings:
    def __init__(
        self,
        tick_seconds: float = 0.05,
        snapshot_entries: int = 20_000,
        snapshot_trailing_entries: int = 5_000,
        segment_bytes_max: int = 64 * 1024 * 1024,
        fsync: bool = True,
    ) -> None:
        self.tick_seconds = tick_seconds
        self.snapshot_entries = snapshot_entries
        """Snapshot the state machine every this many applied entries (bounds the log)."""
        self.snapshot_trailing_entries = snapshot_trailing_entries
        """Entries kept behind a snapshot, so a follower a little behind needs no snapshot."""
        self.segment_bytes_max = segment_bytes_max
        self.fsync = fsync


class GroupRunner:
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
    ) -> None:
        self.group_id = group_id
        self.node_id = raft_config.node_id
        self.machine = machine
        self.send_message = send
        self.executor = executor
        self.settings = settings or GroupSettings()
        data_dir.mkdir(parents=True, exist_ok=True)
        self.store = SegmentLogStore.open(
            data_dir / "log",
            segment_bytes_max=self.settings.segment_bytes_max,
            sync_policy=SyncPolicy.EXPLICIT if self.settings.fsync else SyncPolicy.NEVER,
        )
        if self.store.recovery.torn_bytes_dropped:
            log.warning(
                "group %s: dropped a torn tail of %d bytes in %s",
                group_id,
                self.store.recovery.torn_bytes_dropped,
                self.store.recovery.torn_file,
            )
        self.hard_state_file = HardStateFile(data_dir)
        self.snapshots = SnapshotStore(data_dir / "snapshots")
        snapshot = self.snapshots.latest()
        if snapshot is not None:
            machine.restore(snapshot.data)
            meta = snapshot.meta
            if self.store.last_index < meta.index or self.store.first_index > meta.index + 1:
                self.store.reset(meta.index + 1)  # a crash between snapshot save and reset
        self.last_snapshot_index = snapshot.meta.index if snapshot else 0
        self.core = RaftCore(
            raft_config,
            self.store,
            hard_state=self.hard_state_file.saved,
            configuration=bootstrap,
            snapshot=snapshot.meta if snapshot else None,
            snapshot_data=snapshot.data if snapshot else None,
            random=random.Random(),
        )
        self.unwritten: list[Ready] = []
        """Readies taken from the core whose durable part is not written yet, in order."""
        self.disk_full_logged = False
        self.syncing = False
        self.sync_idle = asyncio.Event()
        self.sync_idle.set()
        self.scheduled = False
        self.stopped = False
        self.failure: str | None = None
        self.waiters: dict[int, tuple[int, asyncio.Future[Any]]] = {}
        self.read_requests: list[asyncio.Future[int]] = []
        self.reads_in_flight: dict[int, list[asyncio.Future[int]]] = {}
        self.reads_waiting_apply: list[tuple[int, list[asyncio.Future[int]]]] = []
        self.read_request_id = 0
        self.was_leader = False
        self.pending_compaction: int | None = None
        self.snapshot_in_flight = False
        self.ticker: asyncio.Task[None] | None = None
        self.on_configuration: Callable[[Configuration], None] | None = None
        self.on_snapshot_saved: Callable[[SnapshotMeta], None] | None = None
        self.last_configuration: Configuration | None = None

    # --- life cycle ---------------------------------------------------------------------

    def start(self) -> None:
        self.ticker = asyncio.create_task(self.tick_forever())
        self.schedule()

    async def tick_forever(self) -> None:
        interval = self.settings.tick_seconds
        loop = asyncio.get_running_loop()
        next_tick = loop.time() + interval
        while not self.stopped:
            await asyncio.sleep(max(0.0, next_tick - loop.time()))
            next_tick += interval
            if self.failure is None:
                self.core.tick()
                self.schedule()

    async def stop(self) -> None:
        self.stopped = True
        if self.ticker is not None:
            self.ticker.cancel()
        await self.sync_idle.wait()  # let the fsync in flight land before closing files
        self.fail_waiters(LeadershipLostError(f"{self.node_id} is stopping; outcome unknown"))
        self.store.close()

    # --- events in ----------------------------------------------------------------------

    def step(self, message: Message) -> None:
        if self.failure is None:
            self.core.step(message)
            self.schedule()

    def propose(self, data: bytes) -> asyncio.Future[Any]:
        """Propose one entry; the future gets the state machine's result once applied.

        Raises at once (NotLeaderError, PendingFullError, ...) if the core refuses it."""
        self.require_healthy()
        index = self.core.propose(data)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiters[index] = (self.core.term, future)
        self.schedule()
        return future

    def change_membership(self, change: MembershipChange) -> asyncio.Future[Any]:
        self.require_healthy()
        index = self.core.change_membership(change)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiters[index] = (self.core.term, future)
        self.schedule()
        return future

    def linearizable_read(self) -> asyncio.Future[int]:
        """A future that resolves, with the read index, once reads may be served here."""
        self.require_healthy()
        if not self.core.is_leader:
            raise NotLeaderError(self.node_id, self.core.leader_id)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.read_requests.append(future)
        self.schedule()
        return future

    def require_healthy(self) -> None:
        if self.failure is not None:
            raise QuorumLogError(f"group {self.group_id} stopped after a failure: {self.failure}")

    # --- the Ready loop -----------------------------------------------------------------

    def schedule(self) -> None:
        if not self.scheduled and not self.stopped:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self.process)

    def process(self) -> None:
        self.scheduled = False
        if self.failure is not None or self.stopped:
            return
        try:
            if not self.syncing:
                self.compact_if_due()  # the store changes only while no sync is in flight
            self.request_reads()
            # Take Readies even while a sync is in flight: their messages go out at once (the
            # leader replicates while it writes); their durable part waits its turn below.
            while len(self.unwritten) < READIES_QUEUED_MAX and self.core.has_ready():
                ready = self.core.ready()
                for message in ready.messages:
                    self.send_message(self.group_id, message.target, message)
                self.unwritten.append(ready)
        except QuorumLogError as error:
            self.fail(error)
            return
        if not self.syncing and self.unwritten:
            self.write_and_sync()

    def write_and_sync(self) -> None:
        """Write every queued Ready and cover them all with one fsync (group commit)."""
        batch: list[Ready] = []
        needs_sync = False
        hard_state: HardState | None = None
        try:
            while self.unwritten:
                ready = self.unwritten[0]
                if ready.snapshot is not None and batch:
                    break  # restore only after the entries before it are applied
                needs_sync |= self.write(ready)
                self.unwritten.pop(0)
                batch.append(ready)
                hard_state = ready.hard_state or hard_state
        except DiskFullError as error:
            # The store rolled the failed write back; that Ready stays first in the queue
            # and is tried again (nothing after it may be written first).
            if not self.disk_full_logged:
                log.error("group %s: disk full, retrying writes: %s", self.group_id, error)
                self.disk_full_logged = True
            asyncio.get_running_loop().call_later(DISK_FULL_RETRY_SECONDS, self.schedule)
        except QuorumLogError as error:
            self.fail(error)
            return
        if not batch:
            return
        if self.disk_full_logged and not self.unwritten:
            log.warning("group %s: writes go through again", self.group_id)
            self.disk_full_logged = False
        save_hard_state = hard_state is not None and self.hard_state_file.needs_save(hard_state)
        if needs_sync or save_hard_state:
            self.syncing = True
            self.sync_idle.clear()
            job = self.executor.submit(
                self.sync_job, hard_state if save_hard_state else None, needs_sync
            )
            loop = asyncio.get_running_loop()
            job.add_done_callback(
                lambda done: loop.call_soon_threadsafe(self.after_sync, batch, done.exception())
            )
        else:
            self.after_sync(batch, None)

    def write(self, ready: Ready) -> bool:
        """Apply the Ready's durable changes to the store (not yet synced)."""
        if ready.snapshot is not None:
            meta = ready.snapshot.meta
            self.machine.restore(ready.snapshot.data)
            # The snapshot must be durable before the log it replaces is dropped.
            self.snapshots.save(meta, ready.snapshot.data)
            self.store.reset(meta.index + 1)
            self.last_snapshot_index = meta.index
            self.fail_waiters_up_to(meta.index)
        if ready.truncate_after is not None:
            self.store.truncate_suffix(ready.truncate_after)
        if ready.entries:
            self.store.append(ready.entries)
            return True
        return False

    def sync_job(self, hard_state: HardState | None, sync_log: bool) -> None:
        if sync_log:
            self.store.sync()
        if hard_state is not None:
            self.hard_state_file.save(hard_state)  # after the log it refers to

    def after_sync(self, batch: list[Ready], error: BaseException | None) -> None:
        self.syncing = False
        self.sync_idle.set()
        if error is not None:
            self.fail(error)
            return
        for ready in batch:
            for message in ready.messages_after_persist:
                self.send_message(self.group_id, message.target, message)
            if ready.entries:
                last = ready.entries[-1]
                self.core.persisted(last.index, last.term)
            try:
                self.apply(ready.committed_entries)
            except QuorumLogError as apply_error:
                self.fail(apply_error)
                return
            self.note_reads(ready)
        self.note_role_and_configuration()
        self.schedule()

    def fail(self, error: BaseException) -> None:
        """A storage failure (fsync error, corruption): stop this group rather than risk
        acknowledging what is not durable. The process keeps serving its other groups."""
        self.failure = f"{type(error).__name__}: {error}"
        log.error("group %s stopped: %s", self.group_id, self.failure)
        self.fail_waiters(QuorumLogError(self.failure))

    # --- apply --------------------------------------------------------------------------

    def apply(self, entries: list[LogEntry]) -> None:
        if not entries:
            return
        for entry in entries:
            result: Any = None
            if entry.type is EntryType.DATA:
                result = self.machine.apply(entry.index, entry.data)
            else:
                self.machine.mark_applied(entry.index)
            waiter = self.waiters.pop(entry.index, None)
            if waiter is not None:
                term, future = waiter
                if future.done():
                    continue
                if term == entry.term:
                    future.set_result(result)
                else:
                    future.set_exception(
                        ProposalDroppedError(f"entry {entry.index} was replaced by a new leader")
                    )
        last = entries[-1].index
        self.core.applied(last)
        if last - self.last_snapshot_index >= self.settings.snapshot_entries:
            self.take_snapshot()

    def take_snapshot(self) -> None:
        self.snapshot_at(self.core.applied_index, None)

    def snapshot_at(self, index: int, data: bytes | None) -> None:
        """Snapshot the state machine as of `index` (<= applied) and compact the log.

        `data` None: ask the machine for its state now (index must be the applied index).
        Machines whose log is their data (stream partitions) pass an older checkpoint."""
        if self.snapshot_in_flight or index <= self.core.log.snapshot_index:
            return
        core = self.core
        term = core.log.term(index)
        if term is None:
            return
        configuration = core.configurations[0][1]
        for config_index, candidate in core.configurations:
            if config_index <= index:
                configuration = candidate
        meta = SnapshotMeta(index=index, term=term, configuration=configuration)
        payload = self.machine.snapshot() if data is None else data
        self.snapshot_in_flight = True
        job = self.executor.submit(self.snapshots.save, meta, payload)
        loop = asyncio.get_running_loop()
        job.add_done_callback(
            lambda done: loop.call_soon_threadsafe(
                self.snapshot_saved, meta, payload, done.exception()
            )
        )

    def snapshot_saved(self, meta: SnapshotMeta, data: bytes, error: BaseException | None) -> None:
        self.snapshot_in_flight = False
        if error is not None:
            log.error("group %s: saving snapshot %d failed: %s", self.group_id, meta.index, error)
            return
        self.last_snapshot_index = meta.index
        self.core.snapshot_taken(meta, data)
        keep_from = meta.index + 1 - self.settings.snapshot_trailing_entries
        if self.on_snapshot_saved is not None:
            self.on_snapshot_saved(meta)
        if keep_from > self.store.first_index:
            self.pending_compaction = keep_from
        self.schedule()

    def compact_if_due(self) -> None:
        target = self.pending_compaction
        if target is None:
            return
        self.pending_compaction = None
        # Never past what the core may still read below its unstable tail.
        target = min(target, self.core.log.snapshot_index + 1, self.store.last_index + 1)
        if target > self.store.first_index:
            self.store.truncate_prefix(target)

    # --- reads and roles ----------------------------------------------------------------

    def request_reads(self) -> None:
        if not self.read_requests:
            return
        futures, self.read_requests = self.read_requests, []
        if not self.core.is_leader:
            error = NotLeaderError(self.node_id, self.core.leader_id)
            for future in futures:
                if not future.done():
                    future.set_exception(error)
            return
        self.read_request_id += 1
        self.reads_in_flight[self.read_request_id] = futures
        self.core.read_index(self.read_request_id)  # one ReadIndex round serves them all

    def note_reads(self, ready: Ready) -> None:
        for state in ready.read_states:
            futures = self.reads_in_flight.pop(state.request_id, [])
            self.reads_waiting_apply.append((state.index, futures))
        for request_id in ready.failed_reads:
            error = NotLeaderError(self.node_id, self.core.leader_id)
            for future in self.reads_in_flight.pop(request_id, []):
                if not future.done():
                    future.set_exception(error)
        applied = self.core.applied_index
        still_waiting = []
        for index, futures in self.reads_waiting_apply:
            if index <= applied:
                for future in futures:
                    if not future.done():
                        future.set_result(index)
            else:
                still_waiting.append((index, futures))
        self.reads_waiting_apply = still_waiting

    def note_role_and_configuration(self) -> None:
        is_leader = self.core.role is Role.LEADER
        if self.was_leader and not is_leader:
            # Outcomes are unknown now; clients retry with the same sequence (deduplicated).
            self.fail_waiters(
                LeadershipLostError(f"{self.node_id} lost leadership; the outcome is unknown")
            )
        self.was_leader = is_leader
        configuration = self.core.configuration
        if configuration is not self.last_configuration:
            self.last_configuration = configuration
            if self.on_configuration is not None:
                self.on_configuration(configuration)

    def fail_waiters(self, error: BaseException) -> None:
        waiters, self.waiters = self.waiters, {}
        for _, future in waiters.values():
            if not future.done():
                future.set_exception(error)
        for futures in [*self.reads_in_flight.values(), *(f for _, f in self.reads_waiting_apply)]:
            for future in futures:
                if not future.done():
                    future.set_exception(error)
        self.reads_in_flight = {}
        self.reads_waiting_apply = []

    def fail_waiters_up_to(self, index: int) -> None:
        for waiter_index in [i for i in self.waiters if i <= index]:
            _, future = self.waiters.pop(waiter_index)
            if not future.done():
                future.set_exception(ProposalDroppedError("replaced by an installed snapshot"))
