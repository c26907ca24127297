"""The leader's side: per-follower replication states, commit, reads and transfer.

One `Progress` per follower walks DLedger's states (reference 000 §3):
COMPARE finds the match point with fast backup by term; TRUNCATE drops the follower's
divergent tail; APPEND pipelines batches within a bounded window and goes back to COMPARE
on a gap, a mismatch or a timeout; INSTALL_SNAPSHOT ships a snapshot in chunks when the
entries a follower needs were compacted. The commit index is the quorum match index
(median of the watermarks), advanced only for an entry of the current term (§5.4.2).
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import TYPE_CHECKING

from quorumlog.errors import InvalidConfigurationChangeError, NotLeaderError
from quorumlog.raft.messages import (
    PUSH_APPEND,
    PUSH_COMMIT,
    PUSH_COMPARE,
    PUSH_TRUNCATE,
    Message,
    Push,
    PushKind,
    PushResponse,
    SnapshotChunk,
    SnapshotResponse,
    TimeoutNow,
)
from quorumlog.raft.progress import Progress, ReplicationState
from quorumlog.raft.ready import ReadState
from quorumlog.storage.entry import EntryType, LogEntry

if TYPE_CHECKING:
    from quorumlog.raft.core import RaftCore

COMPARE = ReplicationState.COMPARE
TRUNCATE = ReplicationState.TRUNCATE
APPEND = ReplicationState.APPEND
INSTALL_SNAPSHOT = ReplicationState.INSTALL_SNAPSHOT


LEASE_VOID_TICK = -(10**9)
"""A lease start so far back that the lease is never valid."""


class PendingRead:
    __slots__ = ("index", "request_id", "sequence")

    def __init__(self, request_id: int, index: int, sequence: int) -> None:
        self.request_id = request_id
        self.index = index
        self.sequence = sequence


class LeaderState:
    def __init__(self, core: RaftCore) -> None:
        self.core = core
        self.term = core.term
        self.progress: dict[str, Progress] = {}
        self.rounds = itertools.count(1)
        self.heartbeat_elapsed = 0
        self.check_quorum_elapsed = 0
        self.read_sequence = 0
        self.sequence_sent_tick: dict[int, int] = {}
        """Read sequences not yet confirmed by a quorum (and the newest confirmed one), with
        the tick each went out at: a lease runs from the send of a confirmed heartbeat."""
        self.lease_start_tick = LEASE_VOID_TICK
        self.timeout_now_sent = False
        """Once a TimeoutNow went out, the target may win an election at any moment of this
        term (voters ignore their lease for it, and the message may be delayed past the
        transfer's deadline): no lease read is safe for the rest of the term."""
        self.pending_reads: list[PendingRead] = []
        self.reads_before_first_commit: list[int] = []
        self.transfer_target: str | None = None
        self.transfer_deadline_tick = 0
        self.uncommitted: deque[tuple[int, int]] = deque()
        self.uncommitted_bytes = 0
        self.configuration_unpersisted_index: int | None = None
        """A configuration entry of ours not yet durable here: no follower gets it (or
        anything after it) before we have it. Otherwise a leader that crashed and lost it
        could leave a follower holding a change that removes that follower, with a longer
        log than any voter of the change: it may not campaign and refuses their votes, and
        the group never elects again (found by seed 102 of the simulator)."""
        self.first_index_of_term = core.log.last_index + 1
        self.replicate_pending = False
        self.heartbeat_due = False
        self.idle_ticks = 0
        """Ticks in a row with every follower caught up and nothing pending (quiescing)."""
        self.idle_watermark = (-1, -1)
        """(last index, commit index) at the last tick: any change restarts `idle_ticks`."""
        self.quiesce_sequence = 0
        self.idle_since_sequence = 0
        """The read sequence when the idle stretch began (see `heard_while_idle`)."""
        """The read sequence of the last quiesce heartbeat: answers to older heartbeats
        arriving late never wake a quiet leader."""
        self.followers_in_order: list[tuple[str, Progress]] = []
        """`sorted(self.progress.items())`, kept (`order_followers`): every tick walks it,
        and a busy node ticks hundreds of leaders."""
        for peer in core.peers():
            self.progress[peer] = self.new_progress()
            self.send_compare(peer, self.progress[peer])
        self.order_followers()

    def order_followers(self) -> None:
        self.followers_in_order = sorted(self.progress.items())

    def new_progress(self) -> Progress:
        progress = Progress(next_index=self.first_index_of_term, rounds=self.rounds)
        progress.enter(COMPARE, self.core.log.last_index)
        progress.recent_active = True
        return progress

    def describe(self) -> dict[str, object]:
        return {peer: repr(p) for peer, p in sorted(self.progress.items())}

    def abandon(self) -> list[int]:
        """Leadership is lost: every read not yet answered fails (the client retries)."""
        failed = [read.request_id for read in self.pending_reads]
        failed.extend(self.reads_before_first_commit)
        self.pending_reads = []
        self.reads_before_first_commit = []
        return failed

    # --- local appends ------------------------------------------------------------------

    def append_local(self, data: bytes, entry_type: EntryType) -> int:
        core = self.core
        index = core.log.last_index + 1
        entry = LogEntry(index=index, term=core.term, data=data, type=entry_type)
        core.log.append([entry])
        if entry_type is EntryType.CONFIGURATION and self.configuration_unpersisted_index is None:
            self.configuration_unpersisted_index = index
        self.uncommitted.append((index, len(data)))
        self.uncommitted_bytes += len(data)
        core.note_appended([entry])
        self.replicate_pending = True
        if not self.progress:
            self.maybe_commit()  # alone: commit once our own write is durable
        return index

    def persisted_through(self, index: int) -> None:
        held = self.configuration_unpersisted_index
        if held is not None and index >= held:
            self.configuration_unpersisted_index = None
            self.replicate_pending = True

    def configuration_changed(self) -> None:
        members = set(self.core.peers())
        for peer in sorted(members - set(self.progress)):
            progress = self.new_progress()
            self.progress[peer] = progress
            self.send_compare(peer, progress)
        for peer in sorted(set(self.progress) - members):
            del self.progress[peer]
            if self.transfer_target == peer:
                self.transfer_target = None
        self.order_followers()

    # --- ticks --------------------------------------------------------------------------

    def tick(self) -> None:
        core = self.core
        config = core.config
        self.heartbeat_elapsed += 1
        if self.heartbeat_elapsed >= config.heartbeat_ticks:
            self.heartbeat_elapsed = 0
            self.heartbeat_due = True
        self.check_quorum_elapsed += 1
        if self.check_quorum_elapsed >= config.election_ticks:
            self.check_quorum_elapsed = 0
            if config.check_quorum and not self.quorum_active():
                core.become_follower(core.term, None)  # §6.2: we may be cut off: step down
                return
            for progress in self.progress.values():
                progress.recent_active = False
        if self.transfer_target is not None and core.ticks >= self.transfer_deadline_tick:
            self.transfer_target = None  # the target never took over: carry on leading
        last_index = core.log.last_index
        for peer, progress in self.followers_in_order:
            if (
                progress.state is APPEND
                and not progress.inflight
                and progress.next_index > last_index
            ):
                continue  # caught up, nothing in flight: nothing to time out or send
            self.retry_if_timed_out(peer, progress)
        if config.quiesce_idle_ticks:
            self.maybe_quiesce()
        if self.heartbeat_due and core.send_heartbeats_at_once:
            self.heartbeat_due = False  # sent now, not by the next Ready's `flush`
            self.broadcast_heartbeat(at_once=True)

    # --- quiet groups -------------------------------------------------------------------

    def maybe_quiesce(self) -> None:
        """Go quiet after `quiesce_idle_ticks` idle ticks: tell the followers with one last
        heartbeat (it carries our last index and commit index, so each can tell whether it
        has everything), and want no more ticks."""
        core = self.core
        watermark = (core.log.last_index, core.commit_index)
        if watermark != self.idle_watermark or not self.idle():
            self.idle_watermark = watermark
            self.idle_ticks = 0
            self.idle_since_sequence = self.read_sequence
            return
        self.idle_ticks += 1
        if self.idle_ticks < core.config.quiesce_idle_ticks or not self.heard_while_idle():
            return
        self.heartbeat_due = False
        self.broadcast_heartbeat(quiesce=True)
        self.quiesce_sequence = self.read_sequence
        core.quiet = True

    def idle(self) -> bool:
        """Nothing in flight, and every follower holds our whole log (durable here too)."""
        core = self.core
        log = core.log
        last_index = log.last_index
        if (
            core.commit_index != last_index
            or log.persisted_index != last_index
            or self.pending_reads
            or self.reads_before_first_commit
            or self.transfer_target is not None
            or self.configuration_unpersisted_index is not None
            or self.replicate_pending
        ):
            return False
        return all(
            progress.state is APPEND
            and progress.match_index == last_index
            and not progress.inflight
            for progress in self.progress.values()
        )

    def heard_while_idle(self) -> bool:
        """Every follower answered a heartbeat sent since we became idle: a leader cut off
        from its followers must stay awake, so that check-quorum steps it down. (A slow
        answer only delays quiescing; it does not restart the idle count.)"""
        since = self.idle_since_sequence
        return all(progress.read_sequence_acked > since for progress in self.progress.values())

    def keeps_quiet(self, message: Message) -> bool:
        """Does `message` leave a quiet leader quiet? Only an answer to a heartbeat that
        changes nothing: a follower that went quiet too, or a late answer to an older
        heartbeat. Anything else (a follower that could not go quiet, a vote request, a
        follower that forgot what it acknowledged) needs the leader awake."""
        if not isinstance(message, PushResponse) or message.kind is not PUSH_COMMIT:
            return False
        progress = self.progress.get(message.source)
        return (
            progress is not None
            and message.term == self.term
            and message.success
            and message.match_index == progress.match_index
            and (message.quiet or message.read_sequence < self.quiesce_sequence)
        )

    def wake(self) -> None:
        """Back from quiet. Ticks stood still meanwhile, so nothing measured in ticks from
        before can be trusted: the lease is void (and no answer to an older heartbeat may
        start one), the check-quorum window starts afresh, and a heartbeat goes out now."""
        self.lease_start_tick = LEASE_VOID_TICK
        self.sequence_sent_tick.clear()
        self.check_quorum_elapsed = 0
        self.heartbeat_elapsed = 0
        self.idle_ticks = 0
        self.idle_since_sequence = self.read_sequence  # only answers from now on count
        for progress in self.progress.values():
            progress.recent_active = True
        self.heartbeat_due = True

    def quorum_active(self) -> bool:
        voters = self.core.configuration.voters
        active = sum(
            1
            for voter in voters
            if voter == self.core.node_id
            or (voter in self.progress and self.progress[voter].recent_active)
        )
        return active >= self.core.configuration.quorum()

    def retry_if_timed_out(self, peer: str, progress: Progress) -> None:
        now = self.core.ticks
        config = self.core.config
        timeout = max(config.append_timeout_ticks, progress.retry_ticks)
        if (
            progress.state is APPEND
            and progress.inflight
            and now - progress.inflight[0][1] >= timeout
        ) or (
            progress.state is not APPEND
            and progress.request_tick is not None
            and now - progress.request_tick >= timeout
        ):
            # Unanswered: back off before the next retry, up to an election timeout.
            progress.retry_ticks = min(2 * timeout, max(config.election_ticks, timeout))
        if progress.state is APPEND:
            if progress.inflight and now - progress.inflight[0][1] >= timeout:
                # Something was lost: find the match point again rather than guess.
                progress.enter(COMPARE, self.core.log.last_index)
                self.send_compare(peer, progress)
            elif not progress.inflight:
                self.send_appends(peer, progress)  # entries waiting and nothing in flight
            return
        if progress.request_tick is None or now - progress.request_tick >= timeout:
            if progress.state is COMPARE:
                self.send_compare(peer, progress)
            elif progress.state is TRUNCATE:
                self.send_truncate(peer, progress)
            else:
                self.send_snapshot_chunk(peer, progress)

    # --- sending ------------------------------------------------------------------------

    def flush(self) -> None:
        """Called once per Ready: coalesce new entries and heartbeats into few pushes.

        A heartbeat due while no read waits and no lease is kept (a leader woken by a
        proposal, say) goes after the new entries, and only to the followers this pass
        pushed nothing at the commit index: a push resets a follower's timer and carries
        the commit index as a heartbeat does (see `broadcast_heartbeat`). A waiting read
        needs its new sequence at every follower: then every follower gets it, first."""
        heartbeat_due = self.heartbeat_due
        self.heartbeat_due = False
        plain = heartbeat_due and not self.pending_reads and not self.core.config.lease_read
        if heartbeat_due and not plain:
            self.broadcast_heartbeat()
        if self.replicate_pending:
            self.replicate_pending = False
            for peer, progress in self.followers_in_order:
                if progress.state is APPEND:
                    self.send_appends(peer, progress)
        if plain:
            self.broadcast_heartbeat(skip_pushed=True)

    def push(self, peer: str, progress: Progress, kind: PushKind, **fields: object) -> Push:
        progress.commit_sent = self.core.commit_index
        progress.sent_tick = self.core.ticks
        return Push(
            source=self.core.node_id,
            target=peer,
            term=self.term,
            kind=kind,
            round=progress.round,
            commit_index=self.core.commit_index,
            read_sequence=self.read_sequence,
            **fields,  # type: ignore[arg-type]
        )

    def send_compare(self, peer: str, progress: Progress) -> None:
        index = progress.next_index - 1
        term = self.core.log.term(index)
        if term is None:
            self.start_snapshot(peer, progress)
            return
        progress.request_tick = self.core.ticks
        self.core.send(self.push(peer, progress, PUSH_COMPARE, index=index, index_term=term))

    def send_truncate(self, peer: str, progress: Progress) -> None:
        index = progress.match_index
        term = self.core.log.term(index)
        if term is None:
            self.start_snapshot(peer, progress)
            return
        progress.request_tick = self.core.ticks
        self.core.send(self.push(peer, progress, PUSH_TRUNCATE, index=index, index_term=term))

    def send_appends(self, peer: str, progress: Progress) -> None:
        core = self.core
        log = core.log
        config = core.config
        while (
            progress.next_index <= log.last_index
            and len(progress.inflight) < config.inflight_appends_max
        ):
            previous_index = progress.next_index - 1
            previous_term = log.term(previous_index)
            if previous_term is None or progress.next_index < log.first_index:
                self.start_snapshot(peer, progress)
                return
            high = min(progress.next_index + config.append_entries_max, log.last_index + 1)
            held = self.configuration_unpersisted_index
            if held is not None:
                high = min(high, held)
                if high <= progress.next_index:
                    return  # sent again once our own copy is durable (`persisted_through`)
            entries = log.entries(progress.next_index, high, config.append_bytes_max)
            core.send(
                self.push(
                    peer,
                    progress,
                    PUSH_APPEND,
                    index=previous_index,
                    index_term=previous_term,
                    entries=entries,
                )
            )
            progress.next_index = entries[-1].index + 1
            progress.inflight.append((entries[-1].index, core.ticks))

    def broadcast_heartbeat(
        self, quiesce: bool = False, at_once: bool = False, skip_pushed: bool = False
    ) -> None:
        """One COMMIT push to every follower with a new read sequence. `at_once`: into
        the core's `outbox_at_once` (a tick's plain heartbeat), else the next Ready.
        `skip_pushed`: not to a follower pushed this tick at our commit index (`flush`).

        Which followers a tick's heartbeat leaves out (`thin`: a tick's heartbeat while no
        read waits and no lease is kept; every other heartbeat goes to every follower and
        wants every answer). The invariant: each follower still gets, from some push, each
        of these within one interval of its own:
        - its election timer reset: some push at least every keepalive interval
          (max(heartbeat_ticks, election_ticks // 5); an election timeout spans five);
        - the commit index: a follower that lacks it gets it at the next tick, or with
          `commit_heartbeat_ticks` once that long has passed since its last push;
        - check-quorum: a follower not heard in this check-quorum window gets every tick's
          heartbeat and must answer it at once (one answer per window suffices);
        - quiescing (`idle_ticks` > 0): a follower that has not answered a heartbeat sent
          since the group went idle gets every tick's heartbeat, wanting an answer
          (`heard_while_idle`); once it answered, only the keepalive and commit rules;
        - a read sequence a waiting read needs, or a lease: never thin (every follower,
          every answer wanted).
        A heard follower in APPEND is asked for no answer while the group is busy: its
        appends answer for themselves, a lost one times out (`retry_if_timed_out`), and a
        follower that cannot vouch for our commit index answers anyway
        (`FollowerState.answer_wanted`). Safety never rests on any of this: a heartbeat
        decides nothing (Raft's safety holds with any heartbeat lost)."""
        core = self.core
        self.read_sequence += 1
        if core.config.lease_read:  # only a lease needs to know when each went out
            self.sequence_sent_tick[self.read_sequence] = core.ticks
        send = core.send_at_once if at_once else core.send
        log = core.log
        commit_index = core.commit_index
        thin = at_once and not self.pending_reads and not core.config.lease_read
        quiescing = self.idle_ticks > 0
        idle_since_sequence = self.idle_since_sequence
        keepalive_ticks = max(core.config.heartbeat_ticks, core.config.election_ticks // 5)
        # With `commit_heartbeat_ticks`, a new commit index alone waits that long after
        # the last push to a follower (a busy group's commit moves every tick, and its
        # followers' heartbeats and their answers were most of a busy node's messages).
        commit_spacing_ticks = core.config.commit_heartbeat_ticks
        now = core.ticks
        node_id = core.node_id
        term = self.term
        read_sequence = self.read_sequence
        for peer, progress in self.followers_in_order:
            heard = progress.recent_active
            if skip_pushed and progress.sent_tick == now and progress.commit_sent == commit_index:
                continue
            if (
                thin
                and heard
                and now - progress.sent_tick < keepalive_ticks
                and (
                    progress.commit_sent == commit_index
                    or now - progress.sent_tick < commit_spacing_ticks
                )
                and not (quiescing and progress.read_sequence_acked <= idle_since_sequence)
            ):
                continue
            if quiesce:
                push = self.push(
                    peer,
                    progress,
                    PUSH_COMMIT,
                    index=log.last_index,
                    index_term=log.last_term(),
                    quiesce=True,
                )
            else:
                # Built here rather than through `push` (its keyword forwarding costs more
                # than the rest of a heartbeat, and a busy node sends thousands a second).
                progress.commit_sent = commit_index
                progress.sent_tick = now
                push = Push(
                    source=node_id,
                    target=peer,
                    term=term,
                    kind=PUSH_COMMIT,
                    round=progress.round,
                    commit_index=commit_index,
                    read_sequence=read_sequence,
                    answer_wanted=not (
                        thin and heard and not quiescing and progress.state is APPEND
                    ),
                )
            send(push)
        self.check_reads()  # alone in the group: every read is confirmed at once

    def start_snapshot(self, peer: str, progress: Progress) -> None:
        progress.enter(INSTALL_SNAPSHOT)
        self.send_snapshot_chunk(peer, progress)

    def send_snapshot_chunk(self, peer: str, progress: Progress) -> None:
        core = self.core
        progress.request_tick = core.ticks
        if core.own_snapshot is None:
            return  # the runtime has not given us one yet; retried on the next timeout
        meta, data = core.own_snapshot
        offset = progress.snapshot_offset
        chunk = data[offset : offset + core.config.snapshot_chunk_bytes_max]
        core.send(
            SnapshotChunk(
                source=core.node_id,
                target=peer,
                term=self.term,
                round=progress.round,
                meta=meta,
                offset=offset,
                data=chunk,
                done=offset + len(chunk) >= len(data),
                commit_index=core.commit_index,
            )
        )

    # --- responses ----------------------------------------------------------------------

    def handle_push_response(self, response: PushResponse) -> None:
        peer = response.source
        progress = self.progress.get(peer)
        if progress is None:
            return
        progress.recent_active = True
        if response.read_sequence > progress.read_sequence_acked:
            progress.read_sequence_acked = response.read_sequence
            self.check_reads()
        if response.round != progress.round:
            return  # an answer to an older round: the state it answers is gone
        progress.retry_ticks = 0  # the link answers within the round: no more backing off
        kind = response.kind
        if kind is PUSH_COMMIT:
            if response.success and response.match_index > progress.match_index:
                progress.acknowledge(response.match_index)
                self.maybe_commit()
                if progress.state is APPEND:
                    self.send_appends(peer, progress)  # the ack may have freed the window
            elif response.match_index < progress.match_index and progress.state is APPEND:
                # The follower no longer vouches for entries it acknowledged (it restarted,
                # so it has not compared its log with ours since): until it does, it takes
                # no commit index from us. COMPARE again; its entries are still durable.
                progress.enter(COMPARE, self.core.log.last_index)
                self.send_compare(peer, progress)
        elif progress.state is COMPARE and kind is PUSH_COMPARE:
            if response.index == progress.next_index - 1:  # else: an answer to an old probe
                self.handle_compare_response(peer, progress, response)
        elif (
            progress.state is TRUNCATE
            and kind is PUSH_TRUNCATE
            and response.index == progress.match_index
        ):
            if response.success:
                self.enter_append(peer, progress)
            else:
                progress.enter(COMPARE, self.core.log.last_index)
                self.send_compare(peer, progress)
        elif progress.state is APPEND and kind is PUSH_APPEND:
            if response.success:
                progress.acknowledge(response.match_index)
                self.maybe_commit()
                self.send_appends(peer, progress)
            else:
                progress.enter(COMPARE, self.core.log.last_index)
                self.send_compare(peer, progress)
        self.maybe_finish_transfer(peer, progress)

    def take_heartbeat_answer(self, response: PushResponse) -> bool:
        """`handle_push_response` of a heartbeat's answer (this term, we awake) when it
        changes no replication state: the follower is active, its read acknowledgement
        counts (which may confirm reads and start a lease, as usual), and its backoff
        ends. False, changing nothing: the answer moves a match index or concerns a
        transfer's target, so the caller steps it as usual."""
        peer = response.source
        progress = self.progress.get(peer)
        if progress is None:
            return True  # not a member any more: `handle_push_response` ignores it too
        same_round = response.round == progress.round
        if self.transfer_target == peer or (
            same_round and response.match_index != progress.match_index
        ):
            return False
        progress.recent_active = True
        if response.read_sequence > progress.read_sequence_acked:
            progress.read_sequence_acked = response.read_sequence
            self.check_reads()
        if same_round:
            progress.retry_ticks = 0
        return True

    def handle_compare_response(
        self, peer: str, progress: Progress, response: PushResponse
    ) -> None:
        if response.success:
            progress.acknowledge(response.match_index)
            self.maybe_commit()
            if response.end_index > response.match_index:
                progress.state = TRUNCATE  # same round: TRUNCATE answers this COMPARE
                progress.request_tick = None
                self.send_truncate(peer, progress)
            else:
                self.enter_append(peer, progress)
            return
        compared = progress.next_index - 1
        if response.conflict_term == 0:
            candidate = min(response.end_index, compared - 1)
        else:
            log = self.core.log
            ours = log.last_index_of_term(response.conflict_term)
            if ours is not None:
                candidate = ours
            else:
                # We hold no entry of that term — or it was compacted away. Entries at or
                # below our compaction point are committed, so they match on the follower
                # too: never probe below it (probing lower could TRUNCATE committed data).
                floor = log.first_index - 1
                if log.term(floor) is None:
                    floor = log.snapshot_index
                candidate = max(response.conflict_index - 1, floor)
            candidate = min(candidate, compared - 1)
        progress.next_index = max(candidate, 0) + 1
        progress.request_tick = None
        self.send_compare(peer, progress)

    def enter_append(self, peer: str, progress: Progress) -> None:
        progress.enter(APPEND)
        progress.next_index = progress.match_index + 1
        self.send_appends(peer, progress)

    def handle_snapshot_response(self, response: SnapshotResponse) -> None:
        progress = self.progress.get(response.source)
        if progress is None:
            return
        progress.recent_active = True
        if response.round != progress.round or progress.state is not INSTALL_SNAPSHOT:
            return
        if response.success and response.match_index > 0:
            progress.acknowledge(response.match_index)
            self.maybe_commit()
            self.enter_append(response.source, progress)
            return
        if 0 <= response.chunk_offset != progress.snapshot_offset:
            return  # answers a chunk no longer in flight (a duplicate, or late): one stream
        progress.snapshot_offset = response.next_offset
        self.send_snapshot_chunk(response.source, progress)

    # --- commit -------------------------------------------------------------------------

    def maybe_commit(self) -> None:
        core = self.core
        configuration = core.configuration
        node_id = core.node_id
        progress = self.progress
        # A list comprehension, not a generator: this runs on every acknowledgement.
        matches = [
            core.log.persisted_index
            if voter == node_id
            else (progress[voter].match_index if voter in progress else 0)
            for voter in configuration.voters
        ]
        matches.sort()
        quorum_index = matches[len(matches) - configuration.quorum()]
        if quorum_index <= core.commit_index:
            return
        if core.log.term(quorum_index) != core.term:
            return  # §5.4.2: never commit an older term's entry by counting replicas
        core.commit_index = quorum_index
        while self.uncommitted and self.uncommitted[0][0] <= quorum_index:
            self.uncommitted_bytes -= self.uncommitted.popleft()[1]
        self.replicate_pending = True  # followers learn the new commit index promptly
        if self.reads_before_first_commit:
            waiting, self.reads_before_first_commit = self.reads_before_first_commit, []
            for request_id in waiting:
                self.read_index(request_id)
        core.forget_old_configurations()
        if not core.configuration.is_voter(core.node_id) and (
            core.configurations[-1][0] <= core.commit_index
        ):
            core.become_follower(core.term, None)  # we were removed; the change is committed

    # --- reads --------------------------------------------------------------------------

    def read_index(self, request_id: int) -> None:
        """ReadIndex (dissertation §6.4): the commit index now, served once a quorum has
        confirmed we still lead. Until an entry of our term commits, we do not know the
        commit index of the cluster, so the read waits."""
        core = self.core
        if core.commit_index < self.first_index_of_term:
            self.reads_before_first_commit.append(request_id)
            return
        if core.config.lease_read and self.lease_valid() and self.transfer_target is None:
            # During a transfer the target may be elected without waiting out the voters'
            # leases, so only a quorum round in this term (ReadIndex) proves we still lead.
            core.read_states.append(ReadState(request_id=request_id, index=core.commit_index))
            return
        self.pending_reads.append(
            PendingRead(request_id, core.commit_index, self.read_sequence + 1)
        )
        self.heartbeat_due = True

    def quorum_acked_sequence(self) -> int:
        """The highest read sequence a quorum of voters has answered (this node answers
        every sequence it sent): the quorum-th highest acknowledgement, one sort of the
        voters rather than one quorum count per outstanding sequence."""
        configuration = self.core.configuration
        node_id = self.core.node_id
        progress = self.progress
        acknowledged = [
            self.read_sequence
            if voter == node_id
            else (progress[voter].read_sequence_acked if voter in progress else 0)
            for voter in configuration.voters
        ]
        acknowledged.sort()
        return acknowledged[len(acknowledged) - configuration.quorum()]

    def check_reads(self) -> None:
        if not self.pending_reads and not self.core.config.lease_read:
            return  # nothing waits for a confirmation and no lease is kept
        confirmed = self.quorum_acked_sequence()
        while self.pending_reads and self.pending_reads[0].sequence <= confirmed:
            read = self.pending_reads.pop(0)
            self.core.read_states.append(ReadState(request_id=read.request_id, index=read.index))
        sent_ticks = self.sequence_sent_tick
        if confirmed in sent_ticks:
            self.lease_start_tick = sent_ticks[confirmed]
            # Sequences go in ascending, so the confirmed ones are at the front.
            while next(iter(sent_ticks)) < confirmed:
                del sent_ticks[next(iter(sent_ticks))]

    def lease_valid(self) -> bool:
        """No other leader can exist before lease start + election timeout: a quorum heard
        us at lease start and will not vote for anyone else within that time (§6.4.1).
        One tick of margin covers a tick boundary falling between send and receipt.
        A transfer breaks the promise: voters grant a TimeoutNow's candidate at once."""
        if self.timeout_now_sent:
            return False
        return self.core.ticks < self.lease_start_tick + self.core.config.election_ticks - 1

    # --- leader transfer ----------------------------------------------------------------

    def transfer(self, target: str) -> None:
        core = self.core
        if target == core.node_id:
            return
        if not core.configuration.is_voter(target):
            raise InvalidConfigurationChangeError(f"cannot transfer leadership to {target}")
        if not core.is_leader:
            raise NotLeaderError(core.node_id, core.leader_id)
        self.transfer_target = target
        timeout = core.config.transfer_timeout_ticks or core.config.election_ticks
        self.transfer_deadline_tick = core.ticks + timeout
        progress = self.progress[target]
        self.maybe_finish_transfer(target, progress)

    def maybe_finish_transfer(self, peer: str, progress: Progress) -> None:
        core = self.core
        if self.transfer_target != peer:
            return
        if progress.match_index == core.log.last_index:
            # The target campaigns with `transfer` set and voters grant it despite our
            # lease, so the lease is void from now on (see `timeout_now_sent`).
            self.lease_start_tick = LEASE_VOID_TICK
            self.timeout_now_sent = True
            core.send(TimeoutNow(source=core.node_id, target=peer, term=self.term))
        elif progress.state is APPEND:
            self.send_appends(peer, progress)
