"""A small in-process stand-in for a KV cluster that speaks the real wire protocol.

Every node listens on a loopback port the OS picks. One node is the leader; the others
answer writes and linearizable reads with NOT_LEADER and a hint. All nodes share one real
KVStateMachine (the "replicated" state), so deduplication is the real thing. Knobs let a
test make a node refuse the handshake, swallow writes, apply-but-not-answer, or answer
with error codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from quorumlog.codec import wire
from quorumlog.codec.frame import FrameDecoder, encode_frame
from quorumlog.kv.commands import ClientBatch, KVEntry, encode_entry
from quorumlog.kv.machine import KVStateMachine

T = TypeVar("T")


class FakeNode:
    def __init__(self, cluster: FakeCluster, node_id: str) -> None:
        self.cluster = cluster
        self.node_id = node_id
        self.address = ""
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.refuse_reason: str | None = None
        self.swallow_writes = False
        """Accept writes and never answer (nor apply) them."""
        self.unanswered_writes = 0
        """Apply this many next writes without answering them."""
        self.write_errors: list[wire.ErrorCode] = []
        """Answer the next writes with these codes, one each."""
        self.hide_leader_hint = False
        self.hold_answers_until_writes = 0
        """Hold write answers until this many writes arrived (proves pipelining)."""
        self.held_answers: list[wire.Frame] = []
        self.requests: list[wire.Frame] = []
        self.produce_many = False
        """Say in the Welcome that this node serves ProduceMany frames."""
        self.request_arrived = asyncio.Condition()

    @property
    def is_leader(self) -> bool:
        return self.cluster.leader_id == self.node_id

    def writes(self) -> list[wire.KVWrite]:
        return [frame for frame in self.requests if isinstance(frame, wire.KVWrite)]

    async def start(self) -> None:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.address = f"127.0.0.1:{port}"

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in list(self.writers):
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        if self.server is not None:
            await self.server.wait_closed()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        decoder = FrameDecoder()

        def reply(frame: wire.Frame) -> None:
            if not writer.is_closing():
                writer.write(encode_frame(wire.encode(frame)))

        try:
            handshaken = False
            while data := await reader.read(65536):
                for payload in decoder.feed(data):
                    frame = wire.decode(payload)
                    if not handshaken:
                        if not self.handshake(frame, reply):
                            await writer.drain()
                            return
                        handshaken = True
                        continue
                    async with self.request_arrived:
                        self.requests.append(frame)
                        self.request_arrived.notify_all()
                    self.handle(frame, reply)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.writers.discard(writer)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    def handshake(self, frame: wire.Frame, reply: Any) -> bool:
        if not isinstance(frame, wire.Hello):
            reply(wire.Refused(reason="expected Hello"))
            return False
        if self.refuse_reason is not None:
            reply(wire.Refused(reason=self.refuse_reason))
            return False
        if frame.cluster_id != self.cluster.cluster_id:
            reply(wire.Refused(reason=f"cluster id {frame.cluster_id!r} is not ours"))
            return False
        reply(wire.Welcome(node_id=self.node_id, produce_many=self.produce_many))
        return True

    def not_leader(self, request_id: int) -> wire.ErrorResponse:
        leader = self.cluster.nodes.get(self.cluster.leader_id or "")
        hint = None if self.hide_leader_hint or leader is None else leader.address
        return wire.ErrorResponse(
            request_id=request_id,
            code=wire.ErrorCode.NOT_LEADER,
            message=f"{self.node_id} is not the leader",
            leader_hint=hint,
        )

    def handle(self, frame: wire.Frame, reply: Any) -> None:
        cluster = self.cluster
        if isinstance(frame, wire.KVWrite):
            if not self.is_leader:
                reply(self.not_leader(frame.request_id))
            elif self.write_errors:
                code = self.write_errors.pop(0)
                reply(wire.ErrorResponse(frame.request_id, code, f"injected {code.value}"))
            elif self.swallow_writes:
                pass
            else:
                results = cluster.apply(frame)
                answer = wire.KVWriteResult(request_id=frame.request_id, results=results)
                if self.unanswered_writes:
                    self.unanswered_writes -= 1
                elif len(self.writes()) < self.hold_answers_until_writes:
                    self.held_answers.append(answer)
                else:
                    for held in self.held_answers:
                        reply(held)
                    self.held_answers.clear()
                    reply(answer)
        elif isinstance(frame, wire.KVRead):
            if not frame.stale and not self.is_leader:
                reply(self.not_leader(frame.request_id))
            else:
                values = cluster.machine.read(frame.keys)
                reply(wire.KVReadResult(request_id=frame.request_id, values=values))
        elif isinstance(frame, wire.StatusRequest):
            reply(cluster.status(self, frame.request_id))
        elif isinstance(frame, wire.MemberChangeRequest):
            if not self.is_leader:
                reply(self.not_leader(frame.request_id))
            else:
                cluster.member_changes.append(frame)
                reply(
                    wire.Done(request_id=frame.request_id, detail=f"{frame.kind} {frame.node_id}")
                )
        elif isinstance(frame, wire.TransferLeaderRequest):
            if not self.is_leader:
                reply(self.not_leader(frame.request_id))
            elif frame.target not in cluster.nodes:
                reply(
                    wire.ErrorResponse(
                        frame.request_id, wire.ErrorCode.NOT_FOUND, f"no node {frame.target}"
                    )
                )
            else:
                cluster.leader_id = frame.target
                reply(wire.Done(request_id=frame.request_id, detail=f"leader is {frame.target}"))


class FakeCluster:
    def __init__(self, node_count: int = 3, cluster_id: str = "quorumlog") -> None:
        self.cluster_id = cluster_id
        self.nodes = {
            f"n{number}": FakeNode(self, f"n{number}") for number in range(1, node_count + 1)
        }
        self.leader_id: str | None = "n1"
        self.machine = KVStateMachine()
        self.index = 0
        self.term = 3
        self.member_changes: list[wire.MemberChangeRequest] = []

    @property
    def endpoints(self) -> list[str]:
        return [node.address for node in self.nodes.values()]

    def node(self, node_id: str) -> FakeNode:
        return self.nodes[node_id]

    async def start(self) -> None:
        for node in self.nodes.values():
            await node.start()

    async def stop(self) -> None:
        for node in self.nodes.values():
            await node.stop()

    def apply(self, write: wire.KVWrite) -> list[wire.KVCommandResult]:
        self.index += 1
        entry = KVEntry(
            timestamp_ms=self.index,
            batches=[ClientBatch(write.client_id, write.first_unacknowledged, write.commands)],
        )
        [results] = self.machine.apply(self.index, encode_entry(entry))
        return results

    def status(self, node: FakeNode, request_id: int) -> wire.StatusResponse:
        return wire.StatusResponse(
            request_id=request_id,
            node_id=node.node_id,
            group="kv",
            role="leader" if node.is_leader else "follower",
            is_leader=node.is_leader,
            leader=self.leader_id,
            term=self.term,
            commit_index=self.index,
            applied_index=self.machine.applied_index,
            first_index=1,
            last_index=self.index,
            voters=list(self.nodes),
            learners=[],
            addresses={other.node_id: other.address for other in self.nodes.values()},
        )


class ClusterThread:
    """Runs a FakeCluster on its own event loop in a thread, for blocking clients."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> FakeCluster:
        self.thread.start()
        self.run(self.cluster.start())
        return self.cluster

    def __exit__(self, *exception: object) -> None:
        try:
            self.run(self.cluster.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            self.loop.close()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=10)
