"""A real node, in process: bad KV requests get typed errors and the node keeps serving."""

from __future__ import annotations

import asyncio
from pathlib import Path

from quorumlog.codec import wire
from quorumlog.codec.frame import FrameDecoder, encode_frame
from quorumlog.node.server import Node, NodeSettings


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder()
        self.frames: list[bytes] = []

    @classmethod
    async def connect(cls, port: int) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer)
        client.send(wire.Hello(cluster_id="quorumlog", sender="test", is_peer=False))
        assert isinstance(await client.receive(), wire.Welcome)
        return client

    def send(self, frame: wire.Frame) -> None:
        self.writer.write(encode_frame(wire.encode(frame)))

    async def receive(self) -> wire.Frame:
        while not self.frames:
            data = await asyncio.wait_for(self.reader.read(1 << 20), 10)
            if not data:
                raise AssertionError("the node closed the connection")
            self.frames.extend(self.decoder.feed(data))
        return wire.decode(self.frames.pop(0))

    async def ask(self, frame: wire.Frame) -> wire.Frame:
        self.send(frame)
        return await self.receive()

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def write(request_id: int, *commands: wire.KVCommand) -> wire.KVWrite:
    return wire.KVWrite(request_id=request_id, client_id="test", commands=list(commands))


def test_bad_kv_requests_get_typed_errors_and_the_node_keeps_serving(tmp_path: Path) -> None:
    async def scenario() -> None:
        node = Node(
            NodeSettings(
                node_id="n1",
                listen="127.0.0.1:0",
                data_dir=str(tmp_path),
                tick_ms=5,
                election_ticks=2,
            )
        )
        port = await node.start()
        try:
            client = await RawClient.connect(port)
            deadline = asyncio.get_running_loop().time() + 10
            while not node.groups["kv"].core.is_leader:
                assert asyncio.get_running_loop().time() < deadline, "no leader"
                await asyncio.sleep(0.005)
            cases: list[tuple[wire.KVWrite, wire.ErrorCode]] = [
                (
                    write(1, wire.KVCommand(1, "put", "k", "x" * (1024 * 1024 + 1))),
                    wire.ErrorCode.TOO_LARGE,
                ),
                # 300,000 characters of 4 UTF-8 bytes each: short in characters, too large.
                (
                    write(2, wire.KVCommand(1, "put", "k", "\U0001f600" * 300_000)),
                    wire.ErrorCode.TOO_LARGE,
                ),
                (write(3, wire.KVCommand(1, "put", "k" * 5000, "v")), wire.ErrorCode.TOO_LARGE),
                (write(4, wire.KVCommand(1, "rename", "k", "v")), wire.ErrorCode.BAD_REQUEST),
                (write(5, wire.KVCommand(1, "put", "k", None)), wire.ErrorCode.BAD_REQUEST),
                (write(6), wire.ErrorCode.BAD_REQUEST),
            ]
            for request, code in cases:
                answer = await client.ask(request)
                assert isinstance(answer, wire.ErrorResponse), answer
                assert answer.code is code, answer
                assert answer.request_id == request.request_id
            wrong_group = await client.ask(wire.KVRead(request_id=7, keys=["k"], group="nope"))
            assert isinstance(wrong_group, wire.ErrorResponse)
            assert wrong_group.code is wire.ErrorCode.UNKNOWN_GROUP
            # Nothing above changed the store, and a good request still works.
            assert await client.ask(wire.KVRead(request_id=8, keys=["k"])) == wire.KVReadResult(
                request_id=8, values=[None]
            )
            fine = await client.ask(write(9, wire.KVCommand(1, "put", "k", "\U0001f600" * 1000)))
            assert isinstance(fine, wire.KVWriteResult) and fine.results[0].ok
            assert await client.ask(wire.KVRead(request_id=10, keys=["k"])) == wire.KVReadResult(
                request_id=10, values=["\U0001f600" * 1000]
            )
            await client.close()
        finally:
            await node.stop()

    asyncio.run(scenario())
