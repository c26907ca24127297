"""What the clients of one seed do to a ledger, and what they were told.

Per ledger: one writer appending batches at a seeded pace (and sometimes closing the
ledger itself), recoverers that open it with recovery at seeded times (sometimes two at
once), readers that open it without recovery and read at the LAC, and, after the final
heal, the checker's recovery and read-back. Every outcome a client hears is recorded in
the `LedgerRecord`, and the checks that are cheap are made the moment it is heard:

- acks move forward, never name an entry not appended, and never pass the end a recovery
  (or the writer's own close) stored;
- a reader's LAC (from bookies, the ledger not closed) names only acknowledged entries,
  and every entry it reads has the bytes the writer appended;
- every close agrees on the last entry and the length.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from quorumlog.codec.wire import LedgerEntryData
from quorumlog.errors import LedgerError, LedgerPendingFullError
from quorumlog.ledger.driver import DriverWriter
from quorumlog.ledger.metadata import LedgerMetadata, LedgerState, master_key
from quorumlog.ledger.protocol_actions import (
    MetadataRead,
    MetadataResult,
    ReadLedgerMetadata,
)
from quorumlog.runtime.completion import Completion
from quorumlog.testing.sim.checks import check_invariant
from quorumlog.testing.sim.events import draw_int
from quorumlog.testing.sim.ledger.clients import SimLedgerClient

RETRY_MS = 100
READ_SPAN_ENTRIES_MAX = 48
ENTRY_SIZES = (0, 8, 40, 100, 300, 1200)


class CheckCounter:
    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def check(self, condition: bool, message: str) -> None:
        self.count += 1
        check_invariant(condition, message)


class LedgerRecord:
    """Everything the clients were told about one ledger."""

    def __init__(self, metadata: LedgerMetadata, password: bytes, checks: CheckCounter) -> None:
        self.ledger_id = metadata.ledger_id
        self.created = metadata
        self.password = password
        self.master_key = master_key(password)
        self.checks = checks
        self.appended: list[bytes] = []
        self.acknowledged_through = -1
        self.acks_after_close = 0
        self.writer_failure: str | None = None
        self.closes: list[tuple[str, LedgerMetadata]] = []
        """(who, the CLOSED metadata it stored or adopted), in the order heard."""
        self.read_entries = 0
        self.reader_lac_max = -1

    @property
    def name(self) -> str:
        return f"ledger {self.ledger_id}"

    @property
    def closed_at(self) -> int | None:
        return self.closes[0][1].last_entry_id if self.closes else None

    def acknowledged(self, last_add_confirmed: int) -> None:
        check = self.checks.check
        check(
            last_add_confirmed > self.acknowledged_through,
            f"{self.name}: the writer's LAC went from {self.acknowledged_through} to "
            f"{last_add_confirmed}",
        )
        check(
            last_add_confirmed < len(self.appended),
            f"{self.name}: ack through {last_add_confirmed}, only {len(self.appended)} appended",
        )
        closed_at = self.closed_at
        if closed_at is not None:
            self.acks_after_close += 1
            check(
                last_add_confirmed <= closed_at,
                f"{self.name}: the writer was acknowledged through {last_add_confirmed} after "
                f"{self.closes[0][0]} closed the ledger at {closed_at}",
            )
        self.acknowledged_through = last_add_confirmed

    def closed(self, who: str, metadata: LedgerMetadata) -> None:
        check = self.checks.check
        check(
            metadata.state is LedgerState.CLOSED,
            f"{self.name}: {who} finished with {metadata.state.value} metadata",
        )
        check(
            metadata.last_entry_id >= self.acknowledged_through,
            f"{self.name}: {who} closed at {metadata.last_entry_id}, but the writer was "
            f"acknowledged through {self.acknowledged_through}",
        )
        if self.closes:
            first_who, first = self.closes[0]
            check(
                (metadata.last_entry_id, metadata.length) == (first.last_entry_id, first.length),
                f"{self.name}: {who} closed at entry {metadata.last_entry_id} ({metadata.length} "
                f"bytes), {first_who} at {first.last_entry_id} ({first.length} bytes)",
            )
        self.closes.append((who, metadata))

    def entries_read(self, who: str, entries: list[LedgerEntryData], lac: int) -> None:
        check = self.checks.check
        for entry in entries:
            self.read_entries += 1
            entry_id = entry.entry_id
            check(
                entry_id <= lac,
                f"{self.name}: {who} read entry {entry_id} beyond its LAC {lac}",
            )
            check(
                entry_id < len(self.appended) and self.appended[entry_id] == entry.data,
                f"{self.name}: {who} read entry {entry_id} with bytes the writer never "
                f"appended there: {entry.data[:40]!r}",
            )


class Writer:
    def __init__(
        self,
        record: LedgerRecord,
        client: SimLedgerClient,
        rng: random.Random,
        think_ms_max: int,
        batch_entries_max: int,
    ) -> None:
        self.record = record
        self.client = client
        self.rng = rng
        self.think_ms_max = think_ms_max
        self.batch_entries_max = batch_entries_max
        self.handle: DriverWriter | None = None
        self.stopped = False

    def start(self) -> None:
        record = self.record
        self.handle = self.client.driver.start_writer(
            record.created, record.master_key, record.acknowledged, self.failed
        )
        self.step()

    def failed(self, error: LedgerError) -> None:
        self.record.writer_failure = type(error).__name__

    def step(self) -> None:
        handle = self.handle
        if self.stopped or handle is None or handle.failure is not None:
            return
        record = self.record
        count = draw_int(self.rng, 1, self.batch_entries_max)
        first = len(record.appended)
        datas = [self.entry_data(first + offset) for offset in range(count)]
        try:
            appended_at = handle.append_many(datas)
        except LedgerPendingFullError:
            pass  # the writer holds too much unacknowledged: try again later
        except LedgerError:
            return  # failed, fenced or closed: the writer is done
        else:
            record.checks.check(
                appended_at == first, f"{record.name}: append got id {appended_at}, not {first}"
            )
            record.appended.extend(datas)
        think_seconds = draw_int(self.rng, 1, self.think_ms_max) / 1000
        self.client.scheduler.call_later(think_seconds, self.step)

    def entry_data(self, entry_id: int) -> bytes:
        size = self.rng.choice(ENTRY_SIZES)
        return b"%d:%d:" % (self.record.ledger_id, entry_id) + self.rng.randbytes(size)

    def close(self) -> None:
        """Stop appending and close the ledger (what it closed at is checked)."""
        self.stopped = True
        if self.handle is None:
            return
        completion = self.handle.close()
        completion.add_done_callback(self.close_done)

    def close_done(self, completion: Completion[LedgerMetadata]) -> None:
        if completion.exception() is None:
            self.record.closed(f"writer {self.client.name}", completion.result())


class Recoverer:
    """Opens the ledger with recovery until it succeeds (or is told to give up)."""

    def __init__(
        self, record: LedgerRecord, client: SimLedgerClient, on_done: Callable[[], None] | None
    ) -> None:
        self.record = record
        self.client = client
        self.on_done = on_done
        self.operation_ids = 0
        self.attempts = 0
        self.failures: list[str] = []
        self.result: LedgerMetadata | None = None

    def start(self) -> None:
        self.attempts += 1
        self.operation_ids += 1
        operation = ReadLedgerMetadata(self.operation_ids, self.record.ledger_id)
        self.client.metadata.submit(operation, self.metadata_read)

    def metadata_read(self, result: MetadataResult) -> None:
        if not isinstance(result, MetadataRead):
            self.client.scheduler.call_later(RETRY_MS / 1000, self.start)
            return
        completion = self.client.driver.recover(result.metadata, self.record.master_key)
        completion.add_done_callback(self.recovered)

    def recovered(self, completion: Completion[LedgerMetadata]) -> None:
        error = completion.exception()
        if error is not None:
            self.failures.append(type(error).__name__)
            self.client.scheduler.call_later(RETRY_MS / 1000, self.start)
            return
        self.result = completion.result()
        self.record.closed(f"recoverer {self.client.name}", self.result)
        if self.on_done is not None:
            self.on_done()


class Reader:
    """Opens the ledger without recovery, again and again, and reads up to its LAC."""

    def __init__(
        self, record: LedgerRecord, client: SimLedgerClient, rng: random.Random, interval_ms: int
    ) -> None:
        self.record = record
        self.client = client
        self.rng = rng
        self.interval_ms = interval_ms
        self.operation_ids = 0
        self.stopped = False
        self.reads_failed = 0

    def start(self) -> None:
        if self.stopped:
            return
        self.operation_ids += 1
        operation = ReadLedgerMetadata(self.operation_ids, self.record.ledger_id)
        self.client.metadata.submit(operation, self.metadata_read)

    def again(self) -> None:
        self.client.scheduler.call_later(self.interval_ms / 1000, self.start)

    def metadata_read(self, result: MetadataResult) -> None:
        if not isinstance(result, MetadataRead):
            self.again()
            return
        metadata = result.metadata
        if metadata.state is LedgerState.CLOSED:
            self.read(metadata, metadata.last_entry_id, from_bookies=False)
            return
        completion = self.client.driver.read_last_add_confirmed(metadata)

        def lac_read(done: Completion[int]) -> None:
            if done.exception() is not None:
                self.again()
                return
            lac = max(metadata.known_last_add_confirmed, done.result())
            self.read(metadata, lac, from_bookies=True)

        completion.add_done_callback(lac_read)

    def read(self, metadata: LedgerMetadata, lac: int, from_bookies: bool) -> None:
        record = self.record
        record.reader_lac_max = max(record.reader_lac_max, lac)
        if from_bookies:
            record.checks.check(
                lac <= record.acknowledged_through,
                f"{record.name}: reader {self.client.name} opened at LAC {lac}, but the "
                f"writer was acknowledged only through {record.acknowledged_through}",
            )
        closed_at = record.closed_at
        if closed_at is not None:
            record.checks.check(
                lac <= closed_at,
                f"{record.name}: reader {self.client.name} opened at LAC {lac} after the "
                f"ledger closed at {closed_at}",
            )
        if lac < 0:
            self.again()
            return
        first = draw_int(self.rng, 0, lac)
        last = min(lac, first + draw_int(self.rng, 0, READ_SPAN_ENTRIES_MAX - 1))
        completion = self.client.driver.read(metadata, first, last, lac)

        def entries_read(done: Completion[list[LedgerEntryData]]) -> None:
            if done.exception() is not None:
                self.reads_failed += 1
            else:
                entries = done.result()
                record.checks.check(
                    [entry.entry_id for entry in entries] == list(range(first, last + 1)),
                    f"{record.name}: reader {self.client.name} asked for {first}..{last}, got "
                    f"{[entry.entry_id for entry in entries][:20]}",
                )
                record.entries_read(f"reader {self.client.name}", entries, lac)
            self.again()

        completion.add_done_callback(entries_read)
