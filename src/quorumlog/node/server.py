"""One node process: the endpoint (listener + peer links) and the groups it hosts.

Today a node hosts the replicated KV group ("kv"); streams and shards add groups here, all
sharing one endpoint.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from quorumlog.codec import wire
from quorumlog.errors import QuorumLogError
from quorumlog.kv.machine import KVStateMachine
from quorumlog.node.errors_to_wire import error_code
from quorumlog.node.kv_service import KVLimits, KVService
from quorumlog.node.stream_service import StreamService, TopicWatchingMachine
from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import ChangeKind, Configuration, MembershipChange
from quorumlog.raft.messages import Message
from quorumlog.runtime.group import GroupRunner, GroupSettings
from quorumlog.runtime.transport import Endpoint, Replier, parse_address

log = logging.getLogger("quorumlog.node")

KV_GROUP = "kv"


class NodeSettings(msgspec.Struct, frozen=True):
    node_id: str
    listen: str
    """HOST:PORT to listen on (port 0: any free port)."""
    data_dir: str
    peers: dict[str, str] = {}
    """Every other member's id and HOST:PORT."""
    cluster_id: str = "quorumlog"
    join: bool = False
    """Start with no membership and wait to be added (`quorumlog member add`)."""
    tick_ms: int = 50
    election_ticks: int = 10
    fsync: bool = True
    snapshot_entries: int = 20_000
    snapshot_trailing_entries: int = 5_000


class Node:
    def __init__(self, settings: NodeSettings) -> None:
        self.settings = settings
        self.node_id = settings.node_id
        # Each group keeps at most one sync in flight; several groups may sync at once.
        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fsync")
        self.addresses: dict[str, str] = dict(settings.peers)
        self.endpoint = Endpoint(settings.node_id, settings.cluster_id, settings.peers, self)
        self.groups: dict[str, GroupRunner] = {}
        self.kv: KVService | None = None
        self.port = 0
        self.unknown_group_messages = 0

    async def start(self) -> int:
        """Open storage, start listening; returns the port bound."""
        settings = self.settings
        host, port = parse_address(settings.listen)
        self.port = await self.endpoint.listen(host, port)
        self.addresses[self.node_id] = f"{host}:{self.port}"
        voters = () if settings.join else tuple(sorted([*settings.peers, settings.node_id]))
        machine = KVStateMachine()
        self.streams = StreamService(self, lambda: self.groups[KV_GROUP], machine)
        group = GroupRunner(
            KV_GROUP,
            RaftConfig(node_id=settings.node_id, election_ticks=settings.election_ticks),
            Path(settings.data_dir) / KV_GROUP,
            TopicWatchingMachine(machine, self.streams.schedule_sync),
            self.send,
            Configuration(voters=voters),
            self.executor,
            GroupSettings(
                tick_seconds=settings.tick_ms / 1000,
                snapshot_entries=settings.snapshot_entries,
                snapshot_trailing_entries=settings.snapshot_trailing_entries,
                fsync=settings.fsync,
            ),
        )
        group.on_configuration = self.configuration_changed
        self.groups[KV_GROUP] = group
        self.kv = KVService(
            group, machine, lambda: self.address_of(group.core.leader_id), KVLimits()
        )
        group.start()
        self.streams.start()
        log.info(
            "node %s listening on %s:%d (data in %s)",
            self.node_id,
            host,
            self.port,
            settings.data_dir,
        )
        return self.port

    async def stop(self) -> None:
        await self.endpoint.close()
        await self.streams.stop()
        for group in list(self.groups.values()):
            if not group.stopped:
                await group.stop()
        self.executor.shutdown(wait=True)

    def address_of(self, node_id: str | None) -> str | None:
        return self.addresses.get(node_id) if node_id is not None else None

    def configuration_changed(self, configuration: Configuration) -> None:
        self.learn_addresses(dict(configuration.addresses))

    def learn_addresses(self, learned: dict[str, str]) -> None:
        if any(self.addresses.get(member) != address for member, address in learned.items()):
            self.addresses.update(learned)
            self.endpoint.update_peers(
                {m: a for m, a in self.addresses.items() if m != self.node_id}
            )

    # --- transport handler --------------------------------------------------------------

    def send(self, group: str, target: str, message: Message) -> None:
        self.endpoint.send(target, wire.RaftEnvelope(group=group, message=message))

    def on_peer_batch(self, batch: wire.PeerBatch) -> None:
        for envelope in batch.envelopes:
            group = self.groups.get(envelope.group)
            if group is None or envelope.message.target != self.node_id:
                self.unknown_group_messages += 1
                continue
            group.step(envelope.message)

    def on_client_request(self, request: wire.ClientRequest, reply: Replier) -> None:
        if not isinstance(
            request,
            wire.KVWrite
            | wire.KVRead
            | wire.KVScan
            | wire.StatusRequest
            | wire.MemberChangeRequest
            | wire.TransferLeaderRequest,
        ):
            self.on_stream_request(request, reply)
            return
        group = self.groups.get(request.group)
        if group is None or self.kv is None:
            reply(
                wire.ErrorResponse(
                    request_id=request.request_id,
                    code=wire.ErrorCode.UNKNOWN_GROUP,
                    message=f"no group {request.group!r} on {self.node_id}",
                )
            )
            return
        if isinstance(request, wire.KVWrite):
            self.kv.write(request, reply)
        elif isinstance(request, wire.KVRead | wire.KVScan):
            self.kv.read(request, reply)
        elif isinstance(request, wire.StatusRequest):
            reply(self.status(group, request.request_id))
        elif isinstance(request, wire.MemberChangeRequest):
            self.change_membership(group, request, reply)
        else:
            self.transfer_leader(group, request, reply)

    def on_stream_request(self, request: wire.ClientRequest, reply: Replier) -> None:
        self.streams.handle(request, reply)

    def status(self, group: GroupRunner, request_id: int) -> wire.StatusResponse:
        core = group.core
        errors = [group.failure] if group.failure else []
        return wire.StatusResponse(
            request_id=request_id,
            node_id=self.node_id,
            group=group.group_id,
            role=core.role.value,
            is_leader=core.is_leader,
            leader=core.leader_id,
            term=core.term,
            commit_index=core.commit_index,
            applied_index=core.applied_index,
            first_index=core.log.first_index,
            last_index=core.log.last_index,
            voters=list(core.configuration.voters),
            learners=list(core.configuration.learners),
            addresses=dict(self.addresses),
            errors=errors,
        )

    def change_membership(
        self, group: GroupRunner, request: wire.MemberChangeRequest, reply: Replier
    ) -> None:
        try:
            kind = ChangeKind(request.kind)
        except ValueError:
            reply(
                wire.ErrorResponse(
                    request_id=request.request_id,
                    code=wire.ErrorCode.BAD_REQUEST,
                    message=f"unknown membership change {request.kind!r}",
                )
            )
            return
        if request.address is not None:
            try:
                parse_address(request.address)
            except ValueError as error:
                reply(
                    wire.ErrorResponse(
                        request_id=request.request_id,
                        code=wire.ErrorCode.BAD_REQUEST,
                        message=str(error),
                    )
                )
                return
        try:
            future = group.change_membership(
                MembershipChange(kind=kind, node_id=request.node_id, address=request.address)
            )
        except QuorumLogError as error:
            self.reply_error(reply, request.request_id, error, group)
            return

        def answer(done: asyncio.Future[Any]) -> None:
            error = done.exception()
            if error is not None:
                self.reply_error(reply, request.request_id, error, group)
            else:
                reply(
                    wire.Done(
                        request_id=request.request_id,
                        detail=f"{kind.value} {request.node_id} committed",
                    )
                )

        future.add_done_callback(answer)

    def transfer_leader(
        self, group: GroupRunner, request: wire.TransferLeaderRequest, reply: Replier
    ) -> None:
        try:
            group.core.transfer_leadership(request.target)
        except (QuorumLogError, ValueError) as error:
            self.reply_error(reply, request.request_id, error, group)
            return
        group.schedule()
        reply(
            wire.Done(
                request_id=request.request_id, detail=f"leadership is moving to {request.target}"
            )
        )

    def reply_error(
        self, reply: Replier, request_id: int, error: BaseException, group: GroupRunner
    ) -> None:
        code = error_code(error)
        hint = self.address_of(group.core.leader_id) if code is wire.ErrorCode.NOT_LEADER else None
        reply(
            wire.ErrorResponse(
                request_id=request_id, code=code, message=str(error), leader_hint=hint
            )
        )


async def run_node(settings: NodeSettings, stop: asyncio.Event) -> None:
    node = Node(settings)
    await node.start()
    try:
        await stop.wait()
    finally:
        await node.stop()
