"""Opening a host: the log must follow the newest snapshot (defect 4 of the review).

Installing a snapshot from the leader is two durable steps: save the snapshot, then reset
the log to start after it. A crash between them leaves the old log beside the new
snapshot. If that log holds a different entry at the snapshot's index, its suffix does
not follow the snapshot, and keeping it later asks the follower to truncate below its
commit index (it gets stuck). At open the log is kept only if it follows the snapshot.
"""

from __future__ import annotations

import random

import pytest

from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import Configuration
from quorumlog.raft.messages import SnapshotMeta
from quorumlog.runtime.host import RaftHost, reconcile_log_with_snapshot
from quorumlog.storage import EntryType, LogEntry, MemoryLogStore
from quorumlog.testing.sim.disk import SimDisk

CONFIGURATION = Configuration(voters=("n1", "n2", "n3"))


def log_with_terms(terms: list[int], first_index: int = 1) -> MemoryLogStore:
    store = MemoryLogStore(first_index=first_index)
    store.append(
        [
            LogEntry(index=first_index + offset, term=term, data=b"x", type=EntryType.DATA)
            for offset, term in enumerate(terms)
        ]
    )
    return store


def snapshot_at(index: int, term: int) -> SnapshotMeta:
    return SnapshotMeta(index=index, term=term, configuration=CONFIGURATION)


@pytest.mark.parametrize(
    ("store", "kept"),
    [
        (log_with_terms([1] * 5 + [3] * 10), True),  # holds entry 10 of term 3: follows
        (log_with_terms([3] * 5, first_index=11), True),  # starts right after it
        (log_with_terms([1] * 5 + [2] * 10), False),  # entry 10 has term 2: stale suffix
        (log_with_terms([1] * 5), False),  # wholly below the snapshot
        (log_with_terms([3] * 5, first_index=14), False),  # a gap after the snapshot
    ],
)
def test_the_log_is_kept_only_if_it_follows_the_snapshot(store: MemoryLogStore, kept: bool) -> None:
    before = (store.first_index, store.last_index)
    reset = reconcile_log_with_snapshot(store, snapshot_at(10, 3))
    assert reset is not kept
    if kept:
        assert (store.first_index, store.last_index) == before
    else:
        assert (store.first_index, store.last_index) == (11, 10)


def test_a_crash_between_snapshot_save_and_log_reset_opens_on_the_snapshot() -> None:
    disk = SimDisk()
    # The follower's log before the install: entries 1..15, the tail from a deposed leader
    # of term 2. The snapshot it was installing holds 1..12 of term 3.
    disk.store.append(log_with_terms([1] * 5 + [2] * 10).entries(1, 16))
    disk.store.sync()
    disk.snapshots.save(snapshot_at(12, 3), b"state at 12")
    # ... and the process died before `store.reset(13)`.
    restored: list[bytes] = []

    class Machine:
        def apply(self, index: int, data: bytes) -> None:
            raise AssertionError("nothing is committed past the snapshot")

        def mark_applied(self, index: int) -> None:
            pass

        def snapshot(self) -> bytes:
            return b""

        def restore(self, data: bytes) -> None:
            restored.append(data)

    host = RaftHost(
        "g",
        RaftConfig(node_id="n1"),
        store=disk.store,
        hard_state=disk.hard_state,
        snapshots=disk.snapshots,
        machine=Machine(),
        send=lambda message: None,
        bootstrap=CONFIGURATION,
        scheduler=None,  # type: ignore[arg-type]  # opening schedules nothing
        background=None,  # type: ignore[arg-type]
        random_source=random.Random(1),
    )
    assert restored == [b"state at 12"]
    assert (disk.store.first_index, disk.store.last_index) == (13, 12)
    assert host.core.log.last_index == 12
    assert host.core.log.last_term() == 3
