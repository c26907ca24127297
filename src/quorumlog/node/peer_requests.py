"""Requests a node makes to other nodes' client ports: controller queries, shard pulls and
shard deletes.

These go through the client protocol (not the peer links) because the other side may be a
group this node is not a member of, named only by the addresses in a shard configuration.
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
from quorumlog.kv.connection import is_endpoint

ATTEMPT_TIMEOUT_SECONDS = 1.0
"""One attempt at one address: about an election, so a dead leader is soon given up on.
Requests whose answers are large (shard pulls) pass a longer one."""


class PeerRequester:
    def __init__(
        self,
        cluster_id: str,
        client_name: str,
        attempt_timeout_seconds: float = ATTEMPT_TIMEOUT_SECONDS,
    ) -> None:
        self.cluster_id = cluster_id
        self.client_name = client_name
        self.attempt_timeout_seconds = attempt_timeout_seconds
        self.connections: dict[str, StreamConnection] = {}
        self.connecting: dict[str, asyncio.Lock] = {}
        self.leaders: dict[tuple[str, ...], str] = {}
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

        Each address is tried at most once per pass; passes repeat until the deadline."""
        if not addresses:
            raise UnavailableError("no address to send to")
        key = tuple(sorted(addresses))
        deadline = time.monotonic() + timeout_seconds
        last_problem = "no attempt finished"
        while time.monotonic() < deadline and not self.closed:
            order = self.order(key, addresses)
            while order:
                address = order.pop(0)
                frame = await self.attempt(
                    address,
                    make_request,
                    deadline,
                    attempt_timeout_seconds or self.attempt_timeout_seconds,
                )
                if frame is None:
                    last_problem = f"{address} did not answer"
                    continue
                if isinstance(frame, wire.ErrorResponse):
                    last_problem = f"{address}: {frame.code.value}: {frame.message}"
                    hint = frame.leader_hint
                    if (
                        frame.code is wire.ErrorCode.NOT_LEADER
                        and hint is not None
                        and hint != address
                        and is_endpoint(hint)
                    ):
                        if hint in order:
                            order.remove(hint)
                        order.insert(0, hint)
                    continue
                if accept is not None and not accept(frame):
                    last_problem = f"{address} answered {type(frame).__name__}"
                    continue
                self.leaders[key] = address
                return frame
            await asyncio.sleep(0.05)  # every address failed this pass: back off a little
        raise UnavailableError(f"no node of {list(addresses)} answered: {last_problem}")

    def order(self, key: tuple[str, ...], addresses: Sequence[str]) -> list[str]:
        ordered = list(addresses)
        leader = self.leaders.get(key)
        if leader is not None:
            if leader in ordered:
                ordered.remove(leader)
            ordered.insert(0, leader)
        return ordered

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
