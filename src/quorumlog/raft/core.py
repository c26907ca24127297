"""The Raft core: a pure state machine in the style of etcd's raft.

Feed it events — `tick()`, `step(message)`, `propose(data)`, `read_index(...)`, and the
acknowledgements `persisted(...)` / `applied(...)` — and collect what it wants done with
`ready()` (see ready.py for the order a runtime must follow). It reads no clock (time is
ticks), draws randomness only from the injected `random.Random`, and never writes a file
or a socket: the same code runs under the real runtime and the simulator.

Quiet groups (CockroachDB's range quiescence, TiKV's hibernate regions, in our own form):
with `RaftConfig.quiesce_idle_ticks` set, an idle leader whose followers hold its whole
log sends them a quiesce heartbeat and goes quiet; a follower that matches it goes quiet
too. A quiet core wants no ticks (the runtime stops ticking it) and sends nothing. Any
proposal, read, transfer or message wakes it (a quiet leader ignores only the answers to
its own heartbeats), and so does `peer_unreachable` for a member: the runtime's node-level
liveness is how a quiet follower notices that its leader is gone. Safety never rests on
the quiet state: waking voids the leader's lease, so reads go through ReadIndex until a
fresh heartbeat round, and a woken follower follows the usual election rules.

Election (Raft §5.2, dissertation §9.6 pre-vote, §6.2 check-quorum) lives here; the
leader's replication machinery (DLedger's per-follower COMPARE / TRUNCATE / APPEND /
INSTALL_SNAPSHOT) lives in leader.py; the follower's side of pushes in follower.py.

Heartbeats the cheap way (with `send_heartbeats_at_once`, which the host sets): many awake
groups on one node each heartbeat every tick, and taking a Ready for each heartbeat and
each answer cost more than the rest of the node's work. So a tick's heartbeats go to
`outbox_at_once`, which the host sends right after the tick, and `step_heartbeat` /
`step_heartbeat_answer` take a heartbeat or its answer that changes nothing but timers and
read acknowledgements without any Ready. Each does exactly what `step` would do, or
declines (returns None / False) and the caller steps the message as usual: the fast path
decides nothing of its own, so safety never rests on it.

Elections held while the leader's node is live (`RaftConfig.leader_node_hold_ticks`): on a
busy node hosting many groups, a leader's heartbeats can come late while its node is
plainly alive (its frames for other groups keep arriving), and the elections that followed
made the node busier still. A follower whose timeout ran out asks `leader_node_live` (the
runtime's node-level liveness) and, while the leader's node is heard, holds its campaign,
for a bounded number of ticks. A leader's node that falls silent, a report that the group
stopped there (`peer_unreachable`), or the bound ends the hold.
"""

from __future__ import annotations

import enum
import random as random_module
from collections.abc import Callable

from quorumlog.errors import (
    ConfigurationChangeInProgressError,
    LeaderNotReadyError,
    LeaderTransferringError,
    NotLeaderError,
    PendingFullError,
)
from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import (
    Configuration,
    MembershipChange,
    apply_change,
    decode_configuration,
    encode_configuration,
)
from quorumlog.raft.follower import FollowerState
from quorumlog.raft.invariants import require
from quorumlog.raft.leader import LeaderState
from quorumlog.raft.log import LogReader, RaftLog
from quorumlog.raft.messages import (
    PUSH_COMMIT,
    Message,
    Push,
    PushResponse,
    SnapshotChunk,
    SnapshotMeta,
    SnapshotResponse,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from quorumlog.raft.ready import HardState, IncomingSnapshot, ReadState, Ready
from quorumlog.storage.entry import EntryType, LogEntry

COMMITTED_ENTRIES_PER_READY_MAX = 4096
"""Bound the entries one Ready hands over to apply, so one Ready never holds the world."""


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


FOLLOWER = Role.FOLLOWER
"""Read once (see messages.PUSH_APPEND): `dispatch` compares the role on every push."""


class RaftCore:
    def __init__(
        self,
        config: RaftConfig,
        log: LogReader,
        *,
        hard_state: HardState,
        configuration: Configuration,
        snapshot: SnapshotMeta | None = None,
        snapshot_data: bytes | None = None,
        random: random_module.Random,
    ) -> None:
        """Build a core from what survived on disk.

        `configuration` is the bootstrap membership, used only when neither the snapshot
        nor the log holds one. `snapshot_data`, if given, is the snapshot the core sends to
        followers that are behind its compacted log (else it waits for `snapshot_taken`).
        The runtime must have restored its state machine from `snapshot` already.
        """

        config.validate()
        self.config = config
        self.node_id = config.node_id
        self.random = random
        self.log = RaftLog(log, snapshot)
        # A torn write can leave entries whose term is ahead of the durable hard state.
        self.term = max(hard_state.term, self.log.last_term())
        self.vote: str | None = hard_state.vote if hard_state.term == self.term else None
        self.commit_index = max(
            min(hard_state.commit, self.log.last_index), self.log.snapshot_index
        )
        self.applied_index = self.log.snapshot_index
        self.applying_index = self.applied_index
        self.role = Role.FOLLOWER
        self.leader_id: str | None = None
        self.ticks = 0
        self.quiet = False
        """No ticks wanted and nothing sent until something wakes us (see the docstring)."""
        self.election_elapsed = 0
        self.randomized_election_ticks = 0
        self.reset_election_timer()
        self.woken_by_unreachable: str | None = None
        """The peer whose unreachable report woke this quiet follower, until a message, a
        campaign or that peer's return (`peer_reachable`)."""
        self.election_elapsed_before_wake = 0
        self.leader_node_live: Callable[[str], bool] | None = None
        """The runtime's node-level liveness (True: that peer's node is heard), asked only
        when an election timeout runs out (see the module docstring); None: never hold."""
        self.election_held_ticks = 0
        """Ticks in a row this follower held its campaign (reset with the election timer)."""
        self.elections_held = 0
        """Holds begun: election timeouts that ran out while the leader's node was live."""
        self.hold_voided_for: str | None = None
        """A leader reported unreachable for this group (`peer_unreachable`): no hold for it
        until it is heard again in this group (its next message resets the timer)."""
        self.votes: dict[str, bool] = {}
        self.own_snapshot: tuple[SnapshotMeta, bytes] | None = None
        if snapshot is not None and snapshot_data is not None:
            self.own_snapshot = (snapshot, snapshot_data)
        # Membership history for entries after the snapshot; the last one is in force.
        self.configurations: list[tuple[int, Configuration]] = [
            (snapshot.index, snapshot.configuration) if snapshot else (0, configuration)
        ]
        self.load_configurations_from_log()
        self.leader: LeaderState | None = None
        self.follower = FollowerState(self)
        self.incoming_snapshot: IncomingSnapshot | None = None
        self.outbox: list[Message] = []
        self.outbox_after_persist: list[Message] = []
        self.send_heartbeats_at_once = False
        """Tick heartbeats go to `outbox_at_once` (the host drains it after every tick)
        instead of waiting for a Ready. Off: every message goes through a Ready."""
        self.outbox_at_once: list[Message] = []
        self.read_states: list[ReadState] = []
        self.failed_reads: list[int] = []
        # What is durable now; if term or vote were corrected above, the next Ready says so.
        self.last_hard_state = hard_state

    # --- read-only views ---------------------------------------------------------------

    @property
    def configuration(self) -> Configuration:
        return self.configurations[-1][1]

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    def peers(self) -> list[str]:
        """Every member but this node, in a fixed order."""
        return sorted(m for m in self.configuration.members() if m != self.node_id)

    def status(self) -> dict[str, object]:
        return {
            "id": self.node_id,
            "role": self.role.value,
            "quiet": self.quiet,
            "term": self.term,
            "leader": self.leader_id,
            "commit_index": self.commit_index,
            "applied_index": self.applied_index,
            "first_index": self.log.first_index,
            "last_index": self.log.last_index,
            "voters": list(self.configuration.voters),
            "learners": list(self.configuration.learners),
            "progress": self.leader.describe() if self.leader else {},
        }

    # --- events ------------------------------------------------------------------------

    def tick(self) -> None:
        if self.quiet:
            return  # the runtime stops ticking a quiet core; a stray tick changes nothing
        self.ticks += 1
        if self.leader is not None:
            self.leader.tick()
            return
        self.election_elapsed += 1
        if self.election_elapsed >= self.randomized_election_ticks and (
            self.configuration.is_voter(self.node_id)
        ):
            if self.holds_election():
                return  # the timer stays run out: the next tick asks again
            # Only a campaign restarts the timer: a node that may not vote must let its
            # view of the leader's lease run out, or it would ignore real candidates.
            self.election_elapsed = 0
            self.campaign()

    def holds_election(self) -> bool:
        """At a run-out election timeout: hold the campaign (True) because the leader's
        node is live and the hold has not reached `leader_node_hold_ticks`."""
        hold_ticks_max = self.config.leader_node_hold_ticks
        leader_id = self.leader_id
        live = self.leader_node_live
        if (
            hold_ticks_max == 0
            or live is None
            or leader_id is None
            or leader_id == self.node_id
            or self.role is not Role.FOLLOWER
            or leader_id == self.hold_voided_for
            or not self.configuration.is_voter(leader_id)  # removed: it stepped down
            or self.election_held_ticks >= hold_ticks_max
            or not live(leader_id)
        ):
            return False
        if self.election_held_ticks == 0:
            self.elections_held += 1
        self.election_held_ticks += 1
        return True

    def tick_counting_only(self) -> bool:
        """`tick` when it would only count: a follower's (or candidate's) tick that does not
        reach its election timeout. Taken and True; False, changing nothing, when this tick
        could do more (a leader, a quiet core, a timeout reached): the caller calls `tick`.
        Most ticks of a node hosting many groups are these, and the host skips the rest of
        its tick work for them (runtime/host.py `tick`)."""
        if (
            self.leader is not None
            or self.quiet
            or self.election_elapsed + 1 >= self.randomized_election_ticks
        ):
            return False
        self.ticks += 1
        self.election_elapsed += 1
        return True

    def step(self, message: Message) -> None:
        require(
            message.target == self.node_id,
            "%s got a message for %s",
            self.node_id,
            message.target,
        )
        if message.source == self.node_id:
            return
        self.woken_by_unreachable = None
        if self.quiet and not (self.leader is not None and self.leader.keeps_quiet(message)):
            self.wake()
        if message.term > self.term:
            if isinstance(message, VoteRequest):
                if self.in_leader_lease() and not message.transfer:
                    return  # §6.2: a healthy leader's followers ignore disruptive candidates
                if message.pre_vote:
                    self.handle_vote_request(message)  # a pre-vote never changes our term
                    return
                self.become_follower(message.term, None)
            elif isinstance(message, VoteResponse) and message.pre_vote and message.granted:
                pass  # a granted pre-vote carries the term we would campaign in
            else:
                leader = (
                    message.source
                    if isinstance(message, Push | SnapshotChunk | TimeoutNow)
                    else None
                )
                self.become_follower(message.term, leader)
        elif message.term < self.term:
            self.answer_stale(message)
            return
        self.dispatch(message)

    def dispatch(self, message: Message) -> None:
        # The message types are disjoint; the commonest (pushes and their answers) go first.
        if isinstance(message, Push):
            if self.role is not FOLLOWER:
                self.become_follower(self.term, message.source)
            self.follower.handle_push(message)
        elif isinstance(message, PushResponse):
            if self.leader is not None:
                self.leader.handle_push_response(message)
        elif isinstance(message, VoteRequest):
            self.handle_vote_request(message)
        elif isinstance(message, VoteResponse):
            self.handle_vote_response(message)
        elif isinstance(message, SnapshotChunk):
            if self.role is not Role.FOLLOWER:
                self.become_follower(self.term, message.source)
            self.follower.handle_snapshot_chunk(message)
        elif isinstance(message, SnapshotResponse):
            if self.leader is not None:
                self.leader.handle_snapshot_response(message)
        elif isinstance(message, TimeoutNow) and self.configuration.is_voter(self.node_id):
            self.campaign(transfer=True)

    def step_heartbeat(self, push: Push) -> bool:
        """A heartbeat (COMMIT push) taken without a Ready: its answer, if the leader wants
        one, goes to `outbox_at_once` (send it now). False, changing nothing, when the
        heartbeat could change more than the election timer and the round: the caller
        steps it as usual. Equal to `step` for what it accepts: a follower of
        `push.source` in this term, awake, whose term is durable and whose commit index
        this heartbeat does not move."""
        self.woken_by_unreachable = None  # as `step` does for every message
        if (
            self.role is not FOLLOWER
            or self.quiet
            or push.kind is not PUSH_COMMIT
            or push.quiesce
            or push.term != self.term
            or push.target != self.node_id
            or self.last_hard_state.term != self.term
        ):
            return False
        return self.follower.answer_heartbeat_at_once(push)

    def step_heartbeat_answer(self, response: PushResponse) -> bool:
        """Take the answer to a heartbeat without a Ready, if it changes no replication
        state (see `LeaderState.take_heartbeat_answer`). False: the caller steps it as
        usual. Read states it confirms show in `has_ready`."""
        self.woken_by_unreachable = None  # as `step` does for every message
        leader = self.leader
        if (
            leader is None
            or self.quiet
            or response.kind is not PUSH_COMMIT
            or response.term != self.term
            or response.target != self.node_id
        ):
            return False
        return leader.take_heartbeat_answer(response)

    def take_messages_at_once(self) -> list[Message]:
        """The heartbeats a tick sent (see `send_heartbeats_at_once`) and the answers
        `step_heartbeat` gave: send them now."""
        messages, self.outbox_at_once = self.outbox_at_once, []
        return messages

    def answer_stale(self, message: Message) -> None:
        """Tell a node from an older term about ours, so a stale leader steps down."""
        if isinstance(message, Push):
            self.send(
                PushResponse(
                    source=self.node_id,
                    target=message.source,
                    term=self.term,
                    kind=message.kind,
                    round=message.round,
                    success=False,
                )
            )
        elif isinstance(message, SnapshotChunk):
            self.send(
                SnapshotResponse(
                    source=self.node_id,
                    target=message.source,
                    term=self.term,
                    round=message.round,
                    success=False,
                )
            )
        elif isinstance(message, VoteRequest):
            # Refuse with our term, so a candidate stuck in an old term learns of ours
            # instead of campaigning there again and again.
            self.send(
                VoteResponse(
                    source=self.node_id,
                    target=message.source,
                    term=self.term,
                    granted=False,
                    pre_vote=message.pre_vote,
                )
            )

    # --- client requests ----------------------------------------------------------------

    def require_leader(self) -> LeaderState:
        if self.leader is None:
            raise NotLeaderError(self.node_id, self.leader_id)
        return self.leader

    def propose(self, data: bytes, entry_type: EntryType = EntryType.DATA) -> int:
        """Append `data` as one entry; returns its index. The proposal succeeded if, when
        that index is applied, the entry there has the term `self.term` had on return."""
        leader = self.require_leader()
        if self.quiet:
            self.wake()
        if leader.transfer_target is not None:
            raise LeaderTransferringError(
                f"leadership is moving from {self.node_id} to {leader.transfer_target}"
            )
        pending_entries = self.log.last_index - self.commit_index
        if pending_entries >= self.config.pending_entries_max:
            raise PendingFullError(
                f"{pending_entries} entries await commit (pending_entries_max="
                f"{self.config.pending_entries_max})"
            )
        if leader.uncommitted_bytes + len(data) > self.config.pending_bytes_max and (
            leader.uncommitted_bytes > 0
        ):
            raise PendingFullError(
                f"{leader.uncommitted_bytes} bytes await commit (pending_bytes_max="
                f"{self.config.pending_bytes_max})"
            )
        return leader.append_local(data, entry_type)

    def change_membership(self, change: MembershipChange) -> int:
        """Propose one membership change; it takes effect as soon as it is in the log.

        Only once an entry of this leader's term has committed (its no-op): before that, a
        change an earlier leader appended may still commit without this leader's knowing,
        and a change on top of it could give the cluster two majorities that do not overlap
        (the single-server change bug, Ongaro on raft-dev 2015; dissertation §4.1 errata).
        """
        leader = self.require_leader()
        if self.quiet:
            self.wake()
        if leader.transfer_target is not None:
            raise LeaderTransferringError("a leader transfer is in progress")
        if self.commit_index < leader.first_index_of_term:
            raise LeaderNotReadyError(
                f"leader {self.node_id} of term {self.term} has not committed an entry of its "
                f"term yet (commit {self.commit_index} < {leader.first_index_of_term})"
            )
        if self.configurations[-1][0] > self.commit_index:
            raise ConfigurationChangeInProgressError(
                f"the change at index {self.configurations[-1][0]} is not committed yet"
            )
        new_configuration = apply_change(self.configuration, change)
        return leader.append_local(encode_configuration(new_configuration), EntryType.CONFIGURATION)

    def read_index(self, request_id: int) -> None:
        """Ask for a linearizable read point. The answer is a ReadState in a later Ready
        (or the id in `failed_reads` if leadership is lost first). A quiet leader wakes:
        its lease is void then, so the read takes a heartbeat round (ReadIndex)."""
        leader = self.require_leader()
        if self.quiet:
            self.wake()
        leader.read_index(request_id)

    def transfer_leadership(self, target: str) -> None:
        leader = self.require_leader()
        if self.quiet:
            self.wake()
        leader.transfer(target)

    # --- quiet groups ---------------------------------------------------------------------

    def wake(self) -> None:
        """Leave the quiet state. A leader heartbeats at once with its lease void; a
        follower gives the leader a whole election timeout to be heard from again."""
        if not self.quiet:
            return
        self.quiet = False
        if self.leader is not None:
            self.leader.wake()
        else:
            self.reset_election_timer()

    def peer_unreachable(self, peer: str) -> None:
        """The runtime's node-level liveness lost `peer` (no word from its node for a
        while). A quiet group with that member wakes; a quiet follower whose leader it is
        also stops honouring the leader's lease, so it campaigns within an election
        timeout (pre-vote first: a leader that is alive after all keeps its term). An awake
        follower of that leader stops holding its campaign for it (`holds_election`)."""
        if self.quiet and peer in self.configuration.members():
            elapsed_before_wake = self.election_elapsed
            self.wake()
            if self.leader is None and self.leader_id == peer:
                self.election_elapsed = self.config.election_ticks
                self.woken_by_unreachable = peer
                self.election_elapsed_before_wake = elapsed_before_wake
        if peer == self.leader_id and self.leader is None:
            self.hold_voided_for = peer  # after `wake`, which resets the timer and the void

    def peer_reachable(self, peer: str) -> None:
        """The node-level liveness hears `peer` again after `peer_unreachable`. A follower
        that report woke, whose leader `peer` is and that has had no message and no
        campaign since, goes quiet again as it was: its leader's node is back, and the
        leader, still quiet, never knew. Without it, a node that stalled a little longer
        than the liveness allows (a busy machine) lost every quiet group it led at once,
        and those elections made the next stall likelier. Liveness only: the follower's
        log is what it was when it went quiet, and a message or the next unreachable
        report wakes it as before."""
        if (
            self.woken_by_unreachable == peer
            and self.role is Role.FOLLOWER
            and not self.quiet
            and self.leader_id == peer
        ):
            self.woken_by_unreachable = None
            self.quiet = True
            self.election_elapsed = self.election_elapsed_before_wake

    def campaign(self, transfer: bool = False) -> None:
        """Start an election now (with a pre-vote first, unless handing over leadership)."""
        if not self.configuration.is_voter(self.node_id) or self.is_leader:
            return
        self.woken_by_unreachable = None
        self.quiet = False
        if self.config.pre_vote and not transfer:
            self.become_pre_candidate()
        else:
            self.become_candidate(transfer)

    # --- acknowledgements from the runtime ------------------------------------------------

    def persisted(self, index: int, term: int) -> None:
        """Entries through `index` (whose term is `term`) are durable."""
        if self.log.persisted(index, term) and self.leader is not None:
            self.leader.persisted_through(self.log.persisted_index)
            self.leader.maybe_commit()

    def applied(self, index: int) -> None:
        require(
            index <= self.applying_index, "applied %d > handed out %d", index, self.applying_index
        )
        self.applied_index = max(self.applied_index, index)

    def snapshot_taken(self, meta: SnapshotMeta, data: bytes) -> None:
        """The runtime snapshotted its state machine through meta.index (<= applied)."""
        require(meta.index <= self.applied_index, "snapshot ahead of what was applied")
        if self.own_snapshot is None or meta.index > self.own_snapshot[0].index:
            self.own_snapshot = (meta, data)
            self.log.snapshot_taken(meta)
            self.forget_old_configurations()

    # --- output -------------------------------------------------------------------------

    def send(self, message: Message) -> None:
        self.outbox.append(message)

    def send_after_persist(self, message: Message) -> None:
        self.outbox_after_persist.append(message)

    def send_at_once(self, message: Message) -> None:
        """A message that needs nothing persisted first and may go before the next Ready
        (a tick's heartbeat, with `send_heartbeats_at_once`)."""
        self.outbox_at_once.append(message)

    def has_ready(self) -> bool:
        leader = self.leader
        # The leader has work when `flush` has something to send. Read here rather than
        # through a method: the host asks after every event.
        if leader is not None and (leader.replicate_pending or leader.heartbeat_due):
            return True
        log = self.log
        saved = self.last_hard_state
        # Field by field rather than building a HardState: the host asks after every event.
        return bool(
            self.outbox
            or self.outbox_at_once
            or self.outbox_after_persist
            or self.read_states
            or self.failed_reads
            or self.incoming_snapshot is not None
            or log.pending_truncate_after is not None
            or log.handed_out_index < log.last_index
            or self.applying_index < self.commit_index
            or self.term != saved.term
            or self.vote != saved.vote
            or self.commit_index != saved.commit
        )

    def current_hard_state(self) -> HardState:
        return HardState(term=self.term, vote=self.vote, commit=self.commit_index)

    def ready(self) -> Ready:
        if self.leader is not None:
            self.leader.flush()
        if self.outbox_at_once:
            # Not drained by a host (a caller that only takes Readies): they go now.
            self.outbox[:0] = self.take_messages_at_once()
        snapshot = self.incoming_snapshot
        self.incoming_snapshot = None
        truncate_after, entries = self.log.take_unsent()
        # Field by field (as in `has_ready`): no HardState is built unless it changed.
        hard_state: HardState | None = None
        saved = self.last_hard_state
        if self.term != saved.term or self.vote != saved.vote or self.commit_index != saved.commit:
            hard_state = self.current_hard_state()
            self.last_hard_state = hard_state
        committed_entries: list[LogEntry] = []
        if self.applying_index < self.commit_index:
            high = min(self.commit_index, self.applying_index + COMMITTED_ENTRIES_PER_READY_MAX)
            committed_entries = self.log.entries(self.applying_index + 1, high + 1)
            self.applying_index = high
            self.log.release_through(high)
        # Built in one call with every field (not filled in afterwards): one Ready per pass.
        ready = Ready(
            hard_state=hard_state,
            snapshot=snapshot,
            truncate_after=truncate_after,
            entries=entries,
            messages=self.outbox,
            messages_after_persist=self.outbox_after_persist,
            committed_entries=committed_entries,
            read_states=self.read_states,
            failed_reads=self.failed_reads,
        )
        self.outbox = []
        self.outbox_after_persist = []
        self.read_states = []
        self.failed_reads = []
        return ready

    # --- roles --------------------------------------------------------------------------

    def reset_election_timer(self) -> None:
        self.election_elapsed = 0
        self.election_held_ticks = 0
        self.hold_voided_for = None
        ticks = self.config.election_ticks
        self.randomized_election_ticks = ticks + self.random.randrange(ticks)

    def in_leader_lease(self) -> bool:
        """Heard from a leader within the election timeout (§6.2, with check-quorum)."""
        if self.leader is not None:
            return self.config.check_quorum
        return (
            self.config.check_quorum
            and self.leader_id is not None
            and self.election_elapsed < self.config.election_ticks
        )

    def become_follower(self, term: int, leader_id: str | None) -> None:
        require(term >= self.term, "terms never go back")
        if self.leader is not None:
            self.failed_reads.extend(self.leader.abandon())
            self.leader = None
        if term > self.term:
            self.term = term
            self.vote = None
        if term != self.follower.term or leader_id != self.follower.leader_id:
            self.follower.start(term, leader_id)
        self.quiet = False  # only a quiesce push makes a follower quiet
        self.role = Role.FOLLOWER
        self.leader_id = leader_id
        self.reset_election_timer()

    def become_pre_candidate(self) -> None:
        self.role = Role.PRE_CANDIDATE
        self.leader_id = None
        self.votes = {self.node_id: True}
        self.reset_election_timer()
        if self.tally() is True:
            self.become_candidate(transfer=False)
            return
        for voter in self.other_voters():
            self.send(self.vote_request(voter, self.term + 1, pre_vote=True, transfer=False))

    def become_candidate(self, transfer: bool) -> None:
        self.term += 1
        self.vote = self.node_id
        self.role = Role.CANDIDATE
        self.leader_id = None
        self.votes = {self.node_id: True}
        self.reset_election_timer()
        if self.tally() is True:
            self.become_leader()
            return
        for voter in self.other_voters():
            # The vote for ourselves must be durable before anyone counts on this election.
            self.send_after_persist(
                self.vote_request(voter, self.term, pre_vote=False, transfer=transfer)
            )

    def become_leader(self) -> None:

        require(self.role is Role.CANDIDATE, "only a candidate becomes leader")
        self.role = Role.LEADER
        self.leader_id = self.node_id
        self.leader = LeaderState(self)
        # §5.4.2 / §8: commit earlier terms' entries by committing one of our own term.
        self.leader.append_local(b"", EntryType.NO_OP)

    def other_voters(self) -> list[str]:
        return sorted(v for v in self.configuration.voters if v != self.node_id)

    def vote_request(self, target: str, term: int, pre_vote: bool, transfer: bool) -> VoteRequest:
        return VoteRequest(
            source=self.node_id,
            target=target,
            term=term,
            last_log_index=self.log.last_index,
            last_log_term=self.log.last_term(),
            pre_vote=pre_vote,
            transfer=transfer,
        )

    def handle_vote_request(self, message: VoteRequest) -> None:
        if message.pre_vote:
            can_vote = message.term > self.term
        else:
            can_vote = self.vote == message.source or (self.vote is None and self.leader_id is None)
        up_to_date = self.log.is_up_to_date(message.last_log_index, message.last_log_term)
        granted = can_vote and up_to_date
        if granted and not message.pre_vote:
            self.vote = message.source
            self.reset_election_timer()
        elif up_to_date and not message.pre_vote:
            # We voted already (for ourselves, as a candidate) but the asker's log is at
            # least as good as ours: give it the next election rather than racing it to
            # every new term (without pre-vote, a node with a stale membership that cannot
            # win could otherwise beat a node that can to each term, for ever).
            self.reset_election_timer()
        response = VoteResponse(
            source=self.node_id,
            target=message.source,
            term=message.term if granted else self.term,
            granted=granted,
            pre_vote=message.pre_vote,
        )
        if message.pre_vote:
            self.send(response)
        else:
            self.send_after_persist(response)  # a vote is a promise: durable first

    def handle_vote_response(self, message: VoteResponse) -> None:
        if message.pre_vote:
            if self.role is not Role.PRE_CANDIDATE or message.term != self.term + 1:
                return
        elif self.role is not Role.CANDIDATE or message.term != self.term:
            return
        self.votes[message.source] = message.granted
        outcome = self.tally()
        if outcome is True:
            if self.role is Role.PRE_CANDIDATE:
                self.become_candidate(transfer=False)
            else:
                self.become_leader()
        elif outcome is False:
            self.become_follower(self.term, None)

    def tally(self) -> bool | None:
        """True once a quorum granted, False once a quorum refused, else None."""
        voters = self.configuration.voters
        granted = sum(1 for v in voters if self.votes.get(v) is True)
        refused = sum(1 for v in voters if self.votes.get(v) is False)
        quorum = self.configuration.quorum()
        if granted >= quorum:
            return True
        if refused >= quorum:
            return False
        return None

    # --- membership -----------------------------------------------------------------------

    def load_configurations_from_log(self) -> None:
        low = max(self.log.first_index, self.log.snapshot_index + 1)
        for entry in self.log.entries(low, self.log.last_index + 1):
            if entry.type is EntryType.CONFIGURATION:
                self.configurations.append((entry.index, decode_configuration(entry.data)))

    def note_appended(self, entries: list[LogEntry]) -> None:
        """A configuration takes effect as soon as it is in the log (dissertation §4.1)."""
        changed = False
        for entry in entries:
            if entry.type is EntryType.CONFIGURATION:
                self.configurations.append((entry.index, decode_configuration(entry.data)))
                changed = True
        if changed and self.leader is not None:
            self.leader.configuration_changed()

    def truncate_log_after(self, after: int) -> None:
        """Drop the entries after `after` (a follower obeying its leader), and the
        configurations they held. Checked first: a refused truncation changes nothing, so
        nothing a runtime could persist later has lost a committed entry."""
        require(after >= self.commit_index, f"truncating committed entries after {after}")
        self.log.truncate_after(after)
        while len(self.configurations) > 1 and self.configurations[-1][0] > after:
            self.configurations.pop()

    def forget_old_configurations(self) -> None:
        """Keep only the newest configuration at or below the commit index, and later ones."""
        while len(self.configurations) > 1 and self.configurations[1][0] <= self.commit_index:
            self.configurations.pop(0)

    def install_snapshot(self, snapshot: IncomingSnapshot) -> None:
        meta = snapshot.meta
        require(meta.index > self.commit_index, "installing a snapshot we already have")
        self.log.install_snapshot(meta)
        self.commit_index = meta.index
        self.applied_index = meta.index
        self.applying_index = meta.index
        self.configurations = [(meta.index, meta.configuration)]
        self.incoming_snapshot = snapshot
        self.own_snapshot = (meta, snapshot.data)
