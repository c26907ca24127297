"""The cluster's feature level (codec/feature_levels.py, node/cluster_level.py): the lowest
level among the members, agreed only once every one said it, never going down, and no
node below a committed level starting, joining or applying."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from quorumlog.cli.kv_commands import STATUS_COLUMNS, status_cells
from quorumlog.codec.feature_levels import (
    BASELINE_FEATURE_LEVEL,
    FEATURE_LEVEL,
    FEATURE_LEVELS,
    GROUP_FENCING_LEVEL,
    agreed_level,
    check_level,
    level_to_propose,
    raised,
)
from quorumlog.errors import ClusterLevelError
from quorumlog.node.cluster_level import CommittedLevelFile, PeerLevels
from quorumlog.stream.group_coordinator import GroupCoordinatorMachine
from quorumlog.stream.group_model import GroupEntry, JoinGroup, encode_entry


def test_the_table_names_every_level_up_to_this_release() -> None:
    assert sorted(FEATURE_LEVELS) == list(range(BASELINE_FEATURE_LEVEL, FEATURE_LEVEL + 1))


def test_the_agreed_level_is_the_lowest_among_the_members() -> None:
    levels = {"n1": 3, "n2": 2, "n3": 4}
    assert agreed_level(levels, ["n1", "n2", "n3"]) == 2
    assert agreed_level(levels, ["n1", "n3"]) == 3


def test_nothing_is_agreed_while_a_member_has_not_said_its_level() -> None:
    assert agreed_level({"n1": 2, "n2": 2}, ["n1", "n2", "n3"]) is None
    assert agreed_level({"n1": 2}, []) is None


def test_a_leader_proposes_only_a_higher_level_and_never_above_its_own() -> None:
    assert level_to_propose(committed=1, agreed=2, own=2) == 2
    assert level_to_propose(committed=2, agreed=2, own=2) is None
    assert level_to_propose(committed=2, agreed=1, own=2) is None  # never down
    assert level_to_propose(committed=1, agreed=None, own=2) is None
    assert level_to_propose(committed=1, agreed=5, own=3) == 3


def test_an_applied_level_never_goes_down() -> None:
    assert raised(committed=2, proposed=1, own=2) == 2
    assert raised(committed=1, proposed=2, own=2) == 2


def test_a_build_below_a_committed_level_refuses_in_one_line() -> None:
    with pytest.raises(ClusterLevelError) as refused:
        raised(committed=1, proposed=3, own=2)
    message = str(refused.value)
    assert "runs feature level 2, below the cluster's committed feature level 3" in message
    assert "\n" not in message
    check_level(own=2, committed=2)  # at the level: fine


def test_a_peer_below_the_committed_level_is_refused_and_counted() -> None:
    committed = [BASELINE_FEATURE_LEVEL]
    levels = PeerLevels("n1", own_level=2, committed=lambda: committed[0])
    assert levels.heard("n2", 2) is None
    assert levels.heard("n3", 1) is None  # nothing committed above it yet
    assert levels.agreed(["n1", "n2"]) == 1  # n3 was heard: it counts, so no raise yet
    assert levels.heard("n3", 2) is None  # n3 restarted on the new release
    assert levels.agreed(["n1", "n2"]) == 2
    assert levels.agreed(["n1", "n2", "n4"]) is None  # n4 never said its level
    committed[0] = 2
    refusal = levels.heard("n4", 1)
    assert refusal is not None and "feature level 1, below" in refusal and "level 2" in refusal


def test_the_committed_level_is_kept_never_lowered_and_checked_at_start(tmp_path: Path) -> None:
    kept = CommittedLevelFile(tmp_path / "n1")
    assert kept.read() == BASELINE_FEATURE_LEVEL  # a new node, or one from before the gate
    kept.raise_to(2)
    kept.raise_to(1)
    assert kept.read() == 2
    assert kept.check_start(own_level=2) == 2
    with pytest.raises(ClusterLevelError, match="this release runs feature level 1, below"):
        kept.check_start(own_level=1)
    kept.path.write_text("two\n")
    with pytest.raises(ClusterLevelError, match="not a feature level"):
        kept.read()


def raise_entry(level: int) -> bytes:
    return encode_entry(GroupEntry(timestamp_ms=0, batches=[], cluster_level=level))


def test_the_machine_takes_its_level_from_the_log_only_upwards() -> None:
    machine = GroupCoordinatorMachine()
    raises: list[int] = []
    machine.on_level_raised = raises.append
    assert machine.cluster_level == BASELINE_FEATURE_LEVEL
    machine.apply(1, raise_entry(GROUP_FENCING_LEVEL))
    assert machine.cluster_level == GROUP_FENCING_LEVEL
    machine.apply(2, raise_entry(BASELINE_FEATURE_LEVEL))  # a stale, lower raise
    assert machine.cluster_level == GROUP_FENCING_LEVEL
    assert raises == [GROUP_FENCING_LEVEL]


def test_an_older_build_stops_at_a_raise_above_its_level() -> None:
    old = GroupCoordinatorMachine(feature_level=BASELINE_FEATURE_LEVEL)
    with pytest.raises(ClusterLevelError):
        old.apply(1, raise_entry(GROUP_FENCING_LEVEL))
    assert old.applied_index == 0 and old.cluster_level == BASELINE_FEATURE_LEVEL


def test_snapshots_keep_the_level_and_an_older_build_refuses_them() -> None:
    machine = GroupCoordinatorMachine()
    machine.apply(1, raise_entry(GROUP_FENCING_LEVEL))
    restored = GroupCoordinatorMachine()
    restored.restore(machine.snapshot())
    assert restored.cluster_level == GROUP_FENCING_LEVEL
    old = GroupCoordinatorMachine(feature_level=BASELINE_FEATURE_LEVEL)
    with pytest.raises(ClusterLevelError):
        old.restore(machine.snapshot())
    assert old.applied_index == 0


def test_endpoint_status_shows_the_level_in_its_last_column() -> None:
    assert STATUS_COLUMNS[-1] == "cluster level"
    row = {
        "endpoint": "127.0.0.1:1",
        "node_id": "n1",
        "is_leader": True,
        "term": 3,
        "commit_index": 9,
        "applied_index": 9,
        "last_index": 9,
        "errors": [],
        "cluster_level": 2,
    }
    assert status_cells(row)[-1] == "2"
    assert status_cells({"endpoint": "127.0.0.1:2", "errors": ["refused"]})[-1] == ""


def test_a_snapshot_below_the_fencing_level_is_restored_with_its_fencing_fields() -> None:
    """A snapshot that the session-7 release wrote (fields set, no level) holds what its
    replicas that replay the log hold, and this release at level 1 applies as they do: it
    is restored as written, at every level."""
    from quorumlog.stream.group_coordinator import (
        ConsumerGroupState,
        GroupCoordinatorSnapshot,
        MemberState,
    )

    member = MemberState("m", "m", ["t"], 10_000, revoking_since=5, commit_sequence=3)
    state = ConsumerGroupState("g", generation=6, members={"m": member})
    for level in (BASELINE_FEATURE_LEVEL, GROUP_FENCING_LEVEL):
        snapshot = GroupCoordinatorSnapshot(1, 9, [state], cluster_level=level)
        machine = GroupCoordinatorMachine()
        machine.restore(msgspec.msgpack.encode(snapshot))
        restored = machine.groups["g"].members["m"]
        assert (restored.revoking_since, restored.commit_sequence) == (5, 3), level


def level_one_entry(member_id: str) -> bytes:
    """A join as this release's leader proposes it below level 2 (no owned_generation)."""
    join = JoinGroup("g", member_id, member_id, ["u"], partition_counts={"u": 2}, owned=[])
    return encode_entry(GroupEntry(timestamp_ms=0, batches=[[join]]))


def as_session_6_writes(snapshot: bytes) -> bytes:
    """A coordinator snapshot as the session-6 release writes it: no level, and members
    without revoking_since and commit_sequence (its MemberState had 6 fields)."""
    fields: list[Any] = msgspec.msgpack.decode(snapshot)[:3]
    for group in fields[2]:
        for member_id, member in group[3].items():
            group[3][member_id] = member[:6]
    return msgspec.msgpack.encode(fields)


def test_the_raise_to_the_fencing_level_sets_revocations_alike_after_a_session_6_snapshot() -> None:
    """A replica restored from a session-6 snapshot lacks the generation of a revocation
    under way that a replica replaying the same entries noted; applying the raise to level
    2 sets it from what both hold (the generation, as the member still revokes)."""
    replayed = GroupCoordinatorMachine()
    replayed.apply(1, level_one_entry("m"))
    replayed.apply(2, level_one_entry("m2"))  # takes one of m's partitions: m revokes it
    restored = GroupCoordinatorMachine()
    restored.restore(as_session_6_writes(replayed.snapshot()))
    assert replayed.groups["g"].members["m"].revoking_since == 2
    assert restored.groups["g"].members["m"].revoking_since == 0
    for machine in (replayed, restored):
        machine.apply(3, level_one_entry("m3"))
    assert replayed.snapshot() != restored.snapshot()  # they differ in revoking_since only
    for machine in (replayed, restored):
        machine.apply(4, raise_entry(GROUP_FENCING_LEVEL))
    assert replayed.snapshot() == restored.snapshot()
    state = replayed.groups["g"]
    for member in state.members.values():
        assert member.revoking_since == (state.generation if member.revoking else 0)
    assert state.members["m"].revoking and state.members["m"].revoking_since == 3
