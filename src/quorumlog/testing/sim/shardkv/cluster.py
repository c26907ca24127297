"""A simulated sharded KV deployment with a scriptable API, for scenarios and the runner.

One controller group on nodes "ctl-1".."ctl-3" (or on the first shard group's nodes, with
`colocate_controller`) and shard groups (gid g on "g{g}-1".."g{g}-3"), each node a
`ShardNode` running the shipped hosts, services, migrators and preferred leaders; all on
one event queue in virtual milliseconds. Each group's Raft traffic has its
own `SimNetwork`, everything else travels as wire frames on one `SimFrameNetwork`, and all
of them share one set of cut links (`network`), so one partition cuts every kind of
traffic. Clients and the admin are the shipped client rules on events (`shardkv.client`).
Raft safety is checked per group after every event; the shard checks (`shardkv.checks`) run
every `check_interval_ms` and at the end.

    cluster = ShardCluster(seed=3, options=ShardSimOptions(gids=(100, 101)))
    cluster.join(100, 101)
    cluster.put("k", "v")
    cluster.crash_group(101)
    assert cluster.get("k") == "v"   # if k's shard is on 100
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from quorumlog.codec import wire
from quorumlog.errors import RequestRejectedError
from quorumlog.node.composition import ShardedKVLayout
from quorumlog.raft.config import RaftConfig
from quorumlog.shard.config import ShardConfiguration, shard_for_key
from quorumlog.shard.controller_commands import ControllerCommand, Join, Leave, Move
from quorumlog.shard.group_machine import ShardGroupMachine, ShardState
from quorumlog.testing.history import History
from quorumlog.testing.linearizability import LinearizabilityResult, check_linearizable
from quorumlog.testing.sim.checks import SimulationError, check_invariant
from quorumlog.testing.sim.events import EventQueue, derive_random
from quorumlog.testing.sim.frame_network import SimFrameNetwork
from quorumlog.testing.sim.invariants import InvariantChecker
from quorumlog.testing.sim.network import NetworkFaults, SimNetwork
from quorumlog.testing.sim.process import SimProcess
from quorumlog.testing.sim.shardkv.checks import ShardChecker
from quorumlog.testing.sim.shardkv.client import ClientOptions, SimAdmin, SimShardedClient
from quorumlog.testing.sim.shardkv.nemesis import ShardNemesisOptions
from quorumlog.testing.sim.shardkv.node import (
    GroupMember,
    MemberOptions,
    ServerOptions,
    ShardNode,
    SimStats,
)
from quorumlog.testing.sim.shardkv.transport import FrameCalls, address_of
from quorumlog.testing.sim.trace import TraceRecorder

REPLICAS_PER_GROUP = 3
ADMIN_TIMEOUT_MS = 20_000


class ShardSimOptions(msgspec.Struct, frozen=True):
    gids: tuple[int, ...] = (100, 101, 102)
    """Every shard group that exists (and runs) from the start; scenarios join them."""
    shard_count: int = 10
    raft: RaftConfig = RaftConfig(node_id="template", election_ticks=10, heartbeat_ticks=1)
    member: MemberOptions = MemberOptions()
    server: ServerOptions = ServerOptions()
    client: ClientOptions = ClientOptions()
    network: NetworkFaults = NetworkFaults()
    nemesis: ShardNemesisOptions = ShardNemesisOptions()
    """Partitions and pauses, for the scenarios that start a nemesis (the concurrent ones)."""
    check_interval_ms: int = 25
    colocate_controller: bool = False
    """Run the controller group on the first shard group's nodes (a node then hosts two
    groups, as a real node may) instead of on nodes of its own. The nemesis assumes nodes
    of one group each: leave it off where a nemesis runs."""


class OperationTimeoutError(SimulationError):
    """A scripted operation did not finish within its deadline."""


def member_ids(gid: int) -> list[str]:
    return [f"g{gid}-{replica}" for replica in range(1, REPLICAS_PER_GROUP + 1)]


CONTROLLER_IDS = [f"ctl-{replica}" for replica in range(1, REPLICAS_PER_GROUP + 1)]


class SharedLinks:
    """The cut links every network of the deployment shares: (source, target) pairs that
    drop everything, Raft messages and frames alike."""

    def __init__(self) -> None:
        self.blocked: set[tuple[str, str]] = set()

    def partition(self, groups: list[list[str]]) -> None:
        """Block every link between different groups, both ways (adds to current cuts)."""
        for group_index, group in enumerate(groups):
            for other_index, other in enumerate(groups):
                if group_index != other_index:
                    for source in group:
                        for target in other:
                            self.blocked.add((source, target))

    def cut(self, source: str, target: str) -> None:
        """Drop what goes from `source` to `target` only (a one-way fault)."""
        self.blocked.add((source, target))

    def heal(self) -> None:
        self.blocked.clear()


class ShardCluster:
    def __init__(
        self, seed: int, options: ShardSimOptions | None = None, trace: TraceRecorder | None = None
    ) -> None:
        self.seed = seed
        self.options = options = options or ShardSimOptions()
        self.trace = trace
        self.events = EventQueue()
        self.network = SharedLinks()
        self.controller_ids = (
            member_ids(options.gids[0]) if options.colocate_controller else list(CONTROLLER_IDS)
        )
        self.layout = ShardedKVLayout(
            controller=list(self.controller_ids),
            shard_groups={gid: member_ids(gid) for gid in options.gids},
            shard_count=options.shard_count,
            monitor_seconds=options.server.monitor_interval_ms / 1000,
            pull_bytes_max=options.server.pull_bytes_max,
            preferred_leader_seconds=options.server.preferred_leader_ms / 1000,
        )
        groups = [wire.CONTROLLER_GROUP] + [wire.shard_group_name(gid) for gid in options.gids]
        self.raft_networks: dict[str, SimNetwork] = {}
        self.raft_checkers: dict[str, InvariantChecker] = {}
        for group in groups:
            raft_network = SimNetwork(
                self.events,
                derive_random(seed, f"raft-network:{group}"),
                options.network,
                {},
                trace,
            )
            raft_network.blocked = self.network.blocked
            self.raft_networks[group] = raft_network
            self.raft_checkers[group] = InvariantChecker()
        self.frames = SimFrameNetwork(
            self.events,
            derive_random(seed, "frame-network"),
            options.network,
            self.network.blocked,
            trace,
        )
        self.stats = SimStats()
        self.nodes: dict[str, ShardNode] = {}
        node_ids = self.controller_ids + [n for gid in options.gids for n in member_ids(gid)]
        for node_id in dict.fromkeys(node_ids):
            self.nodes[node_id] = ShardNode(
                node_id,
                seed=seed,
                layout=self.layout,
                raft_config=options.raft,
                options=options.member,
                server=options.server,
                events=self.events,
                raft_networks=self.raft_networks,
                frames=self.frames,
                checkers=self.raft_checkers,
                stats=self.stats,
                trace=trace,
            )
        self.controller_members = [
            self.nodes[node_id].members[wire.CONTROLLER_GROUP] for node_id in self.controller_ids
        ]
        self.members: dict[int, list[GroupMember]] = {
            gid: [self.nodes[n].members[wire.shard_group_name(gid)] for n in member_ids(gid)]
            for gid in options.gids
        }
        self.history = History()
        self.clients: dict[str, SimShardedClient] = {}
        self.script_client = self.new_client("script")
        self.admin = SimAdmin(
            "admin",
            calls=self.calls_for("admin"),
            controller_endpoints=self.controller_endpoints(),
            options=options.client,
            timeout_seconds=ADMIN_TIMEOUT_MS / 1000,
        )
        self.shard_checker = ShardChecker(self)
        self.events.schedule(options.check_interval_ms, self.periodic_check)

    def calls_for(self, name: str) -> FrameCalls:
        """A client process named `name` on the frame network (it never crashes)."""
        process = SimProcess(name, self.events, derive_random(self.seed, f"resume:{name}"))
        process.boot()
        self.frames.register(name, process)
        return FrameCalls(name, self.frames, process)

    def controller_endpoints(self) -> list[str]:
        return [address_of(node_id) for node_id in self.controller_ids]

    def new_client(self, name: str) -> SimShardedClient:
        client_id = f"client-{name}"
        client = SimShardedClient(
            client_id,
            calls=self.calls_for(client_id),
            controller_endpoints=self.controller_endpoints(),
            history=self.history,
            options=self.options.client,
        )
        self.clients[client_id] = client
        return client

    # --- time -----------------------------------------------------------------------------

    @property
    def now_ms(self) -> int:
        return self.events.now_ms

    def run(self, ms: int) -> None:
        self.events.run_until(self.events.now_ms + ms)

    def run_until(self, predicate: Callable[[], bool], ms_max: int) -> bool:
        """Run event by event until `predicate()` holds; False if `ms_max` pass first."""
        events = self.events
        deadline_ms = events.now_ms + ms_max
        while not predicate():
            next_time_ms = events.next_time_ms()
            if next_time_ms is None or next_time_ms > deadline_ms:
                events.run_until(deadline_ms)
                return predicate()
            events.run_next()
        return True

    def periodic_check(self, _: object = None) -> None:
        self.events.schedule(self.options.check_interval_ms, self.periodic_check)
        self.shard_checker.check_serving()

    # --- members and faults ---------------------------------------------------------------

    def group_members(self, gid: int) -> list[GroupMember]:
        return self.members[gid]

    def all_endpoints(self) -> list[str]:
        return [*self.nodes, *self.clients, self.admin.client_id]

    def crash_group(self, gid: int) -> None:
        self.note(f"crash group {gid}")
        for member in self.group_members(gid):
            member.crash()

    def restart_group(self, gid: int) -> None:
        self.note(f"restart group {gid}")
        for member in self.group_members(gid):
            member.restart()

    def crash_controller(self) -> None:
        for member in self.controller_members:
            member.crash()

    def restart_controller(self) -> None:
        for member in self.controller_members:
            member.restart()

    def partition_away(self, gid: int) -> None:
        """Cut every link between group `gid`'s members and everything else."""
        inside = member_ids(gid)
        outside = [endpoint for endpoint in self.all_endpoints() if endpoint not in inside]
        self.note(f"partition group {gid} away")
        self.network.partition([inside, outside])

    def heal(self) -> None:
        self.note("heal")
        self.network.heal()

    def set_faults(self, faults: NetworkFaults) -> None:
        faults.validate()
        for raft_network in self.raft_networks.values():
            raft_network.set_faults(faults)
        self.frames.faults = faults

    def note(self, text: str) -> None:
        """Record `text` in the trace (if tracing) at the current virtual time."""
        if self.trace is not None:
            self.trace.record(self.events.now_ms, text)

    # --- views ----------------------------------------------------------------------------

    def leader_of(self, gid: int) -> GroupMember | None:
        best: GroupMember | None = None
        for member in self.group_members(gid):
            if member.is_leader and (best is None or member.core.term > best.core.term):
                best = member
        return best

    def latest_configuration(self) -> ShardConfiguration:
        """The newest configuration any live controller member applied."""
        live: list[ShardConfiguration] = [
            member.machine.latest for member in self.controller_members if member.up
        ]
        return max(live, key=lambda configuration: configuration.number)

    def owner_of_key(self, key: str) -> int:
        return self.latest_configuration().shards[shard_for_key(key, self.options.shard_count)]

    def describe(self) -> str:
        lines = [member.describe() for member in self.controller_members]
        for gid, members in self.members.items():
            for member in members:
                line = member.describe()
                if member.up:
                    machine: ShardGroupMachine = member.machine
                    states = "".join(shard.state.value[0] for shard in machine.shards)
                    line += (
                        f" config={machine.current_configuration.number} shards={states} "
                        f"keys={machine.stored_key_count()}"
                    )
                lines.append(f"[{gid}] {line}")
        return "\n".join(lines)

    @property
    def invariant_checks(self) -> int:
        raft = sum(checker.checks for checker in self.raft_checkers.values())
        return raft + self.shard_checker.checks

    def settled(self, gids: list[int] | None = None) -> bool:
        """Every live group's members applied the latest configuration, nothing migrating."""
        latest = self.latest_configuration().number
        for gid in gids if gids is not None else list(self.members):
            for member in self.group_members(gid):
                if not member.up:
                    return False
                machine: ShardGroupMachine = member.machine
                if machine.current_configuration.number != latest or not machine.all_serving():
                    return False
        return True

    def settle(self, gids: list[int] | None = None, ms_max: int = 30_000) -> None:
        if not self.run_until(lambda: self.settled(gids), ms_max):
            raise OperationTimeoutError(
                f"groups did not settle on configuration {self.latest_configuration().number} "
                f"within {ms_max} ms:\n{self.describe()}"
            )

    # --- scripted requests ----------------------------------------------------------------

    def admin_command(
        self,
        identity: tuple[str, str, str | None, str | None],
        make_command: Callable[[int], ControllerCommand],
    ) -> int:
        """Run one join/leave/move to its end; the configuration number it created."""
        outcome: list[int | BaseException] = []
        ms_max = ADMIN_TIMEOUT_MS
        self.note(f"admin {identity[0]} {identity[1]}")

        def change(_: object) -> None:
            self.admin.change(identity, make_command, outcome.append, outcome.append)

        self.admin.driver.calls.process.enter("local", change)
        if not self.run_until(lambda: bool(outcome), ms_max + 1_000):
            raise OperationTimeoutError(f"{identity[0]} {identity[1]} never ended")
        result = outcome[0]
        if isinstance(result, RequestRejectedError):
            check_invariant(False, f"controller refused {identity[0]} {identity[1]}: {result}")
        if isinstance(result, BaseException):
            raise OperationTimeoutError(
                f"{identity[0]} {identity[1]} did not finish within {ms_max} ms: {result}"
            )
        return result

    def join(self, *gids: int) -> int:
        groups = {gid: [address_of(node_id) for node_id in member_ids(gid)] for gid in gids}
        return self.admin_command(
            ("join", repr(sorted(groups.items())), None, None),
            lambda sequence: Join(sequence, groups),
        )

    def leave(self, *gids: int) -> int:
        return self.admin_command(
            ("leave", repr(sorted(gids)), None, None),
            lambda sequence: Leave(sequence, list(gids)),
        )

    def move(self, shard: int, gid: int) -> int:
        return self.admin_command(
            ("move", str(shard), str(gid), None), lambda sequence: Move(sequence, shard, gid)
        )

    def request(
        self,
        kind: str,
        key: str,
        argument: str | None = None,
        operation_timeout_ms: int = 20_000,
        client: SimShardedClient | None = None,
    ) -> tuple[str, object]:
        """Run one operation to its end: ("ok", output), ("unknown", None) or
        ("unavailable", None)."""
        outcome: list[tuple[str, object]] = []
        chosen = client if client is not None else self.script_client
        chosen.begin(
            kind,
            key,
            argument,
            lambda status, output: outcome.append((status, output)),
            operation_timeout_ms,
        )
        self.run_until(lambda: bool(outcome), operation_timeout_ms + 1_000)
        check_invariant(bool(outcome), f"{kind} {key!r} never ended")
        return outcome[0]

    def put(self, key: str, value: str) -> None:
        self.require_ok("put", key, value)

    def append(self, key: str, suffix: str) -> None:
        self.require_ok("append", key, suffix)

    def get(self, key: str) -> str | None:
        output = self.require_ok("get", key, None)
        return output if isinstance(output, str) else None

    def require_ok(self, kind: str, key: str, argument: str | None) -> object:
        status, output = self.request(kind, key, argument)
        if status != "ok":
            raise OperationTimeoutError(
                f"{kind} {key!r} did not complete ({status}) at {self.now_ms} ms:\n"
                f"{self.describe()}"
            )
        return output

    # --- end-of-run checks ----------------------------------------------------------------

    def check_linearizable(self, steps_max: int = 1_000_000) -> LinearizabilityResult:
        return check_linearizable(self.history.operations(), time_budget_steps=steps_max)

    def shard_states(self, gid: int) -> list[ShardState]:
        leader = self.leader_of(gid)
        members = [leader] if leader is not None else self.group_members(gid)
        machine: ShardGroupMachine = members[0].machine
        return [shard.state for shard in machine.shards]
