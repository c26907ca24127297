"""Shipped bookies on a manual scheduler, shared by any number of ledger clients (each with
its own LedgerDriver), and the managed ledger store over the same metadata: what the
managed ledger tests run on (test_driver.py's World, with more than one client)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from quorumlog.ledger.bookie import Bookie, BookieRequest
from quorumlog.ledger.bookie_storage import BookieStorage
from quorumlog.ledger.driver import LedgerDriver
from quorumlog.ledger.managed import ManagedLedger, ManagedLedgerConfig
from quorumlog.ledger.managed_store import InMemoryManagedLedgerStore
from quorumlog.ledger.metadata import InMemoryMetadataStore
from quorumlog.ledger.protocol_actions import (
    LedgerProtocolConfig,
    MetadataOperation,
    MetadataResult,
    run_metadata_operation,
)
from quorumlog.runtime.completion import Completion
from quorumlog.testing.manual import InlineBackground, ManualScheduler
from quorumlog.testing.sim.filesystem import SimFileSystem

ValueType = TypeVar("ValueType")
NAME = "orders/0"
PASSWORD = b"managed"


class ManagedWorld:
    def __init__(self, bookie_count: int = 5) -> None:
        self.scheduler = ManualScheduler()
        self.metadata = InMemoryMetadataStore()
        self.store = InMemoryManagedLedgerStore(self.scheduler, self.metadata)
        self.bookies: dict[str, Bookie] = {}
        self.down: set[str] = set()
        for number in range(bookie_count):
            bookie_id = f"b{number}"
            disk = SimFileSystem(random.Random(number))
            storage = BookieStorage.open(Path("/") / bookie_id, file_system=disk)
            background = InlineBackground(self.scheduler)
            self.bookies[bookie_id] = Bookie(storage, background, self.scheduler.call_soon)
            self.metadata.register_bookie(bookie_id)

    def client(self, seed: int = 0) -> Client:
        return Client(self, seed)

    def settle(self, completion: Completion[ValueType], seconds_max: float = 10.0) -> None:
        """Run until `completion` is done (a deadline in virtual time, never a sleep)."""
        deadline = self.scheduler.now_seconds + seconds_max
        self.scheduler.run_until_idle()
        while not completion.done():
            if self.scheduler.now_seconds >= deadline:
                raise AssertionError(f"not done after {seconds_max} virtual seconds")
            self.scheduler.advance(0.01)

    def wait(self, completion: Completion[ValueType], seconds_max: float = 10.0) -> ValueType:
        self.settle(completion, seconds_max)
        return completion.result()


class Client:
    """One ledger client: its own driver and its own links to the shared bookies."""

    def __init__(self, world: ManagedWorld, seed: int) -> None:
        self.world = world
        self.dropping: set[str] = set()
        """Bookies this client's frames silently never reach (they time out)."""
        self.driver = LedgerDriver(
            world.scheduler,
            self,
            self,
            LedgerProtocolConfig(request_timeout_ticks=10),
            tick_seconds=0.01,
            random=random.Random(seed),
        )

    def send(self, bookie_id: str, request: BookieRequest) -> None:
        world = self.world
        if bookie_id in self.dropping:
            return
        if bookie_id in world.down:
            world.scheduler.call_soon(lambda: self.driver.bookie_unreachable(bookie_id))
            return
        bookie = world.bookies[bookie_id]

        def deliver() -> None:
            bookie.handle(request, lambda answer: self.driver.receive(bookie_id, answer))

        world.scheduler.call_soon(deliver)

    def submit(self, operation: MetadataOperation, done: Callable[[MetadataResult], None]) -> None:
        result = run_metadata_operation(self.world.metadata, operation)
        self.world.scheduler.call_soon(lambda: done(result))

    def managed(
        self, owner: str, config: ManagedLedgerConfig | None = None, name: str = NAME
    ) -> ManagedLedger:
        config = config or ManagedLedgerConfig(password=PASSWORD)
        return ManagedLedger(name, owner, self.driver, self.world.store, config)
