"""Requests a node makes to other nodes' client ports: controller queries, shard pulls and
shard deletes.

These go through the client protocol (not the peer links) because the other side may be a
group this node is not a member of, named only by the servers in a shard configuration:
addresses, or node ids that `resolve` turns into their current addresses (so a request
finds a node that restarted on a new port).
One connection per address is kept and reused; a NOT_LEADER hint is followed, and the
address that answered is remembered as the leader of that address set.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence

from quorumlog.codec import wire
from quorumlog.errors import UnavailableError
from quorumlog.kv.async_client import StreamConnection
from quorumlog.kv.connection import EndpointSelector

ATTEMPT_TIMEOUT_SECONDS = 1.0
"""One attempt at one address: about an election, so a dead leader is soon given up on.
Requests whose answers are large (shard pulls) pass a longer one."""


class PeerRequester:
    def __init__(
        self,
        cluster_id: str,
        client_name: str,
        attempt_timeout_seconds: float = ATTEMPT_TIMEOUT_SECONDS,
        resolve: Callable[[str], str] = str,
    ) -> None:
        self.cluster_id = cluster_id
        self.resolve = resolve
        """A server name (node id or address) → the address to dial now."""
        self.client_name = client_name
        self.attempt_timeout_seconds = attempt_timeout_seconds
        self.connections: dict[str, StreamConnection] = {}
        self.connecting: dict[str, asyncio.Lock] = {}
        self.selectors: dict[tuple[str, ...], EndpointSelector] = {}
        """Per address set (a group): whom to ask next, its leader first once known."""
        self.next_request_id = 1
        self.closed = False

    async def request(
        self,
        addresses: Sequence[str],
        make_request: Callable[[int], wire.ClientRequest],
        timeout_seconds: float = 5.0,
        accept: Callable[[wire.Frame], bool] | None = None,
        attempt_timeout_seconds: float | None = None,
    ) -> wire.Frame:
        """Send to the group at `addresses` until one answers with something other than
        an error response (or something `accept` takes); UnavailableError at the timeout.

        Whom to ask is the KV clients' rule (`EndpointSelector`): the known leader, a
        NOT_LEADER hint, else the next address in turn. `addresses` may name node ids,
        resolved on every call (they may have moved since the last)."""
        if not addresses:
            raise UnavailableError("no address to send to")
        addresses = [self.resolve(address) for address in addresses]
        key = tuple(sorted(addresses))
        selector = self.selectors.get(key)
        if selector is None:
            selector = self.selectors[key] = EndpointSelector(list(addresses))
        deadline = time.monotonic() + timeout_seconds
        last_problem = "no attempt finished"
        failures = 0
        while time.monotonic() < deadline and not self.closed:
            address = selector.choose()
            frame = await self.attempt(
                address,
                make_request,
                deadline,
                attempt_timeout_seconds or self.attempt_timeout_seconds,
            )
            if frame is None:
                last_problem = f"{address} did not answer"
                selector.failed(address)
            elif isinstance(frame, wire.ErrorResponse):
                last_problem = f"{address}: {frame.code.value}: {frame.message}"
                if frame.code is wire.ErrorCode.NOT_LEADER:
                    selector.hinted(address, frame.leader_hint)
                else:
                    selector.failed(address)
            elif accept is not None and not accept(frame):
                last_problem = f"{address} answered {type(frame).__name__}"
                selector.failed(address)
            else:
                selector.succeeded_at_leader(address)
                return frame
            failures += 1
            if failures % len(addresses) == 0:
                await asyncio.sleep(0.05)  # as many failures as addresses: back off a little
        raise UnavailableError(f"no node of {list(addresses)} answered: {last_problem}")

    async def attempt(
        self,
        address: str,
        make_request: Callable[[int], wire.ClientRequest],
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
