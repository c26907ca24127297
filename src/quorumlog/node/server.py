"""One node process: the endpoint (listener + peer links) and the Raft groups it hosts.

Every group shares the one endpoint; messages carry their group's name.

- "kv": the replicated KV, which also holds stream metadata (`KVService`);
- "<topic>@<created>/<partition>": stream partitions this node replicates (`StreamService`);
- "controller": the shard controller, on the nodes in `controller` (`ControllerService`);
- "shard-<gid>": the shard groups this node is a member of (`ShardGroupService`), each with
  a `ShardMigrator` moving shards while it leads, and `PreferredLeaders` spreading their
  leaders over the nodes.

Where the other nodes listen is kept in an `AddressBook` (`node/addresses.py`, which says
which source of an address wins): this node's own address, what peers announce in their
handshakes, `--peers`, and — only to fill gaps — addresses stored in the logs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from quorumlog.codec import wire
from quorumlog.errors import QuorumLogError
from quorumlog.kv.machine import KVStateMachine
from quorumlog.node.addresses import AddressBook, AddressSource
from quorumlog.node.controller_service import ControllerService
from quorumlog.node.errors_to_wire import error_response
from quorumlog.node.kv_service import KVLimits, KVService
from quorumlog.node.peer_requests import AsyncioPeerRequests, PeerRequester
from quorumlog.node.preferred_leaders import PreferredLeaders, preferred_leader
from quorumlog.node.shard_migration import (
    MIGRATION_BYTES_PER_SECOND_DEFAULT,
    PULL_BYTES_MAX_DEFAULT,
    ByteRatePacer,
    ShardMigrator,
)
from quorumlog.node.shard_service import ShardGroupService
from quorumlog.node.stream_service import StreamService, TopicWatchingMachine
from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import ChangeKind, Configuration, MembershipChange
from quorumlog.raft.messages import Message
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.group import AsyncioScheduler, GroupRunner, GroupSettings, StateMachine
from quorumlog.runtime.host import RaftHost
from quorumlog.runtime.transport import Endpoint, Replier, format_address, parse_address
from quorumlog.shard.config import SHARD_COUNT_DEFAULT
from quorumlog.shard.controller import ControllerMachine
from quorumlog.shard.group_machine import ShardGroupMachine

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
    controller: list[str] = []
    """The node ids of the shard controller group's members (empty: no sharded KV)."""
    shard_groups: dict[int, list[str]] = {}
    """Shard group gid → its members' node ids. This node hosts the groups it is in."""
    shard_count: int = SHARD_COUNT_DEFAULT
    """Shards of the sharded KV: fixed for the cluster's life (keys hash to shards)."""
    shard_monitor_ms: int = 100
    """How often a shard group's leader checks for a new configuration and moves shards."""
    shard_pull_bytes_max: int = PULL_BYTES_MAX_DEFAULT
    """Keys and values per pull chunk (one frame and one log entry each)."""
    shard_migration_bytes_per_second: int = MIGRATION_BYTES_PER_SECOND_DEFAULT
    """How fast this node pulls shard data, all its groups together (0: unthrottled)."""
    preferred_leader_ms: int = 1_000
    """How often a shard group's leader checks whether to hand leadership to the group's
    preferred member (spreads leaders over nodes); 0 turns it off."""
    advertise: str = ""
    """HOST:PORT peers and clients should use to reach this node, when not the listen
    address (behind NAT or a proxy); said in every handshake, so peers follow it."""


class Node:
    def __init__(self, settings: NodeSettings) -> None:
        self.settings = settings
        self.node_id = settings.node_id
        # Each group keeps at most one sync in flight; several groups may sync at once.
        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fsync")
        self.address_book = AddressBook(settings.node_id)
        self.address_book.learn_all(dict(settings.peers), AddressSource.OPERATOR)
        self.endpoint = Endpoint(settings.node_id, settings.cluster_id, settings.peers, self)
        self.groups: dict[str, GroupRunner] = {}
        self.kv: KVService | None = None
        self.controller: ControllerService | None = None
        self.shard_services: dict[int, ShardGroupService] = {}
        self.migrators: list[ShardMigrator] = []
        self.preferred_leaders = PreferredLeaders([], 0)
        self.requester = PeerRequester(
            settings.cluster_id, f"node-{settings.node_id}", resolve=self.resolve
        )
        self.peers: AsyncioPeerRequests | None = None
        self.migration_pacer = ByteRatePacer(settings.shard_migration_bytes_per_second)
        self.port = 0
        self.unknown_group_messages = 0

    async def start(self) -> int:
        """Open storage, start listening; returns the port bound."""
        settings = self.settings
        host, port = parse_address(settings.listen)
        self.port = await self.endpoint.listen(host, port, settings.advertise)
        self.address_book.learn(
            self.node_id, settings.advertise or format_address(host, self.port), AddressSource.SELF
        )
        voters = () if settings.join else tuple(sorted([*settings.peers, settings.node_id]))
        machine = KVStateMachine()
        self.streams = StreamService(self, lambda: self.groups[KV_GROUP], machine)
        group = self.add_group(
            KV_GROUP, TopicWatchingMachine(machine, self.streams.schedule_sync), voters
        )
        group.on_configuration = self.configuration_changed
        self.kv = KVService(
            group.host, machine, lambda: self.address_of(group.core.leader_id), KVLimits()
        )
        self.start_sharded_kv()
        for hosted in self.groups.values():
            hosted.start()
        self.streams.start()
        for migrator in self.migrators:
            migrator.start()
        self.preferred_leaders.start()
        log.info(
            "node %s listening on %s:%d (data in %s)",
            self.node_id,
            host,
            self.port,
            settings.data_dir,
        )
        return self.port

    def add_group(self, name: str, machine: StateMachine, voters: tuple[str, ...]) -> GroupRunner:
        """A Raft group hosted here (not started), its data in `data_dir/name`."""
        settings = self.settings
        group = GroupRunner(
            name,
            RaftConfig(node_id=settings.node_id, election_ticks=settings.election_ticks),
            Path(settings.data_dir) / name,
            machine,
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
        self.groups[name] = group
        return group

    def start_sharded_kv(self) -> None:
        """Host the controller group and the shard groups this node is a member of."""
        settings = self.settings
        if self.node_id in settings.controller:
            machine = ControllerMachine(settings.shard_count)
            group = self.add_group(
                wire.CONTROLLER_GROUP, machine, tuple(sorted(settings.controller))
            )
            self.controller = ControllerService(
                group.host, machine, self.leader_address_function(group)
            )
        preferred: list[tuple[RaftHost, str]] = []
        self.peers = AsyncioPeerRequests(
            self.requester, AsyncioScheduler(asyncio.get_running_loop())
        )
        for gid, members in sorted(settings.shard_groups.items()):
            if self.node_id not in members:
                continue
            shard_machine = ShardGroupMachine(gid, settings.shard_count)
            group = self.add_group(
                wire.shard_group_name(gid), shard_machine, tuple(sorted(members))
            )
            service = ShardGroupService(
                gid, group.host, shard_machine, self.leader_address_function(group), KVLimits()
            )
            self.shard_services[gid] = service
            preferred.append((group.host, preferred_leader(gid, members)))
            self.migrators.append(
                ShardMigrator(
                    service,
                    self.controller_addresses,
                    self.peers,
                    interval_seconds=settings.shard_monitor_ms / 1000,
                    pull_bytes_max=settings.shard_pull_bytes_max,
                    pacer=self.migration_pacer,
                )
            )

        self.preferred_leaders = PreferredLeaders(preferred, settings.preferred_leader_ms / 1000)

    def leader_address_function(self, group: GroupRunner) -> Callable[[], str | None]:
        return lambda: self.address_of(group.core.leader_id)

    def controller_addresses(self) -> list[str]:
        addresses = self.addresses
        return [addresses[member] for member in self.settings.controller if member in addresses]

    async def stop(self) -> None:
        self.preferred_leaders.stop()
        for migrator in self.migrators:
            migrator.stop()
        if self.peers is not None:
            await self.peers.close()
        await self.requester.close()
        await self.endpoint.close()
        await self.streams.stop()
        for group in list(self.groups.values()):
            if not group.stopped:
                await group.stop()
        self.executor.shutdown(wait=True)

    @property
    def addresses(self) -> dict[str, str]:
        """Every node's address as this node knows it (a copy)."""
        return self.address_book.addresses()

    def address_of(self, node_id: str | None) -> str | None:
        return self.address_book.address_of(node_id) if node_id is not None else None

    def resolve(self, server: str) -> str:
        """A shard group's server as an address: a node id's current address, else the
        name itself (taken as "host:port")."""
        return self.address_book.address_of(server) or server

    def configuration_changed(self, configuration: Configuration) -> None:
        self.learn_addresses(dict(configuration.addresses))

    def learn_addresses(
        self, learned: dict[str, str], source: AddressSource = AddressSource.STORED
    ) -> None:
        """Take `learned` addresses from `source`; by default they come from the logs
        (configurations, topic descriptors), which only fill gaps (see `node/addresses`)."""
        if self.address_book.learn_all(learned, source):
            self.endpoint.update_peers(self.address_book.peer_addresses())

    def on_peer_address(self, peer: str, address: str) -> None:
        if self.address_book.learn(peer, address, AddressSource.ANNOUNCED):
            log.info("node %s now listens at %s", peer, address)
            self.endpoint.update_peers(self.address_book.peer_addresses())

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
        if isinstance(
            request,
            wire.ControllerRequest
            | wire.ShardGroupRequest
            | wire.ShardStatusRequest
            | wire.KVWrite
            | wire.KVRead
            | wire.KVScan,
        ) and self.on_sharded_kv_request(request, reply):
            return
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

    def on_sharded_kv_request(
        self,
        request: wire.ControllerRequest
        | wire.ShardGroupRequest
        | wire.ShardStatusRequest
        | wire.KVWrite
        | wire.KVRead
        | wire.KVScan,
        reply: Replier,
    ) -> bool:
        """Serve a request for the controller or a shard group; False if it is for another
        group (the KV requests of the "kv" group go on to the KV service)."""
        if isinstance(request, wire.KVWrite | wire.KVRead | wire.KVScan):
            if request.group == KV_GROUP:
                return False
            if not request.group.startswith("shard-"):
                # The controller or a stream partition: not a KV group. (Without this the
                # request would go on to the KV service and be served by the "kv" group.)
                self.unknown_group(reply, request.request_id, request.group)
                return True
            service = self.shard_services.get(shard_gid(request.group))
            if service is None:
                self.unknown_group(reply, request.request_id, request.group)
            elif isinstance(request, wire.KVWrite):
                service.write(request, reply)
            else:
                service.read(request, reply)
            return True
        if isinstance(request, wire.ControllerRequest):
            if self.controller is None:
                self.unknown_group(reply, request.request_id, wire.CONTROLLER_GROUP)
            else:
                self.controller.handle(request, reply)
            return True
        service = self.shard_services.get(request.gid)
        if service is None:
            self.unknown_group(reply, request.request_id, wire.shard_group_name(request.gid))
        elif isinstance(request, wire.ShardGroupRequest):
            service.handle_group_request(request, reply)
        else:
            reply(service.status(request.request_id, self.node_id))
        return True

    def unknown_group(self, reply: Replier, request_id: int, group: str) -> None:
        reply(
            wire.ErrorResponse(
                request_id=request_id,
                code=wire.ErrorCode.UNKNOWN_GROUP,
                message=f"no group {group!r} on {self.node_id}",
            )
        )

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
            addresses=self.addresses,
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
            future = group.host.change_membership(
                MembershipChange(kind=kind, node_id=request.node_id, address=request.address)
            )
        except QuorumLogError as error:
            self.reply_error(reply, request.request_id, error, group)
            return

        def answer(done: Completion[Any]) -> None:
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
            group.transfer_leadership(request.target)
        except (QuorumLogError, ValueError) as error:
            self.reply_error(reply, request.request_id, error, group)
            return
        reply(
            wire.Done(
                request_id=request.request_id, detail=f"leadership is moving to {request.target}"
            )
        )

    def reply_error(
        self, reply: Replier, request_id: int, error: BaseException, group: GroupRunner
    ) -> None:
        reply(error_response(request_id, error, self.leader_address_function(group)))


def shard_gid(group: str) -> int:
    """The gid in a "shard-<gid>" group name; -1 (no such group) if malformed."""
    number = group.removeprefix("shard-")
    # isdigit alone takes "²" and digit strings too long for int(): ASCII, bounded.
    if number.isascii() and number.isdigit() and len(number) <= 9:
        return int(number)
    return -1


async def run_node(settings: NodeSettings, stop: asyncio.Event) -> None:
    node = Node(settings)
    await node.start()
    try:
        await stop.wait()
    finally:
        await node.stop()
