"""What every simulated node runs on its Raft group: a state machine and, if clients are to
reach it, the service that answers their frames.

The default is what ships: `kv.machine.KVStateMachine` behind `node.kv_service.KVService`,
routed as the real node routes the "kv" group's requests (`node/server.py`). Users
simulate their own machine the same way:

    application = SimApplication(MyMachine)            # any runtime StateMachine
    cluster = SimCluster(seed=1, application=application)
    cluster.wait_for_leader()
    index, term = cluster.propose(b"my command")
    cluster.run(ticks=20)
    cluster.check_converged()

A service, if given, is built on each (re)start of a node from its `RaftHost` (a
`GroupHandle`), its machine and a function naming where the leader listens; it returns
the handler of the client frames that reach the node over the simulated frame network.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from quorumlog.codec import wire
from quorumlog.kv.commands import KVEntry, decode_entry, encode_entry
from quorumlog.kv.machine import KVStateMachine
from quorumlog.kv.requests import KV_GROUP
from quorumlog.node.kv_service import KVLimits, KVService
from quorumlog.runtime.handle import GroupHandle
from quorumlog.runtime.resources import StateMachine
from quorumlog.testing.sim.frame_network import Replier, RequestHandler

MachineType = TypeVar("MachineType", bound=StateMachine)
RequestT = TypeVar("RequestT")

LeaderAddress = Callable[[], str | None]
"""Where the group's leader listens as this node knows it ("host:port"), if it knows."""

ServiceFactory = Callable[[GroupHandle, MachineType, LeaderAddress], RequestHandler]


class SimApplication(Generic[MachineType]):
    def __init__(
        self,
        machine_factory: Callable[[], MachineType],
        service_factory: ServiceFactory[MachineType] | None = None,
        marker_entry: bytes | None = None,
        command_identities: Callable[[bytes], Iterable[tuple[str, int]]] | None = None,
    ) -> None:
        self.machine_factory = machine_factory
        """A fresh, empty machine: at the start of each node and after each crash."""
        self.service_factory = service_factory
        self.marker_entry = marker_entry
        """An entry the machine takes that changes nothing, for `SimCluster.propose()`
        without an entry (scenario tests mark the log with it); None if there is none."""
        self.command_identities = command_identities
        """The (client id, sequence) of every client command an entry carries, if the
        application numbers them: the simulator then knows which writes of unknown outcome
        never reached any state machine, so never happened (runner.py)."""


def kv_service(
    group: GroupHandle, machine: KVStateMachine, leader_address: LeaderAddress
) -> RequestHandler:
    """The shipped KV service on `group`, answering the "kv" group's requests as the real
    node's `on_client_request` does."""
    service = KVService(group, machine, leader_address, KVLimits())

    def handle(request: wire.ClientRequest, reply: Replier) -> None:
        if isinstance(request, wire.KVWrite | wire.KVRead | wire.KVScan):
            if request.group != KV_GROUP:
                reply(unknown_group(request.request_id, request.group, group.node_id))
            elif isinstance(request, wire.KVWrite):
                service.write(request, reply)
            else:
                service.read(request, reply)
            return
        if isinstance(request, wire.KVRangeRequest | wire.WatchPoll | wire.LeaseTimeToLiveRequest):
            if request.group != KV_GROUP:
                reply(unknown_group(request.request_id, request.group, group.node_id))
            else:
                service.read_v3(request, reply)
            return
        reply(not_served(request, "KV node"))

    return handle


def not_served(request: wire.ClientRequest, role: str) -> wire.ErrorResponse:
    """The answer of a simulated `role` to a request the real node routes elsewhere."""
    return wire.ErrorResponse(
        request_id=request.request_id,
        code=wire.ErrorCode.BAD_REQUEST,
        message=f"the simulated {role} serves no {type(request).__name__}",
    )


def serving_only(
    request_type: type[RequestT], serve: Callable[[RequestT, Replier], None], role: str
) -> RequestHandler:
    """A handler that gives requests of `request_type` to `serve` (a shipped service's
    `handle`) and refuses the rest, as a node hosting only that service would."""

    def handle(request: wire.ClientRequest, reply: Replier) -> None:
        if isinstance(request, request_type):
            serve(request, reply)
        else:
            reply(not_served(request, role))

    return handle


def unknown_group(request_id: int, name: str, node_id: str) -> wire.ErrorResponse:
    return wire.ErrorResponse(
        request_id=request_id,
        code=wire.ErrorCode.UNKNOWN_GROUP,
        message=f"no group {name!r} on {node_id}",
    )


KV_MARKER_ENTRY = encode_entry(KVEntry(timestamp_ms=0, batches=[]))
"""A KV entry with no client batches: it changes no key and no session."""


def kv_command_identities(data: bytes) -> Iterable[tuple[str, int]]:
    for batch in decode_entry(data).batches:
        for command in batch.commands:
            yield batch.client_id, command.sequence


SIM_HISTORY_BYTES_MAX = 2048
"""The simulated KV keeps a small watch history: the simulated networks move snapshots in
chunks as small as 64 bytes, and the history rides in every snapshot (its workload has no
watches; `tests/unit/kv/test_mvcc.py` covers the history)."""


def sim_kv_machine() -> KVStateMachine:
    return KVStateMachine(history_bytes_max=SIM_HISTORY_BYTES_MAX)


KV_APPLICATION: SimApplication[KVStateMachine] = SimApplication(
    sim_kv_machine, kv_service, KV_MARKER_ENTRY, kv_command_identities
)
"""The default: the shipped KV machine (with a small history) and service."""


__all__ = ["KV_APPLICATION", "KV_MARKER_ENTRY", "SimApplication", "kv_service"]
