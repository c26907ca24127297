"""Moves shards for one shard group: runs `shard.group_driver.monitor` on the group's leader
every `interval_seconds` and carries out what it asks.

- FetchConfiguration: ask the controller for the next configuration number;
- Propose: propose the entry (a configuration, an insert or a GC confirmation);
- SendPullRequest: pull from the previous owner, chunk by chunk; each chunk is proposed
  and applied before the next is asked for, so the log holds at most one chunk per source
  ahead of the state and a new leader simply starts the pull again;
- SendDeleteRequest: ask the previous owner to drop its copy, then propose the
  confirmation.

Nothing is remembered between rounds except which actions are in flight (so a slow pull is
not started twice) and the controller's latest answer: the driver reads everything else
from the applied state, and every entry and message names its configuration number, so a
repeated or late action is harmless.

No asyncio here: timers come from the group's scheduler, requests to other groups go
through a `PeerRequests` (node/peer_requests.py), and each action is a chain of callbacks
that ends by calling its `finish` once. So the node runs this on asyncio and the simulator
runs it, unchanged, on virtual time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import msgspec

from quorumlog.codec import wire
from quorumlog.errors import QuorumLogError
from quorumlog.node.peer_requests import PeerRequests
from quorumlog.node.shard_service import ShardGroupService
from quorumlog.raft.invariants import InvariantViolation
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.resources import Scheduler, Timer
from quorumlog.shard.config import ShardConfiguration
from quorumlog.shard.controller_commands import Query, decode_results, encode_commands
from quorumlog.shard.group_commands import (
    DeleteResponse,
    GroupEntry,
    PullRequest,
    PullResponse,
    PullStatus,
    decode_message,
    encode_entry,
    encode_message,
)
from quorumlog.shard.group_driver import (
    FetchConfiguration,
    Propose,
    SendDeleteRequest,
    SendPullRequest,
    entry_for_delete_response,
    entry_for_pull_response,
    monitor,
    next_pull_request,
)

log = logging.getLogger("quorumlog.shard")

Response = TypeVar("Response", PullResponse, DeleteResponse)
Finish = Callable[[BaseException | None], None]
"""How an action ends: once, with the error that ended it or None."""

PULL_BYTES_MAX_DEFAULT = 1024 * 1024
"""Keys and values per pull chunk: one frame and one log entry. Small enough that a chunk
holds the loop, the disk and the peer links only briefly (other groups' writes queue
behind it), large enough that per-chunk costs stay small."""

MIGRATION_BYTES_PER_SECOND_DEFAULT = 16 * 1024 * 1024
"""How fast one node pulls shard data, all groups together. Moving a shard costs every
replica of both groups CPU, disk and network; unthrottled it takes that from the shards
that are not moving (as Kafka's replication throttle and TiKV's snapshot rate limit)."""


PROPOSE_TIMEOUT_SECONDS = 30.0
DECODE_ERRORS = wire.DECODE_ERRORS


def pull_attempt_timeout_seconds(bytes_max: int) -> float:
    """How long one pull attempt may take: building, sending and decoding a chunk grows
    with its size; a timeout too short for the chunk would ask for it again for ever."""
    return 2.0 + bytes_max / (1024 * 1024)


class ByteRatePacer:
    """Spaces out work so that, over time, at most `bytes_per_second` pass (0: no limit).

    `pace` books `count` bytes and calls back once the bytes booked before them have had
    their time; shared by every migrator of a node, so the rate is the node's."""

    def __init__(self, bytes_per_second: int) -> None:
        self.bytes_per_second = bytes_per_second
        self.next_free = 0.0
        self.paced_seconds = 0.0

    def delay_seconds(self, now: float, count: int) -> float:
        """Book `count` bytes at time `now`; how long they must wait."""
        if self.bytes_per_second <= 0:
            return 0.0
        self.next_free = max(self.next_free, now) + count / self.bytes_per_second
        delay = self.next_free - now - count / self.bytes_per_second
        if delay <= 0:
            return 0.0
        self.paced_seconds += delay
        return delay

    def pace(self, scheduler: Scheduler, count: int, then: Callable[[], None]) -> None:
        """Call `then` once `count` bytes may pass: at once (inline) if they may now."""
        delay = self.delay_seconds(scheduler.monotonic_seconds(), count)
        if delay > 0:
            scheduler.call_later(delay, then)  # the throttle itself: waiting is the point
        else:
            then()


def insert_bytes(response: PullResponse) -> int:
    insert = response.insert
    if insert is None:
        return 0
    return sum(
        len(key) + len(value) for data in insert.shards.values() for key, value in data.items()
    )


class ShardMigrator:
    def __init__(
        self,
        service: ShardGroupService,
        controller_addresses: Callable[[], list[str]],
        peers: PeerRequests,
        interval_seconds: float = 0.1,
        pull_bytes_max: int = PULL_BYTES_MAX_DEFAULT,
        pacer: ByteRatePacer | None = None,
    ) -> None:
        self.service = service
        self.scheduler = service.group.scheduler
        self.controller_addresses = controller_addresses
        self.peers = peers
        self.interval_seconds = interval_seconds
        self.pull_bytes_max = pull_bytes_max
        self.pacer = pacer or ByteRatePacer(0)
        self.controller_configuration: ShardConfiguration | None = None
        self.in_flight: dict[tuple[object, ...], object] = {}
        """Action key → a token for its run; an action's `finish` frees its key."""
        self.timer: Timer | None = None
        self.stopped = False
        self.rounds = 0

    # --- life cycle -----------------------------------------------------------------------

    def start(self) -> None:
        self.timer = self.scheduler.call_later(self.interval_seconds, self.tick)

    def stop(self) -> None:
        """No more rounds; actions in flight end at their next step."""
        self.stopped = True
        if self.timer is not None:
            self.timer.cancel()
        self.in_flight.clear()

    def tick(self) -> None:
        if self.stopped:
            return
        # The monitors' period, as in the reference.
        self.timer = self.scheduler.call_later(self.interval_seconds, self.tick)
        if not self.service.group.is_leader:
            return
        try:
            self.round()
        except QuorumLogError as error:  # refused now (not leader, stopped): next round
            log.debug("shard group %d: migration round: %s", self.service.gid, error)

    def round(self) -> None:
        """One monitor pass: start every action not already in flight."""
        self.rounds += 1
        machine = self.service.machine
        for action in monitor(machine, self.controller_configuration):
            if isinstance(action, FetchConfiguration):
                self.launch(
                    ("fetch", action.number), partial(self.fetch_configuration, action.number)
                )
            elif isinstance(action, Propose):
                key = ("propose", type(action.entry).__name__, machine.current_configuration.number)
                self.launch(key, partial(self.propose, action.entry))
            elif isinstance(action, SendPullRequest):
                self.launch(
                    ("pull", action.target_gid, action.request.configuration_number),
                    partial(self.pull, action),
                )
            else:
                self.launch(
                    ("delete", action.target_gid, action.request.configuration_number),
                    partial(self.delete, action),
                )

    def launch(self, key: tuple[object, ...], work: Callable[[Finish], None]) -> None:
        """Start `work(finish)` unless the action `key` is in flight."""
        if key in self.in_flight:
            return
        token = object()
        self.in_flight[key] = token

        def finish(error: BaseException | None) -> None:
            if self.in_flight.get(key) is token:
                del self.in_flight[key]
            if error is not None:  # the next round tries again
                log.debug("shard group %d: %s failed: %s", self.service.gid, key, error)

        self.step(finish, lambda: work(finish))

    def step(self, finish: Finish, call: Callable[[], None]) -> None:
        """Run one step of an action: a typed refusal (not leader, pending full, a peer
        that cannot answer) ends the action; the next round tries again."""
        if self.stopped:
            return
        try:
            call()
        except QuorumLogError as error:
            finish(error)

    def after(
        self, completion: Completion[Any], finish: Finish, on_result: Callable[[Any], None]
    ) -> None:
        """Once `completion` is done: `on_result(value)` as the next step, or end the
        action with its error."""

        def done(settled: Completion[Any]) -> None:
            error = settled.exception()
            if error is not None:
                self.step(finish, lambda: finish(error))
            else:
                self.step(finish, lambda: on_result(settled.result()))

        completion.add_done_callback(done)

    # --- the actions ----------------------------------------------------------------------

    def propose(
        self, entry: GroupEntry, finish: Finish, applied: Callable[[], None] | None = None
    ) -> None:
        """Propose `entry`; `applied()` once it applied (else `finish(None)`), or end the
        action with the error. Bounded, so an entry whose fate is never reported cannot hold its
        action's in-flight slot for ever; the next round proposes again (entries are
        idempotent)."""
        completion = self.service.group.propose(encode_entry(entry))
        settled = False

        def settle(error: BaseException | None) -> None:
            nonlocal settled
            if settled:
                return
            settled = True
            timer.cancel()
            if error is not None or applied is None:
                finish(error)
            else:
                self.step(finish, applied)

        timer = self.scheduler.call_later(
            PROPOSE_TIMEOUT_SECONDS,
            lambda: settle(TimeoutError(f"no outcome in {PROPOSE_TIMEOUT_SECONDS:g} s")),
        )
        completion.add_done_callback(lambda done: settle(done.exception()))

    def fetch_configuration(self, number: int, finish: Finish) -> None:
        completion = self.peers.request(
            self.controller_addresses(),
            lambda request_id: wire.ControllerRequest(
                request_id=request_id,
                client_id=f"shard-group-{self.service.gid}",
                commands=encode_commands([Query(0, number)]),
            ),
            accept=lambda frame: isinstance(frame, wire.ControllerResponse),
        )
        self.after(completion, finish, lambda frame: self.learn_configuration(frame, finish))

    def learn_configuration(self, frame: wire.Frame, finish: Finish) -> None:
        if not isinstance(frame, wire.ControllerResponse):
            raise InvariantViolation(f"accepted {type(frame).__name__} from the controller")
        try:
            results = decode_results(frame.results)
        except DECODE_ERRORS as error:
            finish(error)
            return
        if len(results) != 1:
            finish(ValueError(f"the controller answered one query with {len(results)} results"))
            return
        [result] = results
        if result.ok and result.configuration is not None:
            known = self.controller_configuration
            if known is None or result.configuration.number > known.number:
                self.controller_configuration = result.configuration
        finish(None)

    def pull(self, action: SendPullRequest, finish: Finish) -> None:
        # The driver's request may resume a pull an earlier leader began (resume_at).
        request = msgspec.structs.replace(action.request, bytes_max=self.pull_bytes_max)
        self.pull_chunk(action, request, finish)

    def pull_chunk(self, action: SendPullRequest, request: PullRequest, finish: Finish) -> None:
        def paced(response: PullResponse) -> None:
            entry = entry_for_pull_response(self.service.machine, response)
            if entry is None:
                finish(None)
                return
            following = next_pull_request(request, response)
            if following is None:
                self.propose(entry, finish)
            else:
                self.propose(entry, finish, lambda: self.pull_chunk(action, following, finish))

        def answered(response: PullResponse) -> None:
            self.pacer.pace(
                self.scheduler,
                insert_bytes(response),
                lambda: self.step(finish, lambda: paced(response)),
            )

        self.ask(action.target_gid, action.servers, request, PullResponse, finish, answered)

    def delete(self, action: SendDeleteRequest, finish: Finish) -> None:
        def answered(response: DeleteResponse) -> None:
            entry = entry_for_delete_response(self.service.machine, response)
            if entry is None:
                finish(None)
            else:
                self.propose(entry, finish)

        self.ask(
            action.target_gid, action.servers, action.request, DeleteResponse, finish, answered
        )

    def ask(
        self,
        gid: int,
        servers: list[str],
        message: Any,
        expected: type[Response],
        finish: Finish,
        on_answer: Callable[[Response], None],
    ) -> None:
        payload = encode_message(message)
        accepted: list[tuple[wire.Frame, Response]] = []
        """The frame `accept` took and its decoded answer (decoded once: pulls are big)."""

        def accept(frame: wire.Frame) -> bool:
            if not isinstance(frame, wire.ShardGroupResponse):
                return False
            try:
                decoded = decode_message(frame.message)
            except DECODE_ERRORS:
                return False
            # A replica that has not applied the configuration yet answers NOT_READY: ask
            # the next one rather than wait for the next round.
            if isinstance(decoded, PullResponse) and decoded.status is PullStatus.NOT_READY:
                return False
            if not isinstance(decoded, expected):
                return False
            accepted[:] = [(frame, decoded)]
            return True

        attempt_seconds = pull_attempt_timeout_seconds(self.pull_bytes_max)
        completion = self.peers.request(
            servers,
            lambda request_id: wire.ShardGroupRequest(
                request_id=request_id, gid=gid, message=payload
            ),
            accept=accept,
            timeout_seconds=3 * attempt_seconds,
            attempt_timeout_seconds=attempt_seconds,
        )

        def answered(frame: wire.Frame) -> None:
            if not accepted or accepted[0][0] is not frame:
                raise InvariantViolation("a peer answer arrived that `accept` did not take")
            on_answer(accepted[0][1])

        self.after(completion, finish, answered)
