"""`FrameStream` over a real loopback socket: frames written in odd pieces come out whole,
the end of the stream and a broken frame show as a StreamReader's did, and a slow
receiver pauses the socket instead of queueing without bound."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from quorumlog.codec.frame import COLLECT_BYTES_MIN, FRAME_HEADER, FrameError, encode_frame
from quorumlog.kv import frame_stream
from quorumlog.kv.frame_stream import FrameStream, open_frame_stream

ServerWork = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def with_server(serve: ServerWork, test: Callable[[FrameStream], Awaitable[None]]) -> None:
    """Run `test` against a stream connected to a loopback server that runs `serve`."""

    async def main() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await serve(reader, writer)
            writer.close()
            await writer.wait_closed()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        stream = await open_frame_stream("127.0.0.1", port, None, f"127.0.0.1:{port}")
        try:
            await asyncio.wait_for(test(stream), timeout=20)
        finally:
            stream.close()
            await stream.wait_closed()
            server.close()
            await server.wait_closed()

    asyncio.run(main())


async def receive_until_end(stream: FrameStream) -> list[bytes]:
    received: list[bytes] = []
    while payloads := await stream.receive():
        received.extend(bytes(payload) for payload in payloads)
    return received


def test_frames_written_in_pieces_come_out_whole_then_the_end() -> None:
    payloads = [b"small", b"x" * (3 * COLLECT_BYTES_MIN), b"", b"y" * 1000]
    data = b"".join(encode_frame(payload) for payload in payloads)

    async def serve(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for start in range(0, len(data), 7001):  # pieces cutting headers and payloads
            writer.write(data[start : start + 7001])
            await writer.drain()

    async def test(stream: FrameStream) -> None:
        assert await receive_until_end(stream) == payloads
        assert await stream.receive() == []  # the end stays the end

    with_server(serve, test)


def test_a_frame_over_the_bound_ends_the_stream_with_a_frame_error() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(encode_frame(b"fine") + FRAME_HEADER.pack(2**31))
        await writer.drain()
        await reader.read()  # held open until the client closes it

    async def test(stream: FrameStream) -> None:
        # As with the old decoder, a frame cut in the same read as the bad header may be
        # lost with it: the connection is dropped either way.
        with pytest.raises(FrameError, match="frame_bytes_max"):
            while True:
                await stream.receive()
        assert stream.is_closing()

    with_server(serve, test)


def test_a_receiver_that_does_not_keep_up_pauses_the_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(frame_stream, "QUEUED_BYTES_MAX", 2 * COLLECT_BYTES_MIN)
    payloads = [bytes([index]) * COLLECT_BYTES_MIN for index in range(12)]

    async def serve(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for payload in payloads:
            writer.write(encode_frame(payload))
        await writer.drain()

    async def test(stream: FrameStream) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        while not stream.reading_paused:  # nothing taken yet: the queue passes its bound
            assert loop.time() < deadline, "reading was never paused"
            await asyncio.sleep(0.01)
        assert stream.queued_bytes <= 3 * COLLECT_BYTES_MIN + 3 * FRAME_HEADER.size
        assert await receive_until_end(stream) == payloads

    with_server(serve, test)


def test_many_writers_draining_at_once_all_resume() -> None:
    """Each request drains; with the socket's buffer full, many wait at once. Each kept a
    future of its own in one slot, so every waiter but the last was never woken (80 puts
    of 1 MB hung with no timer left)."""
    chunk = b"z" * (1 << 20)
    writers = 40
    release = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await release.wait()  # read nothing until every writer waits: the buffer fills
        await reader.readexactly(len(chunk) * writers)
        writer.write(encode_frame(b"all read"))
        await writer.drain()

    async def test(stream: FrameStream) -> None:
        async def write_and_drain() -> None:
            stream.write(chunk)
            await stream.drain()

        tasks = [asyncio.create_task(write_and_drain()) for _ in range(writers)]
        while not stream.writing_paused:
            await asyncio.sleep(0)  # yields until the transport says its buffer is full
        release.set()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=15)
        assert [bytes(payload) for payload in await stream.receive()] == [b"all read"]

    with_server(serve, test)
