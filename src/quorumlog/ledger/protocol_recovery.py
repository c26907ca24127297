"""Ledger recovery without I/O: fence, find the true end, re-write it, close. Reference
001, "客户端故障" (fence, then recover the LAC).

1. Mark the metadata IN_RECOVERY (a compare-and-set: from then on the writer's own
   metadata updates fail, so it can no longer change the ensemble or close).
2. Fence every bookie of the last ensemble (ReadLastAddConfirmed with `fence`). A write set
   counts as fenced once Qf = Qw - Qa + 1 of its bookies answered: the writer can then
   gather at most Qa - 1 acks for any entry. Every write set must be covered.
3. Start after max(the metadata's known LAC, the bookies' LACs): everything up to there
   was acknowledged. A bookie's LAC is a start only when it also returned the length
   there; otherwise it still bounds what must be found.
4. Read forward from the start. An entry any bookie returns is recoverable. An entry that
   Qf bookies of its write set explicitly do not have (answers to reads sent after they
   confirmed the fence, so they never take the writer's add later) cannot have reached
   Qa bookies: recovery ends before it. A timeout or an error is an unknown: asked again,
   never counted as "not here". Reads go out in ranges, so a long tail costs few frames.
5. Re-write every recovered entry with recovery adds (a LedgerWriter in recovery mode; its
   ensemble changes stay local until the close, and the LAC its adds carry stays at the
   start), so each ends on Qa bookies.
6. Close: CLOSED, the last recovered entry and the length, with the re-writer's fragments,
   as one compare-and-set. A conflict with a ledger another recoverer closed adopts that
   close (both are safe, so two recoveries agree on the stored one); any other conflict
   starts over from the current metadata. A CLOSED ledger needs no recovery at all.
"""

from __future__ import annotations

import enum
import itertools
import random as random_module
from dataclasses import dataclass, field

from quorumlog.codec.wire import (
    AddEntriesResult,
    BookieStatus,
    ErrorResponse,
    LastAddConfirmedResult,
    ReadEntries,
    ReadEntriesResult,
    ReadLastAddConfirmed,
)
from quorumlog.errors import (
    BadPasswordError,
    LedgerError,
    LedgerMetadataConflictError,
    LedgerNotFoundError,
    LedgerPendingFullError,
)
from quorumlog.ledger.metadata import LedgerMetadata, LedgerState
from quorumlog.ledger.protocol_actions import (
    BookieAnswer,
    BookieSend,
    LedgerActions,
    LedgerProtocolConfig,
    MetadataCalls,
    MetadataConflict,
    MetadataRead,
    MetadataResult,
    RequestIds,
)
from quorumlog.ledger.protocol_schedule import DistributionSchedule
from quorumlog.ledger.protocol_write import LedgerWriter, WriterState
from quorumlog.raft.invariants import InvariantViolation, require


class RecoveryPhase(enum.Enum):
    MARKING = "marking"
    FENCING = "fencing"
    RECOVERING = "recovering"
    CLOSING = "closing"
    DONE = "done"
    FAILED = "failed"


@dataclass(slots=True)
class BookieRead:
    """What one bookie of the last ensemble told this recovery."""

    fenced: bool = False
    fence_request_id: int | None = None
    fence_sent_tick: int = 0
    read_request_id: int | None = None
    read_first: int = 0
    read_last: int = 0
    read_after_fence: bool = False
    read_sent_tick: int = 0
    retry_at_tick: int = 0
    covered_through: int = -1
    """Answers after the fence covered this bookie's share up to here (found or missing)."""
    missing: set[int] = field(default_factory=set)
    """Entries (at or after the cursor) this fenced bookie explicitly does not have."""


class LedgerRecovery:
    def __init__(
        self,
        metadata: LedgerMetadata,
        master_key: bytes,
        config: LedgerProtocolConfig,
        *,
        request_ids: RequestIds,
        random: random_module.Random,
    ) -> None:
        config.validate()
        self.master_key = master_key
        self.config = config
        self.request_ids = request_ids
        self.random = random
        self.operation_ids = itertools.count(1)
        self.metadata_calls = MetadataCalls(config.retry_delay_ticks, self.operation_ids)
        self.actions = LedgerActions()
        self.now_tick = 0
        self.restarts = 0
        self.failure: LedgerError | None = None
        self.recovered: LedgerMetadata | None = None
        self.start(metadata)

    # --- phases ------------------------------------------------------------------------

    def start(self, metadata: LedgerMetadata) -> None:
        self.metadata = metadata
        self.schedule = DistributionSchedule(
            metadata.ensemble_size, metadata.write_quorum_size, metadata.ack_quorum_size
        )
        self.ensemble = list(metadata.last_ensemble)
        self.bookies = [BookieRead() for _ in self.ensemble]
        self.lac_answers: list[tuple[int, int]] = []
        """(last_add_confirmed, length) from each fence answer (length -1: not known)."""
        self.writer: LedgerWriter | None = None
        self.found: dict[int, bytes] = {}
        self.cursor = 0
        self.known_acknowledged = -1
        self.recovered_last_entry_id: int | None = None
        self.proposed: LedgerMetadata | None = None
        if metadata.state is LedgerState.CLOSED:
            self.finish(metadata)
        elif metadata.state is LedgerState.OPEN:
            self.phase = RecoveryPhase.MARKING
            self.propose(metadata.updated(state=LedgerState.IN_RECOVERY))
        else:
            self.begin_fencing()

    def propose(self, proposed: LedgerMetadata) -> None:
        self.proposed = proposed
        operation = self.metadata_calls.update(proposed, self.metadata.version)
        self.actions.metadata_operations.append(operation)

    def marked(self, result: MetadataResult) -> None:
        stored = self.stored_or_current(result)
        if stored is None:
            return
        if stored.state is LedgerState.CLOSED:
            self.finish(stored)
        elif stored.state is LedgerState.IN_RECOVERY:
            # Ours, or another recoverer's: either way the writer is shut out.
            self.metadata = stored
            self.begin_fencing()
        else:
            # The writer changed its ensemble first: mark the new metadata.
            self.metadata = stored
            self.ensemble = list(stored.last_ensemble)
            self.bookies = [BookieRead() for _ in self.ensemble]
            self.propose(stored.updated(state=LedgerState.IN_RECOVERY))

    def stored_or_current(self, result: MetadataResult) -> LedgerMetadata | None:
        """The metadata after an update: ours if stored, else the current one (None, after
        failing, when the ledger is gone)."""
        proposed, self.proposed = self.proposed, None
        if isinstance(result, MetadataRead):
            stored = result.metadata
        elif isinstance(result, MetadataConflict) and result.current is not None:
            stored = result.current
        else:
            self.fail(LedgerNotFoundError(self.metadata.ledger_id))
            return None
        require(stored.version >= self.metadata.version, "metadata version went back")
        if proposed is not None and stored == proposed:
            return proposed
        return stored

    def begin_fencing(self) -> None:
        self.phase = RecoveryPhase.FENCING
        self.ensemble = list(self.metadata.last_ensemble)
        self.bookies = [BookieRead() for _ in self.ensemble]
        for index in range(len(self.ensemble)):
            self.send_fence(index)

    def send_fence(self, index: int) -> None:
        bookie = self.bookies[index]
        request_id = self.request_ids()
        bookie.fence_request_id = request_id
        bookie.fence_sent_tick = self.now_tick
        request = ReadLastAddConfirmed(
            request_id, self.metadata.ledger_id, fence=True, master_key=self.master_key
        )
        self.actions.sends.append(BookieSend(self.ensemble[index], request))

    def fenced(self, index: int, answer: LastAddConfirmedResult) -> None:
        bookie = self.bookies[index]
        bookie.fence_request_id = None
        if answer.status is BookieStatus.UNAUTHORIZED:
            self.fail(BadPasswordError(f"bookie {self.ensemble[index]} refused the master key"))
            return
        if answer.status not in (BookieStatus.OK, BookieStatus.FENCED):
            # Not fenced (a bookie that does not know the ledger must fence it anyway,
            # or the writer could still add there): ask again later.
            bookie.retry_at_tick = self.now_tick + self.config.retry_delay_ticks
            return
        bookie.fenced = True
        self.lac_answers.append((answer.last_add_confirmed, answer.length))
        # A late answer still bounds what must be found (its LAC was acknowledged).
        self.known_acknowledged = max(self.known_acknowledged, answer.last_add_confirmed)
        if self.phase is RecoveryPhase.FENCING:
            fenced_positions = {i for i, state in enumerate(self.bookies) if state.fenced}
            if self.schedule.fence_covered(fenced_positions):
                self.begin_recovering()

    def begin_recovering(self) -> None:
        metadata = self.metadata
        start = metadata.known_last_add_confirmed
        length = metadata.length_before_last_fragment
        self.known_acknowledged = start
        for last_add_confirmed, length_there in self.lac_answers:
            self.known_acknowledged = max(self.known_acknowledged, last_add_confirmed)
            if last_add_confirmed > start and length_there >= 0:
                start, length = last_add_confirmed, length_there
        self.phase = RecoveryPhase.RECOVERING
        self.cursor = start + 1
        self.writer = LedgerWriter(
            metadata,
            self.master_key,
            self.config,
            request_ids=self.request_ids,
            random=self.random,
            last_add_confirmed=start,
            length=length,
            recovery=True,
            operation_ids=self.operation_ids,
        )
        self.pump()

    # --- reading forward -----------------------------------------------------------------

    def pump(self) -> None:
        """Feed found entries to the re-writer in order, decide the cursor, ask for more."""
        writer = self.writer
        if self.phase is not RecoveryPhase.RECOVERING or writer is None:
            return
        if self.recovered_last_entry_id is None:
            self.advance_cursor(writer)
            if self.cursor_unrecoverable():
                self.recovered_last_entry_id = self.cursor - 1
                self.found.clear()
            else:
                for index in range(len(self.bookies)):
                    self.maybe_read(index)
        self.maybe_close(writer)

    def advance_cursor(self, writer: LedgerWriter) -> None:
        moved = False
        while self.cursor in self.found and writer.failure is None:
            try:
                entry_id = writer.append(self.found[self.cursor])
            except LedgerPendingFullError:
                break  # the re-writer is full: go on once its adds are acknowledged
            require(entry_id == self.cursor, "the re-writer's entry ids follow the cursor")
            del self.found[self.cursor]
            self.cursor += 1
            moved = True
        if moved:
            for bookie in self.bookies:
                bookie.missing = {entry for entry in bookie.missing if entry >= self.cursor}

    def cursor_unrecoverable(self) -> bool:
        cursor = self.cursor
        if cursor <= self.known_acknowledged or cursor in self.found:
            return False
        not_here = sum(
            1
            for position in self.schedule.write_set(cursor)
            if self.bookies[position].fenced and cursor in self.bookies[position].missing
        )
        return not_here >= self.schedule.fence_quorum_size

    def maybe_read(self, index: int) -> None:
        bookie = self.bookies[index]
        if bookie.read_request_id is not None or self.now_tick < bookie.retry_at_tick:
            return
        if self.cursor in bookie.missing:
            return  # this bookie already said; wait for the others
        first = max(self.cursor, bookie.covered_through + 1)
        while not self.schedule.holds(index, first):
            first += 1
        read_entries_max = self.config.read_entries_max
        if first - self.cursor >= read_entries_max:
            return  # far enough ahead of the cursor
        request_id = self.request_ids()
        last = first + read_entries_max - 1
        bookie.read_request_id = request_id
        bookie.read_first, bookie.read_last = first, last
        bookie.read_after_fence = bookie.fenced
        bookie.read_sent_tick = self.now_tick
        request = ReadEntries(
            request_id, self.metadata.ledger_id, first, last, self.config.read_bytes_max
        )
        self.actions.sends.append(BookieSend(self.ensemble[index], request))

    def read_answered(self, index: int, answer: ReadEntriesResult) -> None:
        bookie = self.bookies[index]
        bookie.read_request_id = None
        if self.recovered_last_entry_id is not None:
            return  # the end is decided; late answers change nothing
        if not bookie.read_after_fence:
            # Only entries it returned count (found); pace the reads of an unfenced bookie.
            bookie.retry_at_tick = self.now_tick + self.config.retry_delay_ticks
        first, last = bookie.read_first, bookie.read_last
        status = answer.status
        in_range = [entry for entry in answer.entries if first <= entry.entry_id <= last]
        if status is BookieStatus.OK and in_range:
            returned = set()
            for entry in in_range:
                if entry.entry_id >= self.cursor:
                    self.found.setdefault(entry.entry_id, entry.data)
                returned.add(entry.entry_id)
            through = max(returned)
            not_returned = range(max(first, self.cursor), through)
            self.record_missing(index, [e for e in not_returned if e not in returned], through)
        elif status is BookieStatus.NO_SUCH_ENTRY:
            self.record_missing(index, [first], first)
        elif status is BookieStatus.NO_SUCH_LEDGER:
            self.record_missing(index, list(range(max(first, self.cursor), last + 1)), last)
        else:
            # An error, or an empty OK: an unknown, never a "not here".
            bookie.retry_at_tick = self.now_tick + self.config.retry_delay_ticks

    def record_missing(self, index: int, entry_ids: list[int], through: int) -> None:
        """Count "not here"s only from reads sent after the bookie confirmed the fence."""
        bookie = self.bookies[index]
        if not bookie.read_after_fence:
            return
        holds = self.schedule.holds
        bookie.missing.update(
            entry for entry in entry_ids if entry >= self.cursor and holds(index, entry)
        )
        bookie.covered_through = max(bookie.covered_through, through)

    # --- close ---------------------------------------------------------------------------

    def maybe_close(self, writer: LedgerWriter) -> None:
        last = self.recovered_last_entry_id
        if last is None or writer.state is not WriterState.WRITING:
            return
        if writer.last_add_confirmed < last:
            return  # re-writes still in flight
        require(writer.last_add_confirmed == last, "re-wrote beyond the recovered end")
        self.phase = RecoveryPhase.CLOSING
        self.propose(
            self.metadata.updated(
                state=LedgerState.CLOSED,
                last_entry_id=last,
                length=writer.length_confirmed,
                ensembles=writer.ensembles,
                length_before_last_fragment=writer.length_before_last_fragment,
            )
        )

    def closed(self, result: MetadataResult) -> None:
        stored = self.stored_or_current(result)
        if stored is None:
            return
        if stored.state is LedgerState.CLOSED:
            self.finish(stored)
            return
        # Changed under us but not closed: start over from what is there now.
        self.restarts += 1
        if self.restarts > self.config.recovery_restarts_max:
            self.fail(
                LedgerMetadataConflictError(stored.ledger_id, self.metadata.version, stored.version)
            )
            return
        self.start(stored)

    def finish(self, metadata: LedgerMetadata) -> None:
        require(metadata.state is LedgerState.CLOSED, "recovery ends with a closed ledger")
        self.phase = RecoveryPhase.DONE
        self.recovered = metadata
        self.metadata = metadata
        self.writer = None
        self.actions.closed = metadata

    def fail(self, error: LedgerError) -> None:
        if self.phase in (RecoveryPhase.DONE, RecoveryPhase.FAILED):
            return
        self.phase = RecoveryPhase.FAILED
        self.failure = error
        self.actions.failure = error
        self.writer = None
        self.metadata_calls.cancel()

    # --- events ----------------------------------------------------------------------------

    def receive(self, bookie_id: str, answer: BookieAnswer) -> None:
        if isinstance(answer, AddEntriesResult):
            if self.writer is not None:
                self.writer.receive(bookie_id, answer)
                self.pump()
            return
        index = self.position_of(answer.request_id, bookie_id)
        if index is None:
            return
        if isinstance(answer, ErrorResponse):
            self.request_lost(index)  # an unknown: asked again after the retry delay
        elif isinstance(answer, LastAddConfirmedResult):
            self.fenced(index, answer)
        else:
            self.read_answered(index, answer)
        self.pump()

    def position_of(self, request_id: int, bookie_id: str) -> int | None:
        for index, bookie in enumerate(self.bookies):
            if request_id in (bookie.fence_request_id, bookie.read_request_id):
                if self.ensemble[index] != bookie_id:
                    raise InvariantViolation("an answer from another bookie than asked")
                return index
        return None

    def bookie_unreachable(self, bookie_id: str) -> None:
        for index, bookie_of_position in enumerate(self.ensemble):
            if bookie_of_position == bookie_id:
                self.request_lost(index)
        if self.writer is not None:
            self.writer.bookie_unreachable(bookie_id)
        self.pump()

    def request_lost(self, index: int) -> None:
        bookie = self.bookies[index]
        if bookie.fence_request_id is None and bookie.read_request_id is None:
            return
        bookie.fence_request_id = None
        bookie.read_request_id = None
        bookie.retry_at_tick = self.now_tick + self.config.retry_delay_ticks

    def tick(self) -> None:
        self.now_tick += 1
        timeout_ticks = self.config.request_timeout_ticks
        for index, bookie in enumerate(self.bookies):
            fence_late = (
                bookie.fence_request_id is not None
                and self.now_tick - bookie.fence_sent_tick >= timeout_ticks
            )
            read_late = (
                bookie.read_request_id is not None
                and self.now_tick - bookie.read_sent_tick >= timeout_ticks
            )
            if fence_late or read_late:
                self.request_lost(index)
        if self.phase in (RecoveryPhase.FENCING, RecoveryPhase.RECOVERING):
            # Keep fencing the rest: their "not here"s count only once they are fenced.
            for index, bookie in enumerate(self.bookies):
                idle = bookie.fence_request_id is None and bookie.read_request_id is None
                if not bookie.fenced and idle and self.now_tick >= bookie.retry_at_tick:
                    self.send_fence(index)
        if self.writer is not None:
            self.writer.tick()
        operation = self.metadata_calls.due(self.now_tick)
        if operation is not None:
            self.actions.metadata_operations.append(operation)
        self.pump()

    def metadata_result(self, result: MetadataResult) -> None:
        accepted = self.metadata_calls.accept(result, self.now_tick)
        if accepted is None:
            if self.writer is not None:
                self.writer.metadata_result(result)
                self.pump()
            return
        if self.phase is RecoveryPhase.MARKING:
            self.marked(accepted)
        elif self.phase is RecoveryPhase.CLOSING:
            self.closed(accepted)

    def take_actions(self) -> LedgerActions:
        writer = self.writer
        if writer is not None:
            written = writer.take_actions()
            self.actions.sends.extend(written.sends)
            self.actions.metadata_operations.extend(written.metadata_operations)
            if written.failure is not None:
                self.fail(written.failure)
        actions, self.actions = self.actions, LedgerActions()
        return actions
