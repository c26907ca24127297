"""A simulated consumer of a group: the shipped membership decisions, a model of the rest.

What it sends and how: `JoinGroup`s (heartbeats carrying `owned`), `CommitOffsets` with
its member id and generation, `DescribeGroup` reads of the committed offsets, and
`LeaveGroup`, as `codec.wire.GroupCoordinatorRequest` frames over the simulator's frame
network, each carried out by the shipped attempt loop (`node.peer_requests`: leader
hints, attempt timeouts, back-off) as the HA controller's brokers do.

What it decides with shipped code: which answer changes what it knows
(`stream.membership.answer_taken`) and when it heartbeats next
(`stream.membership.heartbeat_delay_seconds`). What is a MODEL here (stream/consumer.py is
bound to its threads and fetches): the consumer's take-up of an answer, as
`Consumer.sync_assignment` and `Consumer.revoke` do it: stop reading what it lost, commit
where it stands in those partitions with the new generation, say it no longer holds them
(the next join's `owned`, sent at once), then read the gained ones from their committed
offsets. "Reading" moves a position forward; positions are committed now and then.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from quorumlog.codec import wire
from quorumlog.errors import QuorumLogError
from quorumlog.runtime.completion import Completion
from quorumlog.stream.assignors import ASSIGNOR_DEFAULT, TopicPartition
from quorumlog.stream.group_model import (
    NO_GENERATION,
    CommitOffsets,
    DescribeGroup,
    GroupCommand,
    GroupResult,
    JoinGroup,
    LeaveGroup,
    PartitionOffset,
    Refusal,
    decode_results,
    encode_commands,
)
from quorumlog.stream.membership import Generation, answer_taken, heartbeat_delay_seconds
from quorumlog.testing.history import History
from quorumlog.testing.sim.checks import InvariantViolation
from quorumlog.testing.sim.events import EventQueue, derive_random, draw_int
from quorumlog.testing.sim.frame_network import SimFrameNetwork
from quorumlog.testing.sim.groups.checks import GroupChecker
from quorumlog.testing.sim.process import SimProcess
from quorumlog.testing.sim.shardkv.transport import FrameCalls, SimPeerRequests, address_of

SESSION_TIMEOUT_MS = 1500
HEARTBEAT_INTERVAL_SECONDS = 0.3
ATTEMPT_TIMEOUT_SECONDS = 0.3
REQUEST_TIMEOUT_SECONDS = 1.5
READ_INTERVAL_MS = 60
COMMIT_INTERVAL_MS = 250

Done = Callable[[GroupResult | None], None]
"""A request's end: its result, or None (no node answered in time: outcome unknown)."""


class SimConsumer:
    def __init__(
        self,
        name: str,
        group: str,
        topics: list[str],
        *,
        seed: int,
        events: EventQueue,
        frames: SimFrameNetwork,
        node_ids: list[str],
        checker: GroupChecker,
        history: History,
    ) -> None:
        self.name = name
        self.group = group
        self.topics = sorted(topics)
        self.events = events
        self.checker = checker
        self.history = history
        self.rng = derive_random(seed, f"consumer:{name}")
        self.process = SimProcess(name, events, derive_random(seed, f"resume:{name}"))
        self.process.boot()
        frames.register(name, self.process)
        self.calls = FrameCalls(name, frames, self.process)
        self.requests = SimPeerRequests(self.calls)
        self.addresses = [address_of(node_id) for node_id in node_ids]
        self.member_number = 0
        self.member_id = ""
        self.active = False
        self.current = Generation(NO_GENERATION, frozenset())
        """The newest answer taken (`Membership.current`)."""
        self.applied = Generation(NO_GENERATION, frozenset())
        """What the consumer reads (`Consumer.applied`)."""
        self.owned: frozenset[TopicPartition] = frozenset()
        self.rebalancing = False
        self.revoking = False
        self.positions: dict[TopicPartition, int] = {}
        self.heartbeat_in_flight = False
        self.heartbeat_again = False
        self.heartbeat_token = 0
        self.taken_answers = 0
        self.commits_ok = 0
        self.commits_refused = 0
        self.operation_count = 0
        self.commit_sequence = 0
        self.heartbeats_answered = 0
        self.heartbeat_wait_ms = 0
        """Virtual milliseconds from sending each answered heartbeat to its answer."""

    # --- life ------------------------------------------------------------------------------

    def join(self) -> None:
        """Join as a new member (a new id, as `Membership.become_new_member` makes one)."""
        self.member_number += 1
        self.member_id = f"{self.name}-{self.member_number}"
        self.commit_sequence = 0
        self.active = True
        self.current = Generation(NO_GENERATION, frozenset())
        self.applied = Generation(NO_GENERATION, frozenset())
        self.owned = frozenset()
        self.rebalancing = False
        self.revoking = False
        self.positions = {}
        self.heartbeat_now()
        # The member's own read and commit loops: those of an earlier member stop.
        self.process.schedule(READ_INTERVAL_MS, self.read_records, self.member_number)
        self.process.schedule(COMMIT_INTERVAL_MS, self.commit_positions, self.member_number)

    def leave(self) -> None:
        """Stop reading and leave at once (`Membership.leave`)."""
        if not self.active:
            return
        self.active = False
        self.heartbeat_token += 1
        self.checker.left(self.name, self.member_id, self.group)
        self.positions = {}
        self.send(LeaveGroup(self.group, self.member_id), lambda result: None)

    def crash(self) -> None:
        """Die without a word: the process restarts empty (no leave is sent; the group
        expires the member after its session timeout). The next `join` is a new member."""
        if not self.active:
            return
        self.active = False
        self.checker.left(self.name, self.member_id, self.group)  # a dead process reads nothing
        self.positions = {}
        self.heartbeat_in_flight = False
        self.heartbeat_again = False
        self.process.kill()
        self.process.boot()

    def pause(self) -> None:
        """Silent (a stalled process): no heartbeats, reads or commits until resumed."""
        self.process.pause()

    def resume(self) -> None:
        self.process.resume()

    # --- heartbeats ------------------------------------------------------------------------

    def heartbeat_now(self) -> None:
        if self.heartbeat_in_flight:
            self.heartbeat_again = True
            return
        self.heartbeat_token += 1
        self.heartbeat(self.heartbeat_token)

    def schedule_heartbeat(self) -> None:
        self.heartbeat_token += 1
        delay_seconds = heartbeat_delay_seconds(HEARTBEAT_INTERVAL_SECONDS, self.rebalancing)
        self.process.schedule(round(delay_seconds * 1000), self.heartbeat, self.heartbeat_token)

    def heartbeat(self, token: int) -> None:
        if not self.active or token != self.heartbeat_token or self.heartbeat_in_flight:
            return
        member_id = self.member_id
        owned = sorted(self.owned)
        self.checker.join_sent(self.name, member_id, self.group, {*owned, *self.current.assignment})
        command = JoinGroup(
            self.group,
            member_id,
            self.name,
            self.topics,
            SESSION_TIMEOUT_MS,
            ASSIGNOR_DEFAULT,
            owned=owned,
            owned_generation=self.current.generation,
        )
        self.heartbeat_in_flight = True
        sent_ms = self.events.now_ms

        def answered(result: GroupResult | None) -> None:
            self.heartbeat_in_flight = False
            if result is not None:
                self.heartbeats_answered += 1
                self.heartbeat_wait_ms += self.events.now_ms - sent_ms
            if not self.active:
                return
            # An answer that crossed a leave no longer speaks for this consumer.
            if result is not None and member_id == self.member_id:
                self.take(result)
            if self.heartbeat_again:
                self.heartbeat_again = False
                self.heartbeat_now()
            else:
                self.schedule_heartbeat()

        self.send(command, answered)

    def take(self, result: GroupResult) -> None:
        """`Membership.heartbeat` with the answer, then the consumer's take-up of it."""
        if not result.ok:
            raise InvariantViolation(
                f"{self.name}: the coordinator refused a well-formed join: {result!r}"
            )
        self.rebalancing = result.rebalancing
        taken = answer_taken(self.current, result)
        if taken is None:
            return
        self.taken_answers += 1
        self.checker.answer_taken(
            self.name,
            self.member_id,
            self.group,
            taken.generation,
            taken.assignment,
            self.events.now_ms,
        )
        self.current = taken
        self.sync()

    # --- the consumer's take-up (a model of Consumer.sync_assignment) ----------------------

    def sync(self) -> None:
        latest, applied = self.current, self.applied
        if self.revoking or not self.active:
            return
        if latest.generation == applied.generation and latest.assignment == applied.assignment:
            return
        revoked = applied.assignment - latest.assignment
        gained = latest.assignment - applied.assignment
        if not revoked:
            self.take_up(latest, gained)
            return
        self.revoking = True
        self.applied = Generation(latest.generation, applied.assignment)
        offsets = {key: self.positions[key] for key in revoked if key in self.positions}
        member_id = self.member_id

        def revoked_done() -> None:
            if member_id != self.member_id or not self.active:
                return
            self.revoking = False
            for key in revoked:
                self.positions.pop(key, None)
            self.take_up(latest, gained)
            self.heartbeat_now()  # the new owners wait for this member's word
            self.sync()

        self.commit(offsets, latest.generation, revoked_done)

    def take_up(self, latest: Generation, gained: frozenset[TopicPartition]) -> None:
        self.applied = latest
        self.owned = latest.assignment
        if gained:
            self.position(gained)

    def position(self, gained: frozenset[TopicPartition]) -> None:
        """Read where the group committed in the gained partitions (DescribeGroup, behind a
        ReadIndex round) and start reading there."""
        if not gained:
            return
        member_id = self.member_id
        keys = sorted(gained)
        operations = {
            key: self.history.invoke(self.caller(), "get", (self.group, *key), None, self.now())
            for key in keys
        }

        def answered(result: GroupResult | None) -> None:
            committed: dict[TopicPartition, int] = {}
            if result is None or not (result.ok or result.refusal is Refusal.UNKNOWN_GROUP):
                for operation in operations.values():
                    self.history.fail(operation, self.now())
                if member_id == self.member_id and self.active:
                    self.process.schedule(50, lambda _: self.position(self.unpositioned()))
                return
            if result.group is not None:
                committed = {(o.topic, o.partition): o.offset for o in result.group.offsets}
            for key, operation in operations.items():
                self.history.complete(operation, committed.get(key), self.now())
            if member_id != self.member_id:
                return
            for key in keys:
                if key in self.applied.assignment and key not in self.positions:
                    self.positions[key] = committed.get(key, 0)

        self.send(DescribeGroup(self.group), answered)

    def unpositioned(self) -> frozenset[TopicPartition]:
        return frozenset(k for k in self.applied.assignment if k not in self.positions)

    # --- reading and committing ------------------------------------------------------------

    def read_records(self, number: int) -> None:
        if not self.active or number != self.member_number:
            return
        if not self.revoking:
            for key in sorted(self.positions):
                if key in self.applied.assignment:
                    self.positions[key] += draw_int(self.rng, 0, 3)
        self.process.schedule(READ_INTERVAL_MS, self.read_records, number)

    def commit_positions(self, number: int) -> None:
        if not self.active or number != self.member_number:
            return
        offsets = {k: v for k, v in self.positions.items() if k in self.applied.assignment}
        if offsets and not self.revoking:
            self.commit(offsets, self.applied.generation, lambda: None)
        delay_ms = COMMIT_INTERVAL_MS + draw_int(self.rng, 0, COMMIT_INTERVAL_MS)
        self.process.schedule(delay_ms, self.commit_positions, number)

    def commit(
        self, offsets: dict[TopicPartition, int], generation: int, then: Callable[[], None]
    ) -> None:
        if not offsets:
            then()
            return
        items = [PartitionOffset(t, p, o) for (t, p), o in sorted(offsets.items())]
        operations = [
            self.history.invoke(self.caller(), "put", (self.group, t, p), o, self.now())
            for (t, p), o in sorted(offsets.items())
        ]

        def answered(result: GroupResult | None) -> None:
            for operation in operations:
                # A refusal may answer a retry of a commit whose first attempt took effect
                # (its answer lost, the group moved on meanwhile): not a definite failure.
                if result is None or not result.ok:
                    self.history.unknown(operation)
                elif result.ok:
                    self.history.complete(operation, None, self.now())
                else:
                    self.history.fail(operation, self.now())
            if result is not None and result.ok:
                self.commits_ok += 1
            elif result is not None:
                self.commits_refused += 1
            then()

        # Numbered as `CoordinatorLink.commit` numbers them (a model: that one is asyncio's).
        self.commit_sequence += 1
        command = CommitOffsets(self.group, self.member_id, generation, items, self.commit_sequence)
        self.send(command, answered)

    # --- requests --------------------------------------------------------------------------

    def send(self, command: GroupCommand, done: Done) -> None:
        data = encode_commands([command])

        def make_request(request_id: int) -> wire.ClientRequest:
            return wire.GroupCoordinatorRequest(request_id=request_id, commands=data)

        completion = self.requests.request(
            self.addresses,
            make_request,
            timeout_seconds=REQUEST_TIMEOUT_SECONDS,
            attempt_timeout_seconds=ATTEMPT_TIMEOUT_SECONDS,
        )

        def finished(outcome: Completion[wire.Frame]) -> None:
            if outcome.exception() is not None:
                if not isinstance(outcome.exception(), QuorumLogError):
                    raise InvariantViolation(f"{self.name}: {outcome.exception()!r}")
                done(None)
                return
            frame = outcome.result()
            if not isinstance(frame, wire.GroupCoordinatorResponse):
                done(None)
                return
            results = decode_results(frame.results)
            if len(results) != 1:
                raise InvariantViolation(f"{self.name}: {len(results)} results for one command")
            done(results[0])

        completion.add_done_callback(finished)

    def caller(self) -> str:
        """The history's client of one operation: a consumer has several in flight at once
        (reads, commits), and the checker needs no order among them."""
        self.operation_count += 1
        return f"{self.name}#{self.operation_count}"

    def now(self) -> float:
        return float(self.events.now_ms)

    def describe(self) -> str:
        state = "active" if self.active else "gone"
        state += " paused" if self.process.paused else ""
        return (
            f"{self.name} ({self.member_id}, {state}): generation {self.current.generation} "
            f"{sorted(self.current.assignment)}; reads {sorted(self.applied.assignment)} "
            f"owned {sorted(self.owned)} revoking={self.revoking}"
        )


def pick(rng: random.Random, names: list[str]) -> str:
    return names[draw_int(rng, 0, len(names) - 1)]
