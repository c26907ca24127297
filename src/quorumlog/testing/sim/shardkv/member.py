"""One simulated Raft member of any group (controller or shard group), generic in its machine.

`SimNode` is wired to the simulator's own KV machine; the shard deployment needs the same
runtime around a `ControllerMachine` or a `ShardGroupMachine`. Rather than generalise
`SimNode` (whose traces the byte-for-byte determinism test pins), this class repeats its
Ready loop for a machine given by a factory, in the same order (raft/ready.py): send
messages, install snapshot, truncate, append, sync (virtual fsync time), messages after
persist, persisted, apply, reads. A crash loses unsynced writes through `SimDisk`.

Apply may lag the commit index (`MemberOptions.apply_batch_entries_max`): committed entries
then queue and are applied a bounded batch at a time, each batch after a seeded virtual
delay. A real node is like that: it applies at most `COMMITTED_ENTRIES_PER_READY_MAX`
entries per Ready, after that Ready's fsync, and answers requests between Readies, so a
leader fresh from an election or a restart serves (`is_leader`) while its applied state is
behind its log. Code that reads the applied state on a leader must cope with that; without
the lag every member applies the moment it learns of a commit and such bugs never show.

A member can be paused (`pause`/`resume`), as SIGSTOP/SIGCONT would: it neither ticks nor
handles anything meanwhile. Whatever reaches the process while it is stopped (Raft
messages, fsync and apply completions, and through `hold` its server's RPCs and timers)
queues and is handled on resume, against the state it had when it stopped: a leader
resumes still believing it leads, with requests from before the pause. As a process after
SIGCONT reads its sockets in whatever order, the resume interleaves the queued inputs of
different links (Raft messages per sender, RPC traffic per peer or client) in a seeded
order, keeping each link's own order (one TCP connection is FIFO); the process's local
events (timers, fsync and apply completions) form one more link, also kept in order. So a
client read queued during the pause may be handled before the new leader's messages.

The Raft safety checks of `sim.invariants.InvariantChecker` run on it too: the checker reads
only `node_id`, `core`, `disk` and `applied_index`, which this class has with the same
meaning.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast

import msgspec

from quorumlog.errors import LeaderTransferringError, NotLeaderError, PendingFullError
from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import Configuration, decode_configuration
from quorumlog.raft.core import RaftCore, Role
from quorumlog.raft.messages import Message, SnapshotMeta
from quorumlog.raft.ready import Ready
from quorumlog.storage.entry import EntryType, LogEntry
from quorumlog.testing.sim.checks import InvariantViolation, SimulationError
from quorumlog.testing.sim.events import EventQueue, derive_random, draw_int
from quorumlog.testing.sim.invariants import InvariantChecker
from quorumlog.testing.sim.network import SimNetwork
from quorumlog.testing.sim.shardkv.legacy_disk import SimDisk
from quorumlog.testing.sim.trace import TraceRecorder

if TYPE_CHECKING:
    from quorumlog.testing.sim.node import SimNode


class ReplicatedMachine(Protocol):
    """What the member needs of a state machine (both shard machines have it)."""

    def apply(self, index: int, data: bytes) -> object: ...

    def mark_applied(self, index: int) -> None: ...

    def snapshot(self) -> bytes: ...

    def restore(self, data: bytes) -> None: ...


MachineT = TypeVar("MachineT", bound=ReplicatedMachine)


class MemberOptions(msgspec.Struct, frozen=True):
    tick_ms: int = 50
    fsync_ms_min: int = 0
    fsync_ms_max: int = 3
    snapshot_interval_entries: int = 32
    """Small on purpose: snapshots and their restore must happen in every scenario."""
    snapshot_trailing_entries: int = 2
    torn_tail_probability: float = 0.5
    apply_batch_entries_max: int = 0
    """0: a Ready's committed entries are applied as it is handled (applied == commit
    whenever the member is idle). Otherwise committed entries queue and at most this many
    are applied per step, each step `apply_delay_ms_min..max` after the last (see the module
    docstring)."""
    apply_delay_ms_min: int = 0
    apply_delay_ms_max: int = 0
    apply_stall_probability: float = 0.0
    """The chance that an apply step waits `apply_stall_ms_max` at most instead: a slow
    fsync, a large entry, a pause. It opens the long windows in which a leader serves on an
    old applied state (one elected during the stall, a restart replaying its log)."""
    apply_stall_ms_max: int = 0

    @property
    def apply_lags(self) -> bool:
        return self.apply_batch_entries_max > 0


class ProposalOutcome(msgspec.Struct, frozen=True):
    """How a proposal ended here: applied in the term it was proposed in (with the
    machine's result), or lost (another leader's entry took its index, or a snapshot
    covered it): the proposer may try again."""

    applied: bool
    result: object = None


ProposalCallback = Callable[[ProposalOutcome], None]
ReadCallback = Callable[[bool], None]
LOCAL_LINK = "local"
"""The link of the process's own events (timers, fsync and apply completions)."""


class _Pending:
    __slots__ = ("callback", "term")

    def __init__(self, term: int, callback: ProposalCallback | None) -> None:
        self.term = term
        self.callback = callback


class RaftMember(Generic[MachineT]):
    def __init__(
        self,
        node_id: str,
        *,
        seed: int,
        raft_config: RaftConfig,
        bootstrap: Configuration,
        options: MemberOptions,
        machine_factory: Callable[[], MachineT],
        events: EventQueue,
        network: SimNetwork,
        checker: InvariantChecker,
        trace: TraceRecorder | None,
    ) -> None:
        self.node_id = node_id
        self.seed = seed
        self.raft_config = msgspec.structs.replace(raft_config, node_id=node_id)
        self.bootstrap = bootstrap
        self.options = options
        self.machine_factory = machine_factory
        self.events = events
        self.network = network
        self.checker = checker
        self.trace = trace
        self.rng = derive_random(seed, f"member:{node_id}")
        self.apply_rng = derive_random(seed, f"apply:{node_id}")
        self.disk = SimDisk()
        self.incarnation = 0
        self.up = False
        self.paused = False
        self.paused_inbox: list[tuple[str, Callable[[Any], None], Any]] = []
        """What reached the process while paused: (link, handler, argument), in arrival
        order; `resume` interleaves the links (see the module docstring)."""
        self.resume_rng = derive_random(seed, f"resume:{node_id}")
        self.pause_count = 0
        self.persisting: Ready | None = None
        self.core: RaftCore
        self.machine: MachineT = machine_factory()
        self.applied_index = 0
        self.applied_term = 0
        self.applied_configuration = bootstrap
        self.last_snapshot_index = 0
        self.snapshots_taken = 0
        self.snapshots_restored = 0
        self.crash_count = 0
        self.proposals: dict[int, _Pending] = {}
        self.next_read_id = 0
        self.reads: dict[int, ReadCallback] = {}
        self.reads_waiting: list[tuple[int, int]] = []
        self.unapplied: deque[LogEntry] = deque()
        """Committed entries handed out by the core, not yet applied (apply lag only)."""
        self.apply_scheduled = False
        checker.register(self.as_checked_node())
        self.start()

    def as_checked_node(self) -> SimNode:
        """This member seen as the node type the Raft checker is annotated with: it reads
        only node_id, core, disk and applied_index (see the module docstring)."""
        return cast("SimNode", self)

    # --- life cycle ---------------------------------------------------------------------

    def start(self) -> None:
        self.incarnation += 1
        saved = self.disk.snapshot
        self.machine = self.machine_factory()
        meta: SnapshotMeta | None = None
        if saved is not None:
            meta = saved.meta
            self.machine.restore(saved.data)
            self.snapshots_restored += 1
            self.applied_index = meta.index
            self.applied_term = meta.term
            self.applied_configuration = meta.configuration
        else:
            self.applied_index = 0
            self.applied_term = 0
            self.applied_configuration = self.bootstrap
        self.last_snapshot_index = self.applied_index
        self.core = RaftCore(
            self.raft_config,
            self.disk.store,
            hard_state=self.disk.durable_hard_state,
            configuration=self.bootstrap,
            snapshot=meta,
            snapshot_data=saved.data if saved is not None else None,
            random=derive_random(self.seed, f"core:{self.node_id}:{self.incarnation}"),
        )
        self.up = True
        self.paused = False
        self.paused_inbox = []
        self.persisting = None
        self.unapplied = deque()
        self.apply_scheduled = False
        self.checker.on_start(self.as_checked_node())
        self.events.schedule(self.rng.randrange(self.options.tick_ms), self._tick, self.incarnation)
        self._after_event()

    def crash(self) -> None:
        """Stop at once: unsynced writes are lost; pending callbacks are never called."""
        if not self.up:
            return
        self.up = False
        self.paused = False
        self.paused_inbox = []  # queued socket data and timers die with the process
        self.incarnation += 1
        self.crash_count += 1
        report = self.disk.crash(self.rng, self.options.torn_tail_probability)
        self.persisting = None
        self.unapplied = deque()
        self.apply_scheduled = False
        self.proposals = {}
        self.reads = {}
        self.reads_waiting = []
        self.checker.on_crash(self.as_checked_node())
        self._trace(f"{self.node_id} crash {report!r}")

    def restart(self) -> None:
        if self.up:
            return
        self._trace(f"{self.node_id} restart")
        self.start()

    def pause(self) -> None:
        """Stop the process without losing anything (SIGSTOP): see the module docstring."""
        if not self.up or self.paused:
            return
        self.paused = True
        self.pause_count += 1
        self._trace(f"{self.node_id} pause")

    def resume(self) -> None:
        """Go on (SIGCONT): handle what queued meanwhile, links interleaved (seeded) but
        each link in its own order, then carry on."""
        if not self.up or not self.paused:
            return
        self._trace(f"{self.node_id} resume ({len(self.paused_inbox)} queued)")
        self.paused = False
        inbox = self._interleave(self.paused_inbox)
        self.paused_inbox = []
        for position, (_, handler, argument) in enumerate(inbox):
            if not self.up:
                return
            if self.paused:
                # Paused again by something a handler did: the rest waits, each link still
                # in its order.
                self.paused_inbox = inbox[position:] + self.paused_inbox
                return
            handler(argument)
        self._after_event()

    def _interleave(
        self, inbox: list[tuple[str, Callable[[Any], None], Any]]
    ) -> list[tuple[str, Callable[[Any], None], Any]]:
        """`inbox` in a seeded order that keeps each link's items in arrival order: at each
        step the next item of a link drawn uniformly among those with items left."""
        links: dict[str, deque[tuple[str, Callable[[Any], None], Any]]] = {}
        for item in inbox:
            links.setdefault(item[0], deque()).append(item)
        if len(links) <= 1:
            return list(inbox)
        order: list[tuple[str, Callable[[Any], None], Any]] = []
        live = list(links)  # first-arrival order: deterministic
        rng = self.resume_rng
        while live:
            position = rng.randrange(len(live))
            queue = links[live[position]]
            order.append(queue.popleft())
            if not queue:
                live.pop(position)
        return order

    def hold(self, handler: Callable[[Any], None], argument: Any, link: str = LOCAL_LINK) -> bool:
        """If paused, queue `handler(argument)` for the resume and return True; a handler
        that enters the process calls this first and returns if it is held. `link` names
        the connection it came in on (`LOCAL_LINK` for the process's own timers and
        completions), whose order the resume keeps."""
        if not (self.up and self.paused):
            return False
        self.paused_inbox.append((link, handler, argument))
        return True

    # --- requests -----------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.up and self.core.role is Role.LEADER

    def propose(self, data: bytes, callback: ProposalCallback | None) -> bool:
        """Propose `data`; False (and no callback) if this member cannot take it now."""
        if not self.up:
            return False
        self._require_running("propose")
        try:
            index = self.core.propose(data)
        except (NotLeaderError, PendingFullError, LeaderTransferringError):
            return False
        self.proposals[index] = _Pending(self.core.term, callback)
        self._trace(f"{self.node_id} propose {index}@{self.core.term} ({len(data)} bytes)")
        self._after_event()
        return True

    def read_index(self, callback: ReadCallback) -> bool:
        """Confirm leadership, then call `callback(True)` once applied past the read
        index (`callback(False)` if leadership was lost). False if not the leader."""
        if not self.up:
            return False
        self._require_running("read_index")
        self.next_read_id += 1
        request_id = self.next_read_id
        try:
            self.core.read_index(request_id)
        except NotLeaderError:
            return False
        self.reads[request_id] = callback
        self._after_event()
        return True

    def _require_running(self, what: str) -> None:
        # Every way into the process is held while it is paused (`hold`); a call that gets
        # through anyway is a harness mistake that would let a stopped process act.
        if self.paused:
            raise SimulationError(f"{self.node_id}: {what} while paused")

    # --- events -------------------------------------------------------------------------

    def _tick(self, incarnation: int) -> None:
        if incarnation != self.incarnation:
            return
        self.events.schedule(self.options.tick_ms, self._tick, incarnation)
        if self.paused:
            # Ticks missed while stopped are gone (the core's clock is its ticks), as in
            # `SimNode`: a resumed member's timers go on from where they stopped.
            return
        self.core.tick()
        self._after_event()

    def receive(self, message: Message) -> None:
        if not self.up or self.hold(self.receive, message, f"raft:{message.source}"):
            return
        self.core.step(message)
        self._after_event()

    def _after_event(self) -> None:
        core = self.core
        while self.persisting is None and core.has_ready():
            self._handle_ready(core.ready())
        self.checker.check_node(self.as_checked_node())

    def _handle_ready(self, ready: Ready) -> None:
        for message in ready.messages:
            self.network.send(message)
        disk = self.disk
        wrote = False
        node = self.as_checked_node()
        if ready.snapshot is not None:
            self._install_snapshot(ready.snapshot.meta, ready.snapshot.data)
            wrote = True
        if ready.truncate_after is not None:
            self.checker.on_truncate(node, ready.truncate_after)
            disk.truncate_suffix(ready.truncate_after)
            wrote = True
        if ready.entries:
            self.checker.on_append(node, ready.entries)
            disk.append(ready.entries)
            wrote = True
        if ready.hard_state is not None:
            disk.set_hard_state(ready.hard_state)
            wrote = True
        if not wrote:
            self._finish_ready(ready)
            return
        self.persisting = ready
        delay_ms = draw_int(self.rng, self.options.fsync_ms_min, self.options.fsync_ms_max)
        self.events.schedule(delay_ms, self._persist_done, self.incarnation)

    def _persist_done(self, incarnation: int) -> None:
        if incarnation != self.incarnation or self.hold(self._persist_done, incarnation):
            return
        ready = self.persisting
        self.persisting = None
        if ready is not None:
            self.disk.sync()
            self._finish_ready(ready)
        self._after_event()

    def _finish_ready(self, ready: Ready) -> None:
        for message in ready.messages_after_persist:
            self.network.send(message)
        if ready.entries:
            last = ready.entries[-1]
            self.core.persisted(last.index, last.term)
        if ready.committed_entries:
            if self.options.apply_lags:
                self.unapplied.extend(ready.committed_entries)
                self._schedule_apply()
            else:
                self._apply(ready.committed_entries)
        for read_state in ready.read_states:
            self.reads_waiting.append((read_state.index, read_state.request_id))
        for request_id in ready.failed_reads:
            callback = self.reads.pop(request_id, None)
            if callback is not None:
                callback(False)
        if self.reads_waiting:
            self._serve_reads()

    def _schedule_apply(self) -> None:
        if self.apply_scheduled:
            return
        self.apply_scheduled = True
        options = self.options
        rng = self.apply_rng
        if options.apply_stall_probability and rng.random() < options.apply_stall_probability:
            delay_ms = draw_int(rng, options.apply_delay_ms_max, options.apply_stall_ms_max)
        else:
            delay_ms = draw_int(rng, options.apply_delay_ms_min, options.apply_delay_ms_max)
        self.events.schedule(delay_ms, self._apply_step, self.incarnation)

    def _apply_step(self, incarnation: int) -> None:
        """Apply the next batch of queued committed entries (apply lag only)."""
        if incarnation != self.incarnation or self.hold(self._apply_step, incarnation):
            return
        self.apply_scheduled = False
        queue = self.unapplied
        count = min(len(queue), self.options.apply_batch_entries_max)
        if count:
            self._apply([queue.popleft() for _ in range(count)])
        if queue:
            self._schedule_apply()
        if self.reads_waiting:
            self._serve_reads()
        self._after_event()

    def _install_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        # Entries still queued are all below the snapshot (the core takes one only beyond
        # its commit index), which holds their effects: drop them, and their proposals are
        # reported lost below like any the snapshot covers. (Applying them first would run
        # proposal callbacks, which may propose, in the middle of this Ready.)
        self.unapplied.clear()
        self.checker.on_snapshot_install(self.as_checked_node(), meta, data)
        self.machine.restore(data)
        self.snapshots_restored += 1
        self.disk.install_snapshot(meta, data)
        self.applied_index = meta.index
        self.applied_term = meta.term
        self.applied_configuration = meta.configuration
        self.last_snapshot_index = meta.index
        for index in sorted(self.proposals):
            if index <= meta.index:
                pending = self.proposals.pop(index)
                if pending.callback is not None:
                    pending.callback(ProposalOutcome(applied=False))
        self._trace(f"{self.node_id} installed snapshot {meta.index}@{meta.term}")

    def _apply(self, entries: list[LogEntry]) -> None:
        node = self.as_checked_node()
        for entry in entries:
            if entry.index != self.applied_index + 1:
                raise InvariantViolation(
                    f"{self.node_id} applies {entry.index} after {self.applied_index}"
                )
            self.checker.on_apply(node, entry)
            result: object = None
            if entry.type is EntryType.DATA and entry.data:
                result = self.machine.apply(entry.index, entry.data)
            else:
                if entry.type is EntryType.CONFIGURATION:
                    self.applied_configuration = decode_configuration(entry.data)
                self.machine.mark_applied(entry.index)
            self.applied_index = entry.index
            self.applied_term = entry.term
            pending = self.proposals.pop(entry.index, None)
            if pending is not None and pending.callback is not None:
                if entry.term == pending.term:
                    self.checker.on_acknowledged(node, entry)
                    pending.callback(ProposalOutcome(applied=True, result=result))
                else:
                    pending.callback(ProposalOutcome(applied=False))
        self.core.applied(self.applied_index)
        if self.applied_index - self.last_snapshot_index >= self.options.snapshot_interval_entries:
            self._take_snapshot()

    def _serve_reads(self) -> None:
        still_waiting: list[tuple[int, int]] = []
        for index, request_id in self.reads_waiting:
            if index > self.applied_index:
                still_waiting.append((index, request_id))
                continue
            callback = self.reads.pop(request_id, None)
            if callback is not None:
                callback(True)
        self.reads_waiting = still_waiting

    def _take_snapshot(self) -> None:
        data = self.machine.snapshot()
        meta = SnapshotMeta(
            index=self.applied_index,
            term=self.applied_term,
            configuration=self.applied_configuration,
        )
        self.checker.on_snapshot_taken(self.as_checked_node(), meta, data)
        self.disk.save_snapshot(meta, data)
        self.core.snapshot_taken(meta, data)
        self.last_snapshot_index = meta.index
        self.snapshots_taken += 1
        self.disk.compact(meta.index + 1 - self.options.snapshot_trailing_entries)
        self._trace(f"{self.node_id} snapshot {meta.index}")

    def _trace(self, text: str) -> None:
        if self.trace is not None:
            self.trace.record(self.events.now_ms, text)

    def describe(self) -> str:
        if not self.up:
            return f"{self.node_id}: down"
        core = self.core
        paused = f" paused({len(self.paused_inbox)} held)" if self.paused else ""
        return (
            f"{self.node_id}: {core.role.value} term={core.term} commit={core.commit_index} "
            f"applied={self.applied_index} queued={len(self.unapplied)} "
            f"log=[{core.log.first_index}, {core.log.last_index}]{paused}"
        )


__all__ = ["MemberOptions", "ProposalOutcome", "RaftMember", "ReplicatedMachine"]
