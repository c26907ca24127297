"""`CheckerHooks`: a simulated host's observation points, wired to the Raft invariant
checker. Both simulators (one group per node, and the shard simulator's many) use it.

The checker observes the system under test; it reads the node's disk with no bit flips
(`SimDisk.reading_truthfully`), so the faults the nemesis injects can neither mislead it nor
stop it. Each hook is called before the change it names (runtime/host.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from quorumlog.raft.messages import SnapshotMeta
from quorumlog.runtime.host import HostHooks
from quorumlog.storage.entry import LogEntry
from quorumlog.testing.sim.disk import SimDisk
from quorumlog.testing.sim.invariants import InvariantChecker

if TYPE_CHECKING:
    from quorumlog.testing.sim.node import SimNode


class CheckerHooks(HostHooks):
    def __init__(
        self,
        checker: InvariantChecker,
        checked: SimNode,
        disk: SimDisk,
        name: str,
        record: Callable[[str], None],
    ) -> None:
        self.checker = checker
        self.checked = checked
        """The replica as the checker sees it (node_id, core, disk, applied_index)."""
        self.disk = disk
        self.name = name
        self.record = record

    def on_truncate(self, after: int) -> None:
        with self.disk.reading_truthfully():
            self.checker.on_truncate(self.checked, after)

    def on_append(self, entries: list[LogEntry]) -> None:
        if not self.disk.file_system.read_bit_flip_probability:
            self.checker.on_append(self.checked, entries)  # no flips to hold off: no `with`
            return
        with self.disk.reading_truthfully():
            self.checker.on_append(self.checked, entries)

    def on_snapshot_install(self, meta: SnapshotMeta, data: bytes) -> None:
        with self.disk.reading_truthfully():
            self.checker.on_snapshot_install(self.checked, meta, data)
        self.record(f"{self.name} installs snapshot {meta.index}@{meta.term}")

    def on_snapshot_taken(self, meta: SnapshotMeta, data: bytes) -> None:
        with self.disk.reading_truthfully():
            self.checker.on_snapshot_taken(self.checked, meta, data)
        self.record(f"{self.name} snapshot {meta.index}")

    def on_apply(self, entry: LogEntry) -> None:
        if not self.disk.file_system.read_bit_flip_probability:
            self.checker.on_apply(self.checked, entry)  # once per entry: skip the `with`
            return
        with self.disk.reading_truthfully():
            self.checker.on_apply(self.checked, entry)

    def on_acknowledged(self, entry: LogEntry) -> None:
        if not self.disk.file_system.read_bit_flip_probability:
            self.checker.on_acknowledged(self.checked, entry)
            return
        with self.disk.reading_truthfully():
            self.checker.on_acknowledged(self.checked, entry)
