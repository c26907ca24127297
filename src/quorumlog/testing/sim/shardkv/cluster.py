"""A simulated sharded KV deployment with a scriptable API, for scenarios and the runner.

One controller group ("ctl-1".."ctl-3", RaftCore + ControllerMachine) and shard groups
(gid g: "g{g}-1".."g{g}-3", RaftCore + ShardGroupMachine), all on one event queue in
virtual milliseconds, with Raft traffic on a `SimNetwork` and everything else on an
`RpcNetwork` that shares its cut links. Raft safety is checked per group after every
event (`InvariantChecker`); the shard checks (`shardkv.checks`) run every
`check_interval_ms` and at the end.

    cluster = ShardCluster(seed=3, options=ShardSimOptions(gids=(100, 101)))
    cluster.join(100, 101)
    cluster.put("k", "v")
    cluster.crash_group(101)
    assert cluster.get("k") == "v"   # if k's shard is on 100
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import Configuration
from quorumlog.shard.config import ShardConfiguration, shard_for_key
from quorumlog.shard.controller import ControllerMachine
from quorumlog.shard.controller_commands import (
    ControllerCommand,
    ControllerResult,
    Join,
    Leave,
    Move,
)
from quorumlog.shard.group_machine import ShardGroupMachine, ShardState
from quorumlog.testing.history import History
from quorumlog.testing.linearizability import LinearizabilityResult, check_linearizable
from quorumlog.testing.sim.checks import SimulationError, check_invariant
from quorumlog.testing.sim.events import EventQueue, derive_random
from quorumlog.testing.sim.invariants import InvariantChecker
from quorumlog.testing.sim.network import NetworkFaults, Receiver, SimNetwork
from quorumlog.testing.sim.shardkv.checks import ShardChecker
from quorumlog.testing.sim.shardkv.client import AdminClient, ClientOptions, ShardClient
from quorumlog.testing.sim.shardkv.controller_server import ControllerServer
from quorumlog.testing.sim.shardkv.group_member import ServerOptions, ShardGroupServer
from quorumlog.testing.sim.shardkv.member import MemberOptions, RaftMember
from quorumlog.testing.sim.shardkv.nemesis import ShardNemesisOptions
from quorumlog.testing.sim.shardkv.rpc import RpcNetwork
from quorumlog.testing.sim.trace import TraceRecorder

CONTROLLER = "controller"
REPLICAS_PER_GROUP = 3


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


class OperationTimeoutError(SimulationError):
    """A scripted operation did not finish within its deadline."""


def member_ids(gid: int) -> list[str]:
    return [f"g{gid}-{replica}" for replica in range(1, REPLICAS_PER_GROUP + 1)]


CONTROLLER_IDS = [f"ctl-{replica}" for replica in range(1, REPLICAS_PER_GROUP + 1)]


class ShardCluster:
    def __init__(
        self, seed: int, options: ShardSimOptions | None = None, trace: TraceRecorder | None = None
    ) -> None:
        self.seed = seed
        self.options = options or ShardSimOptions()
        self.trace = trace
        self.events = EventQueue()
        receivers: dict[str, Receiver] = {}
        self.network = SimNetwork(
            self.events,
            derive_random(seed, "raft-network"),
            self.options.network,
            receivers,
            trace,
        )
        self.rpc = RpcNetwork(
            self.events,
            derive_random(seed, "rpc-network"),
            self.options.network,
            self.network.blocked,
            trace,
        )
        self.raft_checkers: dict[str, InvariantChecker] = {}
        checker = InvariantChecker()
        self.raft_checkers[CONTROLLER] = checker
        shard_count = self.options.shard_count
        self.controller_members: list[RaftMember[ControllerMachine]] = []
        for node_id in CONTROLLER_IDS:
            controller_member = RaftMember(
                node_id,
                seed=seed,
                raft_config=self.options.raft,
                bootstrap=Configuration(voters=tuple(CONTROLLER_IDS)),
                options=self.options.member,
                machine_factory=lambda: ControllerMachine(shard_count),
                events=self.events,
                network=self.network,
                checker=checker,
                trace=trace,
            )
            receivers[node_id] = controller_member.receive
            self.controller_members.append(controller_member)
            self.rpc.register(
                node_id,
                ControllerServer(controller_member, self.events).handle,
                gate=controller_member.hold,
            )
        self.servers: dict[int, list[ShardGroupServer]] = {}
        for gid in self.options.gids:
            self.add_group(gid, receivers)
        self.history = History()
        self.clients: dict[str, ShardClient] = {}
        self.script_client = self.new_client("script")
        self.admin = AdminClient(
            "admin",
            events=self.events,
            rpc=self.rpc,
            controller_servers=CONTROLLER_IDS,
            rng=derive_random(seed, "admin"),
            options=self.options.client,
        )
        self.shard_checker = ShardChecker(self)
        self.events.schedule(self.options.check_interval_ms, self.periodic_check)

    def add_group(self, gid: int, receivers: dict[str, Receiver]) -> None:
        ids = member_ids(gid)
        checker = InvariantChecker()
        self.raft_checkers[f"group {gid}"] = checker
        shard_count = self.options.shard_count
        servers: list[ShardGroupServer] = []
        for node_id in ids:
            member = RaftMember(
                node_id,
                seed=self.seed,
                raft_config=self.options.raft,
                bootstrap=Configuration(voters=tuple(ids)),
                options=self.options.member,
                machine_factory=lambda: ShardGroupMachine(gid, shard_count),
                events=self.events,
                network=self.network,
                checker=checker,
                trace=self.trace,
            )
            receivers[node_id] = member.receive
            server = ShardGroupServer(
                gid,
                member,
                rpc=self.rpc,
                events=self.events,
                controller_servers=CONTROLLER_IDS,
                options=self.options.server,
                rng=derive_random(self.seed, f"server:{node_id}"),
                trace=self.trace,
            )
            self.rpc.register(node_id, server.handle, gate=member.hold)
            servers.append(server)
        self.servers[gid] = servers

    def new_client(self, name: str) -> ShardClient:
        client = ShardClient(
            f"client-{name}",
            events=self.events,
            rpc=self.rpc,
            controller_servers=CONTROLLER_IDS,
            rng=derive_random(self.seed, f"client:{name}"),
            options=self.options.client,
            history=self.history,
            shard_count=self.options.shard_count,
        )
        self.clients[client.client_id] = client
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

    def group_members(self, gid: int) -> list[RaftMember[ShardGroupMachine]]:
        return [server.member for server in self.servers[gid]]

    def all_endpoints(self) -> list[str]:
        endpoints = list(CONTROLLER_IDS)
        for gid in self.options.gids:
            endpoints.extend(member_ids(gid))
        endpoints.extend(self.clients)
        endpoints.append(self.admin.client_id)
        return endpoints

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
        self.network.set_faults(faults)
        faults.validate()
        self.rpc.faults = faults

    def note(self, text: str) -> None:
        """Record `text` in the trace (if tracing) at the current virtual time."""
        if self.trace is not None:
            self.trace.record(self.events.now_ms, text)

    # --- views ----------------------------------------------------------------------------

    def leader_of(self, gid: int) -> RaftMember[ShardGroupMachine] | None:
        best: RaftMember[ShardGroupMachine] | None = None
        for member in self.group_members(gid):
            if member.is_leader and (best is None or member.core.term > best.core.term):
                best = member
        return best

    def latest_configuration(self) -> ShardConfiguration:
        """The newest configuration any live controller member applied."""
        live = [member.machine.latest for member in self.controller_members if member.up]
        return max(live, key=lambda configuration: configuration.number)

    def owner_of_key(self, key: str) -> int:
        return self.latest_configuration().shards[shard_for_key(key, self.options.shard_count)]

    def describe(self) -> str:
        lines = [member.describe() for member in self.controller_members]
        for gid, servers in self.servers.items():
            for server in servers:
                member = server.member
                line = member.describe()
                if member.up:
                    machine = member.machine
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
        for gid in gids if gids is not None else list(self.servers):
            for member in self.group_members(gid):
                if not member.up:
                    return False
                machine = member.machine
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

    def admin_command(self, make: Callable[[int], ControllerCommand], ms_max: int = 20_000) -> int:
        """Run one join/leave/move to its end; the configuration number it created."""
        outcome: list[ControllerResult] = []
        command = make(self.admin.take_sequence())
        self.note(f"admin {command!r}")
        self.admin.begin(command, outcome.append)
        if not self.run_until(lambda: bool(outcome), ms_max):
            raise OperationTimeoutError(f"{command!r} did not finish within {ms_max} ms")
        result = outcome[0]
        check_invariant(result.ok, f"controller refused {command!r}: {result.error}")
        return result.configuration_number or 0

    def join(self, *gids: int) -> int:
        return self.admin_command(
            lambda sequence: Join(sequence, {gid: member_ids(gid) for gid in gids})
        )

    def leave(self, *gids: int) -> int:
        return self.admin_command(lambda sequence: Leave(sequence, list(gids)))

    def move(self, shard: int, gid: int) -> int:
        return self.admin_command(lambda sequence: Move(sequence, shard, gid))

    def request(
        self,
        kind: str,
        key: str,
        argument: str | None = None,
        operation_timeout_ms: int = 20_000,
        client: ShardClient | None = None,
    ) -> tuple[str, object]:
        """Run one operation to its end: ("ok", output) or ("unknown", None)."""
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
                f"{kind} {key!r} did not complete at {self.now_ms} ms:\n{self.describe()}"
            )
        return output

    # --- end-of-run checks ----------------------------------------------------------------

    def check_linearizable(self, steps_max: int = 1_000_000) -> LinearizabilityResult:
        return check_linearizable(self.history.operations(), time_budget_steps=steps_max)

    def shard_states(self, gid: int) -> list[ShardState]:
        leader = self.leader_of(gid)
        members = [leader] if leader is not None else self.group_members(gid)
        return [shard.state for shard in members[0].machine.shards]
