"""Concurrent clients for the scenarios: appends of unique tokens and reads, on a few keys.

Appends carry a token unique to (client, operation) so the end-of-run check can tell an
acknowledged write that was lost, or one applied twice (a dedup failure across a shard
move), from a correct history; reads make the linearizability check meaningful.
"""

from __future__ import annotations

import random

import msgspec

from quorumlog.testing.sim.events import EventQueue, draw_int
from quorumlog.testing.sim.shardkv.checks import TOKEN_SEPARATOR
from quorumlog.testing.sim.shardkv.client import SimShardedClient


class WorkloadOptions(msgspec.Struct, frozen=True):
    client_count: int = 3
    keys: tuple[str, ...] = ("a", "b", "c", "d", "e", "f")
    think_ms_min: int = 0
    think_ms_max: int = 100
    read_fraction: float = 0.3
    operation_timeout_ms: int = 6_000


class Workload:
    def __init__(
        self,
        clients: list[SimShardedClient],
        *,
        events: EventQueue,
        rng: random.Random,
        options: WorkloadOptions,
    ) -> None:
        self.clients = clients
        self.events = events
        self.rng = rng
        self.options = options
        self.running = False
        self.operations_started = 0
        self.operations_ok = 0

    def start(self) -> None:
        self.running = True
        for client in self.clients:
            self.events.schedule(self.think_ms(), self.next_operation, client)

    def stop(self) -> None:
        self.running = False

    @property
    def idle(self) -> bool:
        return not any(client.busy for client in self.clients)

    def think_ms(self) -> int:
        return draw_int(self.rng, self.options.think_ms_min, self.options.think_ms_max)

    def next_operation(self, client: SimShardedClient) -> None:
        if not self.running or client.busy:
            return
        options = self.options
        key = options.keys[self.rng.randrange(len(options.keys))]
        self.operations_started += 1
        if self.rng.random() < options.read_fraction:
            kind, argument = "get", None
        else:
            token = f"{client.client_id}.{self.operations_started}"
            kind, argument = "append", token + TOKEN_SEPARATOR

        def finished(status: str, output: object) -> None:
            if status == "ok":
                self.operations_ok += 1
            self.events.schedule(self.think_ms(), self.next_operation, client)

        client.begin(kind, key, argument, finished, options.operation_timeout_ms)
