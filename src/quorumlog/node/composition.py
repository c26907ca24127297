"""The sharded KV part of a node, put together from hosts and resources.

A node that is a member of the shard controller hosts the "controller" group and serves it
(`ControllerService`); for every shard group it is a member of it hosts "shard-<gid>",
serves it (`ShardGroupService`), moves its shards while it leads (`ShardMigrator`), and
spreads those groups' leaders over their members (`PreferredLeaders`).

`compose_sharded_kv` builds all of that from what the world provides: a way to add a hosted
group (a `RaftHost` over files in a real node, over a simulated disk in the simulator),
peer requests, a pacer, and where the controller and the group leaders listen. The real
node (node/server.py) and the simulator's node call it alike, so the simulator runs the
services, migrators and preferred leaders exactly as a node wires them.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from quorumlog.codec import wire
from quorumlog.node.controller_service import ControllerService
from quorumlog.node.kv_service import KVLimits
from quorumlog.node.peer_requests import PeerRequests
from quorumlog.node.preferred_leaders import PreferredLeaders, preferred_leader
from quorumlog.node.shard_migration import (
    PULL_BYTES_MAX_DEFAULT,
    ByteRatePacer,
    ShardMigrator,
)
from quorumlog.node.shard_service import ShardGroupService
from quorumlog.runtime.host import RaftHost
from quorumlog.runtime.resources import StateMachine
from quorumlog.shard.config import SHARD_COUNT_DEFAULT
from quorumlog.shard.controller import ControllerMachine
from quorumlog.shard.group_machine import ShardGroupMachine

AddGroup = Callable[[str, StateMachine, tuple[str, ...]], RaftHost]
"""Host a group here (not started): its name, its state machine, its bootstrap voters."""
LeaderAddress = Callable[[RaftHost], Callable[[], str | None]]
"""For a host: where its group's current leader listens (for NOT_LEADER hints)."""


class ShardedKVLayout(msgspec.Struct, frozen=True):
    """Which groups of the sharded KV exist and how their nodes run them."""

    controller: list[str] = []
    """The node ids of the shard controller group's members (empty: no sharded KV)."""
    shard_groups: dict[int, list[str]] = {}
    """Shard group gid → its members' node ids."""
    shard_count: int = SHARD_COUNT_DEFAULT
    monitor_seconds: float = 0.1
    """How often a shard group's leader checks for a new configuration and moves shards."""
    pull_bytes_max: int = PULL_BYTES_MAX_DEFAULT
    preferred_leader_seconds: float = 1.0
    """How often a leader checks whether to hand its group to the preferred member; 0: off."""


class ShardedKVParts:
    """What `compose_sharded_kv` built on one node."""

    def __init__(self) -> None:
        self.controller: ControllerService | None = None
        self.controller_host: RaftHost | None = None
        self.controller_machine: ControllerMachine | None = None
        self.shard_services: dict[int, ShardGroupService] = {}
        self.shard_hosts: dict[int, RaftHost] = {}
        self.migrators: list[ShardMigrator] = []
        self.preferred_leaders = PreferredLeaders([], 0)

    def start(self) -> None:
        """Start the migrators and the preferred-leader checks (the groups run already)."""
        for migrator in self.migrators:
            migrator.start()
        self.preferred_leaders.start()

    def stop(self) -> None:
        self.preferred_leaders.stop()
        for migrator in self.migrators:
            migrator.stop()


def compose_sharded_kv(
    node_id: str,
    layout: ShardedKVLayout,
    add_group: AddGroup,
    *,
    peers: PeerRequests,
    pacer: ByteRatePacer,
    controller_addresses: Callable[[], list[str]],
    leader_address: LeaderAddress,
    limits: KVLimits | None = None,
) -> ShardedKVParts:
    """Host and serve the controller group and the shard groups `node_id` is a member of."""
    parts = ShardedKVParts()
    if node_id in layout.controller:
        machine = ControllerMachine(layout.shard_count)
        host = add_group(wire.CONTROLLER_GROUP, machine, tuple(sorted(layout.controller)))
        parts.controller_host = host
        parts.controller_machine = machine
        parts.controller = ControllerService(host, machine, leader_address(host))
    preferred: list[tuple[RaftHost, str]] = []
    for gid, members in sorted(layout.shard_groups.items()):
        if node_id not in members:
            continue
        shard_machine = ShardGroupMachine(gid, layout.shard_count)
        host = add_group(wire.shard_group_name(gid), shard_machine, tuple(sorted(members)))
        service = ShardGroupService(
            gid, host, shard_machine, leader_address(host), limits or KVLimits()
        )
        parts.shard_hosts[gid] = host
        parts.shard_services[gid] = service
        preferred.append((host, preferred_leader(gid, members)))
        parts.migrators.append(
            ShardMigrator(
                service,
                controller_addresses,
                peers,
                interval_seconds=layout.monitor_seconds,
                pull_bytes_max=layout.pull_bytes_max,
                pacer=pacer,
            )
        )
    parts.preferred_leaders = PreferredLeaders(preferred, layout.preferred_leader_seconds)
    return parts


__all__ = [
    "AddGroup",
    "LeaderAddress",
    "ShardedKVLayout",
    "ShardedKVParts",
    "compose_sharded_kv",
]
