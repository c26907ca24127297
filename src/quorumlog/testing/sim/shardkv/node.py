"""One simulated node of the sharded KV: a `SimProcess` running what a real node runs.

The node hosts a shipped `RaftHost` for each group it is a member of (the controller, shard
groups), each on its own `SimDisk`, and puts the services together with the shipped
`node.composition.compose_sharded_kv`: `ControllerService`, `ShardGroupService`s,
`ShardMigrator`s and `PreferredLeaders`. Requests reach it as wire frames through the
shipped `node.dispatch.RequestDispatcher`; its own requests to other groups go through
`SimPeerRequests`. Nothing here serves a request or moves a shard itself.

What the simulator adds, as the Raft simulator's `SimNode` does:

- virtual time (`SimScheduler`), fsyncs that take seeded virtual time (`SimBackground`),
  crashes that lose unsynced writes (`SimDisk`), pauses that hold every input and resume
  with links interleaved (`SimProcess`);
- apply lag: most seeds let a group apply behind its commit index (at most
  `apply_batch_entries_max` entries per step, steps a seeded delay apart, sometimes a long
  stall: `HostSettings.apply_entries_per_step_max` and `HostHooks.apply_delay_seconds`). A
  real node is like that, so a leader fresh from an election or a restart serves while its
  applied state is behind its log; code that reads the applied state on a leader must cope;
- the Raft invariant checks of `sim.invariants.InvariantChecker`, one checker per group,
  through the host's hooks and after every event that enters the process; a group that
  stops (fail-stop) is a finding at once;
- counters the seed tests read (chunks inserted, snapshots restored, leaderships that began
  behind, deletes ahead of apply).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import msgspec

from quorumlog.codec import wire
from quorumlog.node.composition import ShardedKVLayout, ShardedKVParts, compose_sharded_kv
from quorumlog.node.dispatch import RequestDispatcher
from quorumlog.node.shard_migration import MIGRATION_BYTES_PER_SECOND_DEFAULT, ByteRatePacer
from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import Configuration
from quorumlog.raft.core import RaftCore, Role
from quorumlog.raft.messages import Message, SnapshotMeta
from quorumlog.runtime.host import HostSettings, RaftHost
from quorumlog.runtime.resources import StateMachine
from quorumlog.shard.group_commands import (
    ControlApplied,
    DeleteRequest,
    InsertShards,
    decode_entry,
    decode_message,
)
from quorumlog.shard.group_machine import ShardGroupMachine
from quorumlog.testing.sim.checks import InvariantViolation
from quorumlog.testing.sim.disk import SimDisk
from quorumlog.testing.sim.events import EventQueue, derive_random, draw_int
from quorumlog.testing.sim.frame_network import Replier, SimFrameNetwork
from quorumlog.testing.sim.hooks import CheckerHooks
from quorumlog.testing.sim.invariants import InvariantChecker
from quorumlog.testing.sim.network import SimNetwork
from quorumlog.testing.sim.process import SimBackground, SimProcess, SimScheduler
from quorumlog.testing.sim.shardkv.transport import FrameCalls, SimPeerRequests, address_of
from quorumlog.testing.sim.trace import TraceRecorder

if TYPE_CHECKING:
    from quorumlog.testing.sim.node import SimNode


class MemberOptions(msgspec.Struct, frozen=True):
    """How a node's groups run on it (not the Raft settings: see RaftConfig)."""

    tick_ms: int = 50
    fsync_ms_min: int = 0
    fsync_ms_max: int = 3
    snapshot_interval_entries: int = 32
    """Small on purpose: snapshots and their restore must happen in every scenario."""
    snapshot_trailing_entries: int = 2
    torn_tail_probability: float = 0.5
    apply_batch_entries_max: int = 0
    """0: a group applies committed entries as soon as they are durable. Otherwise at most
    this many per step, each step `apply_delay_ms_min..max` after the last (see the module
    docstring)."""
    apply_delay_ms_min: int = 0
    apply_delay_ms_max: int = 0
    apply_stall_probability: float = 0.0
    """The chance that an apply step waits `apply_stall_ms_max` at most instead: a slow
    fsync, a large entry, a pause. It opens the long windows in which a leader serves on an
    old applied state (one elected during the stall, a restart replaying its log)."""
    apply_stall_ms_max: int = 0

    @property
    def apply_lags(self) -> bool:
        return self.apply_batch_entries_max > 0


class ServerOptions(msgspec.Struct, frozen=True):
    """How the node's sharded KV services run (`node.composition.ShardedKVLayout`)."""

    monitor_interval_ms: int = 100
    pull_bytes_max: int = 0
    """0: pull whole shards at once; otherwise chunked pulls of about this many bytes."""
    preferred_leader_ms: int = 1_000
    migration_bytes_per_second: int = MIGRATION_BYTES_PER_SECOND_DEFAULT


class SimStats:
    """What the seed tests want to know happened, over the whole deployment."""

    def __init__(self) -> None:
        self.inserts_applied: set[tuple[str, int]] = set()
        """(group, index) of every insert entry applied that was accepted."""
        self.snapshots_restored = 0
        """Shard group replicas that restored a snapshot (at a restart or an install)."""
        self.lagging_leaderships = 0
        """Shard group leaderships that began with applied behind commit (apply lag)."""
        self.deletes_ahead_of_apply = 0
        """Deletes that reached a shard group leader for a configuration it had not
        applied yet: the state the delete handler must answer "not yet" in."""


class ObservedMachine:
    """A group's state machine as its host sees it, counting what the tests ask about."""

    def __init__(self, member: GroupMember, machine: StateMachine) -> None:
        self.member = member
        self.machine = machine

    def apply(self, index: int, data: bytes) -> Any:
        result = self.machine.apply(index, data)
        if (
            isinstance(result, ControlApplied)
            and result.accepted
            and isinstance(decode_entry(data), InsertShards)
        ):
            self.member.stats.inserts_applied.add((self.member.group, index))
        return result

    def mark_applied(self, index: int) -> None:
        self.machine.mark_applied(index)

    def snapshot(self) -> bytes:
        return self.machine.snapshot()

    def restore(self, data: bytes) -> None:
        self.member.snapshots_restored += 1
        if self.member.is_shard_group:
            self.member.stats.snapshots_restored += 1
        self.machine.restore(data)


class CheckedHooks(CheckerHooks):
    """The checker's hooks, plus the member's snapshot count and the seeded apply lag."""

    def __init__(self, member: GroupMember) -> None:
        super().__init__(
            member.checker, member.as_checked_node(), member.disk, member.name, member.node.record
        )
        self.member = member

    def on_snapshot_taken(self, meta: SnapshotMeta, data: bytes) -> None:
        super().on_snapshot_taken(meta, data)
        self.member.snapshots_taken += 1

    def apply_delay_seconds(self) -> float:
        return self.member.node.apply_delay_ms() / 1000


class GroupMember:
    """One group's replica on a node, across the node's restarts: its disk, and the host
    and machine of the node's current incarnation. It is what the Raft checker, the shard
    checks, the scenarios and the nemesis look at (`node_id`, `core`, `disk`,
    `applied_index`, `machine`, ...)."""

    def __init__(
        self, node: ShardNode, group: str, checker: InvariantChecker, stats: SimStats
    ) -> None:
        self.node = node
        self.node_id = node.node_id
        self.group = group
        self.name = f"{node.node_id}/{group}"
        self.checker = checker
        self.stats = stats
        self.is_shard_group = group != wire.CONTROLLER_GROUP
        self.disk = SimDisk()
        self.host: RaftHost
        """Set by the node's composition (`ShardNode.add_group`) at every start, before
        anything reads it."""
        self.machine: Any = None
        """The group's state machine in the node's current incarnation (a
        `ControllerMachine` or a `ShardGroupMachine`)."""
        self.snapshots_taken = 0
        self.snapshots_restored = 0
        self.led_term = 0
        self.checked = self.as_checked_node()
        checker.register(self.checked)

    def as_checked_node(self) -> SimNode:
        """This member seen as the node type the Raft checker is annotated with: it reads
        only node_id, core, disk and applied_index, which this class has with the same
        meaning."""
        return cast("SimNode", self)

    # --- what the checks read -------------------------------------------------------------

    @property
    def core(self) -> RaftCore:
        return self.host.core

    @property
    def applied_index(self) -> int:
        return self.host.core.applied_index

    @property
    def up(self) -> bool:
        return self.node.process.up

    @property
    def paused(self) -> bool:
        return self.node.process.paused

    @property
    def incarnation(self) -> int:
        return self.node.process.incarnation

    @property
    def crash_count(self) -> int:
        return self.node.crash_count

    @property
    def is_leader(self) -> bool:
        return self.node.process.up and self.host.core.role is Role.LEADER

    # --- faults (the whole node: a group member is its node's process) ---------------------

    def crash(self) -> None:
        self.node.crash()

    def restart(self) -> None:
        self.node.restart()

    def pause(self) -> None:
        self.node.pause()

    def resume(self) -> None:
        self.node.resume()

    def after_event(self) -> None:
        self.checker.check_node(self.checked)
        core = self.host.core
        if core.role is Role.LEADER and core.term != self.led_term:
            self.led_term = core.term
            if self.is_shard_group and core.applied_index < core.commit_index:
                self.stats.lagging_leaderships += 1

    def describe(self) -> str:
        if not self.node.process.up:
            return f"{self.node_id}: down"
        core = self.host.core
        paused = f" paused({len(self.node.process.inbox)} held)" if self.paused else ""
        failed = f" FAILED({self.host.failure})" if self.host.failure else ""
        return (
            f"{self.node_id}: {core.role.value} term={core.term} commit={core.commit_index} "
            f"applied={core.applied_index} queued={len(self.host.unapplied)} "
            f"log=[{core.log.first_index}, {core.log.last_index}]{paused}{failed}"
        )


class ShardNode:
    def __init__(
        self,
        node_id: str,
        *,
        seed: int,
        layout: ShardedKVLayout,
        raft_config: RaftConfig,
        options: MemberOptions,
        server: ServerOptions,
        events: EventQueue,
        raft_networks: dict[str, SimNetwork],
        frames: SimFrameNetwork,
        checkers: dict[str, InvariantChecker],
        stats: SimStats,
        trace: TraceRecorder | None,
    ) -> None:
        self.node_id = node_id
        self.seed = seed
        self.layout = layout
        self.raft_config = msgspec.structs.replace(raft_config, node_id=node_id)
        self.options = options
        self.server = server
        self.events = events
        self.raft_networks = raft_networks
        self.frames = frames
        self.stats = stats
        self.trace = trace
        self.rng = derive_random(seed, f"node:{node_id}")
        self.apply_rng = derive_random(seed, f"apply:{node_id}")
        self.process = SimProcess(
            node_id, events, derive_random(seed, f"resume:{node_id}"), self.after_event
        )
        self.process.crash_handler = self.crash  # a disk that halts the process crashes it
        self.scheduler = SimScheduler(self.process)
        self.background = SimBackground(
            self.process,
            derive_random(seed, f"fsync:{node_id}"),
            options.fsync_ms_min,
            options.fsync_ms_max,
        )
        self.crash_count = 0
        self.members: dict[str, GroupMember] = {}
        for group in groups_of(node_id, layout):
            self.members[group] = GroupMember(self, group, checkers[group], stats)
            raft_networks[group].receivers[node_id] = self.receiver(group)
        self.parts = ShardedKVParts()
        self.dispatcher: RequestDispatcher | None = None
        frames.register(node_id, self.process, self.on_request)
        self.start()

    # --- life cycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Boot from what is on the disks (the first time: empty ones) and compose the
        node's groups and services as a real node does."""
        self.process.boot()
        calls = FrameCalls(self.node_id, self.frames, self.process)
        dispatcher = RequestDispatcher(self.node_id, self.host_of, address_or_none, dict)
        parts = compose_sharded_kv(
            self.node_id,
            self.layout,
            self.add_group,
            peers=SimPeerRequests(calls),
            pacer=ByteRatePacer(self.server.migration_bytes_per_second),
            controller_addresses=lambda: [address_of(node) for node in self.layout.controller],
            leader_address=lambda host: lambda: address_or_none(host.leader_id),
        )
        dispatcher.controller = parts.controller
        dispatcher.shard_services = parts.shard_services
        self.dispatcher = dispatcher
        self.parts = parts
        for member in self.members.values():
            member.checker.on_start(member.as_checked_node())
        phases_ms = {group: self.rng.randrange(self.options.tick_ms) for group in self.members}
        self.process.enter("local", lambda _: self.start_groups(phases_ms))

    def add_group(self, group: str, machine: StateMachine, voters: tuple[str, ...]) -> RaftHost:
        member = self.members[group]
        options = self.options
        member.machine = machine
        host = RaftHost(
            group,
            self.raft_config,
            store=member.disk.store,
            hard_state=member.disk.hard_state,
            snapshots=member.disk.snapshots,
            machine=ObservedMachine(member, machine),
            send=self.raft_networks[group].send,
            bootstrap=Configuration(voters=voters),
            scheduler=self.scheduler,
            background=self.background,
            random_source=derive_random(
                self.seed, f"core:{group}:{self.node_id}:{self.process.incarnation}"
            ),
            settings=HostSettings(
                tick_seconds=options.tick_ms / 1000,
                snapshot_entries=options.snapshot_interval_entries,
                snapshot_trailing_entries=options.snapshot_trailing_entries,
                apply_entries_per_step_max=options.apply_batch_entries_max,
            ),
            hooks=CheckedHooks(member),
        )
        host.on_failed = self.group_failed
        member.host = host
        return host

    def start_groups(self, phases_ms: dict[str, int]) -> None:
        for group, member in self.members.items():
            member.host.start(phases_ms[group] / 1000)
        self.parts.start()

    def crash(self) -> None:
        """Stop at once: unsynced writes are lost, pending requests never get an answer."""
        if not self.process.up:
            return
        self.process.kill()
        self.crash_count += 1
        reports = []
        for member in self.members.values():
            reports.append(member.disk.crash(self.rng, self.options.torn_tail_probability))
            member.checker.on_crash(member.as_checked_node())
        self.record(f"{self.node_id} crash {reports!r}")

    def restart(self) -> None:
        if self.process.up:
            return
        self.record(f"{self.node_id} restart")
        self.start()

    def pause(self) -> None:
        """Like SIGSTOP: no ticks, no processing; arriving work queues up."""
        self.record(f"{self.node_id} pause")
        self.process.pause()

    def resume(self) -> None:
        self.record(f"{self.node_id} resume ({len(self.process.inbox)} queued)")
        self.process.resume()

    def group_failed(self, group: str, error: BaseException) -> None:
        """A group that stops in the simulator is a finding (a violated invariant, an
        unexpected error): say so at once, with the seed, instead of running on."""
        raise InvariantViolation(f"{self.node_id}: group {group} failed: {error!r}") from error

    def after_event(self) -> None:
        for member in self.members.values():
            member.after_event()

    def apply_delay_ms(self) -> int:
        """The seeded wait before the next apply step (apply lag only)."""
        options = self.options
        rng = self.apply_rng
        if options.apply_stall_probability and rng.random() < options.apply_stall_probability:
            return draw_int(rng, options.apply_delay_ms_max, options.apply_stall_ms_max)
        return draw_int(rng, options.apply_delay_ms_min, options.apply_delay_ms_max)

    def record(self, text: str) -> None:
        if self.trace is not None:
            self.trace.record(self.events.now_ms, text)

    # --- inputs ---------------------------------------------------------------------------

    def receiver(self, group: str) -> Callable[[Message], None]:
        """What takes group `group`'s Raft messages for this node: they enter the process
        on the link of their sender (one connection per pair of nodes)."""
        member = self.members[group]
        enter = self.process.enter

        def deliver(message: Message) -> None:
            if self.trace is not None:
                self.record(f"{member.name} <- {message!r}")
            member.host.step(message)

        def receive(message: Message) -> None:
            enter(message.source, deliver, message)

        return receive

    def on_request(self, request: wire.ClientRequest, reply: Replier) -> None:
        """A frame for this node's client port (inside its process)."""
        dispatcher = self.dispatcher
        if dispatcher is None:
            return
        if isinstance(request, wire.ShardGroupRequest):
            self.note_delete(request)
        dispatcher.on_client_request(request, reply)

    def note_delete(self, request: wire.ShardGroupRequest) -> None:
        """Count a delete that reaches a leader ahead of its applied configuration."""
        member = self.members.get(wire.shard_group_name(request.gid))
        if member is None or not member.host.is_leader:
            return
        try:
            message = decode_message(request.message)
        except wire.DECODE_ERRORS:
            return
        machine = member.machine
        if (
            isinstance(message, DeleteRequest)
            and isinstance(machine, ShardGroupMachine)
            and message.configuration_number > machine.current_configuration.number
        ):
            self.stats.deletes_ahead_of_apply += 1

    def host_of(self, group: str) -> RaftHost | None:
        member = self.members.get(group)
        return member.host if member is not None else None


def address_or_none(node_id: str | None) -> str | None:
    return address_of(node_id) if node_id is not None else None


def groups_of(node_id: str, layout: ShardedKVLayout) -> list[str]:
    """The groups `node_id` hosts, in the order `compose_sharded_kv` adds them."""
    groups = [wire.CONTROLLER_GROUP] if node_id in layout.controller else []
    groups += [
        wire.shard_group_name(gid)
        for gid, members in sorted(layout.shard_groups.items())
        if node_id in members
    ]
    return groups


__all__ = [
    "GroupMember",
    "MemberOptions",
    "ServerOptions",
    "ShardNode",
    "SimStats",
    "groups_of",
]
