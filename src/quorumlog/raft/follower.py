"""A follower's side of DLedger-style replication (the reference's EntryHandler).

What the follower tracks about the current leader:
- `round`: the highest push round seen; older rounds of the same term are ignored, which
  makes stale or duplicated TRUNCATE pushes harmless.
- `verified_index`: the follower's log is known to match the leader's through this index.
  The commit index a leader announces is only taken up to here, so entries that still
  diverge from the leader (not yet compared) are never applied.

Every response that claims a match goes out after persist: the leader counts it toward a
quorum, so the entries it covers must be durable first. The one exception, a heartbeat's
answer (`answer_heartbeat`), goes out at once and claims a match only through what is
durable already.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quorumlog.raft.invariants import require
from quorumlog.raft.messages import (
    PUSH_APPEND,
    PUSH_COMPARE,
    PUSH_TRUNCATE,
    Push,
    PushResponse,
    SnapshotChunk,
    SnapshotResponse,
)
from quorumlog.raft.ready import IncomingSnapshot

if TYPE_CHECKING:
    from quorumlog.raft.core import RaftCore

PARKED_PUSHES_MAX = 64


class FollowerState:
    def __init__(self, core: RaftCore) -> None:
        self.core = core
        self.term = -1
        self.leader_id: str | None = None
        self.round = 0
        self.verified_index = 0
        self.vouched = False
        """Something was verified against this leader in this term (see `answer_wanted`)."""
        self.snapshot_buffer = bytearray()
        self.snapshot_key: tuple[int, int, int] | None = None
        """(leader term, snapshot index, snapshot term) of the snapshot being received."""
        self.parked: dict[int, Push] = {}
        """APPENDs that arrived ahead of a gap, by the index they follow (DLedger keeps
        early pushes the same way): the missing one usually arrives a moment later."""

    def start(self, term: int, leader_id: str | None) -> None:
        """A new leader (or none): nothing is verified against it yet."""
        self.term = term
        self.leader_id = leader_id
        self.round = 0
        self.verified_index = self.core.log.snapshot_index
        self.vouched = False
        self.snapshot_buffer = bytearray()
        self.snapshot_key = None
        self.parked = {}

    def accept_round(self, round_number: int) -> bool:
        if round_number < self.round:
            return False
        if round_number > self.round:
            self.parked = {}  # pushes of an older round must never be applied now
        self.round = round_number
        return True

    # --- pushes ---------------------------------------------------------------------------

    def handle_push(self, push: Push) -> None:
        core = self.core
        core.leader_id = push.source
        core.reset_election_timer()
        if self.leader_id != push.source or self.term != core.term:
            self.start(core.term, push.source)
        if not self.accept_round(push.round):
            return
        kind = push.kind
        if kind is PUSH_COMPARE:
            self.handle_compare(push)
        elif kind is PUSH_TRUNCATE:
            self.handle_truncate(push)
        elif kind is PUSH_APPEND:
            self.handle_append(push)
        else:
            self.advance_commit(push.commit_index)
            if push.quiesce:
                quiet = self.holds_everything(push)
                if quiet:
                    core.quiet = True
                    self.parked = {}
                self.respond(push, success=True, match_index=self.verified_index, quiet=quiet)
            else:
                self.answer_heartbeat(push)

    def holds_everything(self, push: Push) -> bool:
        """May we go quiet on this quiesce push? Only if our log is the leader's, verified,
        and committed as far as the leader's: a quiet group sends nothing, so a follower
        missing anything would wait for it until something woke the group."""
        core = self.core
        log = core.log
        return (
            log.last_index == push.index
            and self.verified_index == push.index
            and log.term(push.index) == push.index_term
            and core.commit_index == push.commit_index
        )

    def matches(self, index: int, term: int) -> bool:
        """Does our log hold (index, term)? Below the snapshot everything is committed and
        so matches the leader's log (leader completeness)."""
        log = self.core.log
        if index <= log.snapshot_index:
            return True
        return log.term(index) == term

    def handle_compare(self, push: Push) -> None:
        log = self.core.log
        if self.matches(push.index, push.index_term):
            self.verify(push.index)
            self.advance_commit(push.commit_index)
            self.respond(push, success=True, match_index=push.index)
            return
        our_term = log.term(push.index)
        if our_term is None:
            self.respond(push, success=False)  # missing: the leader backs up to our end
            return
        first = log.first_index_of_term(our_term, push.index)
        self.respond(push, success=False, conflict_term=our_term, conflict_index=first)

    def handle_truncate(self, push: Push) -> None:
        core = self.core
        if not self.matches(push.index, push.index_term):
            self.respond(push, success=False)
            return
        if push.index < core.log.last_index:
            core.truncate_log_after(push.index)
            self.truncated(push.index)
        self.verify(push.index)
        self.advance_commit(push.commit_index)
        self.respond(push, success=True, match_index=push.index)

    def handle_append(self, push: Push) -> None:
        core = self.core
        log = core.log
        entries = push.entries
        previous_index, previous_term = push.index, push.index_term
        # Entries at or below our snapshot are committed and already here: skip them.
        if previous_index < log.snapshot_index:
            skip = log.snapshot_index - previous_index
            if skip >= len(entries):
                self.verify(previous_index + len(entries))
                self.respond(push, success=True, match_index=previous_index + len(entries))
                return
            previous_index = log.snapshot_index
            previous_term = entries[skip - 1].term
            entries = entries[skip:]
        if previous_index > log.last_index and len(self.parked) < PARKED_PUSHES_MAX:
            self.parked[previous_index] = push  # answered once the gap before it fills
            return
        if previous_index > log.last_index or not self.matches(previous_index, previous_term):
            # A gap (an earlier push was lost) or a mismatch: the leader goes back to COMPARE.
            self.respond(push, success=False)
            return
        new_entries = entries
        for position, entry in enumerate(entries):
            if entry.index > log.last_index:
                new_entries = entries[position:]
                break
            if log.term(entry.index) != entry.term:
                # Raft §5.3: a conflicting entry and all after it go.
                core.truncate_log_after(entry.index - 1)
                self.truncated(entry.index - 1)
                new_entries = entries[position:]
                break
        else:
            new_entries = []
        if new_entries:
            log.append(new_entries)
            core.note_appended(new_entries)
        last_new = previous_index + len(entries)
        self.verify(last_new)
        self.advance_commit(push.commit_index)
        self.respond(push, success=True, match_index=last_new)
        following = self.parked.pop(log.last_index, None)
        if following is not None:
            self.handle_append(following)

    def verify(self, index: int) -> None:
        self.verified_index = max(self.verified_index, index)
        self.vouched = True

    def truncated(self, after: int) -> None:
        """Entries after `after` are gone: nothing past it can still be verified, and any
        parked push that followed them is stale."""
        self.verified_index = min(self.verified_index, after)
        self.parked = {k: v for k, v in self.parked.items() if k <= after}

    def advance_commit(self, leader_commit: int) -> None:
        core = self.core
        commit = min(leader_commit, self.verified_index)
        if commit > core.commit_index:
            require(commit <= core.log.last_index, "commit beyond our log")
            core.commit_index = commit

    def answer_heartbeat(self, push: Push) -> None:
        """Answer a heartbeat now, not after persist, claiming only what is durable already.

        Every other answer waits for the follower's sync, and so did this one; with many
        groups syncing on a busy disk that took longer than an election timeout, and
        leaders that heard no answer stepped down (check-quorum) although every follower
        was there. A heartbeat answer that claims a match only through `persisted_index`
        can go out at once: what the leader counts toward a quorum is durable, and it is
        never below a match this follower reported before (those went out after their
        sync). A term taken up in this very step is not saved yet: then it waits."""
        core = self.core
        if core.term != core.last_hard_state.term:
            self.respond(push, success=True, match_index=self.verified_index)
            return
        if not self.answer_wanted(push):
            return  # the leader heard us lately and waits on nothing (Push.answer_wanted)
        durable_match = min(self.verified_index, core.log.persisted_index)
        core.send(self.push_response(push, success=True, match_index=durable_match))

    def answer_heartbeat_at_once(self, push: Push) -> bool:
        """`handle_push` of a heartbeat from our leader of this term that moves neither
        our commit index nor anything else but the election timer and the round: its
        answer, if wanted, goes to the core's `outbox_at_once` (`answer_heartbeat`).
        False, changing nothing: step it as usual. The caller checked role, quiet, kind
        and that our term is durable."""
        core = self.core
        if (
            self.leader_id != push.source
            or self.term != core.term
            or push.round < self.round
            or min(push.commit_index, self.verified_index) > core.commit_index
        ):
            return False
        core.leader_id = push.source
        core.reset_election_timer()
        self.accept_round(push.round)
        if self.answer_wanted(push):
            durable_match = min(self.verified_index, core.log.persisted_index)
            core.send_at_once(self.push_response(push, success=True, match_index=durable_match))
        return True

    def answer_wanted(self, push: Push) -> bool:
        """Answer this heartbeat? If the leader wants it, or if we have verified nothing
        against this leader yet and cannot vouch for everything it committed: then we may
        have restarted (or lost state) since we acknowledged it, and the leader must learn
        it now to COMPARE again, not at the next window. A follower that verified entries
        in this term and merely lags the commit index (its appends are in flight, or a
        quorum formed without it) has told the leader all it knows: its appends answer."""
        return push.answer_wanted or (not self.vouched and self.verified_index < push.commit_index)

    def respond(
        self,
        push: Push,
        *,
        success: bool,
        match_index: int = 0,
        conflict_term: int = 0,
        conflict_index: int = 0,
        quiet: bool = False,
    ) -> None:
        self.core.send_after_persist(
            self.push_response(
                push,
                success=success,
                match_index=match_index,
                conflict_term=conflict_term,
                conflict_index=conflict_index,
                quiet=quiet,
            )
        )

    def push_response(
        self,
        push: Push,
        *,
        success: bool,
        match_index: int = 0,
        conflict_term: int = 0,
        conflict_index: int = 0,
        quiet: bool = False,
    ) -> PushResponse:
        return PushResponse(
            source=self.core.node_id,
            target=push.source,
            term=self.core.term,
            kind=push.kind,
            round=push.round,
            success=success,
            index=push.index,
            match_index=match_index,
            end_index=self.core.log.last_index,
            conflict_term=conflict_term,
            conflict_index=conflict_index,
            read_sequence=push.read_sequence,
            quiet=quiet,
        )

    # --- snapshots ------------------------------------------------------------------------

    def handle_snapshot_chunk(self, chunk: SnapshotChunk) -> None:
        core = self.core
        core.leader_id = chunk.source
        core.reset_election_timer()
        if self.leader_id != chunk.source or self.term != core.term:
            self.start(core.term, chunk.source)
        if not self.accept_round(chunk.round):
            return
        meta = chunk.meta
        if meta.index <= core.commit_index:
            # We already hold everything it covers.
            self.verify(meta.index)
            self.respond_snapshot(chunk, success=True, match_index=meta.index, done=True)
            return
        key = (core.term, meta.index, meta.term)
        if self.snapshot_key != key or chunk.offset == 0:
            self.snapshot_key = key
            self.snapshot_buffer = bytearray()
        if chunk.offset != len(self.snapshot_buffer):
            self.respond_snapshot(chunk, success=False, match_index=0, done=False)
            return
        self.snapshot_buffer += chunk.data
        if not chunk.done:
            self.respond_snapshot(chunk, success=True, match_index=0, done=False)
            return
        snapshot = IncomingSnapshot(meta=meta, data=bytes(self.snapshot_buffer))
        core.install_snapshot(snapshot)  # checks first: a refused snapshot changes nothing
        self.snapshot_buffer = bytearray()
        self.snapshot_key = None
        self.verified_index = meta.index
        self.vouched = True
        self.advance_commit(chunk.commit_index)
        self.respond_snapshot(chunk, success=True, match_index=meta.index, done=True)

    def respond_snapshot(
        self, chunk: SnapshotChunk, *, success: bool, match_index: int, done: bool
    ) -> None:
        self.core.send_after_persist(
            SnapshotResponse(
                source=self.core.node_id,
                target=chunk.source,
                term=self.core.term,
                round=chunk.round,
                success=success,
                next_offset=len(self.snapshot_buffer) if not done else 0,
                match_index=match_index,
                chunk_offset=chunk.offset,
            )
        )
