"""A join made before its member learned of a revocation releases nothing.

Found by `quorumlog sim groups --seeds 220-220`: a consumer's first join (owned: nothing)
was duplicated on the network. The first copy made it the group's only member, holding
every partition; a second consumer joined, so some of those partitions were taken from the
first (revoking); then the duplicate, applied, said "I hold nothing": the coordinator took
it as the release and gave the partitions to the second consumer while the first still
read them. A retried or delayed join does the same."""

from __future__ import annotations

from quorumlog.codec.feature_levels import GROUP_FENCING_LEVEL
from quorumlog.stream.group_coordinator import GroupCoordinatorMachine
from quorumlog.stream.group_model import NO_GENERATION, JoinGroup
from quorumlog.testing.sim.groups.runner import run_seed

COUNTS = {"orders": 4}


def join(member_id: str, owned: list[tuple[str, int]], owned_generation: int) -> JoinGroup:
    return JoinGroup(
        "g",
        member_id,
        member_id,
        ["orders"],
        partition_counts=COUNTS,
        owned=owned,
        owned_generation=owned_generation,
    )


def test_a_duplicated_first_join_does_not_release_what_its_member_was_given() -> None:
    machine = fenced_machine()
    first_join = join("first", [], NO_GENERATION)
    assert machine.execute(first_join).generation == 1
    second = machine.execute(join("second", [], NO_GENERATION))
    taken = machine.groups["g"].members["first"].revoking
    assert taken and second.assignment == []

    again = machine.execute(first_join)  # the duplicate, applied after the second join

    state = machine.groups["g"]
    assert state.members["first"].revoking == taken
    assert set(taken).isdisjoint(state.members["second"].assignment)
    assert again.generation == second.generation  # a heartbeat: nothing changed


def test_a_join_that_knew_the_revocation_releases() -> None:
    machine = fenced_machine()
    machine.execute(join("first", [], NO_GENERATION))
    second = machine.execute(join("second", [], NO_GENERATION))
    state = machine.groups["g"]
    kept = state.members["first"].assignment

    machine.execute(join("first", list(kept), second.generation))

    assert not state.members["first"].revoking
    assert len(state.members["second"].assignment) == 2


def test_a_join_from_a_client_without_the_field_releases_as_before() -> None:
    machine = fenced_machine()
    machine.execute(join("first", [], NO_GENERATION))
    machine.execute(join("second", [], NO_GENERATION))
    old_client = JoinGroup("g", "first", "first", ["orders"], partition_counts=COUNTS, owned=[])

    machine.execute(old_client)

    assert not machine.groups["g"].members["first"].revoking


def test_the_seed_that_found_it_keeps_every_invariant() -> None:
    result = run_seed(220, capture_trace=False)
    assert result.ok, f"{result.replay_command}\n{result.failure}"


def fenced_machine() -> GroupCoordinatorMachine:
    """A machine whose log has committed the feature level of the fencing (as a cluster
    whose every node runs this release does: codec/feature_levels.py)."""
    machine = GroupCoordinatorMachine()
    machine.raise_level(GROUP_FENCING_LEVEL)
    return machine
