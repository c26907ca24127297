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
- `request_by_attempts`: the one loop that carries a request out by those rules, on a
  scheduler, sending each attempt through a `SendAttempt` function. The node sends attempts
  over a `PeerRequester` (asyncio: one connection per address, kept and reused), the
  simulator over simulated frames; both run this loop (`AsyncioPeerRequests`, and
  `testing/sim/shardkv/transport.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from quorumlog.auth.credentials import CredentialsSource
from quorumlog.codec import wire
from quorumlog.errors import ClientError, UnavailableError
from quorumlog.kv.async_client import TRANSPORT_ERRORS, StreamConnection
from quorumlog.kv.connection import EndpointSelector
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.resources import Scheduler
from quorumlog.tls.config import TLSConfig

ATTEMPT_TIMEOUT_SECONDS = 1.0
"""One attempt at one address: about an election, so a dead leader is soon given up on.
Requests whose answers are large (shard pulls) pass a longer one."""
REQUEST_TIMEOUT_SECONDS = 5.0
BACKOFF_SECONDS = 0.05
"""The pause after as many failed attempts in a row as there are addresses."""

MakeRequest = Callable[[int], wire.ClientRequest]
Accept = Callable[[wire.Frame], bool]
AttemptOutcome = Callable[[wire.Frame | None], None]
"""How one attempt ended: the frame answered, or None (no answer in time, a broken
connection, a garbled answer)."""
SendAttempt = Callable[[str, MakeRequest, float, AttemptOutcome], None]
"""Send one request to an address, giving it `timeout_seconds`; call the outcome once,
on the scheduler's thread."""
PEER_ATTEMPT_ERRORS: tuple[type[Exception], ...] = (*TRANSPORT_ERRORS, ClientError)
"""What one attempt may meet that is the connection's fault, not the code's: a broken or
refused connection (ClientError: the handshake), a garbled answer. Anything else escapes."""


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


def request_by_attempts(
    scheduler: Scheduler,
    selectors: PeerSelectors,
    send_attempt: SendAttempt,
    addresses: Sequence[str],
    make_request: MakeRequest,
    accept: Accept | None,
    timeout_seconds: float,
    attempt_timeout_seconds: float,
    stopped: Callable[[], bool] = lambda: False,
) -> Completion[wire.Frame]:
    """`PeerRequests.request`, attempt after attempt by the rules of `PeerAttempts`."""
    completion: Completion[wire.Frame] = Completion(scheduler)
    try:
        attempts = selectors.attempts(
            addresses, accept, scheduler.monotonic_seconds() + timeout_seconds
        )
    except UnavailableError as error:
        completion.set_exception(error)
        return completion

    def next_attempt() -> None:
        now = scheduler.monotonic_seconds()
        if stopped():
            completion.set_exception(UnavailableError("the node is stopping"))
            return
        if now >= attempts.deadline_seconds:
            completion.set_exception(attempts.give_up_error())
            return
        address = attempts.choose()

        def outcome(frame: wire.Frame | None) -> None:
            answer = attempts.outcome(address, frame)
            if answer is not None:
                completion.set_result(answer)
                return
            pause = attempts.pause_seconds()
            if pause > 0:
                scheduler.call_later(pause, next_attempt)  # each address failed once more
            else:
                next_attempt()

        timeout = min(attempts.deadline_seconds, now + attempt_timeout_seconds) - now
        send_attempt(address, make_request, timeout, outcome)

    next_attempt()
    return completion


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
        credentials: CredentialsSource | None = None,
        tls: TLSConfig | None = None,
    ) -> None:
        self.cluster_id = cluster_id
        self.tls = tls
        self.client_name = client_name
        self.credentials = credentials
        """The node's own identity when auth is on (`auth.credentials.node_credentials`)."""
        self.attempt_timeout_seconds = attempt_timeout_seconds
        self.selectors = PeerSelectors(resolve)
        self.connections: dict[str, StreamConnection] = {}
        self.connecting: dict[str, asyncio.Lock] = {}
        self.next_request_id = 1
        self.closed = False

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
        except PEER_ATTEMPT_ERRORS:  # lost connection, refused handshake, garbled answer
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
                None if self.credentials is None else self.credentials(),
                self.tls,
            )
            self.connections[address] = fresh
            return fresh

    async def drop(self, address: str) -> None:
        connection = self.connections.pop(address, None)
        if connection is not None:
            with contextlib.suppress(*PEER_ATTEMPT_ERRORS):
                await connection.close()

    async def close(self) -> None:
        self.closed = True
        for address in list(self.connections):
            await self.drop(address)


class AsyncioPeerRequests:
    """`PeerRequests` on a `PeerRequester`: `request_by_attempts` on the host's scheduler,
    each attempt a task on the loop."""

    def __init__(self, requester: PeerRequester, scheduler: Scheduler) -> None:
        self.requester = requester
        self.scheduler = scheduler
        self.tasks: set[asyncio.Task[wire.Frame | None]] = set()
        self.closing = False

    def request(
        self,
        addresses: Sequence[str],
        make_request: MakeRequest,
        accept: Accept | None = None,
        timeout_seconds: float = REQUEST_TIMEOUT_SECONDS,
        attempt_timeout_seconds: float | None = None,
    ) -> Completion[wire.Frame]:
        return request_by_attempts(
            self.scheduler,
            self.requester.selectors,
            self.send_attempt,
            addresses,
            make_request,
            accept,
            timeout_seconds,
            attempt_timeout_seconds or self.requester.attempt_timeout_seconds,
            stopped=lambda: self.closing or self.requester.closed,
        )

    def send_attempt(
        self,
        address: str,
        make_request: MakeRequest,
        timeout_seconds: float,
        outcome: AttemptOutcome,
    ) -> None:
        deadline = time.monotonic() + timeout_seconds
        task = asyncio.get_running_loop().create_task(
            self.requester.attempt(address, make_request, deadline, timeout_seconds)
        )
        self.tasks.add(task)

        def settle(done: asyncio.Task[wire.Frame | None]) -> None:
            self.tasks.discard(done)
            # A cancelled attempt (closing) ends as no answer; the loop then sees `stopped`.
            outcome(None if done.cancelled() else done.result())

        task.add_done_callback(settle)

    async def close(self) -> None:
        """Cancel the requests in flight, then close the connections."""
        self.closing = True
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.requester.close()
