"""Which service answers a client request: the routing of a node's client port.

A node (node/server.py) and a simulated node (testing/sim/shardkv) hand every request that
reaches them to one `RequestDispatcher`, which sends it to the service that serves it:

- KV reads, writes and scans of group "kv" → the KV service; of "shard-<gid>" → that shard
  group's service (a KV request naming any other group gets UNKNOWN_GROUP, never the "kv"
  group's answer);
- controller requests → the controller service; pulls, deletes and status of a shard group
  → its service;
- status, membership changes and leadership transfers of a hosted group → its host (these
  ride on the "kv" group: a node without one answers UNKNOWN_GROUP);
- HA controller requests → the HA controller service (controller mode, reference 003);
- consumer-group requests → the group coordinator service;
- the bookie protocol (adds, reads, LAC reads and fences, drops) → this node's bookie;
- anything else (topics, produce, fetch, partitions) → the stream service.

A service that this node does not run answers UNKNOWN_GROUP naming the group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quorumlog.auth.guard import AUTH_FRAME_TYPES, AuthGuard
from quorumlog.codec import wire
from quorumlog.errors import QuorumLogError
from quorumlog.ledger.bookie import BookieRequest
from quorumlog.node.controller_service import ControllerService
from quorumlog.node.errors_to_wire import error_response
from quorumlog.node.group_coordinator_service import GroupCoordinatorService
from quorumlog.node.ha_controller_service import HAControllerService
from quorumlog.node.kv_service import KVService
from quorumlog.node.shard_service import ShardGroupService
from quorumlog.raft.configuration import ChangeKind, MembershipChange
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.host import RaftHost
from quorumlog.runtime.transport import Replier, parse_address

KV_GROUP = "kv"

ShardedKVRequest = (
    wire.ControllerRequest
    | wire.ShardGroupRequest
    | wire.ShardStatusRequest
    | wire.KVWrite
    | wire.KVRead
    | wire.KVScan
)
StreamHandler = Callable[[wire.ClientRequest, Replier], None]
BookieHandler = Callable[[BookieRequest, Replier], None]
BOOKIE_GROUP = "bookie"
"""How an answer names the bookie service (a node started with `--no-bookie` has none)."""


def shard_gid(group: str) -> int:
    """The gid in a "shard-<gid>" group name; -1 (no such group) if malformed."""
    number = group.removeprefix("shard-")
    # isdigit alone takes "²" and digit strings too long for int(): ASCII, bounded.
    if number.isascii() and number.isdigit() and len(number) <= 9:
        return int(number)
    return -1


class RequestDispatcher:
    """Routes client requests to this node's services. The node fills in the services as
    it brings them up (`kv`, `controller`, `shard_services`, `streams`, `bookie`,
    `ha_controller`)."""

    def __init__(
        self,
        node_id: str,
        host_of: Callable[[str], RaftHost | None],
        address_of: Callable[[str | None], str | None],
        addresses: Callable[[], dict[str, str]],
    ) -> None:
        self.node_id = node_id
        self.host_of = host_of
        """A hosted group's host by group name; None if not hosted here."""
        self.address_of = address_of
        """A node id's client address, as this node knows it."""
        self.addresses = addresses
        """Every node's address as this node knows it (for status answers)."""
        self.kv: KVService | None = None
        self.controller: ControllerService | None = None
        self.shard_services: dict[int, ShardGroupService] = {}
        self.streams: StreamHandler | None = None
        self.bookie: BookieHandler | None = None
        self.ha_controller: HAControllerService | None = None
        self.group_coordinator: GroupCoordinatorService | None = None
        self.auth: AuthGuard | None = None
        """Checks tokens and rights (quorumlog.auth); None: nothing is checked."""
        self.cluster_level: Callable[[], int] = lambda: 0
        """The feature level this node knows its cluster committed (status answers)."""

    def on_client_request(
        self, request: wire.ClientRequest, reply: Replier, peer_common_name: str = ""
    ) -> None:
        auth = self.auth
        if auth is not None and (auth.active or type(request) in AUTH_FRAME_TYPES):
            admitted = auth.admit(request, reply, peer_common_name or None)
            if admitted is None:
                return
            request = admitted
        if isinstance(request, wire.GroupCoordinatorRequest):
            if self.group_coordinator is None:
                self.unknown_group(reply, request.request_id, wire.GROUP_COORDINATOR_GROUP)
            else:
                self.group_coordinator.handle(request, reply)
            return
        if isinstance(request, wire.KVRangeRequest | wire.WatchPoll | wire.LeaseTimeToLiveRequest):
            if self.on_shard_v3_request(request, reply):
                return
            if request.group != KV_GROUP or self.kv is None:
                self.unknown_group(reply, request.request_id, request.group)
            else:
                self.kv.read_v3(request, reply)
            return
        if isinstance(request, wire.HAControllerRequest):
            if self.ha_controller is None:
                self.unknown_group(reply, request.request_id, wire.HA_CONTROLLER_GROUP)
            else:
                self.ha_controller.handle(request, reply)
            return
        if isinstance(
            request,
            wire.AddEntries | wire.ReadEntries | wire.ReadLastAddConfirmed | wire.DropLedger,
        ):
            self.on_bookie_request(request, reply)
            return
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
        host = self.host_of(request.group)
        if host is None or self.kv is None:
            self.unknown_group(reply, request.request_id, request.group)
            return
        if isinstance(request, wire.KVWrite):
            self.kv.write(request, reply)
        elif isinstance(request, wire.KVRead | wire.KVScan):
            self.kv.read(request, reply)
        elif isinstance(request, wire.StatusRequest):
            reply(self.status(host, request.request_id))
        elif isinstance(request, wire.MemberChangeRequest):
            self.change_membership(host, request, reply)
        else:
            self.transfer_leader(host, request, reply)

    def on_sharded_kv_request(self, request: ShardedKVRequest, reply: Replier) -> bool:
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

    def on_shard_v3_request(
        self,
        request: wire.KVRangeRequest | wire.WatchPoll | wire.LeaseTimeToLiveRequest,
        reply: Replier,
    ) -> bool:
        """Serve a range or watch of a shard group; False if it is not for one."""
        if isinstance(request, wire.LeaseTimeToLiveRequest) or not request.group.startswith(
            "shard-"
        ):
            return False
        service = self.shard_services.get(shard_gid(request.group))
        if service is None:
            self.unknown_group(reply, request.request_id, request.group)
        else:
            service.read_v3(request, reply)
        return True

    def on_bookie_request(self, request: BookieRequest, reply: Replier) -> None:
        if self.bookie is None:
            reply(
                wire.ErrorResponse(
                    request_id=request.request_id,
                    code=wire.ErrorCode.UNKNOWN_GROUP,
                    message=f"no {BOOKIE_GROUP} on {self.node_id} (it runs with --no-bookie)",
                )
            )
            return
        self.bookie(request, reply)

    def on_stream_request(self, request: wire.ClientRequest, reply: Replier) -> None:
        if self.streams is None:
            self.unknown_group(reply, request.request_id, "streams")
            return
        self.streams(request, reply)

    def unknown_group(self, reply: Replier, request_id: int, group: str) -> None:
        reply(
            wire.ErrorResponse(
                request_id=request_id,
                code=wire.ErrorCode.UNKNOWN_GROUP,
                message=f"no group {group!r} on {self.node_id}",
            )
        )

    # --- group administration -------------------------------------------------------------

    def status(self, host: RaftHost, request_id: int) -> wire.StatusResponse:
        core = host.core
        errors = [host.failure] if host.failure else []
        return wire.StatusResponse(
            request_id=request_id,
            node_id=self.node_id,
            group=host.group_id,
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
            addresses=self.addresses(),
            errors=errors,
            cluster_level=self.cluster_level(),
        )

    def change_membership(
        self, host: RaftHost, request: wire.MemberChangeRequest, reply: Replier
    ) -> None:
        try:
            kind = ChangeKind(request.kind)
        except ValueError:
            self.bad_request(
                reply, request.request_id, f"unknown membership change {request.kind!r}"
            )
            return
        if request.address is not None:
            try:
                parse_address(request.address)
            except ValueError as error:
                self.bad_request(reply, request.request_id, str(error))
                return
        try:
            completion = host.change_membership(
                MembershipChange(kind=kind, node_id=request.node_id, address=request.address)
            )
        except QuorumLogError as error:
            self.reply_error(reply, request.request_id, error, host)
            return

        def answer(done: Completion[Any]) -> None:
            error = done.exception()
            if error is not None:
                self.reply_error(reply, request.request_id, error, host)
            else:
                reply(
                    wire.Done(
                        request_id=request.request_id,
                        detail=f"{kind.value} {request.node_id} committed",
                    )
                )

        completion.add_done_callback(answer)

    def transfer_leader(
        self, host: RaftHost, request: wire.TransferLeaderRequest, reply: Replier
    ) -> None:
        try:
            host.transfer_leadership(request.target)
        except (QuorumLogError, ValueError) as error:
            self.reply_error(reply, request.request_id, error, host)
            return
        reply(
            wire.Done(
                request_id=request.request_id, detail=f"leadership is moving to {request.target}"
            )
        )

    def bad_request(self, reply: Replier, request_id: int, message: str) -> None:
        reply(
            wire.ErrorResponse(
                request_id=request_id, code=wire.ErrorCode.BAD_REQUEST, message=message
            )
        )

    def reply_error(
        self, reply: Replier, request_id: int, error: BaseException, host: RaftHost
    ) -> None:
        reply(error_response(request_id, error, lambda: self.address_of(host.leader_id)))


__all__ = [
    "BOOKIE_GROUP",
    "KV_GROUP",
    "BookieHandler",
    "RequestDispatcher",
    "ShardedKVRequest",
    "StreamHandler",
    "shard_gid",
]
