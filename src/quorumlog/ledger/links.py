"""`AsyncioBookieLinks`: the ledger driver's `BookieLinks` on an asyncio event loop.

One client connection per bookie, opened on the first send to it. Its address comes from
a resolver (bookie id -> "host:port", read from the bookie registry: a blocking call, so
it runs on an executor, never on the loop). Frames sent before the handshake ends wait in
order and go out once the bookie welcomed us; after that each frame is written at once,
header and payload as two buffers (no copy of a large AddEntries to put 4 bytes in front).

Answers are decoded as they arrive and handed to the driver (`receive`). A connection that
fails — it cannot be opened, the bookie refuses the handshake, it closes, or it sends
something that is not a bookie answer — is dropped and reported with
`bookie_unreachable`, scheduled on the loop (never from inside `send`). Until that report
runs, sends to the dropped link are discarded (the report covers them: the driver then
counts every request outstanding there as lost); the next send after it reconnects.

Per-frame work is small on purpose: a writer puts a whole loop turn of entries in one
AddEntries per bookie, so throughput rides on frames, not entries.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Protocol, cast

from quorumlog.codec import wire
from quorumlog.codec.frame import FRAME_HEADER, FrameDecoder, FrameError
from quorumlog.errors import QuorumLogError
from quorumlog.kv.connection import parse_endpoint
from quorumlog.ledger.protocol_actions import BookieAnswer, BookieRequest
from quorumlog.tls.config import TLSConfig
from quorumlog.tls.handshake import create_connection

log = logging.getLogger("quorumlog.ledger.links")

AddressResolver = Callable[[str], "str | None"]
"""Bookie id -> "host:port" (None: not registered). Blocking: runs on the executor."""

BOOKIE_ANSWER_TYPES = (
    wire.AddEntriesResult,
    wire.ReadEntriesResult,
    wire.LastAddConfirmedResult,
    wire.ErrorResponse,
)

CONNECT_TIMEOUT_SECONDS_DEFAULT = 5.0

_DROP_REQUEST_IDS_FIRST = 1 << 62
"""DropLedger requests are numbered apart from the driver's requests (which count from 1),
so a reader of a connection's traffic never mistakes one for the other."""


class BookieEvents(Protocol):
    """Where answers and lost connections go (the LedgerDriver)."""

    def receive(self, bookie_id: str, answer: BookieAnswer) -> None: ...

    def bookie_unreachable(self, bookie_id: str) -> None: ...


class AsyncioBookieLinks:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        resolve: AddressResolver,
        executor: Executor,
        *,
        cluster_id: str,
        client_id: str,
        connect_timeout_seconds: float = CONNECT_TIMEOUT_SECONDS_DEFAULT,
        tls: TLSConfig | None = None,
    ) -> None:
        """`tls`: talk TLS to the bookies (they are reached at their node's client port,
        or a bookie process's own, as clients: the client TLS settings apply)."""
        self.loop = loop
        self.tls = tls
        self.resolve = resolve
        self.executor = executor
        self.cluster_id = cluster_id
        self.client_id = client_id
        self.connect_timeout_seconds = connect_timeout_seconds
        self.events: BookieEvents | None = None
        """Set by `attach` before the first send (the driver is built with these links)."""
        self.links: dict[str, BookieLink] = {}
        self.drop_request_ids = itertools.count(_DROP_REQUEST_IDS_FIRST)
        self.closed = False

    def attach(self, events: BookieEvents) -> None:
        self.events = events

    def send(self, bookie_id: str, request: BookieRequest) -> None:
        self.link(bookie_id).send(wire.encode(request))

    def link(self, bookie_id: str) -> BookieLink:
        link = self.links.get(bookie_id)
        if link is None:
            link = BookieLink(self, bookie_id)
            self.links[bookie_id] = link
            link.start()
        return link

    def drop_ledger(self, bookie_id: str, ledger_id: int) -> asyncio.Future[None]:
        """Ask a bookie to forget a deleted ledger; the future settles when it answered
        (with an exception if the connection failed first)."""
        request = wire.DropLedger(request_id=next(self.drop_request_ids), ledger_id=ledger_id)
        link = self.link(bookie_id)
        future: asyncio.Future[None] = self.loop.create_future()
        link.drops[request.request_id] = future
        link.send(wire.encode(request))
        return future

    def link_failed(self, link: BookieLink) -> None:
        """Report a failed link soon; it stays in place (discarding sends) until then."""
        self.loop.call_soon(self.report_unreachable, link)

    def report_unreachable(self, link: BookieLink) -> None:
        if self.links.get(link.bookie_id) is link:
            del self.links[link.bookie_id]
        if self.events is not None and not self.closed:
            self.events.bookie_unreachable(link.bookie_id)

    def close(self) -> None:
        self.closed = True
        for link in list(self.links.values()):
            link.fail("the ledger client closed")
        self.links.clear()


class BookieLink(asyncio.Protocol):
    """One connection to one bookie (see the module docstring)."""

    def __init__(self, links: AsyncioBookieLinks, bookie_id: str) -> None:
        self.links = links
        self.bookie_id = bookie_id
        self.decoder = FrameDecoder()
        self.transport: asyncio.Transport | None = None
        self.waiting: list[bytes] | None = []
        """Payloads sent before the handshake ended (None once it has)."""
        self.failed = False
        self.connect_task: asyncio.Task[None] | None = None
        self.drops: dict[int, asyncio.Future[None]] = {}

    def start(self) -> None:
        self.connect_task = self.links.loop.create_task(self.connect())

    async def connect(self) -> None:
        links = self.links
        try:
            address = await links.loop.run_in_executor(
                links.executor, links.resolve, self.bookie_id
            )
            if address is None:
                self.fail("it is not registered")
                return
            host, port = parse_endpoint(address)
            async with asyncio.timeout(links.connect_timeout_seconds):
                await create_connection(links.loop, lambda: self, host, port, links.tls)
        except (OSError, TimeoutError, ValueError, QuorumLogError) as error:
            # ValueError: a registered address that is not host:port; QuorumLogError: the
            # registry could not be read. Either way this bookie cannot be reached now.
            self.fail(f"cannot connect: {error}")

    # --- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.failed:
            transport.close()
            return
        # A cast, not an isinstance check: uvloop's TCP transport does not derive from
        # asyncio.Transport, though it has every method used here.
        self.transport = cast(asyncio.Transport, transport)
        hello = wire.Hello(
            cluster_id=self.links.cluster_id, sender=self.links.client_id, is_peer=False
        )
        self.write(wire.encode(hello))

    def data_received(self, data: bytes) -> None:
        try:
            payloads = self.decoder.feed(data)
            for payload in payloads:
                if self.failed:
                    return
                self.take(wire.decode(payload))
        except FrameError as error:
            self.fail(f"bad frame: {error}")
        except wire.DECODE_ERRORS as error:
            self.fail(f"undecodable answer: {error}")

    def connection_lost(self, error: Exception | None) -> None:
        self.fail(f"connection lost: {error}" if error else "the bookie closed the connection")

    # --- frames --------------------------------------------------------------------------

    def take(self, frame: wire.Frame) -> None:
        if isinstance(frame, BOOKIE_ANSWER_TYPES) and self.waiting is None:
            events = self.links.events
            if events is not None:
                events.receive(self.bookie_id, frame)
        elif isinstance(frame, wire.Done) and self.waiting is None:
            future = self.drops.pop(frame.request_id, None)
            if future is not None and not future.done():
                future.set_result(None)
        elif isinstance(frame, wire.Welcome) and self.waiting is not None:
            waiting, self.waiting = self.waiting, None
            for payload in waiting:
                self.write(payload)
        elif isinstance(frame, wire.Refused):
            self.fail(f"refused: {frame.reason}")
        else:
            self.fail(f"unexpected {type(frame).__name__}")

    def send(self, payload: bytes) -> None:
        if self.failed:
            return
        if self.waiting is not None:
            self.waiting.append(payload)
        else:
            self.write(payload)

    def write(self, payload: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.writelines((FRAME_HEADER.pack(len(payload)), payload))

    def fail(self, reason: str) -> None:
        if self.failed:
            return
        self.failed = True
        log.info("link to bookie %s dropped: %s", self.bookie_id, reason)
        if self.transport is not None:
            self.transport.abort()
        task = self.connect_task
        if task is not None and not task.done() and asyncio.current_task() is not task:
            task.cancel()
        drops, self.drops = self.drops, {}
        for future in drops.values():
            if not future.done():
                future.set_exception(ConnectionError(f"bookie {self.bookie_id}: {reason}"))
        self.links.link_failed(self)
