"""The one Ready loop: drives a RaftCore through its Readies, in production and in the simulator.

`RaftHost` owns a core, its log store, hard state and snapshots, and a state machine, and
does what every Ready asks in the order raft/ready.py states. It does no I/O of its own
kind: time, threads and sockets come in through `runtime/resources.py` (a scheduler, a
background worker, a send function), so `GroupRunner` (asyncio) and the simulator run this
same object, and what the simulator tests is what ships.

Group commit: Readies keep being taken while a sync is in flight and their messages go out
at once (the leader replicates while it writes); their durable parts queue, and when the
sync lands one write and one sync cover them all. The store is mutated only on the host's
thread and never while a sync is in flight.

Order per Ready: send `messages`; install a snapshot (machine restored, snapshot saved,
then the log reset); truncate; append; sync the log, then save the hard state; then send
`messages_after_persist`, report `persisted`, apply the committed entries, answer reads.

Heartbeats outside the Ready loop: a tick's heartbeats (`tick`) and a follower's answer to
a heartbeat that changes nothing but timers (`step`) are sent at once, and a leader takes
such an answer without a pass. They need nothing persisted first: a leader's term was
durable before it could win, and the core answers at once only in a durable term, claiming
a match only through what is durable (raft/core.py `step_heartbeat`). Anything else a
heartbeat or its answer brings goes through the core's `step` and a Ready as before.

Fail-stop: anything unexpected out of the core, the stores or the state machine (an
`InvariantViolation`, an I/O error, a corrupt file) stops the group at once: nothing more
is persisted, sent or applied, every waiter fails, and `on_failed` tells the owner (the
node stops the process for an invariant violation). A full disk is not a failure: the
write that met it is rolled back by the store and retried.

Ticks come from a `GroupTicker` (runtime/ticker.py): the node's, shared by all its groups,
or one of the host's own. A quiet core (raft/core.py) wants no ticks: the host leaves the
ticker's awake set when its core goes quiet and rejoins it in the first pass after the
core wakes. `peer_unreachable` passes the node's liveness verdicts to the core.

Opening (`open_host`) reconciles the log with the newest snapshot: a crash between saving
an installed snapshot and resetting the log leaves a log that may not follow the snapshot.
The log is kept only if it holds the snapshot's last entry with the snapshot's term, or
starts right after it; otherwise it is reset to start after the snapshot.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec

from quorumlog.errors import (
    DiskFullError,
    GroupFailedError,
    LeadershipLostError,
    NotLeaderError,
    ProposalDroppedError,
    RaftError,
)
from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import Configuration, MembershipChange
from quorumlog.raft.core import RaftCore, Role
from quorumlog.raft.messages import PUSH_COMMIT, Message, Push, PushResponse, SnapshotMeta
from quorumlog.raft.ready import HardState, Ready
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.resources import (
    Background,
    HardStateStore,
    Scheduler,
    SnapshotStore,
    StateMachine,
)
from quorumlog.runtime.ticker import GroupTicker
from quorumlog.storage.base import LogStore
from quorumlog.storage.entry import EntryType, LogEntry

log = logging.getLogger("quorumlog.group")

# Enum members read once: on Python 3.11 `Role.LEADER` through its class costs several times
# a global's lookup, and these are read after every sync and for every applied entry.
LEADER = Role.LEADER
DATA = EntryType.DATA

SendFunction = Callable[[Message], None]


class HostSettings(msgspec.Struct, frozen=True):
    tick_seconds: float = 0.05
    snapshot_entries: int = 20_000
    """Snapshot the state machine every this many applied entries (bounds the log)."""
    snapshot_trailing_entries: int = 5_000
    """Entries kept behind a snapshot, so a follower a little behind needs no snapshot."""
    readies_queued_max: int = 256
    """Readies taken while a sync is in flight; past this the core holds the rest."""
    disk_full_retry_seconds: float = 0.5
    apply_entries_per_step_max: int = 0
    """0: apply a Ready's committed entries as soon as its sync lands (production). Else at
    most this many per step, the steps spaced by `HostHooks.apply_delay_seconds`: the
    simulator widens the window in which a leader serves behind its commit index."""


class HostHooks:
    """Observation points. Production leaves them empty; the simulator's invariant checker
    and tracer fill them in. Each is called before the change it names is made."""

    def on_ready(self, ready: Ready) -> None:
        pass

    def on_truncate(self, after: int) -> None:
        pass

    def on_append(self, entries: list[LogEntry]) -> None:
        pass

    def on_snapshot_install(self, meta: SnapshotMeta, data: bytes) -> None:
        pass

    def on_snapshot_taken(self, meta: SnapshotMeta, data: bytes) -> None:
        pass

    def on_apply(self, entry: LogEntry) -> None:
        pass

    def on_acknowledged(self, entry: LogEntry) -> None:
        """A proposal's waiter is told it succeeded (the entry is committed and applied)."""

    def on_synced(self, log_sync_seconds: float | None, hard_state_seconds: float | None) -> None:
        """A sync job landed (on the host's thread): how long the log's sync and the hard
        state's save took, by the scheduler's clock (None: not done in this job). Called
        once per group commit, never per entry (metrics, slow-sync warnings)."""

    def apply_delay_seconds(self) -> float:
        return 0.0

    def on_sent_at_once(self, message: Message) -> None:
        """A heartbeat or a heartbeat's answer went out without a Ready (see `step`)."""


class Waiter:
    __slots__ = ("completion", "term")

    def __init__(self, term: int, completion: Completion[Any]) -> None:
        self.term = term
        self.completion = completion


def reconcile_log_with_snapshot(store: LogStore, snapshot: SnapshotMeta) -> bool:
    """Make the log follow `snapshot`; True if it had to be reset (see the module docstring)."""
    index = snapshot.index
    if store.first_index == index + 1:
        return False
    if store.first_index <= index <= store.last_index and store.term(index) == snapshot.term:
        return False
    store.reset(index + 1)
    return True


class RaftHost:
    def __init__(
        self,
        group_id: str,
        raft_config: RaftConfig,
        *,
        store: LogStore,
        hard_state: HardStateStore,
        snapshots: SnapshotStore,
        machine: StateMachine,
        send: SendFunction,
        bootstrap: Configuration,
        scheduler: Scheduler,
        background: Background,
        random_source: random.Random,
        settings: HostSettings | None = None,
        hooks: HostHooks | None = None,
        ticker: GroupTicker | None = None,
    ) -> None:
        """`ticker`: the node's shared one (its owner starts and stops it); None: the host
        makes one of its own and starts it in `start`."""
        self.group_id = group_id
        self.node_id = raft_config.node_id
        self.store = store
        self.hard_state_store = hard_state
        self.snapshots = snapshots
        self.machine = machine
        self.send_message = send
        self.scheduler = scheduler
        self.background = background
        self.settings = settings or HostSettings()
        self.hooks = hooks or HostHooks()
        snapshot = snapshots.latest()
        if snapshot is not None:
            machine.restore(snapshot.data)
            if reconcile_log_with_snapshot(store, snapshot.meta):
                log.warning(
                    "group %s: log did not follow snapshot %d@%d; reset it",
                    group_id,
                    snapshot.meta.index,
                    snapshot.meta.term,
                )
        self.last_snapshot_index = snapshot.meta.index if snapshot else 0
        self.core = RaftCore(
            raft_config,
            store,
            hard_state=hard_state.saved,
            configuration=bootstrap,
            snapshot=snapshot.meta if snapshot else None,
            snapshot_data=snapshot.data if snapshot else None,
            random=random_source,
        )
        self.core.send_heartbeats_at_once = True  # drained by `tick`
        self.unwritten: deque[Ready] = deque()
        """Readies taken from the core whose durable part is not written yet, in order."""
        self.unapplied: deque[LogEntry] = deque()
        """Committed entries whose Ready is durable, not yet applied (apply steps only)."""
        self.apply_scheduled = False
        self.disk_full_logged = False
        self.syncing = False
        self.idle_callbacks: list[Callable[[], None]] = []
        self.scheduled = False
        self.started = False
        self.stopped = False
        self.failure: str | None = None
        self.waiters: dict[int, Waiter] = {}
        self.read_requests: list[Completion[int]] = []
        self.reads_in_flight: dict[int, list[Completion[int]]] = {}
        self.reads_waiting_apply: list[tuple[int, list[Completion[int]]]] = []
        self.read_request_id = 0
        self.was_leader = False
        self.pending_compaction: int | None = None
        self.snapshot_in_flight = False
        self.owns_ticker = ticker is None
        self.ticker = ticker or GroupTicker(scheduler, self.settings.tick_seconds)
        self.ticking = False
        """In the ticker's awake set (False while the core is quiet)."""
        self.on_configuration: Callable[[Configuration], None] | None = None
        self.on_snapshot_saved: Callable[[SnapshotMeta], None] | None = None
        self.on_failed: Callable[[str, BaseException], None] | None = None
        self.last_configuration: Configuration | None = None
        self.proposals_failed = 0
        """Proposals whose waiter was told they failed or that their outcome is unknown
        (leadership lost, replaced, stopped): etcd's proposals_failed_total."""
        self.sync_seconds: tuple[float | None, float | None] = (None, None)
        """The last sync job's durations (written by the job, read once it landed)."""
        self.sent_at_once = 0
        """Heartbeats and heartbeat answers sent without a Ready (`step`, `tick`)."""
        self.answers_taken_at_once = 0
        """Heartbeat answers a leader took without a Ready."""

    # --- views --------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.failure is None and not self.stopped and self.core.role is LEADER

    @property
    def leader_id(self) -> str | None:
        return self.core.leader_id

    @property
    def applied_index(self) -> int:
        return self.core.applied_index

    @property
    def configuration(self) -> Configuration:
        return self.core.configuration

    # --- life cycle ---------------------------------------------------------------------

    def start(self, first_tick_delay_seconds: float | None = None) -> None:
        """Begin ticking (the first tick after `first_tick_delay_seconds`, default one tick;
        with a shared ticker, at its next tick)."""
        if self.started:
            return
        self.started = True
        self.ticking = True
        self.ticker.wake(self)
        if self.owns_ticker:
            self.ticker.start(first_tick_delay_seconds)
        self.schedule()

    def tick(self) -> bool:
        """One tick of the core (called by the ticker); False: tick no more for now."""
        core = self.core
        if self.stopped or self.failure is not None or core.quiet:
            self.ticking = False
            return False
        if core.tick_counting_only():
            # A follower's tick that only counted (most ticks of a node with many groups):
            # no guard (it cannot raise), nothing sent at once, the core still awake. The
            # pass check stays, as after every tick, so a tick schedules what it did before.
            self.schedule_if_due()
            return True
        # A tick refuses nothing: a RaftError here means the group failed (`fail` said so),
        # and the other groups on the ticker go on.
        with contextlib.suppress(RaftError):
            self.guarded(self.core.tick)
        if self.core.outbox_at_once and self.failure is None:
            self.send_at_once(self.core.take_messages_at_once())
        self.schedule_if_due()
        if self.core.quiet:
            self.ticking = False
            return False
        return True

    def note_awake(self) -> None:
        """Back in the ticker's awake set once the core woke from quiet."""
        if not self.ticking and self.started and not self.core.quiet:
            self.ticking = True
            self.ticker.wake(self)

    def peer_unreachable(self, peer: str) -> None:
        """The node's liveness lost `peer` (or `peer` says this group stopped there): a
        quiet group with that member wakes; an awake follower stops holding its election
        for that leader (`RaftCore.holds_election`)."""
        if self.failure is not None or self.stopped:
            return
        if self.core.quiet:
            self.guarded(lambda: self.core.peer_unreachable(peer))
            self.schedule()
        elif self.core.leader_node_live is not None:
            self.core.peer_unreachable(peer)  # only marks the hold void: nothing to send

    def use_node_liveness(self, leader_node_live: Callable[[str], bool]) -> None:
        """Hold elections while the leader's node is live (`RaftConfig.leader_node_hold_ticks`),
        asking `leader_node_live(peer)`: the node's `PeerLiveness.is_reachable`."""
        self.core.leader_node_live = leader_node_live

    def peer_reachable(self, peer: str) -> None:
        """The node's liveness hears `peer` again (see `RaftCore.peer_reachable`)."""
        if self.failure is None and not self.stopped:
            self.guarded(lambda: self.core.peer_reachable(peer))

    def stop(self) -> None:
        """Stop ticking and processing; every waiter fails (its outcome is unknown). The
        owner closes the store once `when_sync_idle` fires."""
        if self.stopped:
            return
        self.stopped = True
        self.stop_ticking()
        self.fail_waiters(LeadershipLostError(f"{self.node_id} is stopping; outcome unknown"))

    def stop_ticking(self) -> None:
        self.ticking = False
        self.ticker.remove(self)
        if self.owns_ticker:
            self.ticker.stop()

    def when_sync_idle(self, callback: Callable[[], None]) -> None:
        """Call `callback` once no sync is in flight (at once if none is)."""
        if self.syncing:
            self.idle_callbacks.append(callback)
        else:
            callback()

    # --- events in ----------------------------------------------------------------------

    def step(self, message: Message) -> None:
        """Step one message. A heartbeat, or a heartbeat's answer, that changes nothing but
        timers and read acknowledgements is taken by the core's fast path: answered at once
        and no Ready pass (with many awake groups, those passes were most of a node's
        work). Anything else, or whatever the fast path declines, is stepped as usual."""
        if self.failure is not None or self.stopped:
            return
        core = self.core
        try:
            if isinstance(message, Push):
                if message.kind is PUSH_COMMIT and core.step_heartbeat(message):
                    if core.outbox_at_once:
                        self.send_at_once(core.take_messages_at_once())
                    return
            elif (
                isinstance(message, PushResponse)
                and message.kind is PUSH_COMMIT
                and core.step_heartbeat_answer(message)
            ):
                self.answers_taken_at_once += 1
                self.schedule_if_due()  # only if it confirmed reads
                return
            core.step(message)
        except Exception as error:
            # A message is never refused, so anything raised here is a failure (a violated
            # invariant, a corrupt read): the group stops, `on_failed` tells the owner, and
            # the caller (a transport serving every group) is left alone.
            self.fail(error)
            return
        if not self.scheduled:
            self.schedule()

    def send_at_once(self, messages: list[Message]) -> None:
        """Send messages that need nothing persisted first, outside any Ready."""
        self.sent_at_once += len(messages)
        on_sent = self.hooks.on_sent_at_once
        send = self.send_message
        for message in messages:
            on_sent(message)
            send(message)

    def propose(self, data: bytes) -> Completion[Any]:
        """Propose one entry; the completion gets the state machine's result once applied.

        Raises at once (NotLeaderError, PendingFullError, ...) if the core refuses it."""
        return self.propose_with(lambda: self.core.propose(data))

    def change_membership(self, change: MembershipChange) -> Completion[Any]:
        return self.propose_with(lambda: self.core.change_membership(change))

    def propose_with(self, append: Callable[[], int]) -> Completion[Any]:
        self.require_healthy()
        index = self.guarded(append)
        completion: Completion[Any] = Completion(self.scheduler)
        self.waiters[index] = Waiter(self.core.term, completion)
        self.schedule()
        return completion

    def linearizable_read(self) -> Completion[int]:
        """Resolves, with the read index, once linearizable reads may be served here."""
        self.require_healthy()
        if not self.core.is_leader:
            raise NotLeaderError(self.node_id, self.core.leader_id)
        completion: Completion[int] = Completion(self.scheduler)
        self.read_requests.append(completion)
        self.schedule()
        return completion

    def transfer_leadership(self, target: str) -> None:
        self.require_healthy()
        self.guarded(lambda: self.core.transfer_leadership(target))
        self.schedule()

    def campaign(self) -> None:
        self.require_healthy()
        self.guarded(self.core.campaign)
        self.schedule()

    def require_healthy(self) -> None:
        if self.failure is not None:
            raise GroupFailedError(self.group_id, self.failure)
        if self.stopped:
            raise LeadershipLostError(f"group {self.group_id} on {self.node_id} is stopping")

    def guarded(self, call: Callable[[], Any]) -> Any:
        """Run a core call: its refusals (`RaftError`: not the leader, pending full, ...) go
        back to the caller; anything else, a storage error included, fails the group before
        the core's state can be persisted or sent."""
        try:
            return call()
        except RaftError:
            raise
        except Exception as error:
            self.fail(error)
            raise GroupFailedError(self.group_id, self.failure or str(error)) from error

    # --- the Ready loop -----------------------------------------------------------------

    def schedule(self) -> None:
        if not self.scheduled and not self.stopped and self.failure is None:
            self.scheduled = True
            self.scheduler.call_soon(self.process)

    def schedule_if_due(self) -> None:
        """Schedule a pass only if it has something to do (most follower ticks and many
        sync completions leave nothing): the same as `schedule`, minus an idle pass."""
        if self.scheduled:
            return
        if (
            self.core.has_ready()
            or self.read_requests
            or (self.unwritten and not self.syncing)
            or (self.pending_compaction is not None and not self.syncing)
        ):
            self.schedule()

    def process(self) -> None:
        self.scheduled = False
        if self.failure is not None or self.stopped:
            return
        core = self.core
        unwritten = self.unwritten
        try:
            if self.pending_compaction is not None and not self.syncing:
                self.compact_if_due()  # the store changes only while no sync is in flight
            if self.read_requests:
                self.request_reads()
            # Take Readies even while a sync is in flight: their messages go out at once
            # (the leader replicates while it writes); their durable part waits below.
            queued_max = self.settings.readies_queued_max
            send = self.send_message
            on_ready = self.hooks.on_ready
            while len(unwritten) < queued_max and core.has_ready():
                ready = core.ready()
                on_ready(ready)
                for message in ready.messages:
                    send(message)
                unwritten.append(ready)
        except Exception as error:
            self.fail(error)
            return
        if not self.ticking:
            self.note_awake()  # whatever woke the core (a message, a read) came through here
        if unwritten and not self.syncing:
            self.write_and_sync()

    def write_and_sync(self) -> None:
        """Write every queued Ready and cover them all with one sync (group commit)."""
        unwritten = self.unwritten
        if len(unwritten) == 1 and not self.disk_full_logged:
            ready = unwritten[0]
            if (
                ready.snapshot is None
                and ready.truncate_after is None
                and not ready.entries
                and (
                    ready.hard_state is None
                    or not self.hard_state_store.needs_save(ready.hard_state)
                )
            ):
                # The common Ready, with nothing to write or sync (messages, a new commit
                # index): what the loop below would do for it, without the loop.
                unwritten.popleft()
                self.after_sync([ready], None)
                return
        batch: list[Ready] = []
        needs_sync = False
        hard_state: HardState | None = None
        try:
            while self.unwritten:
                ready = self.unwritten[0]
                if ready.snapshot is not None and (batch or self.unapplied):
                    break  # restore only after the entries before it are applied
                needs_sync |= self.write(ready)
                self.unwritten.popleft()
                batch.append(ready)
                hard_state = ready.hard_state or hard_state
        except DiskFullError as error:
            # The store rolled the failed write back; that Ready stays first in the queue
            # and is tried again (nothing after it may be written first).
            if not self.disk_full_logged:
                log.error("group %s: disk full, retrying writes: %s", self.group_id, error)
                self.disk_full_logged = True
            self.scheduler.call_later(self.settings.disk_full_retry_seconds, self.schedule)
        except Exception as error:
            self.fail(error)
            return
        if not batch:
            return
        if self.disk_full_logged and not self.unwritten:
            log.warning("group %s: writes go through again", self.group_id)
            self.disk_full_logged = False
        save_hard_state = hard_state is not None and self.hard_state_store.needs_save(hard_state)
        if needs_sync or save_hard_state:
            self.syncing = True
            self.submit_sync(batch, hard_state if save_hard_state else None, needs_sync)
        else:
            self.after_sync(batch, None)

    def submit_sync(self, batch: list[Ready], hard_state: HardState | None, sync_log: bool) -> None:
        def done(error: BaseException | None) -> None:
            if isinstance(error, DiskFullError) and self.failure is None and not self.stopped:
                # Saving the hard state needs a little room (a new file renamed into place):
                # a full disk holds the batch back, it does not fail the group. The store is
                # still not touched meanwhile (`syncing` stays set).
                if not self.disk_full_logged:
                    log.error("group %s: disk full, retrying a sync: %s", self.group_id, error)
                    self.disk_full_logged = True
                self.scheduler.call_later(
                    self.settings.disk_full_retry_seconds,
                    lambda: self.submit_sync(batch, hard_state, sync_log),
                )
                return
            if error is None:
                self.hooks.on_synced(*self.sync_seconds)
            self.after_sync(batch, error)

        self.background.submit(lambda: self.sync_job(hard_state, sync_log), done)

    def write(self, ready: Ready) -> bool:
        """Make the Ready's durable changes in the stores (appends not yet synced)."""
        if ready.snapshot is not None:
            meta = ready.snapshot.meta
            self.hooks.on_snapshot_install(meta, ready.snapshot.data)
            self.machine.restore(ready.snapshot.data)
            # The snapshot must be durable before the log it replaces is dropped; a crash
            # between the two is repaired at open (reconcile_log_with_snapshot).
            self.snapshots.save(meta, ready.snapshot.data)
            self.store.reset(meta.index + 1)
            self.last_snapshot_index = meta.index
            self.drop_waiters_up_to(meta.index)
        if ready.truncate_after is not None:
            self.hooks.on_truncate(ready.truncate_after)
            self.store.truncate_suffix(ready.truncate_after)
        if ready.entries:
            self.hooks.on_append(ready.entries)
            self.store.append(ready.entries)
            return True
        return False

    def sync_job(self, hard_state: HardState | None, sync_log: bool) -> None:
        # Timed by the scheduler's clock: real time in a node, virtual in the simulator.
        clock = self.scheduler.monotonic_seconds
        log_seconds = hard_state_seconds = None
        if sync_log:
            started = clock()
            self.store.sync()
            log_seconds = clock() - started
        if hard_state is not None:
            started = clock()
            self.hard_state_store.save(hard_state)  # after the log it refers to
            hard_state_seconds = clock() - started
        self.sync_seconds = (log_seconds, hard_state_seconds)

    def after_sync(self, batch: list[Ready], error: BaseException | None) -> None:
        self.syncing = False
        if self.idle_callbacks:
            idle, self.idle_callbacks = self.idle_callbacks, []
            for callback in idle:
                callback()
        if self.failure is not None or self.stopped:
            return  # a sync that ends after a stop or a failure changes nothing more
        if error is not None:
            self.fail(error)
            return
        try:
            core = self.core
            unapplied = self.unapplied
            apply_at_once = self.settings.apply_entries_per_step_max == 0
            for ready in batch:
                # Most Readies carry only messages: each step below is skipped unless its
                # part of the Ready (or a read waiting for an apply) is there.
                for message in ready.messages_after_persist:
                    self.send_message(message)
                if ready.entries:
                    last = ready.entries[-1]
                    core.persisted(last.index, last.term)
                if ready.committed_entries:
                    unapplied.extend(ready.committed_entries)
                if apply_at_once and unapplied:
                    self.apply_available()
                if ready.read_states or ready.failed_reads or self.reads_waiting_apply:
                    self.note_reads(ready)
            if self.unapplied and not self.apply_scheduled:
                self.schedule_apply_step()
            self.note_role_and_configuration()
        except Exception as apply_error:
            self.fail(apply_error)
            return
        self.schedule_if_due()

    def fail(self, error: BaseException) -> None:
        """Stop this group: nothing more is persisted, sent or applied."""
        if self.failure is not None:
            return
        self.failure = f"{type(error).__name__}: {error}"
        log.error("group %s on %s stopped: %s", self.group_id, self.node_id, self.failure)
        self.stop_ticking()
        self.fail_waiters(GroupFailedError(self.group_id, self.failure))
        if self.on_failed is not None:
            self.on_failed(self.group_id, error)

    # --- apply --------------------------------------------------------------------------

    def schedule_apply_step(self) -> None:
        self.apply_scheduled = True
        delay = self.hooks.apply_delay_seconds()
        if delay > 0:
            self.scheduler.call_later(delay, self.apply_step)
        else:
            self.scheduler.call_soon(self.apply_step)

    def apply_step(self) -> None:
        self.apply_scheduled = False
        if self.failure is not None or self.stopped:
            return
        try:
            self.apply_available(self.settings.apply_entries_per_step_max)
            self.serve_reads_applied()
        except Exception as error:
            self.fail(error)
            return
        if self.unapplied:
            self.schedule_apply_step()
        self.schedule()  # a snapshot install may have waited for these entries

    def apply_available(self, count_max: int = 0) -> None:
        """Apply queued committed entries (all, or at most `count_max`)."""
        if not self.unapplied:
            return
        count = len(self.unapplied) if count_max <= 0 else min(count_max, len(self.unapplied))
        entries = [self.unapplied.popleft() for _ in range(count)]
        self.apply(entries)

    def apply(self, entries: list[LogEntry]) -> None:
        hooks = self.hooks
        waiters = self.waiters
        for entry in entries:
            hooks.on_apply(entry)
            result: Any = None
            if entry.type is DATA:
                result = self.machine.apply(entry.index, entry.data)
            else:
                self.machine.mark_applied(entry.index)
            waiter = waiters.pop(entry.index, None) if waiters else None
            if waiter is not None and not waiter.completion.done():
                if waiter.term == entry.term:
                    hooks.on_acknowledged(entry)
                    waiter.completion.set_result(result)
                else:
                    self.proposals_failed += 1
                    waiter.completion.set_exception(
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
        self.hooks.on_snapshot_taken(meta, payload)
        self.snapshot_in_flight = True
        self.background.submit(
            lambda: self.snapshots.save(meta, payload),
            lambda error: self.snapshot_saved(meta, payload, error),
        )

    def snapshot_saved(self, meta: SnapshotMeta, data: bytes, error: BaseException | None) -> None:
        self.snapshot_in_flight = False
        if self.failure is not None or self.stopped:
            return
        if error is not None:
            # The log still holds everything; the next snapshot tries again.
            log.error("group %s: saving snapshot %d failed: %s", self.group_id, meta.index, error)
            return
        self.last_snapshot_index = meta.index
        self.guarded(lambda: self.core.snapshot_taken(meta, data))
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
        completions, self.read_requests = self.read_requests, []
        if not self.core.is_leader:
            error = NotLeaderError(self.node_id, self.core.leader_id)
            for completion in completions:
                completion.set_exception(error)
            return
        self.read_request_id += 1
        self.reads_in_flight[self.read_request_id] = completions
        self.core.read_index(self.read_request_id)  # one ReadIndex round serves them all

    def note_reads(self, ready: Ready) -> None:
        for state in ready.read_states:
            completions = self.reads_in_flight.pop(state.request_id, [])
            self.reads_waiting_apply.append((state.index, completions))
        for request_id in ready.failed_reads:
            error = NotLeaderError(self.node_id, self.core.leader_id)
            for completion in self.reads_in_flight.pop(request_id, []):
                completion.set_exception(error)
        self.serve_reads_applied()

    def serve_reads_applied(self) -> None:
        if not self.reads_waiting_apply:
            return
        applied = self.core.applied_index
        still_waiting = []
        for index, completions in self.reads_waiting_apply:
            if index <= applied:
                for completion in completions:
                    completion.set_result(index)
            else:
                still_waiting.append((index, completions))
        self.reads_waiting_apply = still_waiting

    def note_role_and_configuration(self) -> None:
        is_leader = self.core.role is LEADER
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
        self.proposals_failed += len(waiters)
        for waiter in waiters.values():
            waiter.completion.set_exception(error)
        for completions in [
            *self.reads_in_flight.values(),
            *(waiting for _, waiting in self.reads_waiting_apply),
            self.read_requests,
        ]:
            for completion in completions:
                completion.set_exception(error)
        self.reads_in_flight = {}
        self.reads_waiting_apply = []
        self.read_requests = []

    def drop_waiters_up_to(self, index: int) -> None:
        """Proposals an installed snapshot covers: their fate is not visible here; the
        client retries with the same sequence and the session table answers it."""
        for waiter_index in [i for i in self.waiters if i <= index]:
            waiter = self.waiters.pop(waiter_index)
            self.proposals_failed += 1
            waiter.completion.set_exception(
                ProposalDroppedError("replaced by an installed snapshot")
            )
