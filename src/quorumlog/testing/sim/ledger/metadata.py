"""The metadata every simulated client shares, and the simulated way to reach it.

`RecordingMetadataStore` is the shipped `InMemoryMetadataStore` that also records every
version it stores and checks, as each one is stored, that a ledger's metadata only moves
forward: versions go up by one, a CLOSED ledger never changes again, IN_RECOVERY never
goes back to OPEN, and fragments before the last one are never rewritten.

`SimMetadataAccess` is the driver's `MetadataAccess` for one client: each operation reaches
the store after a seeded latency and its answer comes back after another; some operations
never reach the store and some answers are lost after the store carried the operation out
(both come back as `MetadataUnavailable`: the cores must then recognise their own write
when they ask again). The store itself (a Raft group in production) never crashes here.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import msgspec

from quorumlog.ledger.metadata import InMemoryMetadataStore, LedgerMetadata, LedgerState
from quorumlog.ledger.protocol_actions import (
    MetadataOperation,
    MetadataResult,
    MetadataUnavailable,
    run_metadata_operation,
)
from quorumlog.testing.sim.checks import check_invariant
from quorumlog.testing.sim.events import EventQueue, draw_int
from quorumlog.testing.sim.process import SimProcess
from quorumlog.testing.sim.trace import TraceRecorder


class MetadataFaults(msgspec.Struct, frozen=True):
    latency_ms_min: int = 1
    latency_ms_max: int = 10
    unavailable_probability: float = 0.0
    """Chance that an operation comes back `MetadataUnavailable`: half of those never
    reached the store, half were carried out and only the answer was lost."""
    timeout_ms: int = 200
    """How long a client waits before it calls an unanswered operation unavailable."""


class StoredVersion(msgspec.Struct, frozen=True):
    time_ms: int
    version: int
    state: LedgerState
    last_entry_id: int
    length: int


class RecordingMetadataStore(InMemoryMetadataStore):
    def __init__(self, events: EventQueue) -> None:
        super().__init__()
        self.events = events
        self.history: dict[int, list[StoredVersion]] = {}
        self.checks = 0

    def create_ledger(self, metadata: LedgerMetadata) -> LedgerMetadata:
        stored = super().create_ledger(metadata)
        self.record(stored)
        return stored

    def update_ledger(self, metadata: LedgerMetadata, expected_version: int) -> LedgerMetadata:
        before = self.read_ledger(metadata.ledger_id)
        stored = super().update_ledger(metadata, expected_version)
        self.check_moves_forward(before, stored)
        self.record(stored)
        return stored

    def record(self, metadata: LedgerMetadata) -> None:
        self.history.setdefault(metadata.ledger_id, []).append(
            StoredVersion(
                self.events.now_ms,
                metadata.version,
                metadata.state,
                metadata.last_entry_id,
                metadata.length,
            )
        )

    def check_moves_forward(self, before: LedgerMetadata, after: LedgerMetadata) -> None:
        self.checks += 1
        ledger = f"ledger {after.ledger_id}"
        check_invariant(
            after.version == before.version + 1,
            f"{ledger}: metadata version {before.version} followed by {after.version}",
        )
        check_invariant(
            before.state is not LedgerState.CLOSED,
            f"{ledger}: closed at version {before.version} (last entry "
            f"{before.last_entry_id}), then changed to {after.state.value} "
            f"(last entry {after.last_entry_id}) at version {after.version}",
        )
        check_invariant(
            not (before.state is LedgerState.IN_RECOVERY and after.state is LedgerState.OPEN),
            f"{ledger}: IN_RECOVERY went back to OPEN at version {after.version}",
        )
        last_before = before.last_fragment_first_entry
        for first_entry, bookies in before.ensembles.items():
            if first_entry < last_before:
                check_invariant(
                    after.ensembles.get(first_entry) == bookies,
                    f"{ledger}: fragment {first_entry} {bookies} rewritten as "
                    f"{after.ensembles.get(first_entry)} at version {after.version}",
                )

    def versions_never_went_back(self) -> None:
        """The recorded versions of each ledger, in store order, count up by one."""
        for ledger_id, versions in self.history.items():
            self.checks += 1
            numbers = [stored.version for stored in versions]
            check_invariant(
                numbers == list(range(len(numbers))),
                f"ledger {ledger_id}: stored versions {numbers[:50]} do not count up by one",
            )


class SimMetadataAccess:
    """The `MetadataAccess` of one client process (see the module docstring)."""

    def __init__(
        self,
        store: RecordingMetadataStore,
        process: SimProcess,
        rng: random.Random,
        faults: MetadataFaults,
        trace: TraceRecorder | None = None,
    ) -> None:
        self.store = store
        self.process = process
        self.rng = rng
        self.faults = faults
        self.trace = trace
        self.operations = 0
        self.unavailable = 0

    def submit(self, operation: MetadataOperation, done: Callable[[MetadataResult], None]) -> None:
        faults = self.faults
        self.operations += 1
        to_store_ms = draw_int(self.rng, faults.latency_ms_min, faults.latency_ms_max)
        back_ms = draw_int(self.rng, faults.latency_ms_min, faults.latency_ms_max)
        roll = self.rng.random()
        unavailable = roll < faults.unavailable_probability
        reaches_store = not unavailable or roll < faults.unavailable_probability / 2
        if not reaches_store:
            self.unavailable += 1
            answer = MetadataUnavailable(operation.operation_id)
            self.process.schedule(faults.timeout_ms, self.deliver, (done, answer))
            return
        self.store.events.schedule(
            to_store_ms, self.carry_out, (operation, done, unavailable, back_ms)
        )

    def carry_out(
        self,
        arguments: tuple[MetadataOperation, Callable[[MetadataResult], None], bool, int],
    ) -> None:
        """At the store: the operation happens whatever becomes of its answer."""
        operation, done, answer_lost, back_ms = arguments
        result = run_metadata_operation(self.store, operation)
        if self.trace is not None:
            self.trace.record(
                self.store.events.now_ms,
                f"metadata {self.process.name}: {operation!r} -> {result!r}"
                + (" (answer lost)" if answer_lost else ""),
            )
        if answer_lost:
            self.unavailable += 1
            answer: MetadataResult = MetadataUnavailable(operation.operation_id)
            delay_ms = self.faults.timeout_ms
        else:
            answer, delay_ms = result, back_ms
        self.process.schedule(delay_ms, self.deliver, (done, answer))

    def deliver(self, arguments: tuple[Callable[[MetadataResult], None], MetadataResult]) -> None:
        done, result = arguments
        done(result)
