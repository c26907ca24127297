"""The end of a seed: read every recovered ledger back through the driver and check what
the clients were told against what the ledger holds.

1. Every entry ever acknowledged to a writer is in the recovered ledger with its exact
   bytes: the checker reads entries 0..last back and compares each with what the writer
   appended (which also proves the recovered last entry >= every acknowledged entry).
2. No entry beyond the recovered end was ever readable: readers' LACs stayed at or below
   it, and no bookie stores a LAC beyond it.
3. A fenced writer got no ack beyond the recovered end (`LedgerRecord.acknowledged`
   checked each ack as it came; here the last one again).
4. Every recovery (and a writer's own close) agreed on the last entry and the length.
5. Metadata versions never went back (the store checked each update as it was stored; here
   every recorded sequence once more).
"""

from __future__ import annotations

from collections.abc import Callable

from quorumlog.codec.wire import LedgerEntryData
from quorumlog.ledger.metadata import LedgerMetadata
from quorumlog.runtime.completion import Completion
from quorumlog.testing.sim.ledger.clients import SimLedgerClient
from quorumlog.testing.sim.ledger.workload import LedgerRecord
from quorumlog.testing.sim.ledger.world import LedgerWorld

READ_BACK_CHUNK_ENTRIES = 512
READ_BACK_ATTEMPTS_MAX = 20
"""A read may fail (an unknown from a flipped bit, a slow bookie): asked again."""


class ReadBack:
    """Reads entries 0..last of a closed ledger through one client's driver."""

    def __init__(self, client: SimLedgerClient, closed: LedgerMetadata) -> None:
        self.client = client
        self.closed = closed
        self.entries: list[LedgerEntryData] = []
        self.failures = 0
        self.finished = closed.last_entry_id < 0
        self.error: str | None = None

    def start(self) -> None:
        if not self.finished:
            self.read_next()

    def read_next(self) -> None:
        first = len(self.entries)
        last_entry_id = self.closed.last_entry_id
        last = min(last_entry_id, first + READ_BACK_CHUNK_ENTRIES - 1)
        completion = self.client.driver.read(self.closed, first, last, last_entry_id)
        completion.add_done_callback(self.chunk_read)

    def chunk_read(self, completion: Completion[list[LedgerEntryData]]) -> None:
        error = completion.exception()
        if error is not None:
            self.failures += 1
            if self.failures >= READ_BACK_ATTEMPTS_MAX:
                self.error = f"{type(error).__name__}: {error}"
                self.finished = True
                return
            self.client.scheduler.call_later(0.1, self.read_next)
            return
        self.entries.extend(completion.result())
        if len(self.entries) > self.closed.last_entry_id:
            self.finished = True
        else:
            self.read_next()


def check_ledger(
    world: LedgerWorld,
    record: LedgerRecord,
    closed: LedgerMetadata,
    read_back: ReadBack,
    check: Callable[[bool, str], None],
) -> None:
    name = record.name
    last = closed.last_entry_id
    check(read_back.error is None, f"{name}: reading back 0..{last} failed: {read_back.error}")
    ids = [entry.entry_id for entry in read_back.entries]
    check(ids == list(range(last + 1)), f"{name}: read back ids {ids[:20]}... for 0..{last}")
    check(
        last < len(record.appended),
        f"{name}: recovered through {last}, but the writer appended {len(record.appended)}",
    )
    for entry in read_back.entries:
        if record.appended[entry.entry_id] != entry.data:
            check(
                False,
                f"{name}: entry {entry.entry_id} recovered as {entry.data[:40]!r}, appended "
                f"as {record.appended[entry.entry_id][:40]!r}",
            )
    length = sum(len(entry.data) for entry in read_back.entries)
    check(length == closed.length, f"{name}: closed with length {closed.length}, holds {length}")
    check(
        record.acknowledged_through <= last,
        f"{name}: the writer was acknowledged through {record.acknowledged_through}, the "
        f"ledger recovered through {last}",
    )
    check(
        record.reader_lac_max <= last,
        f"{name}: a reader opened at LAC {record.reader_lac_max}, beyond the recovered {last}",
    )
    for who, other in record.closes:
        check(
            (other.last_entry_id, other.length) == (last, closed.length),
            f"{name}: {who} closed at {other.last_entry_id} ({other.length} bytes), the "
            f"final recovery at {last} ({closed.length} bytes)",
        )
    for bookie_id, bookie in world.bookies.items():
        if bookie.bookie is None:
            continue
        state = bookie.bookie.storage.ledger(record.ledger_id)
        if state is not None:
            check(
                state.last_add_confirmed <= last,
                f"{name}: bookie {bookie_id} stores LAC {state.last_add_confirmed}, beyond "
                f"the recovered end {last}",
            )
