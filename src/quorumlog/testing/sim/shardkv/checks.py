"""The shard deployment's own invariants, on top of Raft's (checked per group elsewhere).

* one server per configuration: for every shard and configuration number, the members
  that can serve the shard in that configuration all belong to one group (two groups
  serving one shard in one configuration would let both take writes);
* replicas agree: members of a group that applied the same index hold the same state;
* storage stays bounded: once settled, no group keeps data of a shard it does not own
  (the garbage collection of moved shards happened);
* no acknowledged write lost or applied twice: every workload append carries a unique
  token, and in the final value of its key each acknowledged token appears exactly once,
  each unknown one at most once, and nothing else appears (in particular no token of an
  append the client was told certainly did not happen).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from quorumlog.shard.group_machine import ShardGroupMachine, ShardState
from quorumlog.testing.history import Operation, OperationStatus
from quorumlog.testing.sim.checks import check_invariant

if TYPE_CHECKING:
    from quorumlog.testing.sim.shardkv.cluster import ShardCluster

TOKEN_SEPARATOR = ";"


class ShardChecker:
    def __init__(self, cluster: ShardCluster) -> None:
        self.cluster = cluster
        self.checks = 0
        self.serving_checked: tuple[tuple[bool, int, int], ...] = ()
        """What every shard member was when `check_serving` last looked: (up, incarnation,
        applied index). A machine changes only by applying (or restoring, which moves
        the index too), so the same again means the same answer."""

    def serving_state(self) -> tuple[tuple[bool, int, int], ...]:
        return tuple(
            (member.up, member.incarnation, member.machine.applied_index if member.up else 0)
            for members in self.cluster.members.values()
            for member in members
        )

    def check_serving(self) -> None:
        """At most one group can serve a shard in any one configuration number."""
        members_now = self.serving_state()
        if members_now == self.serving_checked:
            return
        self.serving_checked = members_now
        self.checks += 1
        servers: dict[tuple[int, int], int] = {}
        for gid, members in self.cluster.members.items():
            for member in members:
                if not member.up:
                    continue
                machine: ShardGroupMachine = member.machine
                number = machine.current_configuration.number
                for shard in range(machine.shard_count):
                    if not machine.can_serve(shard):
                        continue
                    other = servers.setdefault((shard, number), gid)
                    check_invariant(
                        other == gid,
                        f"shard {shard} is served by groups {other} and {gid} in "
                        f"configuration {number}",
                    )
                    # Serving is only for the owner, and a PULLING or BE_PULLING shard
                    # does not serve: what can_serve says must follow the shard's state.
                    state = machine.shard_state(shard)
                    check_invariant(
                        state in (ShardState.SERVING, ShardState.GARBAGE_COLLECTING),
                        f"{member.node_id} serves shard {shard} while it is {state.value}",
                    )

    def check_replicas_agree(self) -> None:
        for gid, members in self.cluster.members.items():
            seen: dict[int, tuple[str, bytes]] = {}
            for member in members:
                if not member.up:
                    continue
                state = member.machine.snapshot()
                first = seen.setdefault(member.applied_index, (member.node_id, state))
                check_invariant(
                    first[1] == state,
                    f"group {gid}: {member.node_id} and {first[0]} applied through "
                    f"{member.applied_index} but hold different states",
                )

    def check_storage_bounded(self) -> None:
        """Once settled: only owned shards hold keys, on every live member."""
        for gid, members in self.cluster.members.items():
            for member in members:
                if not member.up:
                    continue
                machine: ShardGroupMachine = member.machine
                for shard in range(machine.shard_count):
                    if machine.owns(shard):
                        continue
                    check_invariant(
                        not machine.shards[shard].data,
                        f"group {gid} ({member.node_id}) still stores "
                        f"{len(machine.shards[shard].data)} keys of shard {shard}, which "
                        f"belongs to group {machine.current_configuration.shards[shard]} in "
                        f"configuration {machine.current_configuration.number}",
                    )


def check_append_tokens(
    operations: Sequence[Operation], final_values: Mapping[str, str | None]
) -> None:
    """Each acknowledged append's token is in its key's final value exactly once; unknown
    ones at most once; no other token (failed ones: none). Appends must carry
    `token + TOKEN_SEPARATOR`."""
    acknowledged: dict[str, set[str]] = {}
    possible: dict[str, set[str]] = {}
    for operation in operations:
        if operation.kind != "append":
            continue
        token = str(operation.argument).rstrip(TOKEN_SEPARATOR)
        if operation.status is OperationStatus.FAILED:
            continue  # the client was told it certainly did not happen
        possible.setdefault(operation.key, set()).add(token)
        if operation.status is OperationStatus.OK:
            acknowledged.setdefault(operation.key, set()).add(token)
    for key, value in final_values.items():
        found = [token for token in (value or "").split(TOKEN_SEPARATOR) if token]
        counts: dict[str, int] = {}
        for token in found:
            counts[token] = counts.get(token, 0) + 1
        for token in sorted(acknowledged.get(key, set())):
            check_invariant(
                counts.get(token, 0) == 1,
                f"key {key!r}: acknowledged append {token!r} appears {counts.get(token, 0)} "
                f"times in the final value {value!r}",
            )
        for token, count in sorted(counts.items()):
            check_invariant(
                token in possible.get(key, set()),
                f"key {key!r}: {token!r} was never appended (or its append failed)",
            )
            check_invariant(count == 1, f"key {key!r}: {token!r} applied {count} times")
