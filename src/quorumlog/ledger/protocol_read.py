"""Reading a ledger without I/O: entries within the LAC, failing over across write sets, and
the LAC of a ledger opened without recovery. Reference 001, "消费".

`EntryRangeRead` reads entries first..last (all at or below the handle's LAC: an entry
after it may never have been acknowledged, so reading one is an error). It asks in ranges:
one ReadEntries covers up to `read_entries_max` entries, and a bookie answers with every
entry of the range it holds (its share, under striping), so a long read costs few frames.
Each entry is asked first of one bookie of its write set (chunk by chunk, rotating, so
reads spread over the ensemble); an entry a bookie did not return, or an error, moves that
entry to the next bookie of its write set. After `read_rounds_max` rounds over the write
set the read fails with LedgerEntryUnavailableError.

`LastAddConfirmedRead` asks the last ensemble for their LACs without fencing. Every LAC a
bookie stored was acknowledged, so the highest one answered (and never less than the
metadata proves) is a safe end to read to; it waits until every write set has Qf answers
(as BookKeeper's readLastConfirmed does) or every bookie answered or failed.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass

from quorumlog.codec.wire import (
    BookieStatus,
    ErrorResponse,
    LastAddConfirmedResult,
    LedgerEntryData,
    ReadEntries,
    ReadEntriesResult,
    ReadLastAddConfirmed,
)
from quorumlog.errors import LedgerEntryRangeError, LedgerEntryUnavailableError
from quorumlog.ledger.metadata import LedgerMetadata, LedgerState
from quorumlog.ledger.protocol_actions import (
    BookieAnswer,
    BookieSend,
    LedgerActions,
    LedgerProtocolConfig,
    MetadataResult,
    RequestIds,
)
from quorumlog.ledger.protocol_schedule import DistributionSchedule

_READS_PER_BOOKIE_MAX = 4
"""ReadEntries frames a read keeps outstanding at one bookie."""

_LAST_ADD_CONFIRMED_ANSWERS = (
    BookieStatus.OK,
    BookieStatus.FENCED,
    BookieStatus.NO_SUCH_LEDGER,
    BookieStatus.NO_SUCH_ENTRY,
)
"""Answers that tell a bookie's LAC ("no such ledger": it has nothing, so -1)."""


@dataclass(slots=True)
class RangeRequest:
    bookie_id: str
    first: int
    last: int
    sent_tick: int


class EntryRangeRead:
    def __init__(
        self,
        metadata: LedgerMetadata,
        first_entry_id: int,
        last_entry_id: int,
        last_add_confirmed: int,
        config: LedgerProtocolConfig,
        *,
        request_ids: RequestIds,
    ) -> None:
        """LedgerEntryRangeError unless 0 <= first <= last <= last_add_confirmed."""
        config.validate()
        if not 0 <= first_entry_id <= last_entry_id:
            raise LedgerEntryRangeError(f"bad range {first_entry_id}..{last_entry_id}")
        if last_entry_id > last_add_confirmed:
            raise LedgerEntryRangeError(
                f"ledger {metadata.ledger_id}: entry {last_entry_id} is beyond the last add "
                f"confirmed ({last_add_confirmed})"
            )
        self.metadata = metadata
        self.config = config
        self.request_ids = request_ids
        self.schedule = DistributionSchedule(
            metadata.ensemble_size, metadata.write_quorum_size, metadata.ack_quorum_size
        )
        self.fragment_firsts = metadata.fragment_first_entries
        self.fragment_ensembles = [metadata.ensembles[first] for first in self.fragment_firsts]
        self.first = first_entry_id
        self.last = last_entry_id
        count = last_entry_id - first_entry_id + 1
        self.data: list[bytes | None] = [None] * count
        self.attempts = [0] * count
        self.remaining = count
        self.requests: dict[int, RangeRequest] = {}
        self.queue: deque[tuple[int, int]] = deque()
        """Ranges to ask for; each goes to a bookie chosen by its first missing entry."""
        chunk = config.read_entries_max
        for start in range(first_entry_id, last_entry_id + 1, chunk):
            self.queue.append((start, min(start + chunk - 1, last_entry_id)))
        self.busy: dict[str, int] = {}
        self.retry_at_tick: dict[str, int] = {}
        self.now_tick = 0
        self.done = False
        self.actions = LedgerActions()
        self.pump()

    def bookie_for(self, entry_id: int) -> str:
        """The bookie to ask for `entry_id` now: its write set in position order, starting
        at a place that rotates with the chunk, moved on by each failed attempt."""
        fragment = bisect.bisect_right(self.fragment_firsts, entry_id) - 1
        ensemble = self.fragment_ensembles[fragment]
        write_set = self.schedule.sorted_write_sets[entry_id % self.schedule.ensemble_size]
        chunk_index = (entry_id - self.first) // self.config.read_entries_max
        turn = chunk_index + self.attempts[entry_id - self.first]
        return ensemble[write_set[turn % len(write_set)]]

    def pump(self) -> None:
        waiting: deque[tuple[int, int]] = deque()
        while self.queue:
            queued_first, last = self.queue.popleft()
            first = self.first_missing(queued_first, last)
            if first is None:
                continue
            bookie_id = self.bookie_for(first)
            if self.busy.get(
                bookie_id, 0
            ) >= _READS_PER_BOOKIE_MAX or self.now_tick < self.retry_at_tick.get(bookie_id, 0):
                waiting.append((first, last))
                continue
            request_id = self.request_ids()
            self.requests[request_id] = RangeRequest(bookie_id, first, last, self.now_tick)
            self.busy[bookie_id] = self.busy.get(bookie_id, 0) + 1
            request = ReadEntries(
                request_id, self.metadata.ledger_id, first, last, self.config.read_bytes_max
            )
            self.actions.sends.append(BookieSend(bookie_id, request))
        self.queue = waiting

    def first_missing(self, first: int, last: int) -> int | None:
        for entry_id in range(first, last + 1):
            if self.data[entry_id - self.first] is None:
                return entry_id
        return None

    def answered(self, request_id: int, answer: ReadEntriesResult | None) -> None:
        """`answer` None: the request was lost (timeout, connection)."""
        request = self.requests.pop(request_id)
        self.busy[request.bookie_id] -= 1
        first, last = request.first, request.last
        through = last
        in_range = 0
        if answer is not None and answer.status is BookieStatus.OK:
            for entry in answer.entries:
                if first <= entry.entry_id <= last:
                    self.store(entry)
                    in_range += 1
                    through = entry.entry_id
        if answer is not None and answer.status is BookieStatus.NO_SUCH_ENTRY:
            through = first
        elif in_range == 0:
            # An error, a lost request or an empty answer: give this bookie a rest.
            self.retry_at_tick[request.bookie_id] = self.now_tick + self.config.retry_delay_ticks
        if in_range != through - first + 1:
            self.move_on(request.bookie_id, first, through)
        if not self.done:
            self.queue.append((first, last))
            self.finish_or_pump()

    def move_on(self, bookie_id: str, first: int, through: int) -> None:
        """Entries this bookie was asked for and did not return (up to where its answer
        reached) go to the next bookie of their write set."""
        attempts_max = self.schedule.write_quorum_size * self.config.read_rounds_max
        for entry_id in range(first, through + 1):
            offset = entry_id - self.first
            if self.data[offset] is None and self.bookie_for(entry_id) == bookie_id:
                self.attempts[offset] += 1
                if self.attempts[offset] >= attempts_max:
                    self.fail(entry_id)
                    return

    def store(self, entry: LedgerEntryData) -> None:
        offset = entry.entry_id - self.first
        if self.data[offset] is None:
            self.data[offset] = entry.data
            self.remaining -= 1

    def finish_or_pump(self) -> None:
        if self.remaining == 0:
            self.done = True
            self.requests.clear()
            self.queue.clear()
            self.actions.entries = [
                LedgerEntryData(self.first + offset, data)
                for offset, data in enumerate(self.data)
                if data is not None
            ]
            return
        self.pump()

    def fail(self, entry_id: int) -> None:
        self.done = True
        self.requests.clear()
        self.queue.clear()
        self.actions.failure = LedgerEntryUnavailableError(
            f"ledger {self.metadata.ledger_id}: no bookie of entry {entry_id}'s write set "
            "returned it"
        )

    # --- events ------------------------------------------------------------------------

    def receive(self, bookie_id: str, answer: BookieAnswer) -> None:
        request = self.requests.get(answer.request_id)
        if self.done or request is None or request.bookie_id != bookie_id:
            return
        if isinstance(answer, ReadEntriesResult):
            self.answered(answer.request_id, answer)
        elif isinstance(answer, ErrorResponse):
            self.answered(answer.request_id, None)  # an unknown: try elsewhere

    def bookie_unreachable(self, bookie_id: str) -> None:
        for request_id, request in list(self.requests.items()):
            if request.bookie_id == bookie_id and not self.done:
                self.answered(request_id, None)

    def tick(self) -> None:
        self.now_tick += 1
        timeout_ticks = self.config.request_timeout_ticks
        for request_id, request in list(self.requests.items()):
            if self.now_tick - request.sent_tick >= timeout_ticks and not self.done:
                self.answered(request_id, None)
        if not self.done:
            self.pump()

    def metadata_result(self, result: MetadataResult) -> None:
        """Reads ask the metadata nothing."""

    def take_actions(self) -> LedgerActions:
        actions, self.actions = self.actions, LedgerActions()
        return actions


class LastAddConfirmedRead:
    def __init__(
        self, metadata: LedgerMetadata, config: LedgerProtocolConfig, *, request_ids: RequestIds
    ) -> None:
        config.validate()
        self.metadata = metadata
        self.config = config
        self.schedule = DistributionSchedule(
            metadata.ensemble_size, metadata.write_quorum_size, metadata.ack_quorum_size
        )
        self.ensemble = list(metadata.last_ensemble)
        self.last_add_confirmed = metadata.known_last_add_confirmed
        self.requests: dict[int, tuple[int, int]] = {}
        """request id -> (position, sent tick)."""
        self.answered_positions: set[int] = set()
        self.settled_positions: set[int] = set()
        """Positions that answered or failed."""
        self.now_tick = 0
        self.done = False
        self.actions = LedgerActions()
        if metadata.state is LedgerState.CLOSED:
            self.finish()
            return
        for position, bookie_id in enumerate(self.ensemble):
            request_id = request_ids()
            self.requests[request_id] = (position, 0)
            request = ReadLastAddConfirmed(request_id, metadata.ledger_id)
            self.actions.sends.append(BookieSend(bookie_id, request))

    def settle(self, request_id: int, answer: LastAddConfirmedResult | None) -> None:
        position, _ = self.requests.pop(request_id)
        self.settled_positions.add(position)
        if answer is not None and answer.status in _LAST_ADD_CONFIRMED_ANSWERS:
            self.answered_positions.add(position)
            self.last_add_confirmed = max(self.last_add_confirmed, answer.last_add_confirmed)
        covered = self.schedule.fence_covered(self.answered_positions)
        if covered or len(self.settled_positions) == len(self.ensemble):
            self.finish()

    def finish(self) -> None:
        self.done = True
        self.requests.clear()
        self.actions.last_add_confirmed = self.last_add_confirmed

    def receive(self, bookie_id: str, answer: BookieAnswer) -> None:
        found = self.requests.get(answer.request_id)
        if self.done or found is None or self.ensemble[found[0]] != bookie_id:
            return
        if isinstance(answer, LastAddConfirmedResult):
            self.settle(answer.request_id, answer)
        elif isinstance(answer, ErrorResponse):
            self.settle(answer.request_id, None)

    def bookie_unreachable(self, bookie_id: str) -> None:
        for request_id, (position, _) in list(self.requests.items()):
            if self.ensemble[position] == bookie_id and not self.done:
                self.settle(request_id, None)

    def tick(self) -> None:
        self.now_tick += 1
        for request_id, (_, sent_tick) in list(self.requests.items()):
            if self.now_tick - sent_tick >= self.config.request_timeout_ticks and not self.done:
                self.settle(request_id, None)

    def metadata_result(self, result: MetadataResult) -> None:
        """Reading the LAC asks the metadata nothing."""

    def take_actions(self) -> LedgerActions:
        actions, self.actions = self.actions, LedgerActions()
        return actions
