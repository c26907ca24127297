"""One simulated node of the Raft simulator: a `SimProcess` running the shipped `RaftHost`.

The host is the production Ready loop (runtime/host.py); here it gets virtual time
(`SimScheduler`), fsyncs that take seeded virtual time (`SimBackground`), and a `SimDisk`
whose unsynced writes a crash loses. The invariant checker watches through the host's hooks
and after every event that enters the process.

On the host runs the application's state machine (by default the shipped KV machine) and,
if it has one, its service (the shipped `KVService`). Clients reach the service as wire
frames over the `SimFrameNetwork`: the node listens there under its node id and says it
listens at `client_address(node_id)`, which is what NOT_LEADER hints name. A crash loses
every request in flight: its client times out, as a real one does.

With quiet groups on (`RaftConfig.quiesce_idle_ticks`), the node runs as a real one does:
its group ticks from a node `GroupTicker` that skips it while quiet, and a `PeerLiveness`
pings the other nodes over the simulated network and wakes the quiet group when a peer's
node falls silent (both shipped, runtime/ticker.py and runtime/liveness.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from quorumlog.codec import wire
from quorumlog.errors import (
    ConfigurationChangeInProgressError,
    InvalidConfigurationChangeError,
    LeaderTransferringError,
    NotLeaderError,
    StorageError,
)
from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import Configuration, MembershipChange
from quorumlog.raft.core import RaftCore, Role
from quorumlog.raft.messages import Message
from quorumlog.raft.ready import Ready
from quorumlog.runtime.host import HostSettings, RaftHost
from quorumlog.runtime.liveness import PeerLiveness
from quorumlog.runtime.resources import StateMachine
from quorumlog.runtime.ticker import GroupTicker
from quorumlog.storage.entry import LogEntry
from quorumlog.testing.sim.application import SimApplication
from quorumlog.testing.sim.checks import InvariantViolation, require
from quorumlog.testing.sim.disk import SimDisk
from quorumlog.testing.sim.events import EventQueue, derive_random
from quorumlog.testing.sim.frame_network import Replier, RequestHandler, SimFrameNetwork
from quorumlog.testing.sim.hooks import CheckerHooks
from quorumlog.testing.sim.network import SimNetwork
from quorumlog.testing.sim.process import SimBackground, SimProcess, SimScheduler
from quorumlog.testing.sim.trace import TraceRecorder

if TYPE_CHECKING:
    from quorumlog.testing.sim.invariants import InvariantChecker

GROUP = "kv"
CLIENT_PORT = 2379
"""The port every simulated node "listens" on for clients: clients name nodes by
"host:port" (`kv.connection.EndpointSelector`), and the host is the node id."""


def client_address(node_id: str) -> str:
    return f"{node_id}:{CLIENT_PORT}"


class NodeOptions(msgspec.Struct, frozen=True):
    """How one simulated node's runtime behaves (not the Raft settings: see RaftConfig)."""

    tick_ms: int = 50
    fsync_ms_min: int = 0
    fsync_ms_max: int = 3
    snapshot_interval_entries: int = 64
    """Snapshot the state machine every this many applied entries."""
    snapshot_trailing_entries: int = 4
    """Entries kept in the log below a snapshot, so a slightly lagging follower can still
    be caught up from the log instead of by INSTALL_SNAPSHOT."""
    torn_tail_probability: float = 0.5
    """At a crash, the chance that some unsynced entries survive (a torn tail)."""
    read_bit_flip_probability: float = 0.0
    """The chance that a read from the disk returns one bit flipped. The stores must detect
    it (checksums): the group then stops (fail-stop) and the node is restarted."""


class CheckedHooks(CheckerHooks):
    """The checker's hooks, plus the trace of Readies and the cluster's apply observer."""

    def __init__(self, node: SimNode) -> None:
        super().__init__(node.checker, node, node.disk, node.node_id, node.record)
        self.node = node

    def on_ready(self, ready: Ready) -> None:
        trace = self.node.trace
        if trace is not None:
            trace.record(self.node.events.now_ms, f"{self.node.node_id} ready {describe(ready)}")

    def on_sent_at_once(self, message: Message) -> None:
        trace = self.node.trace
        if trace is not None:
            trace.record(self.node.events.now_ms, f"{self.node.node_id} at once send {message!r}")

    def on_apply(self, entry: LogEntry) -> None:
        super().on_apply(entry)
        observer = self.node.apply_observer
        if observer is not None:
            observer(entry)


class SimNode:
    def __init__(
        self,
        node_id: str,
        *,
        seed: int,
        raft_config: RaftConfig,
        bootstrap: Configuration,
        options: NodeOptions,
        events: EventQueue,
        network: SimNetwork,
        frames: SimFrameNetwork,
        application: SimApplication[Any],
        checker: InvariantChecker,
        trace: TraceRecorder | None,
    ) -> None:
        self.node_id = node_id
        self.seed = seed
        self.raft_config = raft_config
        self.bootstrap = bootstrap
        self.options = options
        self.events = events
        self.network = network
        self.application = application
        self.apply_observer: Callable[[LogEntry], None] | None = None
        """Told of every entry this node applies (the cluster records client commands)."""
        self.checker = checker
        self.trace = trace
        self.rng = derive_random(seed, f"node:{node_id}")
        self.process = SimProcess(
            node_id, events, derive_random(seed, f"resume:{node_id}"), self.after_event
        )
        self.scheduler = SimScheduler(self.process)
        self.background = SimBackground(
            self.process,
            derive_random(seed, f"fsync:{node_id}"),
            options.fsync_ms_min,
            options.fsync_ms_max,
        )
        self.disk = SimDisk(
            derive_random(seed, f"disk:{node_id}"),
            read_bit_flip_probability=options.read_bit_flip_probability,
        )
        self.process.crash_handler = self.crash
        self.storage_failures = 0
        self.crash_count = 0
        self.machine: StateMachine
        self.host: RaftHost
        self.ticker: GroupTicker | None = None
        self.liveness: PeerLiveness | None = None
        network.ping_receivers[node_id] = self.receive_ping
        self.handle_request: RequestHandler | None = None
        """The service's handler of client frames in this incarnation (None: no service)."""
        frames.register(node_id, self.process, self.on_request)
        self.start()

    # --- life cycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Boot from what is on disk (the first time: an empty disk). A storage error while
        opening (a flipped bit the stores caught) stops the boot, as it stops a real node:
        the node stays down until the next restart."""
        self.process.boot()
        try:
            self.open_host()
        except StorageError as error:
            self.storage_failures += 1
            self.record(f"{self.node_id} could not start: {error!r}")
            self.process.kill()
            return
        with self.disk.reading_truthfully():
            self.checker.on_start(self)
        phase_ms = self.rng.randrange(self.options.tick_ms)
        ticker = self.ticker
        if ticker is None:
            self.process.enter("local", lambda _: self.host.start(phase_ms / 1000))
            return

        def start_ticking(_: Any) -> None:
            self.host.start()
            ticker.start(phase_ms / 1000)

        self.process.enter("local", start_ticking)

    def open_host(self) -> None:
        self.machine = self.application.machine_factory()
        options = self.options
        self.ticker = None
        self.liveness = None
        if self.raft_config.quiesce_idle_ticks:
            self.ticker = GroupTicker(self.scheduler, options.tick_ms / 1000)
            self.liveness = PeerLiveness(
                self.node_id,
                ping=lambda peer: self.network.send_ping(self.node_id, peer),
                unreachable=self.peer_unreachable,
                silent_ticks_max=self.raft_config.election_ticks,
                reachable=self.peer_reachable,
            )
            self.liveness.set_peers(self.bootstrap.members())
            self.ticker.every_tick.append(self.liveness.tick)
        self.host = RaftHost(
            GROUP,
            self.raft_config,
            store=self.disk.store,
            hard_state=self.disk.hard_state,
            snapshots=self.disk.snapshots,
            machine=self.machine,
            send=self.network.send,
            bootstrap=self.bootstrap,
            scheduler=self.scheduler,
            background=self.background,
            random_source=derive_random(
                self.seed, f"core:{self.node_id}:{self.process.incarnation}"
            ),
            settings=HostSettings(
                tick_seconds=options.tick_ms / 1000,
                snapshot_entries=options.snapshot_interval_entries,
                snapshot_trailing_entries=options.snapshot_trailing_entries,
            ),
            hooks=CheckedHooks(self),
            ticker=self.ticker,
        )
        self.host.on_failed = self.group_failed
        if self.liveness is not None:
            # As the node does (node/server.py `register_group`): the elections a follower
            # holds while its leader's node is live (RaftConfig.leader_node_hold_ticks).
            self.host.use_node_liveness(self.liveness.is_reachable)
        service_factory = self.application.service_factory
        self.handle_request = (
            None
            if service_factory is None
            else service_factory(self.host, self.machine, self.leader_address)
        )

    def crash(self) -> None:
        """Stop at once: unsynced writes are lost, pending requests never get an answer."""
        if not self.process.up:
            return
        self.process.kill()
        self.crash_count += 1
        report = self.disk.crash(self.rng, self.options.torn_tail_probability)
        self.checker.on_crash(self)
        self.record(f"{self.node_id} crash {report!r}")

    def restart(self) -> None:
        if self.process.up:
            return
        self.record(f"{self.node_id} restart")
        self.start()

    def pause(self) -> None:
        """Like SIGSTOP: no ticks, no processing; arriving work queues up."""
        self.process.pause()

    def resume(self) -> None:
        self.process.resume()

    def group_failed(self, group_id: str, error: BaseException) -> None:
        """A group that stops on a storage error (a flipped bit its checksums caught) did
        what it must: the node goes down, to be restarted like a crashed one. Any other
        stop in the simulator is a finding (a violated invariant, an unexpected error): say
        so at once, with the seed, instead of running on."""
        if isinstance(error, StorageError):
            self.storage_failures += 1
            self.record(f"{self.node_id} group {group_id} stopped on {error!r}")
            self.crash()
            return
        raise InvariantViolation(f"{self.node_id}: group {group_id} failed: {error!r}") from error

    def after_event(self) -> None:
        if not self.disk.file_system.read_bit_flip_probability:
            self.checker.check_node(self)  # the common case, after every event: no `with`
            return
        with self.disk.reading_truthfully():
            self.checker.check_node(self)

    def record(self, text: str) -> None:
        if self.trace is not None:
            self.trace.record(self.events.now_ms, text)

    # --- events -------------------------------------------------------------------------

    def receive(self, message: Message) -> None:
        self.process.enter(message.source, self.deliver, message)

    def deliver(self, message: Message) -> None:
        if self.trace is not None:
            self.record(f"{self.node_id} <- {message!r}")
        if self.liveness is not None:
            self.liveness.heard(message.source)
        self.host.step(message)

    def peer_unreachable(self, peer: str) -> None:
        self.record(f"{self.node_id} liveness: {peer} unreachable")
        self.host.peer_unreachable(peer)

    def peer_reachable(self, peer: str) -> None:
        self.record(f"{self.node_id} liveness: {peer} reachable again")
        self.host.peer_reachable(peer)

    def receive_ping(self, source: str) -> None:
        self.process.enter(source, self.hear_ping, source)

    def hear_ping(self, source: str) -> None:
        if self.liveness is not None:
            self.liveness.heard(source)

    def on_request(self, request: wire.ClientRequest, reply: Replier) -> None:
        """A client frame, inside this process (the frame network entered it)."""
        handle = self.handle_request
        if handle is not None:
            handle(request, reply)
            return
        reply(
            wire.ErrorResponse(
                request_id=request.request_id,
                code=wire.ErrorCode.UNKNOWN_GROUP,
                message=f"{self.node_id} runs no service for clients",
            )
        )

    def leader_address(self) -> str | None:
        leader_id = self.host.leader_id
        return client_address(leader_id) if leader_id is not None else None

    def propose(self, data: bytes) -> tuple[int, int]:
        """Propose one entry here for a scenario test: its (index, term). Raises the
        group's typed refusal (NotLeaderError with the leader's id as hint, ...)."""
        require(self.process.running, f"{self.node_id} is down or paused: it takes nothing")
        self.host.propose(data)
        self.after_event()
        return self.host.core.log.last_index, self.host.core.term

    def change_membership(self, change: MembershipChange) -> int | None:
        """Propose a membership change here; None if this node cannot take it now."""
        if not self.process.running:
            return None
        try:
            self.host.change_membership(change)
        except (
            NotLeaderError,
            LeaderTransferringError,
            ConfigurationChangeInProgressError,
            InvalidConfigurationChangeError,
        ):
            return None
        self.after_event()
        return self.host.core.log.last_index

    def transfer_leadership(self, target: str) -> bool:
        if not self.process.running:
            return False
        try:
            self.host.transfer_leadership(target)
        except (NotLeaderError, InvalidConfigurationChangeError):
            return False
        self.after_event()
        return True

    def campaign(self) -> None:
        if self.process.running:
            self.host.campaign()
            self.after_event()

    # --- views --------------------------------------------------------------------------

    @property
    def core(self) -> RaftCore:
        return self.host.core

    @property
    def up(self) -> bool:
        return self.process.up

    @property
    def paused(self) -> bool:
        return self.process.paused

    @property
    def incarnation(self) -> int:
        return self.process.incarnation

    @property
    def applied_index(self) -> int:
        return self.host.core.applied_index

    @property
    def is_leader(self) -> bool:
        return self.process.up and self.host.core.role is Role.LEADER

    @property
    def available(self) -> bool:
        return self.process.running

    def describe(self) -> str:
        if not self.process.up:
            return f"{self.node_id}: down"
        core = self.host.core
        paused = " paused" if self.process.paused else ""
        paused += " quiet" if core.quiet else ""
        failed = f" FAILED({self.host.failure})" if self.host.failure else ""
        return (
            f"{self.node_id}: {core.role.value} term={core.term} leader={core.leader_id} "
            f"commit={core.commit_index} applied={core.applied_index} "
            f"log=[{core.log.first_index}, {core.log.last_index}] "
            f"voters={','.join(core.configuration.voters)}{paused}{failed}"
        )


def describe(ready: Ready) -> str:
    parts: list[str] = []
    if ready.hard_state is not None:
        parts.append(f"hs={ready.hard_state!r}")
    if ready.snapshot is not None:
        parts.append(f"snapshot={ready.snapshot.meta.index}@{ready.snapshot.meta.term}")
    if ready.truncate_after is not None:
        parts.append(f"truncate_after={ready.truncate_after}")
    if ready.entries:
        parts.append(f"entries={[(e.index, e.term) for e in ready.entries]}")
    if ready.committed_entries:
        first, last = ready.committed_entries[0], ready.committed_entries[-1]
        parts.append(f"apply=[{first.index}, {last.index}]")
    for message in ready.messages:
        parts.append(f"send {message!r}")
    for message in ready.messages_after_persist:
        parts.append(f"send_after_persist {message!r}")
    if ready.read_states:
        parts.append(f"reads={ready.read_states!r}")
    if ready.failed_reads:
        parts.append(f"failed_reads={ready.failed_reads!r}")
    return " ".join(parts) if parts else "(empty)"
