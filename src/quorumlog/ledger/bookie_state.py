"""What a bookie knows about its ledgers, kept in memory, built the same way twice.

Writes change it as they go into the log, and open rebuilds it by replaying the log's
records through the same methods, so what a restart sees is what the writes made (no
second copy of the rules for recovery).

Per ledger: its master key, whether it is fenced, the highest LAC that rode on an add and
the ledger's length there (so recovery can start at that LAC), the entry index, and the
files that hold its entries. Per file: the ledgers with entries in it, which decides when a
file is garbage (every one of them dropped).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from quorumlog.ledger.bookie_format import LENGTH_UNKNOWN, CheckpointItem
from quorumlog.ledger.bookie_index import LedgerEntryIndex


class LedgerState:
    __slots__ = (
        "fence_position",
        "fenced",
        "files",
        "index",
        "last_add_confirmed",
        "length",
        "master_key",
    )

    def __init__(self, master_key: bytes) -> None:
        self.master_key = master_key
        self.fenced = False
        self.fence_position = 0
        """Log position the fence record ends at: the fence holds once that is durable (0
        after a restart: whatever open found is durable)."""
        self.last_add_confirmed = -1
        self.length = LENGTH_UNKNOWN
        """The ledger's bytes through `last_add_confirmed` (-1: not known)."""
        self.index = LedgerEntryIndex()
        self.files: set[int] = set()

    @property
    def last_entry_id(self) -> int:
        return self.index.last_entry_id

    def confirm(self, last_add_confirmed: int, length: int) -> None:
        """Keep the highest LAC and the length that came with it. The length at one LAC is
        one number, so a LAC seen again may fill in a length not known the first time (a
        version-1 record, or an add from a writer that did not send it)."""
        if last_add_confirmed > self.last_add_confirmed:
            self.last_add_confirmed = last_add_confirmed
            self.length = length
        elif last_add_confirmed == self.last_add_confirmed and self.length == LENGTH_UNKNOWN:
            self.length = length


class BookieState:
    def __init__(self) -> None:
        self.ledgers: dict[int, LedgerState] = {}
        self.file_ledgers: dict[int, set[int]] = {}
        """File number -> ids of the ledgers with entries in that file."""

    def create(self, ledger_id: int, master_key: bytes) -> LedgerState:
        state = LedgerState(master_key)
        self.ledgers[ledger_id] = state
        return state

    def add_entries(
        self,
        ledger_id: int,
        state: LedgerState,
        last_add_confirmed: int,
        length: int,
        file_number: int,
        base_offset: int,
        entry_ids: Sequence[int],
        offsets: Sequence[int],
        lengths: Sequence[int],
    ) -> None:
        """Entries now in file `file_number` at base_offset + offsets[i]."""
        state.index.put_many(entry_ids, file_number, base_offset, offsets, lengths)
        state.confirm(last_add_confirmed, length)
        if entry_ids and file_number not in state.files:
            state.files.add(file_number)
            self.file_ledgers.setdefault(file_number, set()).add(ledger_id)

    def drop(self, ledger_id: int) -> LedgerState | None:
        return self.ledgers.pop(ledger_id, None)

    def apply_checkpoint(self, items: Iterable[CheckpointItem]) -> None:
        """A checkpoint lists every ledger alive when its file began: any other is gone."""
        alive: dict[int, LedgerState] = {}
        for item in items:
            state = self.ledgers.get(item.ledger_id)
            if state is None:
                state = LedgerState(item.master_key)
            state.master_key = item.master_key
            state.fenced = state.fenced or item.fenced
            state.confirm(item.last_add_confirmed, item.length)
            alive[item.ledger_id] = state
        self.ledgers = alive

    def checkpoint_items(self) -> list[CheckpointItem]:
        return [
            CheckpointItem(
                ledger_id, state.last_add_confirmed, state.fenced, state.master_key, state.length
            )
            for ledger_id, state in sorted(self.ledgers.items())
        ]

    def garbage_files(self, file_numbers: Iterable[int], active_file_number: int) -> list[int]:
        """The files that hold no entry of a live ledger. Any older than the file being
        written may go: the checkpoint at the head of each later file restates the state
        their key, fence and drop records set. (Never the file being written.)"""
        garbage: list[int] = []
        for number in file_numbers:
            if number == active_file_number:
                continue
            holders = self.file_ledgers.get(number, ())
            if not any(ledger_id in self.ledgers for ledger_id in holders):
                garbage.append(number)
        return garbage

    def forget_file(self, number: int) -> None:
        self.file_ledgers.pop(number, None)
