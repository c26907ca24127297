"""Seeded fault schedules: partitions, one-way cuts, crashes, pauses, leader transfers and
membership changes, then a final heal.

The nemesis wakes at seeded intervals and injects one fault, which it undoes after a
seeded duration. It keeps at most `down_max` nodes crashed or paused at once (a minority
by default), so that the cluster can make progress whenever the network lets it, and at
most one network fault at a time (a new one replaces the last). `heal_all` ends every
fault for the final quiet period in which liveness is checked.

Two shapes in shapes.py are scripted in steps timed to protocol events: a membership
race (a promotion can become one, `membership_race_probability`) and a transfer that
cuts the old leader off once the target campaigns (the `transfer_then_cut` kind).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from quorumlog.raft.configuration import ChangeKind, MembershipChange
from quorumlog.testing.sim.shapes import MembershipRace, TransferThenCut

if TYPE_CHECKING:
    from quorumlog.testing.sim.cluster import SimCluster

FAULT_KINDS = (
    "partition",
    "isolate_leader",
    "cut",
    "crash",
    "crash_leader",
    "pause",
    "transfer",
    "membership",
    "transfer_then_cut",
    "crash_mid_write",
    "disk_full",
    "idle",
)
DISK_FULL_SLACK_BYTES = 2048
"""Room a filled disk keeps: a few small writes go through, then writes meet ENOSPC."""
CRASH_MID_WRITE_CHANGES_MAX = 24
"""A node armed to die mid-write does so within this many more disk changes: a few
Readies' worth, so the crash falls inside the persistence steps of one of them (between a
snapshot's save and the log's reset, a segment's roll and its meta file, ...)."""


class NemesisOptions(msgspec.Struct, frozen=True):
    interval_ms_min: int = 300
    interval_ms_max: int = 2500
    fault_ms_min: int = 200
    fault_ms_max: int = 4000
    weights: dict[str, int] = msgspec.field(
        default_factory=lambda: {
            "partition": 3,
            "isolate_leader": 3,
            "cut": 2,
            "crash": 3,
            "crash_leader": 2,
            "pause": 2,
            "transfer": 2,
            "membership": 0,
            "transfer_then_cut": 0,
            "crash_mid_write": 2,
            "disk_full": 0,
            "idle": 0,
        }
    )
    down_max: int | None = None
    """Nodes crashed or paused at once; None: a minority, (nodes - 1) // 2."""
    membership_retry_ms: int = 300
    membership_race_probability: float = 0.0
    """At each attempt to promote a learner, the chance to run it as a membership race
    (shapes.py); it needs four voters or more besides the learner."""
    race_isolate_removed_probability: float = 0.75
    """In a race, the chance that the member the new leader removes is cut off as well."""
    snapshot_halt_probability: float = 0.3
    """After each snapshot save on any node, the chance its disk halts the process a few
    changes later (testing/sim/disk.py): crashes inside a snapshot install."""
    watch_ms: int = 1
    """How often a scripted shape looks at the cluster: under one network delay, so it
    acts between a protocol event and the messages that follow it."""


class NemesisStats(msgspec.Struct):
    faults: dict[str, int] = msgspec.field(default_factory=dict)
    membership_cycles: int = 0
    race_changes: int = 0
    """Races in which the new leader's change was taken."""
    transfer_cuts: int = 0
    """Transfers whose target campaigned, so the old leader was cut off."""


class Nemesis:
    def __init__(self, cluster: SimCluster, options: NemesisOptions, rng: random.Random) -> None:
        self.cluster = cluster
        self.options = options
        self.rng = rng
        self.node_ids = sorted(cluster.nodes)
        self.down_max = (
            options.down_max if options.down_max is not None else (len(self.node_ids) - 1) // 2
        )
        self.kinds = [kind for kind in FAULT_KINDS if options.weights.get(kind, 0) > 0]
        self.kind_weights = [options.weights[kind] for kind in self.kinds]
        self.running = False
        self.network_fault_token = 0
        self.crashed: set[str] = set()
        self.paused: set[str] = set()
        self.membership_target: str | None = None
        self.membership_phase = ""
        self.membership_returns: list[str] = []
        """Members a race removed, to add back (one cycle each) when no cycle runs."""
        self.race: MembershipRace | None = None
        """The membership race under way: it owns the network and membership until done."""
        self.stats = NemesisStats()
        self.injectors: dict[str, Callable[[], bool]] = {
            "partition": self._inject_partition,
            "isolate_leader": self._inject_isolate_leader,
            "cut": self._inject_cut,
            "crash": self._inject_crash,
            "crash_leader": self._inject_crash_leader,
            "pause": self._inject_pause,
            "transfer": self._inject_transfer,
            "membership": self._inject_membership,
            "transfer_then_cut": self._inject_transfer_then_cut,
            "crash_mid_write": self._inject_crash_mid_write,
            "disk_full": self._inject_disk_full,
            "idle": self._inject_idle,
        }

    # --- schedule -----------------------------------------------------------------------

    def start(self) -> None:
        self.running = True
        for node_id in self.node_ids:
            self.cluster.nodes[
                node_id
            ].disk.snapshot_halt_probability = self.options.snapshot_halt_probability
        self._schedule_next()

    def _schedule_next(self) -> None:
        options = self.options
        delay_ms = self.rng.randint(options.interval_ms_min, options.interval_ms_max)
        self.cluster.events.schedule(delay_ms, self._step, None)

    def fault_ms(self) -> int:
        return self.rng.randint(self.options.fault_ms_min, self.options.fault_ms_max)

    def _step(self, _: object) -> None:
        if not self.running or not self.kinds:
            return
        self._adopt_halted_nodes()
        kind = self.rng.choices(self.kinds, self.kind_weights)[0]
        if self.injectors[kind]():
            self.stats.faults[kind] = self.stats.faults.get(kind, 0) + 1
        self._schedule_next()

    def heal_all(self) -> None:
        """Stop injecting; end every fault now; finish a membership cycle under way.

        The networks (Raft messages and client frames) keep their delays (and reordering)
        but stop dropping, duplicating and stalling messages: liveness is checked on a
        healed network, not a lossy one (the lossy one has had the whole fault phase to
        break safety)."""
        self.running = False
        self.network_fault_token += 1
        self.cluster.workload.end_idle()
        for node_id in self.node_ids:
            disk = self.cluster.nodes[node_id].disk
            disk.snapshot_halt_probability = 0.0
            disk.halt_after(None)
            disk.file_system.bytes_max = None
            disk.file_system.read_bit_flip_probability = 0.0  # liveness on healthy disks
            if not self.cluster.nodes[node_id].up:
                self.crashed.add(node_id)
        self.cluster.heal()
        self.cluster.set_network_faults(
            msgspec.structs.replace(
                self.cluster.network.faults,
                drop_probability=0.0,
                duplicate_probability=0.0,
                tail_probability=0.0,
            )
        )
        for node_id in sorted(self.crashed):
            self.cluster.nodes[node_id].disk.halt_after(None)  # an armed disk is disarmed
            self.cluster.restart(node_id)
        for node_id in sorted(self.paused):
            self.cluster.resume(node_id)
        self.crashed.clear()
        self.paused.clear()

    # --- network faults -----------------------------------------------------------------

    def network_fault(self) -> None:
        """A new network fault replaces the previous one; it heals after a while."""
        self.cluster.heal()
        self.network_fault_token += 1
        self.cluster.events.schedule(self.fault_ms(), self._heal_network, self.network_fault_token)

    def own_network(self) -> None:
        """Take the network over for a scripted shape: heal it, and void the heal timer
        of the last fault (the shape heals when it ends)."""
        self.network_fault_token += 1
        self.cluster.heal()

    def _heal_network(self, token: int) -> None:
        if token == self.network_fault_token and self.running:
            self.cluster.heal()

    def _inject_partition(self) -> bool:
        if self.race is not None:
            return False  # the race owns the network until it ends
        shuffled = list(self.node_ids)
        self.rng.shuffle(shuffled)
        minority_size = self.rng.randint(1, max(1, (len(shuffled) - 1) // 2))
        self.network_fault()
        self.cluster.partition([sorted(shuffled[:minority_size]), sorted(shuffled[minority_size:])])
        return True

    def _inject_isolate_leader(self) -> bool:
        leader = self.cluster.leader()
        if leader is None or self.race is not None:
            return False
        self.network_fault()
        self.cluster.isolate(leader)
        return True

    def _inject_cut(self) -> bool:
        if self.race is not None:
            return False
        self.network_fault()
        for _ in range(self.rng.randint(1, 3)):
            source, target = self.rng.sample(self.node_ids, 2)
            self.cluster.cut(source, target)
        return True

    # --- node faults --------------------------------------------------------------------

    def _down_count(self) -> int:
        return len(self.crashed) + len(self.paused)

    def _pick_up_node(self) -> str | None:
        candidates = [
            node_id
            for node_id in self.node_ids
            if node_id not in self.crashed and node_id not in self.paused
        ]
        return self.rng.choice(candidates) if candidates else None

    def _inject_crash(self, node_id: str | None = None) -> bool:
        if self._down_count() >= self.down_max:
            return False
        if node_id is None:
            node_id = self._pick_up_node()
        if node_id is None:
            return False
        self.crashed.add(node_id)
        self.cluster.crash(node_id)
        self.cluster.events.schedule(self.fault_ms(), self._restart, node_id)
        return True

    def _inject_disk_full(self) -> bool:
        """Fill a node's disk for a while: its writes meet ENOSPC and are retried; nothing
        is acknowledged that is not durable, and the group does not stop."""
        candidates = [node_id for node_id in self.node_ids if self.cluster.nodes[node_id].up]
        if not candidates:
            return False
        node_id = self.rng.choice(candidates)
        file_system = self.cluster.nodes[node_id].disk.file_system
        file_system.bytes_max = file_system.bytes_used + DISK_FULL_SLACK_BYTES
        self.cluster.events.schedule(self.fault_ms(), self._free_disk, node_id)
        return True

    def _inject_idle(self) -> bool:
        """The clients fall silent for a while: with quiet groups on, the group goes quiet,
        and the faults that follow (a crash or an isolation of its leader) hit it quiet."""
        self.cluster.workload.idle(self.fault_ms())
        return True

    def _free_disk(self, node_id: str) -> None:
        self.cluster.nodes[node_id].disk.file_system.bytes_max = None

    def _adopt_halted_nodes(self) -> None:
        """Nodes whose disk halted them are down: restart them after a fault's time."""
        for node_id in self.node_ids:
            if node_id not in self.crashed and not self.cluster.nodes[node_id].up:
                self.crashed.add(node_id)
                self.cluster.events.schedule(self.fault_ms(), self._restart_or_disarm, node_id)

    def _inject_crash_mid_write(self) -> bool:
        """Arm a node's disk to halt the process in the middle of a later change; it is
        counted down from now, and restarted (or disarmed, if it never wrote enough) after
        the fault's time."""
        if self._down_count() >= self.down_max:
            return False
        node_id = self._pick_up_node()
        if node_id is None:
            return False
        self.crashed.add(node_id)
        self.cluster.nodes[node_id].disk.halt_after(
            self.rng.randint(0, CRASH_MID_WRITE_CHANGES_MAX)
        )
        self.cluster.events.schedule(self.fault_ms(), self._restart_or_disarm, node_id)
        return True

    def _restart_or_disarm(self, node_id: str) -> None:
        self.cluster.nodes[node_id].disk.halt_after(None)
        self._restart(node_id)

    def _inject_crash_leader(self) -> bool:
        leader = self.cluster.leader()
        return leader is not None and self._inject_crash(leader)

    def _restart(self, node_id: str) -> None:
        if node_id in self.crashed:
            self.crashed.discard(node_id)
            self.cluster.restart(node_id)

    def _inject_pause(self) -> bool:
        if self._down_count() >= self.down_max:
            return False
        node_id = self._pick_up_node()
        if node_id is None:
            return False
        self.paused.add(node_id)
        self.cluster.pause(node_id)
        self.cluster.events.schedule(self.fault_ms(), self._resume, node_id)
        return True

    def _resume(self, node_id: str) -> None:
        if node_id in self.paused:
            self.paused.discard(node_id)
            self.cluster.resume(node_id)

    def _inject_transfer(self) -> bool:
        leader = self.cluster.leader()
        if leader is None or self.race is not None:
            return False
        voters = self.cluster.nodes[leader].core.configuration.voters
        targets = [voter for voter in voters if voter != leader]
        if not targets:
            return False
        return self.cluster.transfer_leadership(self.rng.choice(targets))

    # --- membership: remove a node, add it back as a learner, promote it ----------------

    def _inject_membership(self) -> bool:
        if self.membership_target is not None:
            return False
        self.membership_target = self.rng.choice(self.node_ids)
        self.membership_phase = "remove"
        self.stats.membership_cycles += 1
        self._drive_membership(None)
        return True

    def _drive_membership(self, _: object) -> None:
        """One step of the cycle at the current leader; retried until the cycle is done.

        Runs on after `heal_all` too, so every cycle ends with the node a voter again."""
        target = self.membership_target
        if target is None:
            return
        leader = self.cluster.leader()
        if leader is not None and self.race is None:
            # A change takes effect once in the log; the next one is refused until it
            # commits (ConfigurationChangeInProgressError), and a new leader's first one
            # until its term has an entry committed (LeaderNotReadyError), so retrying is
            # all it takes.
            configuration = self.cluster.nodes[leader].core.configuration
            if not self._maybe_race(leader, target):
                self._membership_step(target, configuration.voters, configuration.learners)
            if self.membership_target is None and self.membership_returns:
                # Bring back a member a race removed (a voter still: nothing to do).
                self.membership_target = self.membership_returns.pop(0)
                self.membership_phase = "add_learner"
                self.stats.membership_cycles += 1
            if self.membership_target is None:
                return
        self.cluster.events.schedule(self.options.membership_retry_ms, self._drive_membership)

    def _maybe_race(self, leader: str, target: str) -> bool:
        """On a seeded coin, promote `target` as a membership race (shapes.py)."""
        probability = self.options.membership_race_probability
        if (
            probability <= 0.0
            or self.membership_phase not in ("add_learner", "promote")
            or not MembershipRace.fits(self, leader, target)
            or self.rng.random() >= probability
        ):
            return False
        race = MembershipRace(self, leader, target)
        self.membership_phase = "promote"
        self.race = race
        if not race.start():
            self.race = None
            return False
        self.stats.faults["membership_race"] = self.stats.faults.get("membership_race", 0) + 1
        return True

    def _inject_transfer_then_cut(self) -> bool:
        leader = self.cluster.leader()
        if leader is None or self.race is not None:
            return False
        voters = self.cluster.nodes[leader].core.configuration.voters
        targets = [voter for voter in voters if voter != leader]
        if not targets:
            return False
        return TransferThenCut(self, leader, self.rng.choice(targets)).start()

    def _membership_step(
        self, target: str, voters: tuple[str, ...], learners: tuple[str, ...]
    ) -> None:
        phase = self.membership_phase
        if phase == "remove":
            if target in voters or target in learners:
                if len(voters) > 1:
                    self.cluster.change_membership(MembershipChange(ChangeKind.REMOVE, target))
                return
            self.membership_phase = phase = "add_learner"
        if phase == "add_learner":
            if target not in voters and target not in learners:
                self.cluster.change_membership(MembershipChange(ChangeKind.ADD_LEARNER, target))
                return
            self.membership_phase = phase = "promote"
        if phase == "promote":
            if target in learners:
                self.cluster.change_membership(MembershipChange(ChangeKind.PROMOTE_LEARNER, target))
                return
            if target in voters:
                self.membership_target = None
                self.membership_phase = ""
