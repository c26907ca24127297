"""The one driver of the ledger protocol cores: what the LedgerClient runs and what the
simulator runs, as `RaftHost` is for Raft groups.

The cores (protocol_write.py, protocol_recovery.py, protocol_read.py) take events and hand
out actions, and do no I/O. `LedgerDriver` connects them to their world through three small
interfaces, so the asyncio client and the seeded simulator run the same code:

- a `Scheduler` (runtime/resources.py): callbacks on the driver's one thread, and timers for
  the ticks that time out requests and pace retries;
- `BookieLinks`: fire-and-forget sends to bookies by id. Answers come back through
  `receive(bookie_id, answer)`; a connection that failed through
  `bookie_unreachable(bookie_id)` (every request outstanding there is then lost);
- `MetadataAccess`: one metadata operation at a time per core, answered exactly once with a
  `MetadataResult` (`MetadataUnavailable` when the store did not answer in time).

Batching. An append only queues its entry and asks for one flush soon; the flush takes the
actions of every core that changed since the last one, so every entry appended in one turn
of the loop leaves in one AddEntries frame per bookie (the writer's group commit).
Answers route back to the core that asked by request id; the ids come from one counter
shared by every core of a driver.

Outcomes go to their owners as the cores report them: a writer's LAC advances through
`on_acknowledged` (entries up to it are acknowledged, in entry order), its failure through
`on_failed` (every entry after its LAC failed), and each one-shot operation (recovery, read,
LAC read, close) completes a `Completion`. All of it happens on the scheduler's thread.
"""

from __future__ import annotations

import random as random_module
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from quorumlog.codec.wire import LedgerEntryData
from quorumlog.errors import LedgerError
from quorumlog.ledger.metadata import LedgerMetadata
from quorumlog.ledger.protocol_actions import (
    BookieAnswer,
    BookieRequest,
    LedgerActions,
    LedgerCore,
    LedgerProtocolConfig,
    MetadataOperation,
    MetadataResult,
    request_id_counter,
)
from quorumlog.ledger.protocol_read import EntryRangeRead, LastAddConfirmedRead
from quorumlog.ledger.protocol_recovery import LedgerRecovery
from quorumlog.ledger.protocol_write import LedgerWriter, WriterState
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.resources import Scheduler, Timer

ResultType = TypeVar("ResultType")


class BookieLinks(Protocol):
    def send(self, bookie_id: str, request: BookieRequest) -> None:
        """Send one request (in order per bookie); never blocks, never raises. A bookie that
        cannot be reached is reported with `LedgerDriver.bookie_unreachable`, soon, not
        from inside this call."""
        ...


class MetadataAccess(Protocol):
    def submit(self, operation: MetadataOperation, done: Callable[[MetadataResult], None]) -> None:
        """Carry out `operation`; call `done` exactly once, on the driver's thread and never
        from inside this call, with its result (`MetadataUnavailable` if it failed or timed
        out: its outcome is then unknown, which the cores allow for)."""
        ...


class Running:
    """One core the driver feeds, and where its outcomes go."""

    __slots__ = ("core", "finished", "key")

    def __init__(self, core: LedgerCore, key: int) -> None:
        self.core = core
        self.key = key
        self.finished = False

    def outcome(self, actions: LedgerActions) -> bool:
        """Act on what the core reported; True once the core has nothing more to do."""
        raise NotImplementedError

    def abandon(self, error: LedgerError) -> None:
        """The driver stops before the core finished: tell the owner `error`."""
        raise NotImplementedError


class LedgerDriver:
    def __init__(
        self,
        scheduler: Scheduler,
        bookies: BookieLinks,
        metadata: MetadataAccess,
        config: LedgerProtocolConfig | None = None,
        *,
        tick_seconds: float = 0.02,
        random: random_module.Random | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.bookies = bookies
        self.metadata = metadata
        self.config = config or LedgerProtocolConfig()
        self.config.validate()
        if tick_seconds <= 0:
            raise ValueError("tick_seconds must be > 0")
        self.tick_seconds = tick_seconds
        self.random = random or random_module.Random()
        self.request_ids = request_id_counter()
        self.keys = request_id_counter()
        self.running: dict[int, Running] = {}
        """Every core with work left, by key (in start order: ticks visit them so)."""
        self.routes: dict[int, tuple[str, Running]] = {}
        """Request id -> the bookie asked and the core that asked."""
        self.dirty: dict[int, Running] = {}
        """Cores with events since their last flush."""
        self.flush_scheduled = False
        self.timer: Timer | None = None

    # --- operations ----------------------------------------------------------------------

    def start_writer(
        self,
        metadata: LedgerMetadata,
        master_key: bytes,
        on_acknowledged: Callable[[int], None],
        on_failed: Callable[[LedgerError], None],
    ) -> DriverWriter:
        """A writer for a ledger that was just created (OPEN, nothing written)."""
        core = LedgerWriter(
            metadata, master_key, self.config, request_ids=self.request_ids, random=self.random
        )
        writer = DriverWriter(self, core, self.keys(), on_acknowledged, on_failed)
        self.start(writer)
        return writer

    def recover(self, metadata: LedgerMetadata, master_key: bytes) -> Completion[LedgerMetadata]:
        """Fence, recover and close the ledger; completes with its CLOSED metadata."""
        completion: Completion[LedgerMetadata] = Completion(self.scheduler)
        core = LedgerRecovery(
            metadata, master_key, self.config, request_ids=self.request_ids, random=self.random
        )
        self.start(RunningOperation(core, self.keys(), completion, closed_metadata))
        return completion

    def read(
        self,
        metadata: LedgerMetadata,
        first_entry_id: int,
        last_entry_id: int,
        last_add_confirmed: int,
    ) -> Completion[list[LedgerEntryData]]:
        """Entries first..last (LedgerEntryRangeError at once if beyond the LAC)."""
        completion: Completion[list[LedgerEntryData]] = Completion(self.scheduler)
        try:
            core = EntryRangeRead(
                metadata,
                first_entry_id,
                last_entry_id,
                last_add_confirmed,
                self.config,
                request_ids=self.request_ids,
            )
        except LedgerError as error:
            completion.set_exception(error)
            return completion
        self.start(RunningOperation(core, self.keys(), completion, entries_read))
        return completion

    def read_last_add_confirmed(self, metadata: LedgerMetadata) -> Completion[int]:
        """The highest LAC the last ensemble reports, without fencing."""
        completion: Completion[int] = Completion(self.scheduler)
        core = LastAddConfirmedRead(metadata, self.config, request_ids=self.request_ids)
        self.start(RunningOperation(core, self.keys(), completion, last_add_confirmed_read))
        return completion

    # --- events from the world -----------------------------------------------------------

    def receive(self, bookie_id: str, answer: BookieAnswer) -> None:
        route = self.routes.pop(answer.request_id, None)
        if route is None or route[0] != bookie_id or route[1].finished:
            return  # a duplicate, a stray, or for a core that is done
        running = route[1]
        running.core.receive(bookie_id, answer)
        self.mark_dirty(running)

    def bookie_unreachable(self, bookie_id: str) -> None:
        lost = [request_id for request_id, route in self.routes.items() if route[0] == bookie_id]
        for request_id in lost:
            del self.routes[request_id]
        for running in list(self.running.values()):
            running.core.bookie_unreachable(bookie_id)
            self.mark_dirty(running)

    def metadata_done(self, running: Running, result: MetadataResult) -> None:
        if running.finished:
            return
        running.core.metadata_result(result)
        self.mark_dirty(running)

    # --- the loop ------------------------------------------------------------------------

    def start(self, running: Running) -> None:
        self.running[running.key] = running
        self.mark_dirty(running)
        if self.timer is None:
            self.timer = self.scheduler.call_later(self.tick_seconds, self.tick)

    def mark_dirty(self, running: Running) -> None:
        self.dirty[running.key] = running
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.scheduler.call_soon(self.flush)

    def flush(self) -> None:
        """Carry out every changed core's actions (see the module docstring)."""
        self.flush_scheduled = False
        while self.dirty:
            dirty, self.dirty = self.dirty, {}
            for running in dirty.values():
                if not running.finished:
                    self.carry_out(running, running.core.take_actions())

    def carry_out(self, running: Running, actions: LedgerActions) -> None:
        routes = self.routes
        send = self.bookies.send
        for bookie_send in actions.sends:
            request = bookie_send.request
            routes[request.request_id] = (bookie_send.bookie_id, running)
            send(bookie_send.bookie_id, request)
        for operation in actions.metadata_operations:
            self.metadata.submit(operation, self.metadata_callback(running))
        if running.outcome(actions):
            self.stop(running)

    def metadata_callback(self, running: Running) -> Callable[[MetadataResult], None]:
        def done(result: MetadataResult) -> None:
            self.metadata_done(running, result)

        return done

    def stop(self, running: Running) -> None:
        running.finished = True
        self.running.pop(running.key, None)
        self.dirty.pop(running.key, None)
        if not self.running and self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def tick(self) -> None:
        self.timer = None
        for running in list(self.running.values()):
            running.core.tick()
            self.mark_dirty(running)
        if self.running:
            self.timer = self.scheduler.call_later(self.tick_seconds, self.tick)

    def close(self) -> None:
        """Stop every core; their owners are told the driver closed."""
        for running in list(self.running.values()):
            running.abandon(LedgerError("the ledger client was closed"))
            self.stop(running)
        self.routes.clear()


class DriverWriter(Running):
    """A WriteHandle's protocol side: appends, acknowledgements in order, close."""

    __slots__ = ("close_completion", "driver", "on_acknowledged", "on_failed", "writer")

    def __init__(
        self,
        driver: LedgerDriver,
        core: LedgerWriter,
        key: int,
        on_acknowledged: Callable[[int], None],
        on_failed: Callable[[LedgerError], None],
    ) -> None:
        super().__init__(core, key)
        self.driver = driver
        self.writer = core
        self.on_acknowledged = on_acknowledged
        self.on_failed = on_failed
        self.close_completion: Completion[LedgerMetadata] | None = None

    @property
    def ledger_id(self) -> int:
        return self.writer.metadata.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        """The ledger's metadata as this writer last stored it (its ensembles change as
        bookies are replaced): what a read of the ledger while it is written needs."""
        return self.writer.metadata

    @property
    def last_add_confirmed(self) -> int:
        return self.writer.last_add_confirmed

    @property
    def failure(self) -> LedgerError | None:
        return self.writer.failure

    def append(self, data: bytes) -> int:
        """Queue one entry; its id. Raises the handle's refusal (failed, closing, full)."""
        entry_id = self.writer.append(data)
        self.driver.mark_dirty(self)
        return entry_id

    def append_many(self, datas: list[bytes]) -> int:
        """Queue entries in order (all or none); the first one's id."""
        first = self.writer.append_many(datas)
        self.driver.mark_dirty(self)
        return first

    def close(self) -> Completion[LedgerMetadata]:
        """Close once every appended entry is acknowledged; completes with the CLOSED
        metadata (or fails: a fenced writer has nothing to close)."""
        if self.close_completion is not None:
            return self.close_completion
        completion: Completion[LedgerMetadata] = Completion(self.driver.scheduler)
        self.close_completion = completion
        if self.finished:
            completion.set_exception(self.failure or LedgerError("the writer stopped"))
            return completion
        self.writer.close()
        if self.writer.state is WriterState.FAILED:
            # Fenced or deleted: the ledger is not this writer's to close.
            completion.set_exception(self.writer.failure or LedgerError("the writer failed"))
            self.driver.stop(self)
        else:
            self.driver.mark_dirty(self)
        return completion

    def outcome(self, actions: LedgerActions) -> bool:
        if actions.last_add_confirmed is not None:
            self.on_acknowledged(actions.last_add_confirmed)
        if actions.failure is not None:
            self.on_failed(actions.failure)
        if actions.closed is not None:
            if self.close_completion is not None:
                self.close_completion.set_result(actions.closed)
            return True
        closing = self.writer.state is WriterState.CLOSING
        if actions.failure is not None and self.close_completion is not None and not closing:
            self.close_completion.set_exception(actions.failure)
            return True
        return False

    def abandon(self, error: LedgerError) -> None:
        self.on_failed(error)
        if self.close_completion is not None:
            self.close_completion.set_exception(error)


class RunningOperation(Running, Generic[ResultType]):
    """A one-shot core (recovery, read, LAC read): done with a result or a failure."""

    __slots__ = ("completion", "result_of")

    def __init__(
        self,
        core: LedgerCore,
        key: int,
        completion: Completion[ResultType],
        result_of: Callable[[LedgerActions], ResultType | None],
    ) -> None:
        super().__init__(core, key)
        self.completion = completion
        self.result_of = result_of
        """The operation's result in a batch of actions (None: not there yet)."""

    def outcome(self, actions: LedgerActions) -> bool:
        result = self.result_of(actions)
        if result is not None:
            self.completion.set_result(result)
            return True
        if actions.failure is not None:
            self.completion.set_exception(actions.failure)
            return True
        return False

    def abandon(self, error: LedgerError) -> None:
        self.completion.set_exception(error)


def closed_metadata(actions: LedgerActions) -> LedgerMetadata | None:
    return actions.closed


def entries_read(actions: LedgerActions) -> list[LedgerEntryData] | None:
    return actions.entries


def last_add_confirmed_read(actions: LedgerActions) -> int | None:
    return actions.last_add_confirmed
