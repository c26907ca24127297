"""Clients of the simulated KV store, recording every operation in a History.

A client has one operation in flight. It sends it to the node it believes leads, follows
redirects, backs off when the leader is busy, and on a timeout tries the next node, always
with the same (client id, sequence), so a write retried after a lost reply is applied once.
An operation still unanswered after `operation_timeout_ms` is given up as unknown (it may
yet take effect), and the client goes on with a new sequence number.

Requests and replies cross a client network with its own seeded latency; it is not
partitioned (the nemesis partitions the Raft nodes), but a crashed node never answers.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable
from typing import Any

import msgspec

from quorumlog.testing.history import History
from quorumlog.testing.sim.events import EventQueue, draw_int
from quorumlog.testing.sim.kv_machine import KvCommand, encode_command
from quorumlog.testing.sim.node import ClientReply, SimNode


class WorkloadOptions(msgspec.Struct, frozen=True):
    client_count: int = 3
    key_count: int = 3
    think_ms_min: int = 0
    think_ms_max: int = 150
    latency_ms_min: int = 1
    latency_ms_max: int = 5
    request_timeout_ms: int = 800
    """Without an answer this long, the client tries the next node."""
    operation_timeout_ms: int = 6000
    """Without an answer this long, the client gives up: the outcome is unknown."""
    backoff_ms_min: int = 10
    backoff_ms_max: int = 80
    read_fraction: float = 0.3
    append_fraction: float = 0.35
    cas_fraction: float = 0.05
    """The rest are puts."""
    reconnect_fraction: float = 0.0
    """Chance that a client sends an operation first to a node drawn at random, as one that
    reconnected does (it follows redirects from there). Without it every client soon sticks
    to the leader, and no client sees a new leader while an old one still answers."""


class _Operation:
    __slots__ = ("argument", "attempt", "call_ms", "data", "key", "kind", "operation_id")

    def __init__(self, operation_id: int, kind: str, key: str, argument: Any, call_ms: int):
        self.operation_id = operation_id
        self.kind = kind
        self.key = key
        self.argument = argument
        self.call_ms = call_ms
        self.attempt = 0
        self.data = b""


OnFinish = Callable[[str, Any], None]
"""Called with ("ok", output) or ("unknown", None) when an operation ends."""


class SimClient:
    def __init__(
        self,
        client_id: int,
        *,
        events: EventQueue,
        nodes: dict[str, SimNode],
        history: History,
        options: WorkloadOptions,
        rng: random.Random,
        stats: WorkloadStats,
    ) -> None:
        self.client_id = client_id
        self.events = events
        self.nodes = nodes
        self.node_ids = sorted(nodes)
        self.history = history
        self.options = options
        self.rng = rng
        self.stats = stats
        self.sequence = 0
        self.target = self.node_ids[rng.randrange(len(self.node_ids))]
        self.operation: _Operation | None = None
        self.on_finish: OnFinish | None = None
        self.last_seen: dict[str, str | None] = {}

    @property
    def busy(self) -> bool:
        return self.operation is not None

    def begin(self, kind: str, key: str, argument: Any, on_finish: OnFinish | None) -> None:
        """Invoke one operation: "put"/"append" (argument: str), "get", "delete", or "cas"
        (argument: (expected, new))."""
        now = self.events.now_ms
        operation_id = self.history.invoke(self.client_id, kind, key, argument, now)
        operation = _Operation(operation_id, kind, key, argument, now)
        if kind != "get":
            self.sequence += 1
            expected: str | None = None
            value = ""
            if kind == "cas":
                expected, value = argument
            elif kind in ("put", "append"):
                value = argument
            command = KvCommand(self.client_id, self.sequence, kind, key, value, expected)
            operation.data = encode_command(command)
        self.operation = operation
        self.on_finish = on_finish
        reconnect = self.options.reconnect_fraction
        if reconnect and self.rng.random() < reconnect:
            self.target = self.node_ids[self.rng.randrange(len(self.node_ids))]
        self._send(operation)

    def abandon(self) -> None:
        """Give up the operation in flight, if any: its outcome is unknown."""
        operation = self.operation
        if operation is not None:
            self.history.unknown(operation.operation_id)
            self.stats.unknown += 1
            self._end("unknown", None)

    def _latency_ms(self) -> int:
        return draw_int(self.rng, self.options.latency_ms_min, self.options.latency_ms_max)

    def _send(self, operation: _Operation) -> None:
        operation.attempt += 1
        self.stats.requests += 1
        token = (operation.operation_id, operation.attempt)
        self.events.schedule(self._latency_ms(), self._arrive, token)
        self.events.schedule(self.options.request_timeout_ms, self._timeout, token)

    def _arrive(self, token: tuple[int, int]) -> None:
        operation = self.operation
        if operation is None or operation.operation_id != token[0]:
            return
        node = self.nodes[self.target]

        def reply(answer: ClientReply) -> None:
            self.events.schedule(self._latency_ms(), self._on_reply, (token, answer))

        if operation.kind == "get":
            node.submit_read((operation.key, reply))
        else:
            node.submit_write((operation.data, reply))

    def _on_reply(self, packet: tuple[tuple[int, int], ClientReply]) -> None:
        (operation_id, attempt), answer = packet
        operation = self.operation
        if operation is None or operation.operation_id != operation_id:
            return
        if answer.status == "ok":
            # Even an answer to an earlier attempt is true: the write took effect, or the
            # read saw a state, within this operation's interval.
            self._finish_ok(operation, answer.value)
            return
        if attempt != operation.attempt:
            return  # a refusal from an older attempt says nothing about the current one
        if answer.status == "redirect":
            self.stats.redirects += 1
            if answer.leader_hint is not None and answer.leader_hint in self.nodes:
                self.target = answer.leader_hint
                delay_ms = self._latency_ms()
            else:
                self.target = self._next_node()
                delay_ms = self._backoff_ms()
        else:
            self.stats.retries += 1
            delay_ms = self._backoff_ms()
        self.events.schedule(delay_ms, self._resend, (operation_id, attempt))

    def _backoff_ms(self) -> int:
        return draw_int(self.rng, self.options.backoff_ms_min, self.options.backoff_ms_max)

    def _next_node(self) -> str:
        position = self.node_ids.index(self.target)
        return self.node_ids[(position + 1) % len(self.node_ids)]

    def _resend(self, token: tuple[int, int]) -> None:
        operation = self.operation
        if operation is None or (operation.operation_id, operation.attempt) != token:
            return
        if self._expired(operation):
            return
        self._send(operation)

    def _timeout(self, token: tuple[int, int]) -> None:
        operation = self.operation
        if operation is None or (operation.operation_id, operation.attempt) != token:
            return
        self.stats.timeouts += 1
        if self._expired(operation):
            return
        self.target = self._next_node()
        self._send(operation)

    def _expired(self, operation: _Operation) -> bool:
        if self.events.now_ms - operation.call_ms < self.options.operation_timeout_ms:
            return False
        self.history.unknown(operation.operation_id)
        self.stats.unknown += 1
        self._end("unknown", None)
        return True

    def _finish_ok(self, operation: _Operation, value: Any) -> None:
        now = self.events.now_ms
        output: Any = None
        if operation.kind == "get":
            output = value
            self.last_seen[operation.key] = value
        elif operation.kind == "cas":
            output = value
        self.history.complete(operation.operation_id, output, now)
        self.stats.record_ok(operation.kind, operation.call_ms, now)
        self._end("ok", output)

    def _end(self, status: str, output: Any) -> None:
        on_finish = self.on_finish
        self.operation = None
        self.on_finish = None
        if on_finish is not None:
            on_finish(status, output)


class WorkloadStats:
    def __init__(self) -> None:
        self.requests = 0
        self.redirects = 0
        self.retries = 0
        self.timeouts = 0
        self.unknown = 0
        self.ok = 0
        self.write_completions: list[tuple[int, int]] = []
        """(call ms, return ms) of acknowledged writes, in return order."""

    def record_ok(self, kind: str, call_ms: int, return_ms: int) -> None:
        self.ok += 1
        if kind != "get":
            self.write_completions.append((return_ms, call_ms))

    def first_write_invoked_after(self, time_ms: int) -> int | None:
        """The earliest return time of a write called at or after `time_ms`."""
        best: int | None = None
        start = bisect.bisect_left(self.write_completions, (time_ms, -1))
        for return_ms, call_ms in self.write_completions[start:]:
            if call_ms >= time_ms:
                best = return_ms
                break
        return best


class Workload:
    """Clients that keep issuing random operations on a few keys until `stop()`."""

    def __init__(
        self,
        *,
        events: EventQueue,
        nodes: dict[str, SimNode],
        options: WorkloadOptions,
        rng: random.Random,
        history: History | None = None,
    ) -> None:
        self.events = events
        self.options = options
        self.rng = rng
        self.history = history if history is not None else History()
        self.stats = WorkloadStats()
        self.keys = [f"k{number}" for number in range(options.key_count)]
        self.running = False
        self.clients = [
            SimClient(
                client_id,
                events=events,
                nodes=nodes,
                history=self.history,
                options=options,
                rng=random.Random(rng.getrandbits(64)),
                stats=self.stats,
            )
            for client_id in range(1, options.client_count + 1)
        ]

    def start(self) -> None:
        self.running = True
        for client in self.clients:
            self.events.schedule(self._think_ms(), self._next, client)

    def stop(self) -> None:
        self.running = False

    def _think_ms(self) -> int:
        return draw_int(self.rng, self.options.think_ms_min, self.options.think_ms_max)

    def _next(self, client: SimClient) -> None:
        if not self.running or client.busy:
            return
        kind, key, argument = self._choose(client)

        def on_finish(status: str, output: Any) -> None:
            self.events.schedule(self._think_ms(), self._next, client)

        client.begin(kind, key, argument, on_finish)

    def _choose(self, client: SimClient) -> tuple[str, str, Any]:
        options = self.options
        rng = self.rng
        key = self.keys[rng.randrange(len(self.keys))]
        draw = rng.random()
        # Values are unique per (client, sequence), so a wrong read points at one write.
        value = f"{client.client_id}.{client.sequence + 1}"
        if draw < options.read_fraction:
            return "get", key, None
        draw -= options.read_fraction
        if draw < options.append_fraction:
            return "append", key, value + ";"
        draw -= options.append_fraction
        if draw < options.cas_fraction:
            return "cas", key, (client.last_seen.get(key), value)
        return "put", key, value
