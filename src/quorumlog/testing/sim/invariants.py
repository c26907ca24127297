"""Raft's safety properties, checked after every simulated event, cheaply.

Each check looks only at what changed since the last one, against global maps:

- election safety: `leaders` maps each term to the one node that led in it;
- log matching: every entry any node ever wrote is recorded under (index, term) with its
  content and the term of the entry before it. Two logs holding the same (index, term)
  must hold the same entry with the same predecessor term, so by induction they agree on
  everything below: that is the whole log matching property, at O(1) per appended entry;
- state-machine safety: `committed` maps each index to the one entry committed (or
  applied) there, by any node;
- leader completeness: an entry committed in term T (bounded above by the term of the first
  node seen to know it committed) is in the log of every leader of a term after T: checked
  when a node becomes leader (the newest such entry, and by log matching all before it)
  and when an entry becomes known committed (every current leader of a later term); and
  no node ever truncates a committed entry it holds;
- commit and applied indexes never go back within one run of a node, and after a restart
  they are no lower than what was durable;
- snapshots of one index, taken or installed by any node, hold the same state.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from quorumlog.raft.core import Role
from quorumlog.raft.messages import SnapshotMeta
from quorumlog.storage.entry import EntryType, LogEntry
from quorumlog.testing.sim.checks import InvariantViolation, check_invariant

if TYPE_CHECKING:
    from quorumlog.raft.core import RaftCore
    from quorumlog.testing.sim.node import SimNode

NEW_LEADER_SCAN_STEPS_MAX = 10_000
"""How far below the newest committed entry a new leader's check looks for one committed
before its term (entries committed in its own term or later need not be in its log)."""

LEADER = Role.LEADER
"""Read once: `check_node` runs after every event."""

EntryIdentity = tuple[int, EntryType, bytes]
"""(term, type, data): what makes two entries at one index the same entry."""


def _identity(entry: LogEntry) -> EntryIdentity:
    return (entry.term, entry.type, entry.data)


class InvariantChecker:
    def __init__(self) -> None:
        self.checks = 0
        self.leaders: dict[int, str] = {}
        self.committed: dict[int, EntryIdentity] = {}
        self.committed_index_max = 0
        self.commit_term_bounds: dict[int, int] = {}
        """Index -> a term in which (or before which) the entry there was committed."""
        self.written: dict[tuple[int, int], tuple[EntryType, bytes]] = {}
        self.predecessor_terms: dict[tuple[int, int], int] = {}
        self.node_commit: dict[str, int] = {}
        self.node_applied: dict[str, int] = {}
        self.node_leader_term: dict[str, int] = {}
        self.snapshot_digests: dict[int, bytes] = {}
        self.acknowledged_index_max = 0
        self.nodes: dict[str, SimNode] = {}

    def register(self, node: SimNode) -> None:
        self.nodes[node.node_id] = node

    # --- life cycle ---------------------------------------------------------------------

    def on_start(self, node: SimNode) -> None:
        """A (re)started node: its commit may restart lower, but never below the durable."""
        node_id = node.node_id
        core = node.core
        disk = node.disk
        durable_commit = disk.durable_hard_state.commit
        snapshot_index = disk.snapshot.meta.index if disk.snapshot is not None else 0
        check_invariant(
            core.commit_index >= max(durable_commit, snapshot_index),
            f"{node_id} restarted with commit {core.commit_index} below its durable commit "
            f"{durable_commit} / snapshot {snapshot_index}",
        )
        self.node_commit[node_id] = core.commit_index
        self.node_applied[node_id] = node.applied_index
        self.node_leader_term.pop(node_id, None)
        self._check_terms_never_decrease(node)

    def _check_terms_never_decrease(self, node: SimNode) -> None:
        """A log's terms never go down from one entry to the next, its snapshot included
        (an entry follows only an entry of its own term or an older one). A log kept beside
        a snapshot it does not follow breaks this at the snapshot's boundary: the entries
        after it come from a deposed leader, older than the snapshot's last term."""
        log = node.core.log
        previous_term = log.snapshot_term if log.snapshot_index else 0
        low = max(log.first_index, log.snapshot_index + 1)
        for entry in log.entries(low, log.last_index + 1) if low <= log.last_index else []:
            check_invariant(
                entry.term >= previous_term,
                f"{node.node_id} restarted with entry {entry.index} of term {entry.term} after "
                f"term {previous_term}: its log does not follow its snapshot/log before it",
            )
            previous_term = entry.term

    def on_crash(self, node: SimNode) -> None:
        self.node_leader_term.pop(node.node_id, None)

    # --- after every event --------------------------------------------------------------

    def check_node(self, node: SimNode) -> None:
        self.checks += 1
        core = node.host.core  # what `node.core` reads, minus a property call
        node_id = node.node_id
        if core.role is LEADER:
            term = core.term
            holder = self.leaders.get(term)
            if holder is None:
                self.leaders[term] = node_id
            elif holder != node_id:
                raise InvariantViolation(f"two leaders in term {term}: {holder} and {node_id}")
            if self.node_leader_term.get(node_id) != term:
                self.node_leader_term[node_id] = term
                self._check_new_leader(node)
        elif node_id in self.node_leader_term:  # a test, not a pop: most nodes never led
            del self.node_leader_term[node_id]
        commit = core.commit_index
        previous = self.node_commit[node_id]
        # Hot path: plain ifs, so no message is formatted unless a check fails.
        if commit != previous:
            if commit < previous:
                raise InvariantViolation(
                    f"{node_id} commit index went back: {previous} -> {commit}"
                )
            self._record_committed(node, core, previous, commit)
            self.node_commit[node_id] = commit
        applied = core.applied_index  # what `node.applied_index` reads, minus a property call
        applied_before = self.node_applied[node_id]
        if applied != applied_before:
            if applied < applied_before:
                raise InvariantViolation(
                    f"{node_id} applied index went back: {applied_before} -> {applied}"
                )
            if applied > commit:
                raise InvariantViolation(f"{node_id} applied {applied} beyond its commit {commit}")
            self.node_applied[node_id] = applied

    def _record_committed(self, node: SimNode, core: RaftCore, previous: int, commit: int) -> None:
        log = core.log
        if commit > log.last_index:
            raise InvariantViolation(
                f"{node.node_id} commit {commit} beyond its last index {log.last_index}"
            )
        low = max(previous + 1, log.first_index)
        if low > commit:
            return  # all covered by a snapshot just installed, checked on install
        term = core.term
        node_id = node.node_id
        note_committed = self._note_committed
        written = self.written
        # The content comes from what the checker saw written at (index, term), not from
        # the disk: log matching (on_append) holds every writer of (index, term) to one
        # content, and on_apply checks what the store hands back when it is applied. Only
        # the terms are read here, which the store keeps in memory.
        for index in range(low, commit + 1):
            known_term = log.term(index)
            content = written.get((index, known_term)) if known_term is not None else None
            if known_term is None or content is None:  # never seen written: read it
                [entry] = log.entries(index, index + 1)
                known_term, content = entry.term, (entry.type, entry.data)
            note_committed(index, (known_term, content[0], content[1]), node_id, term)

    def _note_committed(
        self, index: int, identity: EntryIdentity, source: str, observer_term: int
    ) -> None:
        """`observer_term`: the term of a node that knows the entry is committed. The entry
        was committed in that term or earlier, so every leader of a later term holds it."""
        existing = self.committed.get(index)
        if existing is not None:
            if existing != identity:
                raise InvariantViolation(
                    f"state-machine safety: {source} has {_show(identity)} committed at {index}, "
                    f"another node {_show(existing)}"
                )
            if observer_term >= self.commit_term_bounds[index]:
                return
        else:
            self.committed[index] = identity
            if index > self.committed_index_max:
                self.committed_index_max = index
        self.commit_term_bounds[index] = observer_term
        for leader_id, leader_term in self.node_leader_term.items():
            if leader_term > observer_term:
                self._check_holds(self.nodes[leader_id], index, identity, "leader completeness")

    def _check_new_leader(self, node: SimNode) -> None:
        """The newest entry known committed before this leader's term must be in its log;
        by log matching, so is every entry before it."""
        term = node.core.term
        bounds = self.commit_term_bounds
        index = self.committed_index_max
        steps = 0
        while index > 0 and steps < NEW_LEADER_SCAN_STEPS_MAX:
            bound = bounds.get(index)
            if bound is not None and bound < term:
                self._check_holds(node, index, self.committed[index], "leader completeness")
                return
            index -= 1
            steps += 1

    def _check_holds(self, node: SimNode, index: int, identity: EntryIdentity, what: str) -> None:
        log = node.core.log
        if index <= log.snapshot_index:
            return  # in its snapshot, whose content is checked against others' snapshots
        term = log.term(index)
        if term != identity[0]:
            raise InvariantViolation(
                f"{what}: {node.node_id}, leader of term {node.core.term}, has term {term} at "
                f"{index} where {_show(identity)} is committed"
            )

    # --- Ready processing ---------------------------------------------------------------

    def on_append(self, node: SimNode, entries: list[LogEntry]) -> None:
        """Called before the entries are written after the Ready's truncation."""
        disk = node.disk
        first = entries[0].index
        store = disk.store
        previous_index = first - 1
        previous_term: int | None = None
        if previous_index == 0:
            previous_term = 0
        elif store.first_index <= previous_index <= store.last_index:
            previous_term = store.term(previous_index)
        elif disk.snapshot is not None and disk.snapshot.meta.index == previous_index:
            previous_term = disk.snapshot.meta.term
        written = self.written
        predecessors = self.predecessor_terms
        for entry in entries:
            key = (entry.index, entry.term)
            content = (entry.type, entry.data)
            existing = written.get(key)
            if existing is None:
                written[key] = content
            elif existing != content:
                raise InvariantViolation(
                    f"log matching: {node.node_id} writes {entry!r}, another log holds "
                    f"{content!r} at ({entry.index}, {entry.term})"
                )
            if previous_term is not None:
                known = predecessors.get(key)
                if known is None:
                    predecessors[key] = previous_term
                elif known != previous_term:
                    raise InvariantViolation(
                        f"log matching: {node.node_id} holds ({entry.index}, {entry.term}) after "
                        f"term {previous_term}, another log after term {known}"
                    )
            previous_term = entry.term

    def on_truncate(self, node: SimNode, after: int) -> None:
        """No log ever loses a committed entry it holds (only a snapshot may replace it)."""
        store = node.disk.store
        commit = max(node.disk.durable_hard_state.commit, self.node_commit[node.node_id])
        check_invariant(
            after >= commit, f"{node.node_id} truncates after {after}, below its commit {commit}"
        )
        self._check_not_dropping_committed(node, max(after + 1, store.first_index), "truncate")

    def _check_not_dropping_committed(self, node: SimNode, low: int, what: str) -> None:
        store = node.disk.store
        high = min(store.last_index, self.committed_index_max)
        for index in range(low, high + 1):
            identity = self.committed.get(index)
            if identity is not None and store.term(index) == identity[0]:
                raise InvariantViolation(
                    f"{node.node_id} {what} drops committed entry {_show(identity)} at {index}"
                )

    def on_snapshot_install(self, node: SimNode, meta: SnapshotMeta, data: bytes) -> None:
        self._check_not_dropping_committed(node, meta.index + 1, "snapshot install")
        self._check_snapshot(node, meta, data)
        identity = self.committed.get(meta.index)
        if identity is not None:
            check_invariant(
                identity[0] == meta.term,
                f"{node.node_id} installs a snapshot at {meta.index}@{meta.term} but "
                f"{_show(identity)} is committed there",
            )

    def on_snapshot_taken(self, node: SimNode, meta: SnapshotMeta, data: bytes) -> None:
        self._check_snapshot(node, meta, data)

    def _check_snapshot(self, node: SimNode, meta: SnapshotMeta, data: bytes) -> None:
        digest = hashlib.blake2b(data, digest_size=16).digest()
        known = self.snapshot_digests.setdefault(meta.index, digest)
        check_invariant(
            known == digest,
            f"{node.node_id}'s snapshot at {meta.index} differs from another node's",
        )

    def on_apply(self, node: SimNode, entry: LogEntry) -> None:
        self._note_committed(entry.index, _identity(entry), node.node_id, node.core.term)

    def on_acknowledged(self, node: SimNode, entry: LogEntry) -> None:
        if self.committed.get(entry.index) != _identity(entry):
            raise InvariantViolation(
                f"{node.node_id} acknowledged {entry!r}, not what is committed there"
            )
        if entry.index > self.acknowledged_index_max:
            self.acknowledged_index_max = entry.index


def _show(identity: EntryIdentity) -> str:
    term, entry_type, data = identity
    return f"{entry_type.name}@{term}:{data[:40]!r}"
