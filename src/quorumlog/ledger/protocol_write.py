"""The writer's protocol (a WriteHandle without I/O): adds, acks in entry order, ensemble
changes, fencing and close. Reference 001, "数据写入" through "EnsembleChange".

Entry ids are assigned here, contiguous from the first. Entry e goes to the write set of its
fragment's ensemble (protocol_schedule.py); the LAC rides on every AddEntries frame. Each
position keeps a watermark: the highest entry id through which that bookie acknowledged
every entry of its share (one bookie answers frames in any order, so a frame's ack raises the
watermark only once every earlier frame there was answered). The LAC is then a function of
the E watermarks, computed per answer, not per entry.

A bookie that fails (an error, a timeout, a lost connection) is replaced:

- at once when an entry it holds is still short of its ack quorum;
- otherwise (every entry it held had its quorum, as can happen when Qa < Qw) before the next
  entries are sent, as 001 describes.

A change records a new fragment starting at LAC + 1 with one compare-and-set on the
metadata; the LAC does not move while it is in flight (BookKeeper defers add completions
the same way: an entry acknowledged through a bookie the metadata does not list yet would
be lost to a reader of the metadata). Once stored, the new bookie gets the entries of its
share from the fragment's first entry, its watermark starts just below it, and acks from
the replaced bookie no longer count. A conflict whose current metadata is no longer OPEN
means a recoverer fenced the ledger: the handle fails with LedgerFencedError, as it does on
a FENCED answer. No ack beyond the point a recovery found is ever reported: an entry that
reached Qa bookies is found by any recovery (Qf "not here"s from its write set are
impossible), and entries are only reported in order.

In recovery mode (a recoverer re-writing what it found) adds carry `recovery=True` and an
ensemble change is kept in this writer (`local_ensembles`) instead of being stored: the
recoverer stores them with the close, so a concurrent recoverer never sees a fragment whose
new bookie has only part of what was re-written (BookKeeper does the same since 4.9). The
LAC its adds carry stays where recovery started: re-written entries are recovered, not
acknowledged, and a concurrent recoverer may close the ledger before them, so a bookie's
stored LAC (which readers without recovery trust) must not name them.
"""

from __future__ import annotations

import enum
import random as random_module
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from quorumlog.codec.wire import (
    AddEntries,
    AddEntriesResult,
    BookieStatus,
    ErrorResponse,
    LedgerEntryData,
)
from quorumlog.errors import (
    BadPasswordError,
    BookieRejectedError,
    LedgerClosedError,
    LedgerError,
    LedgerFencedError,
    LedgerMetadataConflictError,
    LedgerNotFoundError,
    NotEnoughBookiesError,
)
from quorumlog.ledger.metadata import LedgerMetadata, LedgerState
from quorumlog.ledger.placement import replace_bookies
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
    WritableBookies,
)
from quorumlog.ledger.protocol_schedule import DistributionSchedule
from quorumlog.ledger.protocol_write_buffer import EntryBuffer
from quorumlog.raft.invariants import InvariantViolation, require


class WriterState(enum.Enum):
    WRITING = "writing"
    CHANGING_ENSEMBLE = "changing_ensemble"
    CLOSING = "closing"
    """The CLOSED metadata is being stored."""
    CLOSED = "closed"
    FAILED = "failed"


@dataclass(slots=True)
class InflightAdd:
    request_id: int | None
    """None: the frame had nothing for this position; it counts as answered at once."""
    through_entry_id: int
    """Once answered (and all before it), the position holds its share through here."""
    sent_tick: int
    answered: bool = False


@dataclass(slots=True)
class Position:
    bookie_id: str
    watermark: int
    inflight: deque[InflightAdd] = field(default_factory=deque)
    failed: bool = False


class LedgerWriter:
    def __init__(
        self,
        metadata: LedgerMetadata,
        master_key: bytes,
        config: LedgerProtocolConfig,
        *,
        request_ids: RequestIds,
        random: random_module.Random,
        last_add_confirmed: int = -1,
        length: int = 0,
        recovery: bool = False,
        operation_ids: Iterator[int] | None = None,
    ) -> None:
        """A writer whose next entry is `last_add_confirmed + 1` (0 for a new ledger; a
        recoverer passes where its re-writes start and the length before them)."""
        config.validate()
        require(
            metadata.last_fragment_first_entry <= last_add_confirmed + 1,
            "a writer starts inside its last fragment",
        )
        expected_state = LedgerState.IN_RECOVERY if recovery else LedgerState.OPEN
        require(metadata.state is expected_state, f"a writer needs {expected_state} metadata")
        self.metadata = metadata
        self.master_key = master_key
        self.config = config
        self.request_ids = request_ids
        self.random = random
        self.recovery = recovery
        self.schedule = DistributionSchedule(
            metadata.ensemble_size, metadata.write_quorum_size, metadata.ack_quorum_size
        )
        self.ensemble = list(metadata.last_ensemble)
        self.local_ensembles: dict[int, list[str]] = {}
        """Fragments a recovery-mode writer started (stored by the recoverer at close)."""
        self.length_before_last_fragment = metadata.length_before_last_fragment
        self.positions = [Position(bookie, last_add_confirmed) for bookie in self.ensemble]
        self.requests: dict[int, tuple[int, InflightAdd]] = {}
        self.state = WriterState.WRITING
        self.failure: LedgerError | None = None
        self.close_requested = False
        self.last_add_confirmed = last_add_confirmed
        self.length_confirmed = length
        self.announced_last_add_confirmed = last_add_confirmed
        self.announced_length = length
        """The LAC (and length) that rides on adds. A recovery-mode writer keeps announcing
        where it started: the entries it re-writes are recovered, not acknowledged, and a
        concurrent recoverer may still close the ledger before them; a bookie's LAC must
        only ever name acknowledged entries (readers without recovery trust it)."""
        self.sent_through = last_add_confirmed
        self.buffer = EntryBuffer(metadata.ledger_id, last_add_confirmed + 1, length, config)
        self.failed_bookies: dict[str, int] = {}
        """Bookies that failed this writer, and the tick they failed at (quarantine)."""
        self.replace_positions: set[int] = set()
        self.changing_positions: set[int] = set()
        self.change_attempts = 0
        self.proposed: LedgerMetadata | None = None
        self.metadata_calls = MetadataCalls(config.retry_delay_ticks, operation_ids)
        self.now_tick = 0
        self.actions = LedgerActions()

    # --- commands ----------------------------------------------------------------------

    def append(self, data: bytes) -> int:
        """Queue one entry; returns its id. It goes out with the next `take_actions`."""
        return self.buffer.append(data)

    def append_many(self, datas: Sequence[bytes]) -> int:
        """Queue entries in order (all or none); returns the first id."""
        return self.buffer.append_many(datas)

    def close(self) -> None:
        """Close once every appended entry is acknowledged: store CLOSED metadata with the
        last entry id and length. Appends fail from now on. A writer that failed (but was
        not fenced) closes at its LAC."""
        if self.recovery:
            raise ValueError("a recovery-mode writer is closed by its recoverer")
        self.close_requested = True
        if self.buffer.refusal is None:
            self.buffer.refusal = LedgerClosedError(f"ledger {self.metadata.ledger_id} is closed")
        self.maybe_close()

    @property
    def pending_entries(self) -> int:
        return self.buffer.pending_entries

    @property
    def next_entry_id(self) -> int:
        return self.buffer.next_entry_id

    @property
    def ensembles(self) -> dict[int, list[str]]:
        """Every fragment as this writer knows it (local ones of recovery mode included)."""
        first_local = min(self.local_ensembles, default=None)
        kept = {
            first: bookies
            for first, bookies in self.metadata.ensembles.items()
            if first_local is None or first < first_local
        }
        return kept | self.local_ensembles

    # --- events ------------------------------------------------------------------------

    def receive(self, bookie_id: str, answer: BookieAnswer) -> None:
        if not isinstance(answer, AddEntriesResult | ErrorResponse):
            return
        found = self.requests.pop(answer.request_id, None)
        if found is None:
            return
        position_index, record = found
        position = self.positions[position_index]
        require(position.bookie_id == bookie_id, "an add answered by another bookie")
        if isinstance(answer, ErrorResponse):
            self.bookie_failed(position_index)  # it may or may not have stored them
            return
        status = answer.status
        if status is BookieStatus.OK:
            record.answered = True
            self.advance_watermark(position)
            self.update_last_add_confirmed()
        elif status is BookieStatus.FENCED and not self.recovery:
            self.fail(LedgerFencedError(f"ledger {self.metadata.ledger_id} was fenced"))
        elif status is BookieStatus.UNAUTHORIZED:
            self.fail(BadPasswordError(f"bookie {bookie_id} refused the master key"))
        elif status in (BookieStatus.BAD_REQUEST, BookieStatus.TOO_LARGE):
            self.fail(BookieRejectedError(bookie_id, status.value))
        else:
            self.bookie_failed(position_index)

    def bookie_unreachable(self, bookie_id: str) -> None:
        for index, position in enumerate(self.positions):
            if position.bookie_id == bookie_id and position.inflight:
                self.bookie_failed(index)

    def tick(self) -> None:
        self.now_tick += 1
        timeout_ticks = self.config.request_timeout_ticks
        for index, position in enumerate(self.positions):
            # Answered frames leave the front as they are counted, so the front is the
            # oldest one still waiting.
            if position.inflight and self.now_tick - position.inflight[0].sent_tick >= (
                timeout_ticks
            ):
                self.bookie_failed(index)
        operation = self.metadata_calls.due(self.now_tick)
        if operation is not None:
            self.actions.metadata_operations.append(operation)

    def metadata_result(self, result: MetadataResult) -> None:
        accepted = self.metadata_calls.accept(result, self.now_tick)
        if accepted is None:
            return
        if self.state is WriterState.CHANGING_ENSEMBLE:
            if isinstance(accepted, WritableBookies):
                self.replacements_found(accepted.bookie_ids)
            else:
                self.change_stored(accepted)
        elif self.state is WriterState.CLOSING:
            self.close_stored(accepted)

    def take_actions(self) -> LedgerActions:
        if self.state is WriterState.WRITING:
            self.send_new_entries()
        actions, self.actions = self.actions, LedgerActions()
        return actions

    # --- adds and acks -----------------------------------------------------------------

    def send_new_entries(self) -> None:
        if self.sent_through + 1 >= self.next_entry_id:
            return
        if self.replace_positions:
            # Replace a bookie that failed after its entries' quorums before sending more.
            self.start_ensemble_change()
            return
        window = self.config.inflight_requests_max
        while self.sent_through + 1 < self.next_entry_id:
            if any(len(position.inflight) >= window for position in self.positions):
                return
            last = self.frame_end(self.sent_through + 1, self.next_entry_id - 1)
            self.send_range(self.sent_through + 1, last, range(len(self.positions)))
            self.sent_through = last

    def frame_end(self, first: int, last: int) -> int:
        config = self.config
        return self.buffer.frame_end(first, last, config.batch_entries_max, config.batch_bytes_max)

    def send_range(self, first: int, last: int, position_indexes: range | list[int]) -> None:
        """Send entries first..last to the given positions, each its share, one frame each."""
        batch = self.buffer.slice(first, last)
        for index in position_indexes:
            self.send_share(index, self.schedule.share(index, first, batch), last)

    def send_share(self, index: int, share: list[LedgerEntryData], through: int) -> None:
        position = self.positions[index]
        if not share:
            position.inflight.append(InflightAdd(None, through, self.now_tick, answered=True))
            self.advance_watermark(position)
            return
        request_id = self.request_ids()
        record = InflightAdd(request_id, through, self.now_tick)
        position.inflight.append(record)
        self.requests[request_id] = (index, record)
        frame = AddEntries(
            request_id=request_id,
            ledger_id=self.metadata.ledger_id,
            master_key=self.master_key,
            last_add_confirmed=self.announced_last_add_confirmed,
            entries=share,
            recovery=self.recovery,
            length=self.announced_length,
        )
        self.actions.sends.append(BookieSend(position.bookie_id, frame))

    def advance_watermark(self, position: Position) -> None:
        inflight = position.inflight
        while inflight and inflight[0].answered:
            position.watermark = inflight.popleft().through_entry_id

    def update_last_add_confirmed(self) -> None:
        if self.state is not WriterState.WRITING:
            return  # frozen during an ensemble change; no acks after failing or closing
        watermarks = [position.watermark for position in self.positions]
        frontier = self.schedule.acknowledged_frontier(watermarks, self.last_add_confirmed)
        if frontier <= self.last_add_confirmed:
            return
        require(frontier <= self.sent_through, "an ack beyond what was sent")
        self.buffer.acknowledge(frontier)
        self.last_add_confirmed = frontier
        self.length_confirmed = self.buffer.length_acknowledged
        if not self.recovery:
            self.announced_last_add_confirmed = frontier
            self.announced_length = self.length_confirmed
        self.actions.last_add_confirmed = frontier
        self.maybe_close()

    # --- failures and ensemble changes -------------------------------------------------

    def bookie_failed(self, index: int) -> None:
        position = self.positions[index]
        if position.failed or self.state in (WriterState.CLOSED, WriterState.FAILED):
            return
        position.failed = True
        self.failed_bookies[position.bookie_id] = self.now_tick
        for record in position.inflight:
            if record.request_id is not None:
                self.requests.pop(record.request_id, None)
        position.inflight.clear()
        self.replace_positions.add(index)
        if self.state is WriterState.WRITING and self.short_of_quorum(index, position):
            self.start_ensemble_change()

    def short_of_quorum(self, index: int, position: Position) -> bool:
        """Whether the failed position holds an entry it did not acknowledge that is still
        waiting for its quorum (then replace it now, else before the next send)."""
        first = max(self.last_add_confirmed, position.watermark) + 1
        last = min(self.sent_through, first + self.schedule.ensemble_size - 1)
        return any(self.schedule.holds(index, entry_id) for entry_id in range(first, last + 1))

    def start_ensemble_change(self) -> None:
        self.state = WriterState.CHANGING_ENSEMBLE
        self.change_attempts = 0
        self.actions.metadata_operations.append(self.metadata_calls.list_bookies())

    def replacements_found(self, writable_bookies: list[str]) -> None:
        quarantined = {
            bookie_id
            for bookie_id, failed_tick in self.failed_bookies.items()
            if self.now_tick - failed_tick < self.config.quarantine_ticks
        }
        try:
            try:
                ensemble = replace_bookies(
                    self.ensemble,
                    self.replace_positions,
                    writable_bookies,
                    self.random,
                    exclude=quarantined,
                )
            except NotEnoughBookiesError:
                # Better a bookie that failed a while ago than no writes at all.
                ensemble = replace_bookies(
                    self.ensemble, self.replace_positions, writable_bookies, self.random
                )
        except NotEnoughBookiesError as error:
            self.change_attempts += 1
            if self.change_attempts >= self.config.ensemble_change_attempts_max:
                self.fail(error)
                return
            self.metadata_calls.list_bookies()
            self.metadata_calls.retry_later(self.now_tick)
            return
        self.changing_positions = set(self.replace_positions)
        first_entry = self.last_add_confirmed + 1
        if self.recovery:
            self.local_ensembles[first_entry] = ensemble
            self.length_before_last_fragment = self.length_confirmed
            self.adopt_ensemble(first_entry, ensemble)
            return
        ensembles = dict(self.metadata.ensembles)
        ensembles[first_entry] = ensemble
        self.proposed = self.metadata.updated(
            ensembles=ensembles, length_before_last_fragment=self.length_confirmed
        )
        operation = self.metadata_calls.update(self.proposed, self.metadata.version)
        self.actions.metadata_operations.append(operation)

    def change_stored(self, result: MetadataResult) -> None:
        proposed = self.take_proposal()
        if isinstance(result, MetadataConflict) and result.current != proposed:
            self.follow_conflict(result.current, proposed)
            return
        # A conflict with exactly our proposal is our own update, stored by an attempt
        # whose answer was lost.
        stored = result.metadata if isinstance(result, MetadataRead) else proposed
        require(stored.version > self.metadata.version, "metadata version went back")
        self.metadata = stored
        self.length_before_last_fragment = stored.length_before_last_fragment
        first_entry = self.last_add_confirmed + 1
        self.adopt_ensemble(first_entry, stored.ensembles[first_entry])

    def take_proposal(self) -> LedgerMetadata:
        proposed, self.proposed = self.proposed, None
        if proposed is None:
            raise InvariantViolation("a metadata result without a proposal")
        return proposed

    def follow_conflict(self, current: LedgerMetadata | None, proposed: LedgerMetadata) -> None:
        """Someone else changed the metadata first: fenced (recovery began or the ledger
        closed), deleted, or a change that kept the ledger OPEN (then try again on it)."""
        error = self.conflict_error(current, proposed)
        if error is not None:
            self.fail(error)
            return
        if current is None:
            raise InvariantViolation("a deleted ledger must end the handle")
        self.metadata = current
        self.start_ensemble_change()

    def conflict_error(
        self, current: LedgerMetadata | None, proposed: LedgerMetadata
    ) -> LedgerError | None:
        """Why a conflict ends this handle, or None when the update may be tried again on
        `current` (someone changed only what the writer does not own, such as labels)."""
        ledger_id = self.metadata.ledger_id
        if current is None:
            return LedgerNotFoundError(ledger_id)
        require(current.version >= self.metadata.version, "metadata version went back")
        if current.state is not LedgerState.OPEN:
            return LedgerFencedError(f"ledger {ledger_id} is {current.state.value}")
        if current.ensembles != self.metadata.ensembles:
            # Only this writer changes an OPEN ledger's ensembles: a change by anyone else
            # means the ledger is no longer this writer's to write.
            return LedgerMetadataConflictError(ledger_id, proposed.version - 1, current.version)
        return None

    def adopt_ensemble(self, first_entry: int, ensemble: list[str]) -> None:
        """Switch to the new fragment: new bookies start just below it and get their share
        of every entry sent from it on; the replaced bookies' acks there stop counting."""
        require(first_entry == self.last_add_confirmed + 1, "the LAC moved during a change")
        self.ensemble = list(ensemble)
        replaced = sorted(self.changing_positions)
        for index in replaced:
            self.positions[index] = Position(ensemble[index], self.last_add_confirmed)
        self.replace_positions -= self.changing_positions
        self.changing_positions = set()
        self.state = WriterState.WRITING
        first = first_entry
        while first <= self.sent_through:
            last = self.frame_end(first, self.sent_through)
            self.send_range(first, last, replaced)
            first = last + 1
        if any(
            self.short_of_quorum(index, self.positions[index]) for index in self.replace_positions
        ):
            self.start_ensemble_change()
            return
        self.update_last_add_confirmed()

    def fail(self, error: LedgerError) -> None:
        if self.state in (WriterState.CLOSED, WriterState.FAILED):
            return
        self.state = WriterState.FAILED
        self.failure = error
        self.buffer.refusal = error
        self.actions.failure = error
        self.requests.clear()
        for position in self.positions:
            position.inflight.clear()
        self.metadata_calls.cancel()
        self.maybe_close()

    # --- close -------------------------------------------------------------------------

    def maybe_close(self) -> None:
        if not self.close_requested or self.recovery:
            return
        if self.state is WriterState.WRITING:
            if self.last_add_confirmed < self.next_entry_id - 1:
                return  # wait for the entries in flight
        elif self.state is WriterState.FAILED:
            if isinstance(self.failure, LedgerFencedError | LedgerNotFoundError):
                return  # the ledger is someone else's now (or gone): nothing to close
        else:
            return
        self.state = WriterState.CLOSING
        self.proposed = self.metadata.updated(
            state=LedgerState.CLOSED,
            last_entry_id=self.last_add_confirmed,
            length=self.length_confirmed,
        )
        operation = self.metadata_calls.update(self.proposed, self.metadata.version)
        self.actions.metadata_operations.append(operation)

    def close_stored(self, result: MetadataResult) -> None:
        proposed = self.take_proposal()
        stored = result.metadata if isinstance(result, MetadataRead) else proposed
        if isinstance(result, MetadataConflict):
            current = result.current
            if current is None or current.state is not LedgerState.CLOSED:
                self.close_conflicted(current, proposed)
                return
            if current.last_entry_id != self.last_add_confirmed:
                # Closed by a recoverer at another entry: this writer was fenced.
                self.close_failed(LedgerFencedError(f"ledger {current.ledger_id} was recovered"))
                return
            stored = current  # closed where this writer would have closed it
        require(stored.version > self.metadata.version, "metadata version went back")
        self.metadata = stored
        self.state = WriterState.CLOSED
        self.actions.closed = stored

    def close_conflicted(self, current: LedgerMetadata | None, proposed: LedgerMetadata) -> None:
        error = self.conflict_error(current, proposed)
        if error is not None:
            self.close_failed(error)
            return
        if current is None:
            raise InvariantViolation("a deleted ledger must end the handle")
        self.metadata = current
        self.state = WriterState.WRITING if self.failure is None else WriterState.FAILED
        self.maybe_close()

    def close_failed(self, error: LedgerError) -> None:
        """The close cannot happen: report it even if the handle failed before."""
        self.state = WriterState.FAILED
        self.failure = error
        self.buffer.refusal = error
        self.actions.failure = error
