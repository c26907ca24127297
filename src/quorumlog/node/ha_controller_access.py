"""`RequestControllerAccess`: the broker hosts' `ControllerAccess`, on `PeerRequests`.

What a broker sends the HA controller and how it reads the answers, with no I/O of its own,
so a node and the simulator run this same code: the node over `AsyncioPeerRequests` (one
connection per controller node, kept), the simulator over simulated frames
(`testing/sim/shardkv/transport.py`'s `SimPeerRequests`). Both carry each request out by
the shipped attempt loop (`node.peer_requests.request_by_attempts`: the known leader
first, NOT_LEADER hints followed, a pause once every node failed, a deadline).

- Two lanes, one call at a time each, in order: heartbeats, and the rest (register,
  AlterSyncStateSet). A slow register or AlterSyncStateSet never delays a heartbeat (a late
  heartbeat can cost a master its mastership), and a broker's writes reach the controller
  in the order it made them.
- Register and AlterSyncStateSet are logged writes: each carries a sequence of this
  broker's session (`kv.connection.ClientSession`), the controller applies it once, and a
  call that ended with no answer keeps its sequence for a while (`SequenceTracker`), so the
  same call repeated is recognised as a duplicate. Heartbeats carry none (a repeat is
  harmless).
- The answer: the controller's result (a refusal is `ok=False` with its code), or None
  when the outcome is unknown (no node answered in time, a malformed answer). A duplicate
  whose answer the controller no longer keeps did happen: the group is then read
  (`GetGroup`), as the blocking client does.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from quorumlog.codec import wire
from quorumlog.errors import ClientError, UnavailableError
from quorumlog.ha.broker_host import ControllerCall, ControllerDone
from quorumlog.ha.controller_client import controller_request, single_result, write_identity
from quorumlog.ha.controller_model import (
    AlterSyncStateSet,
    BrokerHeartbeat,
    GetGroup,
    HAControllerResult,
    RegisterBroker,
)
from quorumlog.kv.connection import ClientSession, CommandIdentity, new_client_id
from quorumlog.node.peer_requests import PeerRequests
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.resources import Scheduler

TIMEOUT_SECONDS_DEFAULT = 2.0
"""One call, every attempt included: then its outcome is unknown and the host decides."""
ATTEMPT_TIMEOUT_SECONDS_DEFAULT = 1.0
"""One attempt at one controller node: about an election."""


class ControllerAccessConfig(msgspec.Struct, frozen=True, kw_only=True):
    timeout_seconds: float = TIMEOUT_SECONDS_DEFAULT
    attempt_timeout_seconds: float = ATTEMPT_TIMEOUT_SECONDS_DEFAULT

    def validate(self) -> None:
        if not 0 < self.attempt_timeout_seconds <= self.timeout_seconds:
            raise ValueError("need 0 < attempt_timeout_seconds <= timeout_seconds")


@dataclass
class Lane:
    """Calls that go one at a time, in order."""

    waiting: deque[tuple[ControllerCall, ControllerDone]] = field(default_factory=deque)
    busy: bool = False


class RequestControllerAccess:
    """`ha.broker_host.ControllerAccess` on `PeerRequests`. See the module docstring."""

    def __init__(
        self,
        requests: PeerRequests,
        scheduler: Scheduler,
        endpoints: Sequence[str],
        config: ControllerAccessConfig | None = None,
        client_id: str | None = None,
    ) -> None:
        """`endpoints`: the controller's nodes ("host:port", or what `requests` resolves)."""
        self.config = config or ControllerAccessConfig()
        self.config.validate()
        self.requests = requests
        self.scheduler = scheduler
        self.endpoints = list(endpoints)
        self.session = ClientSession(client_id or new_client_id(), self.config.timeout_seconds)
        self.heartbeats = Lane()
        self.writes = Lane()
        self.closed = False

    def submit(self, command: ControllerCall, done: ControllerDone) -> None:
        if self.closed:
            self.scheduler.call_soon(lambda: done(None))
            return
        lane = self.heartbeats if isinstance(command, BrokerHeartbeat) else self.writes
        lane.waiting.append((command, done))
        if not lane.busy:
            self.next_call(lane)

    def close(self) -> None:
        """Calls still waiting end with an unknown outcome; those under way end as their
        requests do (the transport's close ends them)."""
        self.closed = True
        for lane in (self.heartbeats, self.writes):
            while lane.waiting:
                _, done = lane.waiting.popleft()
                self.scheduler.call_soon(functools.partial(done, None))

    # --- one call ---------------------------------------------------------------------------

    def next_call(self, lane: Lane) -> None:
        lane.busy = bool(lane.waiting)
        if not lane.waiting:
            return
        command, done = lane.waiting.popleft()

        def finished(result: HAControllerResult | None) -> None:
            done(result)
            self.next_call(lane)

        if isinstance(command, RegisterBroker | AlterSyncStateSet):
            self.logged_write(command, finished)
        else:
            self.call(command, 0, finished)

    def logged_write(
        self, command: RegisterBroker | AlterSyncStateSet, done: ControllerDone
    ) -> None:
        session = self.session
        identity = write_identity(command)
        sequence = session.sequences.allocate(identity, self.scheduler.monotonic_seconds())
        numbered = msgspec.structs.replace(command, sequence=sequence)

        def answered(result: HAControllerResult | None) -> None:
            self.settle_sequence(sequence, identity, result)
            if result is not None and result.ok and result.group is None:
                # A duplicate whose answer the controller already let go: it did happen.
                self.call(GetGroup(command.group), 0, done)
                return
            done(result)

        self.call(numbered, session.first_unacknowledged(), answered)

    def settle_sequence(
        self, sequence: int, identity: CommandIdentity, result: HAControllerResult | None
    ) -> None:
        sequences = self.session.sequences
        if result is None:
            sequences.hold_unknown(sequence, identity, self.scheduler.monotonic_seconds())
            return
        self.session.answered = True
        sequences.acknowledge(sequence)

    def call(
        self, command: ControllerCall | GetGroup, first_unacknowledged: int, done: ControllerDone
    ) -> None:
        what = f"{type(command).__name__} {command.group}"
        config = self.config
        completion = self.requests.request(
            self.endpoints,
            controller_request(command, self.session.client_id, first_unacknowledged),
            accept=lambda frame: isinstance(frame, wire.HAControllerResponse),
            timeout_seconds=config.timeout_seconds,
            attempt_timeout_seconds=config.attempt_timeout_seconds,
        )

        def answered(finished: Completion[wire.Frame]) -> None:
            done(self.result_of(what, finished))

        completion.add_done_callback(answered)

    def result_of(self, what: str, finished: Completion[wire.Frame]) -> HAControllerResult | None:
        error = finished.exception()
        if isinstance(error, UnavailableError):
            return None  # no node answered in time: the outcome is unknown
        if error is not None:
            raise error
        response = finished.result()
        if not isinstance(response, wire.HAControllerResponse):
            return None  # `accept` let only those through; anything else is no answer
        try:
            return single_result(what, response)
        except ClientError:
            return None


__all__ = [
    "ATTEMPT_TIMEOUT_SECONDS_DEFAULT",
    "TIMEOUT_SECONDS_DEFAULT",
    "ControllerAccessConfig",
    "RequestControllerAccess",
]
