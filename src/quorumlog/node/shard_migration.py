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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import msgspec

from quorumlog.codec import wire
from quorumlog.errors import QuorumLogError
from quorumlog.node.peer_requests import PeerRequester
from quorumlog.node.shard_service import ShardGroupService
from quorumlog.runtime.group import completion_future
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

PULL_BYTES_MAX_DEFAULT = 1024 * 1024
"""Keys and values per pull chunk: one frame and one log entry. Small enough that a chunk
holds the loop, the disk and the peer links only briefly (other groups' writes queue
behind it), large enough that per-chunk costs stay small."""

MIGRATION_BYTES_PER_SECOND_DEFAULT = 16 * 1024 * 1024
"""How fast one node pulls shard data, all groups together. Moving a shard costs every
replica of both groups CPU, disk and network; unthrottled it takes that from the shards
that are not moving (as Kafka's replication throttle and TiKV's snapshot rate limit)."""


PROPOSE_TIMEOUT_SECONDS = 30.0


def pull_attempt_timeout_seconds(bytes_max: int) -> float:
    """How long one pull attempt may take: building, sending and decoding a chunk grows
    with its size; a timeout too short for the chunk would ask for it again for ever."""
    return 2.0 + bytes_max / (1024 * 1024)


class ByteRatePacer:
    """Spaces out work so that, over time, at most `bytes_per_second` pass (0: no limit).

    `pace(count)` books `count` bytes and waits until the bytes booked before them have
    had their time; shared by every migrator of a node, so the rate is the node's."""

    def __init__(self, bytes_per_second: int) -> None:
        self.bytes_per_second = bytes_per_second
        self.next_free = 0.0
        self.paced_seconds = 0.0

    async def pace(self, count: int) -> None:
        if self.bytes_per_second <= 0:
            return
        now = asyncio.get_running_loop().time()
        self.next_free = max(self.next_free, now) + count / self.bytes_per_second
        delay = self.next_free - now - count / self.bytes_per_second
        if delay > 0:
            self.paced_seconds += delay
            await asyncio.sleep(delay)  # the throttle itself: waiting is the point


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
        requester: PeerRequester,
        interval_seconds: float = 0.1,
        pull_bytes_max: int = PULL_BYTES_MAX_DEFAULT,
        pacer: ByteRatePacer | None = None,
    ) -> None:
        self.service = service
        self.controller_addresses = controller_addresses
        self.requester = requester
        self.interval_seconds = interval_seconds
        self.pull_bytes_max = pull_bytes_max
        self.pacer = pacer or ByteRatePacer(0)
        self.controller_configuration: ShardConfiguration | None = None
        self.in_flight: dict[tuple[object, ...], asyncio.Task[None]] = {}
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        tasks = [task for task in (self.task, *self.in_flight.values()) if task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_seconds)  # the monitors' period, as in the reference
            if not self.service.group.is_leader:
                continue
            try:
                self.round()
            except QuorumLogError as error:  # refused now (not leader, stopped): next round
                log.debug("shard group %d: migration round: %s", self.service.gid, error)

    def round(self) -> None:
        """One monitor pass: start every action not already in flight."""
        machine = self.service.machine
        for action in monitor(machine, self.controller_configuration):
            if isinstance(action, FetchConfiguration):
                self.launch(("fetch", action.number), self.fetch_configuration(action.number))
            elif isinstance(action, Propose):
                key = ("propose", type(action.entry).__name__, machine.current_configuration.number)
                self.launch(key, self.propose(action.entry))
            elif isinstance(action, SendPullRequest):
                self.launch(
                    ("pull", action.target_gid, action.request.configuration_number),
                    self.pull(action),
                )
            else:
                self.launch(
                    ("delete", action.target_gid, action.request.configuration_number),
                    self.delete(action),
                )

    def launch(self, key: tuple[object, ...], work: Coroutine[Any, Any, None]) -> None:
        running = self.in_flight.get(key)
        if running is not None and not running.done():
            work.close()
            return
        # The task runs `work` itself (no wrapper coroutine): a task cancelled before it
        # starts then closes `work` too, instead of leaving it never awaited.
        task = asyncio.get_running_loop().create_task(work)
        self.in_flight[key] = task
        task.add_done_callback(lambda done: self.finished(key, done))

    def finished(self, key: tuple[object, ...], task: asyncio.Task[None]) -> None:
        if self.in_flight.get(key) is task:
            del self.in_flight[key]
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:  # the next round tries again
            log.debug("shard group %d: %s failed: %s", self.service.gid, key, error)

    async def propose(self, entry: GroupEntry) -> None:
        # Bounded, so an entry whose fate is never reported cannot hold its action's
        # in-flight slot for ever; the next round proposes again (entries are idempotent).
        await asyncio.wait_for(
            completion_future(self.service.group.propose(encode_entry(entry))),
            PROPOSE_TIMEOUT_SECONDS,
        )

    async def fetch_configuration(self, number: int) -> None:
        addresses = self.controller_addresses()
        frame = await self.requester.request(
            addresses,
            lambda request_id: wire.ControllerRequest(
                request_id=request_id,
                client_id=f"shard-group-{self.service.gid}",
                commands=encode_commands([Query(0, number)]),
            ),
            accept=lambda frame: isinstance(frame, wire.ControllerResponse),
        )
        assert isinstance(frame, wire.ControllerResponse)
        [result] = decode_results(frame.results)
        if result.ok and result.configuration is not None:
            known = self.controller_configuration
            if known is None or result.configuration.number > known.number:
                self.controller_configuration = result.configuration

    async def pull(self, action: SendPullRequest) -> None:
        # The driver's request may resume a pull an earlier leader began (resume_at).
        request: PullRequest | None = msgspec.structs.replace(
            action.request, bytes_max=self.pull_bytes_max
        )
        while request is not None:
            response = await self.ask(action.target_gid, action.servers, request, PullResponse)
            await self.pacer.pace(insert_bytes(response))
            entry = entry_for_pull_response(self.service.machine, response)
            if entry is None:
                return
            await self.propose(entry)
            request = next_pull_request(request, response)

    async def delete(self, action: SendDeleteRequest) -> None:
        response = await self.ask(action.target_gid, action.servers, action.request, DeleteResponse)
        entry = entry_for_delete_response(self.service.machine, response)
        if entry is not None:
            await self.propose(entry)

    async def ask(
        self,
        gid: int,
        servers: list[str],
        message: Any,
        expected: type[Response],
    ) -> Response:
        payload = encode_message(message)

        def accept(frame: wire.Frame) -> bool:
            # A replica that has not applied the configuration yet answers NOT_READY: ask
            # the next one rather than wait for the next round.
            if not isinstance(frame, wire.ShardGroupResponse):
                return False
            try:
                decoded = decode_message(frame.message)
            except (msgspec.DecodeError, msgspec.ValidationError):
                return False
            if isinstance(decoded, PullResponse) and decoded.status is PullStatus.NOT_READY:
                return False
            return isinstance(decoded, expected)

        attempt_seconds = pull_attempt_timeout_seconds(self.pull_bytes_max)
        frame = await self.requester.request(
            servers,
            lambda request_id: wire.ShardGroupRequest(
                request_id=request_id, gid=gid, message=payload
            ),
            accept=accept,
            timeout_seconds=3 * attempt_seconds,
            attempt_timeout_seconds=attempt_seconds,
        )
        assert isinstance(frame, wire.ShardGroupResponse)
        decoded = decode_message(frame.message)
        assert isinstance(decoded, expected)
        return decoded
