"""Requests a node makes to other nodes' client ports: controller queries, shard pulls and
shard deletes.

These go through the client protocol (not the peer links) because the other side may be a
group this node is not a member of, named only by the servers in a shard configuration:
addresses, or node ids that `resolve` turns into their current addresses (so a request
finds a node that restarted on a new port).

Three parts:

- `PeerRequests`: what the migrator asks of its world, without asyncio: send a request to a
  group until one node answers acceptably, the answer (or `UnavailableError`) arriving as a
  `runtime.completion.Completion`;
- `PeerAttempts`: the rules of one such request, without I/O: whom to ask next (the KV
  clients' `EndpointSelector`: the known leader, a NOT_LEADER hint, else the next address),
  which answers count, when to back off, the error at the deadline. `PeerSelectors` keeps
  one selector per address set, so the leader learned by one request serves the next;
- `PeerRequester` (asyncio: one connection per address, kept and reused) and
  `AsyncioPeerRequests`, which offers it as `PeerRequests`. The simulator has its own
  transport over simulated frames and the same `PeerAttempts`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from quorumlog.codec import wire
from quorumlog.errors import UnavailableError
from quorumlog.kv.async_client import StreamConnection
from quorumlog.kv.connection import EndpointSelector
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.resources import Scheduler

ATTEMPT_TIMEOUT_SECONDS = 1.0
"""One attempt at one address: about an election, so a dead leader is soon given up on.
Requests whose answers are large (shard pulls) pass a longer one."""
REQUEST_TIMEOUT_SECONDS = 5.0
BACKOFF_SECONDS = 0.05
"""The pause after as many failed attempts in a row as there are addresses."""

MakeRequest = Callable[[int], wire.ClientRequest]
Accept = Callable[[wire.Frame], bool]


class PeerRequests(Protocol):
    def request(
        self,
        addresses: Sequence[str],
        make_request: MakeRequest,
        accept: Accept | None = None,
        timeout_seconds: float = REQUEST_TIMEOUT_SECONDS,
        attempt_timeout_seconds: float | None = None,
    ) -> Completion[wire.Frame]:
        """Send to the group at `addresses` (node ids or "host:port") until one node
        answers with something other than an error response (and that `accept` takes,
        if given); the completion fails with `UnavailableError` at the timeout."""
        ...


class PeerAttempts:
    """The rules of one request to a group of peers; the caller does the I/O and reports
    each attempt's outcome (`outcome`)."""

    def __init__(
        self,
        selector: EndpointSelector,
        addresses: list[str],
        accept: Accept | None,
        deadline_seconds: float,
    ) -> None:
        self.selector = selector
        self.addresses = addresses
        self.accept = accept
        self.deadline_seconds = deadline_seconds
        self.last_problem = "no attempt finished"
        self.failures = 0

    def choose(self) -> str:
        return self.selector.choose()

    def outcome(self, address: str, frame: wire.Frame | None) -> wire.Frame | None:
        """The frame if it is the answer wanted; None (after noting why) to try again."""
        selector = self.selector
        if frame is None:
            self.last_problem = f"{address} did not answer"
            selector.failed(address)
        elif isinstance(frame, wire.ErrorResponse):
            self.last_problem = f"{address}: {frame.code.value}: {frame.message}"
            if frame.code is wire.ErrorCode.NOT_LEADER:
                selector.hinted(address, frame.leader_hint)
            else:
                selector.failed(address)
        elif self.accept is not None and not self.accept(frame):
            self.last_problem = f"{address} answered {type(frame).__name__}"
            selector.failed(address)
        else:
            selector.succeeded_at_leader(address)
            return frame
        self.failures += 1
        return None

    def pause_seconds(self) -> float:
        """How long to wait before the next attempt: a little after as many failures as
        there are addresses (each was tried once), else none."""
        return BACKOFF_SECONDS if self.failures % len(self.addresses) == 0 else 0.0

    def give_up_error(self) -> UnavailableError:
        return UnavailableError(f"no node of {self.addresses} answered: {self.last_problem}")


class PeerSelectors:
    """Per address set (a group): whom to ask next, its leader first once known."""

    def __init__(self, resolve: Callable[[str], str] = str) -> None:
        self.resolve = resolve
        """A server name (node id or address) → the address to dial now."""
        self.selectors: dict[tuple[str, ...], EndpointSelector] = {}

    def attempts(
        self, servers: Sequence[str], accept: Accept | None, deadline_seconds: float
    ) -> PeerAttempts:
        """The rules for one request to `servers`, resolved now (they may have moved)."""
        if not servers:
            raise UnavailableError("no address to send to")
        addresses = [self.resolve(server) for server in servers]
        key = tuple(sorted(addresses))
        selector = self.selectors.get(key)
        if selector is None:
            selector = self.selectors[key] = EndpointSelector(list(addresses))
        return PeerAttempts(selector, addresses, accept, deadline_seconds)


class PeerRequester:
    """The asyncio transport of peer requests: one connection per address, reused; a
    NOT_LEADER hint is followed, and the address that answered is remembered as the leader
    of its address set."""

    def __init__(
        self,
        cluster_id: str,
        client_name: str,
        attempt_timeout_seconds: float = ATTEMPT_TIMEOUT_SECONDS,
        resolve: Callable[[str], str] = str,
    ) -> None:
        self.cluster_id = cluster_id
        self.client_name = client_name
        self.attempt_timeout_seconds = attempt_timeout_seconds
        self.selectors = PeerSelectors(resolve)
        self.connections: dict[str, StreamConnection] = {}
        self.connecting: dict[str, asyncio.Lock] = {}
        self.next_request_id = 1
        self.closed = False

    async def request(
        self,
        addresses: Sequence[str],
        make_request: MakeRequest,
        timeout_seconds: float = REQUEST_TIMEOUT_SECONDS,
        accept: Accept | None = None,
        attempt_timeout_seconds: float | None = None,
    ) -> wire.Frame:
        """See `PeerRequests.request`; raises UnavailableError at the timeout."""
        attempts = self.selectors.attempts(addresses, accept, time.monotonic() + timeout_seconds)
        while time.monotonic() < attempts.deadline_seconds and not self.closed:
            address = attempts.choose()
            frame = await self.attempt(
                address,
                make_request,
                attempts.deadline_seconds,
                attempt_timeout_seconds or self.attempt_timeout_seconds,
            )
            answer = attempts.outcome(address, frame)
            if answer is not None:
                return answer
            pause = attempts.pause_seconds()
            if pause > 0:
                await asyncio.sleep(pause)  # every address failed once more: back off a little
        raise attempts.give_up_error()

    async def attempt(
        self,
        address: str,
        make_request: MakeRequest,
        deadline: float,
        attempt_timeout_seconds: float,
    ) -> wire.Frame | None:
        attempt_deadline = min(deadline, time.monotonic() + attempt_timeout_seconds)
        try:
            connection = await self.connect(address, attempt_deadline)
            request_id = self.next_request_id
            self.next_request_id += 1
            loop_deadline = asyncio.get_running_loop().time() + max(
                attempt_deadline - time.monotonic(), 0.0
            )
            return await connection.request(make_request(request_id), request_id, loop_deadline)
        except TimeoutError:
            # Only this request is late: the connection carries other groups' requests
            # too, and stays unless it breaks (a dead peer's connection does, by itself).
            return None
        except Exception:  # lost connection, refused handshake, garbled answer
            await self.drop(address)
            return None

    async def connect(self, address: str, deadline: float) -> StreamConnection:
        lock = self.connecting.setdefault(address, asyncio.Lock())
        async with lock:
            connection = self.connections.get(address)
            if connection is not None and connection.usable:
                return connection
            if connection is not None:
                await connection.close()
            fresh = await StreamConnection.open(
                address,
                self.cluster_id,
                self.client_name,
                max(deadline - time.monotonic(), 0.001),
            )
            self.connections[address] = fresh
            return fresh

    async def drop(self, address: str) -> None:
        connection = self.connections.pop(address, None)
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()

    async def close(self) -> None:
        self.closed = True
        for address in list(self.connections):
            await self.drop(address)


class AsyncioPeerRequests:
    """`PeerRequests` on a `PeerRequester`: each request runs as a task on the loop and
    settles a completion on the host's scheduler."""

    def __init__(self, requester: PeerRequester, scheduler: Scheduler) -> None:
        self.requester = requester
        self.scheduler = scheduler
        self.tasks: set[asyncio.Task[wire.Frame]] = set()

    def request(
        self,
        addresses: Sequence[str],
        make_request: MakeRequest,
        accept: Accept | None = None,
        timeout_seconds: float = REQUEST_TIMEOUT_SECONDS,
        attempt_timeout_seconds: float | None = None,
    ) -> Completion[wire.Frame]:
        completion: Completion[wire.Frame] = Completion(self.scheduler)
        task = asyncio.get_running_loop().create_task(
            self.requester.request(
                addresses,
                make_request,
                timeout_seconds=timeout_seconds,
                accept=accept,
                attempt_timeout_seconds=attempt_timeout_seconds,
            )
        )
        self.tasks.add(task)

        def settle(done: asyncio.Task[wire.Frame]) -> None:
            self.tasks.discard(done)
            if done.cancelled():
                completion.set_exception(UnavailableError("the node is stopping"))
                return
            error = done.exception()
            if error is not None:
                completion.set_exception(error)
            else:
                completion.set_result(done.result())

        task.add_done_callback(settle)
        return completion

    async def close(self) -> None:
        """Cancel the requests in flight, then close the connections."""
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.requester.close()
