"""Seeded network partitions and process pauses for the shard deployment's concurrent
scenarios, while clients run and configurations change.

The nemesis wakes at seeded intervals and injects one fault of a seeded kind:

* network faults, in the shapes that matter to a sharded store, each a two-way cut or
  (with `one_way_probability`) a one-way one in a seeded direction:
  `split_group` (one member from the rest of its group; it still reaches other groups,
  the controller and clients, so a deposed leader keeps answering them),
  `isolate_member` and `isolate_leader` (one member, or a group's current leader, from
  every other endpoint, clients included), `split_groups` (two shard groups from each
  other: pulls and deletes between them fail), `cut_controller` (a shard group from the
  controller group: it cannot learn new configurations), `random_split` (a random
  subset of all members from the others);
* `pause` and `pause_leader`: a member (or a group's current leader) stops as under
  SIGSTOP and resumes after a seeded while with its state intact (its node's `SimProcess`
  holds every input meanwhile).

As in `sim.nemesis`, at most one network fault is in place at a time (a new one replaces
the last) and each heals after a seeded duration. Pauses are bounded so that every group
keeps a majority of running members: at most one paused member per group, and at most
`paused_max` in all. Scenario crashes may still take a second member of a group down for
a while; both faults are short, so every group becomes available again. `stop` ends every
fault for the final checks, which need liveness on a healed deployment.

The nemesis draws from its own random stream, so the scenario's own choices (steps,
crashes, the workload's keys) are drawn as before from theirs.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import msgspec

from quorumlog.raft.core import RaftCore

if TYPE_CHECKING:
    # Only for annotations: the cluster's options hold `ShardNemesisOptions`.
    from quorumlog.testing.sim.shardkv.cluster import ShardCluster

NETWORK_KINDS = (
    "split_group",
    "isolate_member",
    "isolate_leader",
    "split_groups",
    "cut_controller",
    "random_split",
)
PAUSE_KINDS = ("pause", "pause_leader")
FAULT_KINDS = NETWORK_KINDS + PAUSE_KINDS

CONTROLLER_GROUP = "controller"


def weights_for(network: int, pause: int) -> dict[str, int]:
    """The same weight for every network kind and for every pause kind."""
    weights = dict.fromkeys(NETWORK_KINDS, network)
    weights.update(dict.fromkeys(PAUSE_KINDS, pause))
    return weights


class ShardNemesisOptions(msgspec.Struct, frozen=True):
    interval_ms_min: int = 200
    interval_ms_max: int = 1500
    fault_ms_min: int = 200
    fault_ms_max: int = 2000
    """How long a network fault lasts (unless the next one replaces it first)."""
    pause_ms_min: int = 100
    pause_ms_max: int = 1500
    one_way_probability: float = 0.3
    paused_max: int = 2
    weights: dict[str, int] = msgspec.field(default_factory=lambda: weights_for(1, 1))
    """Relative weight of each kind in `FAULT_KINDS`; all zero: no faults."""


class ShardNemesisStats(msgspec.Struct):
    faults: dict[str, int] = msgspec.field(default_factory=dict)
    one_way: int = 0


class Pausable(Protocol):
    """What the nemesis needs of a member of any group (`shardkv.node.GroupMember`)."""

    @property
    def node_id(self) -> str: ...

    @property
    def up(self) -> bool: ...

    @property
    def paused(self) -> bool: ...

    @property
    def is_leader(self) -> bool: ...

    @property
    def core(self) -> RaftCore: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...


class ShardNemesis:
    def __init__(
        self, cluster: ShardCluster, options: ShardNemesisOptions, rng: random.Random
    ) -> None:
        self.cluster = cluster
        self.options = options
        self.rng = rng
        by_group: dict[str, list[Pausable]] = {CONTROLLER_GROUP: list(cluster.controller_members)}
        for gid in cluster.members:
            by_group[str(gid)] = list(cluster.group_members(gid))
        self.groups = {name: [m.node_id for m in members] for name, members in by_group.items()}
        self.shard_groups = [name for name in self.groups if name != CONTROLLER_GROUP]
        self.group_of = {node: name for name, nodes in self.groups.items() for node in nodes}
        self.members = {m.node_id: m for members in by_group.values() for m in members}
        self.node_ids = sorted(self.members)
        self.kinds = [kind for kind in FAULT_KINDS if options.weights.get(kind, 0) > 0]
        self.kind_weights = [options.weights[kind] for kind in self.kinds]
        self.running = False
        self.network_fault_token = 0
        self.paused: set[str] = set()
        self.stats = ShardNemesisStats()
        self.injectors: dict[str, Callable[[], bool]] = {
            "split_group": self._split_group,
            "isolate_member": self._isolate_member,
            "isolate_leader": self._isolate_leader,
            "split_groups": self._split_groups,
            "cut_controller": self._cut_controller,
            "random_split": self._random_split,
            "pause": self._pause_any,
            "pause_leader": self._pause_leader,
        }

    # --- schedule -------------------------------------------------------------------------

    def start(self) -> None:
        if not self.kinds:
            return
        self.running = True
        self._schedule_next()

    def _schedule_next(self) -> None:
        options = self.options
        delay_ms = self.rng.randint(options.interval_ms_min, options.interval_ms_max)
        self.cluster.events.schedule(delay_ms, self._step)

    def _step(self, _: object) -> None:
        if not self.running:
            return
        kind = self.rng.choices(self.kinds, self.kind_weights)[0]
        if self.injectors[kind]():
            self.stats.faults[kind] = self.stats.faults.get(kind, 0) + 1
        self._schedule_next()

    def stop(self) -> None:
        """Stop injecting, heal the network and resume every paused member, now."""
        if not self.running:
            return
        self.running = False
        self.network_fault_token += 1
        self.cluster.heal()
        for node_id in sorted(self.paused):
            self.members[node_id].resume()
        self.paused.clear()

    # --- network faults -------------------------------------------------------------------

    def _leader(self, group: str) -> str | None:
        """The group's running leader of the highest term, if any."""
        best: Pausable | None = None
        for node_id in self.groups[group]:
            member = self.members[node_id]
            if not member.is_leader or member.paused:
                continue
            if best is None or member.core.term > best.core.term:
                best = member
        return None if best is None else best.node_id

    def _cut(self, side: list[str], other: list[str], *, one_way_allowed: bool = True) -> None:
        """Replace the current network fault by a cut between `side` and `other`: both ways,
        or (sometimes) one way, in a seeded direction. It heals after a seeded while."""
        cluster = self.cluster
        cluster.heal()
        self.network_fault_token += 1
        one_way = one_way_allowed and self.rng.random() < self.options.one_way_probability
        if one_way:
            self.stats.one_way += 1
            if self.rng.random() < 0.5:
                side, other = other, side
            cluster.note(f"nemesis: cut {sorted(side)} -> {sorted(other)} (one way)")
        else:
            cluster.note(f"nemesis: partition {sorted(side)} | {sorted(other)}")
        network = cluster.network
        for source in side:
            for target in other:
                network.cut(source, target)
                if not one_way:
                    network.cut(target, source)
        duration_ms = self.rng.randint(self.options.fault_ms_min, self.options.fault_ms_max)
        cluster.events.schedule(duration_ms, self._heal_network, self.network_fault_token)

    def _heal_network(self, token: int) -> None:
        if token == self.network_fault_token and self.running:
            self.cluster.heal()

    def _everything_but(self, nodes: list[str]) -> list[str]:
        return [endpoint for endpoint in self.cluster.all_endpoints() if endpoint not in nodes]

    def _split_group(self) -> bool:
        group = self.rng.choice(list(self.groups))
        nodes = self.groups[group]
        alone = self.rng.choice(nodes)
        self._cut([alone], [node for node in nodes if node != alone])
        return True

    def _isolate_member(self) -> bool:
        node_id = self.rng.choice(self.node_ids)
        self._cut([node_id], self._everything_but([node_id]))
        return True

    def _isolate_leader(self) -> bool:
        leader = self._leader(self.rng.choice(list(self.groups)))
        if leader is None:
            return False
        self._cut([leader], self._everything_but([leader]))
        return True

    def _split_groups(self) -> bool:
        first, second = self.rng.sample(self.shard_groups, 2)
        self._cut(self.groups[first], self.groups[second])
        return True

    def _cut_controller(self) -> bool:
        group = self.rng.choice(self.shard_groups)
        self._cut(self.groups[group], self.groups[CONTROLLER_GROUP])
        return True

    def _random_split(self) -> bool:
        shuffled = list(self.node_ids)
        self.rng.shuffle(shuffled)
        size = self.rng.randint(1, len(shuffled) // 2)
        self._cut(sorted(shuffled[:size]), sorted(shuffled[size:]))
        return True

    # --- pauses ---------------------------------------------------------------------------

    def _pausable(self, node_id: str) -> bool:
        """Up, not paused, and no other member of its group paused (keeps a majority)."""
        member = self.members[node_id]
        if not member.up or member.paused or len(self.paused) >= self.options.paused_max:
            return False
        group = self.group_of[node_id]
        return not any(self.group_of[other] == group for other in self.paused)

    def _pause(self, node_id: str) -> bool:
        if not self._pausable(node_id):
            return False
        self.paused.add(node_id)
        self.cluster.note(f"nemesis: pause {node_id}")
        self.members[node_id].pause()
        duration_ms = self.rng.randint(self.options.pause_ms_min, self.options.pause_ms_max)
        self.cluster.events.schedule(duration_ms, self._resume, node_id)
        return True

    def _resume(self, node_id: str) -> None:
        if node_id not in self.paused:
            return  # resumed by `stop` already
        self.paused.discard(node_id)
        self.cluster.note(f"nemesis: resume {node_id}")
        # A no-op if a scenario crash took the member down meanwhile (a crash ends a pause).
        self.members[node_id].resume()

    def _pause_any(self) -> bool:
        return self._pause(self.rng.choice(self.node_ids))

    def _pause_leader(self) -> bool:
        leader = self._leader(self.rng.choice(list(self.groups)))
        return leader is not None and self._pause(leader)


__all__ = [
    "FAULT_KINDS",
    "Pausable",
    "ShardNemesis",
    "ShardNemesisOptions",
    "ShardNemesisStats",
    "weights_for",
]
