"""A scripted cluster for Raft scenario tests (etcd's `network` in raft_test.go, in spirit).

Messages wait in a queue until the test delivers them; links can be cut; time moves only
when the test ticks; a restart keeps what was synced and loses the rest.

Each node is the shipped Ready loop, `RaftHost` (runtime/host.py), given a `ManualScheduler`
of its own (its clock moves only when the test ticks that node), an `InlineBackground` whose
fsyncs run when the node's scheduler drains, and a `SimDisk`. The host's send function puts
messages on the cluster's queue. So what these scenarios test is the host that ships: its
persist -> send -> apply order, its group commit, its fail-stop.

The core may still be driven directly (`cluster.core(n).propose(...)`, as a service would
through the host); the next `stabilize` wakes every host whose core has something ready.
A group that fails is a finding: the harness raises `GroupFailedError` once for it.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable

import msgspec

from quorumlog.errors import GroupFailedError
from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import Configuration
from quorumlog.raft.core import RaftCore, Role
from quorumlog.raft.messages import Message, SnapshotMeta
from quorumlog.raft.ready import HardState, Ready
from quorumlog.runtime.host import HostHooks, HostSettings, RaftHost
from quorumlog.runtime.stable import SnapshotFile as SavedSnapshot
from quorumlog.storage import LogEntry
from quorumlog.storage.segment import SegmentLogStore
from quorumlog.testing.manual import InlineBackground, ManualScheduler
from quorumlog.testing.sim.disk import SimDisk

GROUP = "raft"
TICK_SECONDS = 1.0
"""One tick of a node's clock (a whole second: exact in floating point)."""
HARNESS_HOST_SETTINGS = HostSettings(
    tick_seconds=TICK_SECONDS,
    snapshot_entries=2**62,  # snapshots only when a test takes one (`Cluster.snapshot`)
    snapshot_trailing_entries=0,  # and then the log is compacted right up to it
)


class RecordingMachine:
    """The state machine of a harness node: the data of every entry applied, in order;
    its snapshot is that list."""

    def __init__(self) -> None:
        self.data: list[bytes] = []

    def apply(self, index: int, data: bytes) -> int:
        self.data.append(data)
        return index

    def mark_applied(self, index: int) -> None:
        pass

    def snapshot(self) -> bytes:
        return msgspec.msgpack.encode(self.data)

    def restore(self, data: bytes) -> None:
        self.data = msgspec.msgpack.decode(data, type=list[bytes])


class RecordingHooks(HostHooks):
    """What the host did, for the scenarios' assertions."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def on_ready(self, ready: Ready) -> None:
        node = self.node
        node.read_results.extend((state.request_id, state.index) for state in ready.read_states)
        node.failed_reads.extend(ready.failed_reads)

    def on_snapshot_install(self, meta: SnapshotMeta, data: bytes) -> None:
        # Entries in the snapshot were applied elsewhere; this node knows only the state.
        self.node.applied = []

    def on_apply(self, entry: LogEntry) -> None:
        self.node.applied.append(entry)


class Node:
    def __init__(
        self,
        node_id: str,
        voters: list[str],
        seed: int,
        send: Callable[[Message], None],
        host_settings: HostSettings,
        **settings: object,
    ) -> None:
        self.node_id = node_id
        self.disk = SimDisk()
        self.config = RaftConfig(node_id=node_id, **settings)  # type: ignore[arg-type]
        self.bootstrap = Configuration(voters=tuple(sorted(voters)))
        self.seed = seed
        self.send = send
        self.host_settings = host_settings
        self.applied: list[LogEntry] = []
        """Entries this node applied (an installed snapshot clears them: their effect came
        in the snapshot; a restart keeps those its own snapshot covers)."""
        self.read_results: list[tuple[int, int]] = []
        self.failed_reads: list[int] = []
        self.failure: BaseException | None = None
        self.failure_reported = False
        self.scheduler = ManualScheduler()
        self.machine = RecordingMachine()
        self.background = InlineBackground(self.scheduler)
        self.host = self.start()

    def start(self) -> RaftHost:
        """A new incarnation on what the disk holds, with a clock that goes on from the
        last one; what the old scheduler still had queued (an unsynced write) is dropped."""
        self.scheduler = ManualScheduler(self.scheduler.now_seconds)
        self.machine = RecordingMachine()
        self.background = InlineBackground(self.scheduler)
        host = RaftHost(
            GROUP,
            self.config,
            store=self.disk.store,
            hard_state=self.disk.hard_state,
            snapshots=self.disk.snapshots,
            machine=self.machine,
            send=self.send,
            bootstrap=self.bootstrap,
            scheduler=self.scheduler,
            background=self.background,
            random_source=random.Random(self.seed),
            settings=self.host_settings,
            hooks=RecordingHooks(self),
        )
        host.on_failed = self.group_failed
        host.start()
        return host

    def group_failed(self, group_id: str, error: BaseException) -> None:
        self.failure = error

    def restart(self) -> None:
        """A crash, then a start: what was synced survives, nothing else does."""
        self.disk.crash(random.Random(self.seed), torn_tail_probability=0.0)
        snapshot = self.disk.snapshot
        snapshot_index = snapshot.meta.index if snapshot else 0
        # The machine restarts from the snapshot; the core applies the rest again.
        self.applied = [entry for entry in self.applied if entry.index <= snapshot_index]
        self.failure = None
        self.failure_reported = False
        self.host = self.start()

    def run(self) -> bool:
        """Run this node until it waits for something (a message, a tick). Whether it ran."""
        if self.core.has_ready():
            self.host.schedule()  # the test drove the core directly
        return self.scheduler.run_until_idle() > 0

    def tick(self) -> None:
        """Let one tick pass on this node's clock: the host's tick timer fires."""
        self.scheduler.advance(self.host_settings.tick_seconds)

    def raise_failure(self) -> None:
        if self.failure is not None and not self.failure_reported:
            self.failure_reported = True
            raise GroupFailedError(GROUP, str(self.host.failure)) from self.failure

    @property
    def core(self) -> RaftCore:
        return self.host.core

    @property
    def store(self) -> SegmentLogStore:
        return self.disk.store

    @property
    def hard_state(self) -> HardState:
        """The hard state a restart reads (saved with term and vote changes)."""
        return self.disk.hard_state.saved

    @property
    def snapshot(self) -> SavedSnapshot | None:
        return self.disk.snapshot

    def data_applied(self) -> list[bytes]:
        return list(self.machine.data)


class Cluster:
    def __init__(
        self,
        size: int = 3,
        seed: int = 1,
        host_settings: HostSettings = HARNESS_HOST_SETTINGS,
        **settings: object,
    ) -> None:
        ids = [f"n{i}" for i in range(1, size + 1)]
        self.host_settings = host_settings
        self.queue: list[Message] = []
        self.cut: set[tuple[str, str]] = set()
        self.down: set[str] = set()
        self.drop_filter: Callable[[Message], bool] | None = None
        self.sent_count: dict[str, int] = {}
        """Messages each node's host has sent (delivered or not)."""
        self.nodes: dict[str, Node] = {}
        for position, node_id in enumerate(ids):
            self.nodes[node_id] = self.new_node(node_id, ids, seed * 100 + position, settings)
            self.process(node_id)

    def new_node(
        self, node_id: str, voters: list[str], seed: int, settings: dict[str, object]
    ) -> Node:
        return Node(node_id, voters, seed, self.send, self.host_settings, **settings)

    def add_node(self, node_id: str, seed: int = 99, **settings: object) -> Node:
        """A node that is in no configuration yet (a learner to be)."""
        node = self.new_node(node_id, [], seed, settings)
        self.nodes[node_id] = node
        self.process(node_id)
        return node

    # --- views --------------------------------------------------------------------------

    def core(self, node_id: str) -> RaftCore:
        return self.nodes[node_id].core

    def host(self, node_id: str) -> RaftHost:
        return self.nodes[node_id].host

    @property
    def read_results(self) -> dict[str, list[tuple[int, int]]]:
        return {node_id: node.read_results for node_id, node in self.nodes.items()}

    @property
    def failed_reads(self) -> dict[str, list[int]]:
        return {node_id: node.failed_reads for node_id, node in self.nodes.items()}

    def leaders(self) -> list[str]:
        return sorted(i for i, n in self.nodes.items() if n.core.role is Role.LEADER)

    # --- the network --------------------------------------------------------------------

    def isolate(self, node_id: str) -> None:
        for other in self.nodes:
            if other != node_id:
                self.cut.add((node_id, other))
                self.cut.add((other, node_id))

    def heal(self) -> None:
        self.cut.clear()

    def send(self, message: Message) -> None:
        """Every host's send function: the message waits until the test delivers it."""
        self.sent_count[message.source] = self.sent_count.get(message.source, 0) + 1
        self.queue.append(message)

    def deliver_one(self) -> bool:
        if not self.queue:
            return False
        message = self.queue.pop(0)
        if (
            (message.source, message.target) in self.cut
            or message.target in self.down
            or message.source in self.down
            or (self.drop_filter is not None and self.drop_filter(message))
        ):
            return True
        target = self.nodes[message.target]
        # A failure is raised below, once, as for one inside the host's own loop.
        with contextlib.suppress(GroupFailedError):
            target.host.step(message)
        target.raise_failure()
        return True

    # --- running ------------------------------------------------------------------------

    def process(self, node_id: str) -> bool:
        """Run `node_id` until it waits (its messages join the queue). Whether it ran."""
        node = self.nodes[node_id]
        if node_id in self.down:
            return False
        moved = node.run()
        node.raise_failure()
        return moved

    def stabilize(self, rounds_max: int = 10_000) -> None:
        """Run every node and deliver every message until nothing moves."""
        for _ in range(rounds_max):
            moved = False
            for node_id in sorted(self.nodes):
                moved |= self.process(node_id)
            while self.deliver_one():
                moved = True
            if not moved:
                return
        raise AssertionError("cluster did not stabilize")

    def tick(self, count: int = 1, nodes: list[str] | None = None) -> None:
        for _ in range(count):
            for node_id in sorted(nodes or self.nodes):
                if node_id not in self.down:
                    self.nodes[node_id].tick()
                    self.nodes[node_id].raise_failure()
            self.stabilize()

    # --- driving the group --------------------------------------------------------------

    def expire_leases(self) -> None:
        """As if an election timeout passed with no word from a leader (check-quorum leases
        would otherwise, rightly, make followers ignore a scripted candidate)."""
        for node in self.nodes.values():
            if node.core.leader is None:
                node.core.election_elapsed = node.core.config.election_ticks

    def elect(self, node_id: str) -> None:
        self.expire_leases()
        self.host(node_id).campaign()
        self.stabilize()
        if self.core(node_id).role is not Role.LEADER:
            raise AssertionError(f"{node_id} did not win: {self.core(node_id).status()}")

    def propose(self, node_id: str, data: bytes) -> int:
        """Propose through the host; the entry's index."""
        self.host(node_id).propose(data)
        index = self.core(node_id).log.last_index
        self.stabilize()
        return index

    def snapshot(self, node_id: str) -> SnapshotMeta:
        """Snapshot `node_id`'s state machine at its applied index and compact its log."""
        host = self.host(node_id)
        host.take_snapshot()
        self.stabilize()
        snapshot = self.nodes[node_id].snapshot
        if snapshot is None or snapshot.meta.index != host.applied_index:
            raise AssertionError(f"{node_id} did not snapshot at {host.applied_index}")
        return snapshot.meta
