"""The simulator's runtime shell: one RaftCore, its disk and its KV state machine.

It runs the core exactly by the Ready contract (raft/ready.py), with one twist that real
disks force on a real runtime: the fsync of step 4 takes virtual time. While it is in
flight the core keeps taking ticks and messages, but the next Ready waits until the sync
completes, so `messages_after_persist`, `persisted` and applying (steps 5-7) happen only
once the writes are durable. A crash in that window loses the unsynced writes.

Client requests arrive through `submit_write` / `submit_read`; the reply callback is
called at most once, and never after a crash (the client times out instead).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from quorumlog.errors import (
    ConfigurationChangeInProgressError,
    InvalidConfigurationChangeError,
    LeaderTransferringError,
    NotLeaderError,
    PendingFullError,
)
from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import (
    Configuration,
    MembershipChange,
    decode_configuration,
)
from quorumlog.raft.core import RaftCore, Role
from quorumlog.raft.messages import Message, SnapshotMeta
from quorumlog.raft.ready import Ready
from quorumlog.storage.entry import EntryType, LogEntry
from quorumlog.testing.sim.checks import InvariantViolation
from quorumlog.testing.sim.disk import SimDisk
from quorumlog.testing.sim.events import EventQueue, derive_random, draw_int
from quorumlog.testing.sim.kv_machine import KvMachine, Result
from quorumlog.testing.sim.network import SimNetwork
from quorumlog.testing.sim.trace import TraceRecorder

if TYPE_CHECKING:
    from quorumlog.testing.sim.invariants import InvariantChecker


class NodeOptions(msgspec.Struct, frozen=True):
    """How one simulated node's runtime behaves (not the Raft settings: see RaftConfig)."""

    tick_ms: int = 50
    fsync_ms_min: int = 0
    fsync_ms_max: int = 3
    snapshot_interval_entries: int = 64
    """Snapshot the state machine every this many applied entries."""
    snapshot_trailing_entries: int = 4
    """Entries kept in the log below a snapshot, so a slightly lagging follower can still
    be caught up from the log instead of by INSTALL_SNAPSHOT."""
    torn_tail_probability: float = 0.5
    """At a crash, the chance that some unsynced entries survive (a torn tail)."""


class ClientReply(msgspec.Struct, frozen=True):
    status: str
    """"ok" (value holds the result), "redirect" (try leader_hint) or "retry" (back off)."""
    value: Any = None
    leader_hint: str | None = None
    reason: str = ""


ReplyCallback = Callable[[ClientReply], None]

REPLY_DROPPED = ClientReply("retry", reason="dropped")
REPLY_PENDING_FULL = ClientReply("retry", reason="pending full")
REPLY_TRANSFERRING = ClientReply("retry", reason="leader transferring")
REPLY_READ_FAILED = ClientReply("retry", reason="read failed")


class _PendingProposal:
    __slots__ = ("reply", "term")

    def __init__(self, term: int, reply: ReplyCallback | None) -> None:
        self.term = term
        self.reply = reply


class SimNode:
    def __init__(
        self,
        node_id: str,
        *,
        seed: int,
        raft_config: RaftConfig,
        bootstrap: Configuration,
        options: NodeOptions,
        events: EventQueue,
        network: SimNetwork,
        checker: InvariantChecker,
        trace: TraceRecorder | None,
    ) -> None:
        self.node_id = node_id
        self.seed = seed
        self.raft_config = raft_config
        self.bootstrap = bootstrap
        self.options = options
        self.events = events
        self.network = network
        self.checker = checker
        self.trace = trace
        self.rng = derive_random(seed, f"node:{node_id}")
        self.disk = SimDisk()
        self.incarnation = 0
        self.up = False
        self.paused = False
        self.paused_inbox: list[tuple[Callable[[Any], None], Any]] = []
        self.persisting: Ready | None = None
        self.persist_deferred = False
        self.core: RaftCore
        self.machine = KvMachine()
        self.applied_index = 0
        self.applied_term = 0
        self.applied_configuration = bootstrap
        self.last_snapshot_index = 0
        self.proposals: dict[int, _PendingProposal] = {}
        self.next_read_id = 0
        self.reads: dict[int, tuple[str, ReplyCallback]] = {}
        self.reads_waiting: list[tuple[int, int]] = []
        """(read index, request id) confirmed by the core, served once applied >= index."""
        self.crash_count = 0
        self.start()

    # --- life cycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Boot from what is on disk (the first time: an empty disk)."""
        self.incarnation += 1
        disk = self.disk
        saved = disk.snapshot
        self.machine = KvMachine()
        meta: SnapshotMeta | None = None
        if saved is not None:
            meta = saved.meta
            self.machine.restore(saved.data)
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
            disk.store,
            hard_state=disk.durable_hard_state,
            configuration=self.bootstrap,
            snapshot=meta,
            snapshot_data=saved.data if saved is not None else None,
            random=derive_random(self.seed, f"core:{self.node_id}:{self.incarnation}"),
        )
        self.up = True
        self.paused = False
        self.persisting = None
        self.persist_deferred = False
        self.checker.on_start(self)
        phase_ms = self.rng.randrange(self.options.tick_ms)
        self.events.schedule(phase_ms, self._tick, self.incarnation)
        self._after_event()

    def crash(self) -> None:
        """Stop at once: unsynced writes are lost, pending requests never get an answer."""
        if not self.up:
            return
        self.up = False
        self.paused = False
        self.paused_inbox = []
        self.incarnation += 1  # every event scheduled by the old process is now void
        self.crash_count += 1
        report = self.disk.crash(self.rng, self.options.torn_tail_probability)
        self.persisting = None
        self.proposals = {}
        self.reads = {}
        self.reads_waiting = []
        self.checker.on_crash(self)
        if self.trace is not None:
            self.trace.record(self.events.now_ms, f"{self.node_id} crash {report!r}")

    def restart(self) -> None:
        if self.up:
            return
        if self.trace is not None:
            self.trace.record(self.events.now_ms, f"{self.node_id} restart")
        self.start()

    def pause(self) -> None:
        """Like SIGSTOP: no ticks, no processing; arriving work queues up."""
        if self.up:
            self.paused = True

    def resume(self) -> None:
        if not self.up or not self.paused:
            return
        self.paused = False
        inbox, self.paused_inbox = self.paused_inbox, []
        for handler, argument in inbox:
            if not self.up or self.paused:
                return
            handler(argument)
        if self.persist_deferred:
            self.persist_deferred = False
            self._persist_done(self.incarnation)
        else:
            self._after_event()

    # --- events -------------------------------------------------------------------------

    def _tick(self, incarnation: int) -> None:
        if incarnation != self.incarnation:
            return
        self.events.schedule(self.options.tick_ms, self._tick, incarnation)
        if self.paused:
            return
        self.core.tick()
        self._after_event()

    def receive(self, message: Message) -> None:
        if not self.up:
            return
        if self.paused:
            self.paused_inbox.append((self.receive, message))
            return
        if self.trace is not None:
            self.trace.record(self.events.now_ms, f"{self.node_id} <- {message!r}")
        self.core.step(message)
        self._after_event()

    def submit_write(self, request: tuple[bytes, ReplyCallback]) -> None:
        """Propose a client command; the reply comes once its index is applied here."""
        if not self.up:
            return
        if self.paused:
            self.paused_inbox.append((self.submit_write, request))
            return
        data, reply = request
        outcome = self._propose(data, reply)
        if isinstance(outcome, ClientReply):
            reply(outcome)
        self._after_event()

    def _propose(self, data: bytes, reply: ReplyCallback | None) -> ClientReply | int:
        """The proposal's index, or the refusal to send back to the client."""
        core = self.core
        try:
            index = core.propose(data)
        except NotLeaderError as error:
            return ClientReply("redirect", leader_hint=error.leader_hint)
        except PendingFullError:
            return REPLY_PENDING_FULL
        except LeaderTransferringError:
            return REPLY_TRANSFERRING
        self.proposals[index] = _PendingProposal(core.term, reply)
        if self.trace is not None:
            self.trace.record(
                self.events.now_ms, f"{self.node_id} propose {index}@{core.term} {data!r}"
            )
        return index

    def submit_read(self, request: tuple[str, ReplyCallback]) -> None:
        """A linearizable read through ReadIndex, served from the local state machine."""
        if not self.up:
            return
        if self.paused:
            self.paused_inbox.append((self.submit_read, request))
            return
        key, reply = request
        self.next_read_id += 1
        request_id = self.next_read_id
        try:
            self.core.read_index(request_id)
        except NotLeaderError as error:
            reply(ClientReply("redirect", leader_hint=error.leader_hint))
            return
        self.reads[request_id] = (key, reply)
        self._after_event()

    def change_membership(self, change: MembershipChange) -> int | None:
        """Propose a membership change here; None if this node cannot take it now."""
        if not self.up or self.paused:
            return None
        try:
            index = self.core.change_membership(change)
        except (
            NotLeaderError,
            LeaderTransferringError,
            ConfigurationChangeInProgressError,
            InvalidConfigurationChangeError,
        ):
            return None
        self._after_event()
        return index

    def transfer_leadership(self, target: str) -> bool:
        if not self.up or self.paused:
            return False
        try:
            self.core.transfer_leadership(target)
        except (NotLeaderError, InvalidConfigurationChangeError):
            return False
        self._after_event()
        return True

    def campaign(self) -> None:
        if self.up and not self.paused:
            self.core.campaign()
            self._after_event()

    def propose_raw(self, data: bytes) -> tuple[int, int] | ClientReply:
        """Propose for a scenario test: (index, term), or the refusal as a reply."""
        outcome = self._propose(data, None)
        if isinstance(outcome, ClientReply):
            return outcome
        term = self.proposals[outcome].term
        self._after_event()
        return outcome, term

    # --- the Ready loop -----------------------------------------------------------------

    def _after_event(self) -> None:
        """Drain the core's Readies (up to a pending fsync), then check invariants."""
        core = self.core
        while self.persisting is None and core.has_ready():
            self._handle_ready(core.ready())
        self.checker.check_node(self)

    def _handle_ready(self, ready: Ready) -> None:
        trace = self.trace
        if trace is not None:
            trace.record(self.events.now_ms, f"{self.node_id} ready {_describe_ready(ready)}")
        send = self.network.send
        for message in ready.messages:  # 1: never depends on local durability
            send(message)
        disk = self.disk
        wrote = False
        if ready.snapshot is not None:  # 2
            self._install_snapshot(ready.snapshot.meta, ready.snapshot.data)
            wrote = True
        if ready.truncate_after is not None:  # 3
            self.checker.on_truncate(self, ready.truncate_after)
            disk.truncate_suffix(ready.truncate_after)
            wrote = True
        if ready.entries:  # 4
            self.checker.on_append(self, ready.entries)
            disk.append(ready.entries)
            wrote = True
        if ready.hard_state is not None:
            disk.set_hard_state(ready.hard_state)
            wrote = True
        if not wrote:
            self._finish_ready(ready)
            return
        self.persisting = ready
        options = self.options
        delay_ms = draw_int(self.rng, options.fsync_ms_min, options.fsync_ms_max)
        self.events.schedule(delay_ms, self._persist_done, self.incarnation)

    def _persist_done(self, incarnation: int) -> None:
        if incarnation != self.incarnation:
            return  # crashed while syncing: the writes were lost (or torn) in the crash
        if self.paused:
            self.persist_deferred = True
            return
        ready = self.persisting
        self.persisting = None
        if ready is not None:
            self.disk.sync()
            self._finish_ready(ready)
        self._after_event()

    def _finish_ready(self, ready: Ready) -> None:
        send = self.network.send
        for message in ready.messages_after_persist:  # 5
            send(message)
        if ready.entries:
            last = ready.entries[-1]
            self.core.persisted(last.index, last.term)
        if ready.committed_entries:  # 6
            self._apply(ready.committed_entries)
        for read_state in ready.read_states:  # 7
            self.reads_waiting.append((read_state.index, read_state.request_id))
        for request_id in ready.failed_reads:
            waiting = self.reads.pop(request_id, None)
            if waiting is not None:
                waiting[1](REPLY_READ_FAILED)
        if self.reads_waiting:
            self._serve_reads()

    def _install_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        self.checker.on_snapshot_install(self, meta, data)
        self.machine.restore(data)
        self.disk.install_snapshot(meta, data)
        self.applied_index = meta.index
        self.applied_term = meta.term
        self.applied_configuration = meta.configuration
        self.last_snapshot_index = meta.index
        # Proposals the snapshot covers: their fate is not visible here; the client retries
        # with the same sequence and the session table answers it.
        for index in sorted(self.proposals):
            if index <= meta.index:
                proposal = self.proposals.pop(index)
                if proposal.reply is not None:
                    proposal.reply(REPLY_DROPPED)

    def _apply(self, entries: list[LogEntry]) -> None:
        checker = self.checker
        machine = self.machine
        proposals = self.proposals
        for entry in entries:
            if entry.index != self.applied_index + 1:
                raise InvariantViolation(
                    f"{self.node_id} applies {entry.index} after {self.applied_index}"
                )
            checker.on_apply(self, entry)
            result: Result = None
            if entry.type is EntryType.DATA:
                result = machine.apply_bytes(entry.data)
            elif entry.type is EntryType.CONFIGURATION:
                self.applied_configuration = decode_configuration(entry.data)
            self.applied_index = entry.index
            self.applied_term = entry.term
            if proposals:
                proposal = proposals.pop(entry.index, None)
                if proposal is not None:
                    self._answer_proposal(proposal, entry, result)
        self.core.applied(self.applied_index)
        if self.applied_index - self.last_snapshot_index >= self.options.snapshot_interval_entries:
            self._take_snapshot()

    def _answer_proposal(self, proposal: _PendingProposal, entry: LogEntry, result: Result) -> None:
        if proposal.reply is None:
            return
        if entry.term == proposal.term:
            self.checker.on_acknowledged(self, entry)
            proposal.reply(ClientReply("ok", value=result))
        else:
            proposal.reply(REPLY_DROPPED)

    def _serve_reads(self) -> None:
        still_waiting: list[tuple[int, int]] = []
        for index, request_id in self.reads_waiting:
            if index > self.applied_index:
                still_waiting.append((index, request_id))
                continue
            waiting = self.reads.pop(request_id, None)
            if waiting is not None:
                key, reply = waiting
                reply(ClientReply("ok", value=self.machine.get(key)))
        self.reads_waiting = still_waiting

    def _take_snapshot(self) -> None:
        data = self.machine.snapshot()
        meta = SnapshotMeta(
            index=self.applied_index,
            term=self.applied_term,
            configuration=self.applied_configuration,
        )
        self.checker.on_snapshot_taken(self, meta, data)
        self.disk.save_snapshot(meta, data)
        self.core.snapshot_taken(meta, data)
        self.last_snapshot_index = meta.index
        self.disk.compact(meta.index + 1 - self.options.snapshot_trailing_entries)
        if self.trace is not None:
            self.trace.record(self.events.now_ms, f"{self.node_id} snapshot {meta.index}")

    # --- views --------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.up and self.core.role is Role.LEADER

    @property
    def available(self) -> bool:
        return self.up and not self.paused

    def describe(self) -> str:
        if not self.up:
            return f"{self.node_id}: down"
        core = self.core
        paused = " paused" if self.paused else ""
        return (
            f"{self.node_id}: {core.role.value} term={core.term} leader={core.leader_id} "
            f"commit={core.commit_index} applied={self.applied_index} "
            f"log=[{core.log.first_index}, {core.log.last_index}] "
            f"voters={','.join(core.configuration.voters)}{paused}"
        )


def _describe_ready(ready: Ready) -> str:
    parts: list[str] = []
    if ready.hard_state is not None:
        parts.append(f"hs={ready.hard_state!r}")
    if ready.snapshot is not None:
        parts.append(f"snapshot={ready.snapshot.meta.index}@{ready.snapshot.meta.term}")
    if ready.truncate_after is not None:
        parts.append(f"truncate_after={ready.truncate_after}")
    if ready.entries:
        parts.append(f"entries={[(e.index, e.term) for e in ready.entries]}")
    if ready.committed_entries:
        first, last = ready.committed_entries[0], ready.committed_entries[-1]
        parts.append(f"apply=[{first.index}, {last.index}]")
    for message in ready.messages:
        parts.append(f"send {message!r}")
    for message in ready.messages_after_persist:
        parts.append(f"send_after_persist {message!r}")
    if ready.read_states:
        parts.append(f"reads={ready.read_states!r}")
    if ready.failed_reads:
        parts.append(f"failed_reads={ready.failed_reads!r}")
    return " ".join(parts) if parts else "(empty)"
