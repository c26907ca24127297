"""A scripted cluster for Raft scenario tests (etcd's `network` in raft_test.go, in spirit).

Messages wait in a queue until the test delivers them; links can be cut; time moves only
when the test ticks. Each node runs the Ready contract exactly as a runtime must.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import Configuration
from quorumlog.raft.core import RaftCore, Role
from quorumlog.raft.messages import Message, SnapshotMeta
from quorumlog.raft.ready import HardState
from quorumlog.storage import EntryType, LogEntry, MemoryLogStore


class Node:
    def __init__(self, node_id: str, voters: list[str], seed: int, **settings: object) -> None:
        self.node_id = node_id
        self.store = MemoryLogStore()
        self.hard_state = HardState()
        self.snapshot: tuple[SnapshotMeta, bytes] | None = None
        self.applied: list[LogEntry] = []
        self.config = RaftConfig(node_id=node_id, **settings)  # type: ignore[arg-type]
        self.bootstrap = Configuration(voters=tuple(sorted(voters)))
        self.seed = seed
        self.core = self.build()

    def build(self) -> RaftCore:
        return RaftCore(
            self.config,
            self.store,
            hard_state=self.hard_state,
            configuration=self.bootstrap,
            snapshot=self.snapshot[0] if self.snapshot else None,
            snapshot_data=self.snapshot[1] if self.snapshot else None,
            random=random.Random(self.seed),
        )

    def restart(self) -> None:
        """A crash that loses nothing synced (every Ready here is synced whole)."""
        self.applied = self.applied[: self.snapshot[0].index if self.snapshot else 0]
        self.core = self.build()

    def data_applied(self) -> list[bytes]:
        return [e.data for e in self.applied if e.type is EntryType.DATA]


class Cluster:
    def __init__(self, size: int = 3, seed: int = 1, **settings: object) -> None:
        ids = [f"n{i}" for i in range(1, size + 1)]
        self.nodes = {i: Node(i, ids, seed * 100 + n, **settings) for n, i in enumerate(ids)}
        self.queue: list[Message] = []
        self.cut: set[tuple[str, str]] = set()
        self.down: set[str] = set()
        self.drop_filter: Callable[[Message], bool] | None = None
        self.read_results: dict[str, list[tuple[int, int]]] = {i: [] for i in ids}
        self.failed_reads: dict[str, list[int]] = {i: [] for i in ids}

    def add_node(self, node_id: str, seed: int = 99, **settings: object) -> Node:
        node = Node(node_id, [], seed, **settings)
        node.bootstrap = Configuration(voters=())
        node.core = node.build()
        self.nodes[node_id] = node
        self.read_results[node_id] = []
        self.failed_reads[node_id] = []
        return node

    def core(self, node_id: str) -> RaftCore:
        return self.nodes[node_id].core

    def isolate(self, node_id: str) -> None:
        for other in self.nodes:
            if other != node_id:
                self.cut.add((node_id, other))
                self.cut.add((other, node_id))

    def heal(self) -> None:
        self.cut.clear()

    def process(self, node_id: str) -> bool:
        """Run one Ready of `node_id` by the contract in ready.py. Returns whether it had one."""
        node = self.nodes[node_id]
        core = node.core
        if node_id in self.down or not core.has_ready():
            return False
        ready = core.ready()
        self.queue.extend(ready.messages)
        if ready.snapshot is not None:
            meta = ready.snapshot.meta
            node.snapshot = (meta, ready.snapshot.data)
            node.store.reset(meta.index + 1)
            node.applied = [LogEntry(index=i, term=0) for i in range(1, meta.index + 1)]
        if ready.truncate_after is not None:
            node.store.truncate_suffix(ready.truncate_after)
        if ready.entries:
            node.store.append(ready.entries)
        if ready.hard_state is not None:
            node.hard_state = ready.hard_state
        self.queue.extend(ready.messages_after_persist)
        if ready.entries:
            core.persisted(ready.entries[-1].index, ready.entries[-1].term)
        for entry in ready.committed_entries:
            node.applied.append(entry)
        if ready.committed_entries:
            core.applied(ready.committed_entries[-1].index)
        self.read_results[node_id].extend((r.request_id, r.index) for r in ready.read_states)
        self.failed_reads[node_id].extend(ready.failed_reads)
        return True

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
        self.nodes[message.target].core.step(message)
        return True

    def stabilize(self, rounds_max: int = 10_000) -> None:
        """Process every Ready and deliver every message until nothing moves."""
        for _ in range(rounds_max):
            moved = False
            for node_id in sorted(self.nodes):
                moved |= self.process(node_id)
            moved |= self.deliver_one()
            while self.deliver_one():
                moved = True
            if not moved:
                return
        raise AssertionError("cluster did not stabilize")

    def tick(self, count: int = 1, nodes: list[str] | None = None) -> None:
        for _ in range(count):
            for node_id in sorted(nodes or self.nodes):
                if node_id not in self.down:
                    self.nodes[node_id].core.tick()
            self.stabilize()

    def expire_leases(self) -> None:
        """As if an election timeout passed with no word from a leader (check-quorum leases
        would otherwise, rightly, make followers ignore a scripted candidate)."""
        for node in self.nodes.values():
            if node.core.leader is None:
                node.core.election_elapsed = node.core.config.election_ticks

    def elect(self, node_id: str) -> None:
        self.expire_leases()
        self.core(node_id).campaign()
        self.stabilize()
        if self.core(node_id).role is not Role.LEADER:
            raise AssertionError(f"{node_id} did not win: {self.core(node_id).status()}")

    def leaders(self) -> list[str]:
        return sorted(i for i, n in self.nodes.items() if n.core.role is Role.LEADER)

    def propose(self, node_id: str, data: bytes) -> int:
        index = self.core(node_id).propose(data)
        self.stabilize()
        return index
