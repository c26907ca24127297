"""A client connection's byte stream as frames: an asyncio BufferedProtocol.

`open_frame_stream` connects (over TLS with a `TLSConfig`) and returns a `FrameStream`:
`receive()` waits for the next payloads, `write`, `drain`, `close`, `wait_closed` and
`is_closing` do what `asyncio.StreamWriter`'s do. The socket writes straight into the
buffers of `codec.frame.FrameReceiver` (a large answer into one buffer of its own size),
where `asyncio.StreamReader` copied every byte into its buffer and out again.

Errors come as they did from a StreamReader: `receive()` returns no payload at the end of
the stream, and raises what the transport reported when the connection was lost (a
ConnectionResetError, or an ssl.SSLError over TLS), so callers tell the cases apart as
before.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from typing import cast

from quorumlog.codec.frame import FRAME_BYTES_MAX_DEFAULT, FrameError, FrameReceiver
from quorumlog.tls.config import TLSConfig
from quorumlog.tls.handshake import create_connection, handshake_error

Payload = bytes | bytearray

QUEUED_BYTES_MAX = 16 * 1024 * 1024
"""Received payload bytes not yet taken by `receive()` before reading from the socket
pauses (the bound a StreamReader's `limit` gave)."""


class FrameStream(asyncio.BufferedProtocol):
    """See the module docstring."""

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT) -> None:
        self.receiver = FrameReceiver(frame_bytes_max)
        self.transport: asyncio.Transport | None = None
        self.payloads: deque[Payload] = deque()
        self.queued_bytes = 0
        self.reading_paused = False
        self.ended = False
        """No more bytes will come (end of stream, connection lost, or a framing error)."""
        self.error: BaseException | None = None
        """What ended the stream, if it did not end cleanly."""
        self.arrived: asyncio.Future[None] | None = None
        """Set when payloads arrive or the stream ends, for a `receive()` waiting."""
        self.writable: asyncio.Future[None] | None = None
        """Set when the transport's write buffer drains, for a `drain()` waiting."""
        self.writing_paused = False
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # --- asyncio.BufferedProtocol --------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.receiver.receive_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            payloads = self.receiver.received(nbytes)
        except FrameError as error:  # the stream cannot be read any further
            self.end(error)
            if self.transport is not None:
                self.transport.close()
            return
        if payloads:
            self.payloads.extend(payloads)
            self.queued_bytes += sum(len(payload) for payload in payloads)
            if self.queued_bytes > QUEUED_BYTES_MAX and self.transport is not None:
                self.transport.pause_reading()
                self.reading_paused = True
            self.wake()

    def eof_received(self) -> bool | None:
        self.end(None)
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.end(exc)
        self.writing_paused = False
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    # --- the stream -----------------------------------------------------------------------

    def end(self, error: BaseException | None) -> None:
        if not self.ended:
            self.ended = True
            self.error = error
        self.wake()

    def wake(self) -> None:
        if self.arrived is not None and not self.arrived.done():
            self.arrived.set_result(None)

    async def receive(self) -> list[Payload]:
        """The payloads received since the last call, waiting for one; [] at the end of the
        stream; raises what broke the connection."""
        while not self.payloads:
            if self.ended:
                if self.error is not None:
                    raise self.error
                return []
            self.arrived = asyncio.get_running_loop().create_future()
            try:
                await self.arrived
            finally:
                self.arrived = None
        payloads = list(self.payloads)
        self.payloads.clear()
        self.queued_bytes = 0
        if self.reading_paused and self.transport is not None and not self.ended:
            self.reading_paused = False
            self.transport.resume_reading()
        return payloads

    def write(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return  # as a StreamWriter's: the loss shows on the reading side
        self.transport.write(data)

    async def drain(self) -> None:
        """Wait while the transport's write buffer is over its high-water mark."""
        if self.ended and self.error is not None:
            raise self.error
        if self.closed.done():
            raise ConnectionResetError("connection lost")
        if not self.writing_paused:
            return
        # Every request drains: many may wait at once, on one future that resume_writing
        # settles. Shielded, so one waiter's cancellation (its timeout) leaves the others'.
        if self.writable is None or self.writable.done():
            self.writable = asyncio.get_running_loop().create_future()
        await asyncio.shield(self.writable)

    def is_closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def wait_closed(self) -> None:
        await asyncio.shield(self.closed)


async def open_frame_stream(
    host: str, port: int, tls: TLSConfig | None, endpoint: str
) -> FrameStream:
    """A FrameStream connected to `host:port` (over TLS with `tls`); TLSHandshakeError if
    the TLS handshake failed."""
    loop = asyncio.get_running_loop()
    try:
        _, stream = await create_connection(loop, FrameStream, host, port, tls)
    except ssl.SSLError as error:
        if tls is None:
            raise
        raise handshake_error(endpoint, error) from error
    return stream
