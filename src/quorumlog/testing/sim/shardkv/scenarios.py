"""The shard KV lab's tests as seeded scenarios on the simulated deployment.

Each scenario is a function of a `ScenarioRun` (a cluster built from the seed's plan and a
seeded random stream). It asserts what it claims with `check_invariant`, and `finish` ends
every one the same way: heal, restart what is down, settle on the latest configuration,
read every key, then check linearizability of the whole recorded history, the append
tokens (no acknowledged write lost or applied twice), that replicas agree, and that no
group still stores a shard it gave away. Raft safety and the one-server-per-configuration
check run throughout.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from quorumlog.shard.config import shard_for_key
from quorumlog.shard.group_machine import ShardState
from quorumlog.testing.sim.checks import check_invariant
from quorumlog.testing.sim.events import derive_random
from quorumlog.testing.sim.network import NetworkFaults
from quorumlog.testing.sim.shardkv.checks import TOKEN_SEPARATOR, check_append_tokens
from quorumlog.testing.sim.shardkv.cluster import ShardCluster
from quorumlog.testing.sim.shardkv.nemesis import ShardNemesis
from quorumlog.testing.sim.shardkv.workload import Workload, WorkloadOptions

LINEARIZABILITY_STEPS_MAX = 1_000_000
UNAVAILABLE_TIMEOUT_MS = 2_000
"""How long an operation on an unavailable shard is tried before it is expected to fail."""

UNRELIABLE_FAULTS = NetworkFaults(
    delay_ms_min=1,
    delay_ms_max=20,
    tail_probability=0.02,
    tail_delay_ms_max=400,
    drop_probability=0.08,
    duplicate_probability=0.05,
)


KEYS_PER_SHARD = 2


def keys_covering_shards(shard_count: int, keys_per_shard: int) -> list[str]:
    """The first `keys_per_shard` keys "k0", "k1", ... of every shard, sorted by shard: a
    scenario that needs a key on a given shard always has one."""
    by_shard: dict[int, list[str]] = {shard: [] for shard in range(shard_count)}
    index = 0
    while any(len(keys) < keys_per_shard for keys in by_shard.values()):
        key = f"k{index}"
        index += 1
        keys = by_shard[shard_for_key(key, shard_count)]
        if len(keys) < keys_per_shard:
            keys.append(key)
    return [key for shard in range(shard_count) for key in by_shard[shard]]


class ScenarioRun:
    """One scenario's cluster, random stream, and the values its scripted writes expect."""

    def __init__(self, cluster: ShardCluster, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng
        self.expected: dict[str, str] = {}
        self.keys = keys_covering_shards(cluster.options.shard_count, KEYS_PER_SHARD)
        self.token_count = 0
        self.workload: Workload | None = None
        self.nemesis: ShardNemesis | None = None
        self.unknown_allowed = True
        self.linearizable: bool | None = None
        """The checker's verdict at the end: None if its search ran out of its budget."""

    def append(self, key: str, padding: str = "") -> None:
        """An acknowledged scripted append of a fresh token (with `padding` to make the
        value larger); remembered as expected."""
        self.token_count += 1
        token = f"s{self.token_count}{padding}{TOKEN_SEPARATOR}"
        self.cluster.append(key, token)
        self.expected[key] = self.expected.get(key, "") + token

    def append_all(self) -> None:
        for key in self.keys:
            self.append(key)

    def check_values(self, keys: list[str] | None = None) -> None:
        for key in keys if keys is not None else self.keys:
            value = self.cluster.get(key)
            check_invariant(
                value == self.expected.get(key),
                f"get {key!r} returned {value!r}, expected {self.expected.get(key)!r}",
            )

    def shard_of(self, key: str) -> int:
        return shard_for_key(key, self.cluster.options.shard_count)

    def keys_of_group(self, gid: int) -> list[str]:
        return [key for key in self.keys if self.cluster.owner_of_key(key) == gid]

    def expect_unavailable(self, key: str) -> None:
        status, _ = self.cluster.request("get", key, operation_timeout_ms=UNAVAILABLE_TIMEOUT_MS)
        check_invariant(status != "ok", f"get {key!r} succeeded on an unavailable shard")

    def start_workload(self, client_count: int = 3) -> Workload:
        clients = [
            self.cluster.new_client(f"worker{index}") for index in range(1, client_count + 1)
        ]
        workload = Workload(
            clients,
            events=self.cluster.events,
            rng=self.rng,
            options=WorkloadOptions(client_count=client_count, keys=tuple(self.keys[:6])),
        )
        workload.start()
        self.workload = workload
        return workload

    def start_nemesis(self) -> ShardNemesis:
        """Partitions and pauses from now until `finish`, on the nemesis's own random
        stream (this run's `rng` keeps drawing the scenario's choices as before)."""
        cluster = self.cluster
        nemesis = ShardNemesis(
            cluster, cluster.options.nemesis, derive_random(cluster.seed, "shardkv-nemesis")
        )
        nemesis.start()
        self.nemesis = nemesis
        return nemesis

    def stop_nemesis(self) -> None:
        if self.nemesis is not None:
            self.nemesis.stop()

    def stop_workload(self) -> None:
        workload = self.workload
        if workload is None:
            return
        workload.stop()
        self.cluster.run_until(lambda: workload.idle, 30_000)
        check_invariant(workload.idle, "workload clients still busy 30 s after stopping")

    def crash_some_member(self) -> None:
        """Crash one random member of one random group (or the controller) for a while."""
        cluster = self.cluster
        if self.rng.random() < 0.2:
            member = self.rng.choice(cluster.controller_members)
            member.crash()
            cluster.run(self.rng.randint(100, 1500))
            member.restart()
            return
        gid = self.rng.choice(list(cluster.members))
        shard_member = self.rng.choice(cluster.group_members(gid))
        shard_member.crash()
        cluster.run(self.rng.randint(100, 1500))
        shard_member.restart()


def finish(run: ScenarioRun) -> None:
    """Heal, restart, settle, read every key, and check the whole history."""
    cluster = run.cluster
    # Faults end before the clients drain: an operation still running then ends on a
    # healed deployment, and liveness is checked from here on.
    run.stop_nemesis()
    run.stop_workload()
    cluster.heal()
    cluster.set_faults(NetworkFaults())
    cluster.restart_controller()
    for gid in cluster.members:
        cluster.restart_group(gid)
    cluster.settle()
    final_values = {key: cluster.get(key) for key in run.keys}
    for key, value in run.expected.items():
        if run.workload is None:
            check_invariant(
                final_values[key] == value,
                f"final {key!r} is {final_values[key]!r}, expected {value!r}",
            )
    operations = cluster.history.operations()
    check_append_tokens(operations, final_values)
    verdict = cluster.check_linearizable(LINEARIZABILITY_STEPS_MAX)
    check_invariant(verdict.ok is not False, f"not linearizable: {verdict.explanation}")
    run.linearizable = verdict.ok
    cluster.run(500)  # followers catch up; replicas at one index must agree
    cluster.shard_checker.check_replicas_agree()
    cluster.shard_checker.check_storage_bounded()


# --- the scenarios ---------------------------------------------------------------------------


def static_shards(run: ScenarioRun) -> None:
    """Kill a whole group: exactly its shards become unavailable, the others keep serving."""
    cluster = run.cluster
    cluster.join(100, 101)
    run.append_all()
    down = run.keys_of_group(101)
    up = run.keys_of_group(100)
    check_invariant(bool(down) and bool(up), "both groups should own some test keys")
    cluster.crash_group(101)
    run.check_values(up)
    for key in down[:3]:
        run.expect_unavailable(key)
    cluster.restart_group(101)
    run.check_values()


def join_then_leave(run: ScenarioRun) -> None:
    """Groups join and leave one by one; every value survives every move."""
    cluster = run.cluster
    cluster.join(100)
    run.append_all()
    cluster.join(101)
    run.append_all()
    run.check_values()
    cluster.leave(100)
    run.append_all()
    run.check_values()
    cluster.join(102)
    cluster.join(100)
    cluster.leave(101)
    run.append_all()
    run.check_values()


def snapshots(run: ScenarioRun) -> None:
    """Restart every member of every group: state survives through snapshots and logs."""
    cluster = run.cluster
    cluster.join(100, 101, 102)
    members = [member for gid in cluster.members for member in cluster.group_members(gid)]
    for _ in range(20):
        run.append_all()
        if all(member.snapshots_taken > 0 for member in members if member.machine.owns(0)):
            break
    cluster.leave(101)
    run.append_all()
    cluster.join(101)
    run.check_values()
    cluster.crash_controller()
    for gid in cluster.members:
        cluster.crash_group(gid)
    cluster.run(200)
    cluster.restart_controller()
    for gid in cluster.members:
        cluster.restart_group(gid)
    run.check_values()
    check_invariant(
        sum(member.snapshots_taken for member in members) > 0, "no shard group took a snapshot"
    )
    check_invariant(
        sum(member.snapshots_restored for member in members) > 0,
        "no shard group member restored a snapshot",
    )


def missed_changes(run: ScenarioRun) -> None:
    """A group down while configurations change catches up one configuration at a time."""
    cluster = run.cluster
    cluster.join(100, 101, 102)
    run.append_all()
    cluster.crash_group(102)
    before = cluster.latest_configuration().number
    cluster.leave(100)
    cluster.join(100)
    cluster.leave(101)
    cluster.join(101)
    cluster.restart_group(102)
    seen: set[int] = set()

    def observe() -> bool:
        for member in cluster.group_members(102):
            if member.up:
                seen.add(member.machine.current_configuration.number)
        return cluster.settled()

    check_invariant(cluster.run_until(observe, 30_000), "group 102 did not catch up")
    latest = cluster.latest_configuration().number
    check_invariant(
        latest > before + 3,
        f"only {latest - before} configurations were made while group 102 was down",
    )
    run.check_values()
    run.append_all()
    run.check_values()


def concurrent_changes(run: ScenarioRun) -> None:
    """Concurrent clients while groups join, leave and shards move, with member crashes and
    a nemesis that partitions (within groups, between groups, from the controller, one way
    too) and pauses members."""
    cluster = run.cluster
    rng = run.rng
    cluster.join(100)
    run.start_workload()
    run.start_nemesis()
    cluster.run(500)
    steps: list[Callable[[], object]] = [
        lambda: cluster.join(101),
        lambda: cluster.join(102),
        lambda: cluster.leave(100),
        lambda: cluster.move(rng.randrange(cluster.options.shard_count), 102),
        lambda: cluster.join(100),
        lambda: cluster.leave(101),
        lambda: cluster.move(rng.randrange(cluster.options.shard_count), 100),
        lambda: cluster.join(101),
    ]
    for step in steps:
        step()
        cluster.run(rng.randint(200, 1200))
        if rng.random() < 0.4:
            run.crash_some_member()
    cluster.run(1000)


def unreliable_network(run: ScenarioRun) -> None:
    """Drops, duplicates and long delays everywhere, during joins, leaves and moves."""
    run.cluster.set_faults(UNRELIABLE_FAULTS)
    concurrent_changes(run)


def deleted_shards(run: ScenarioRun) -> None:
    """Shards that moved away are deleted from their old owner: storage stays bounded."""
    cluster = run.cluster
    cluster.join(100, 101, 102)
    for key in run.keys:
        run.append(key, padding="-" + "v" * 200)
    for gid in (100, 101, 102):
        cluster.leave(gid)
        cluster.join(gid)
    cluster.settle()
    cluster.shard_checker.check_storage_bounded()
    for gid in cluster.members:
        for member in cluster.group_members(gid):
            owned = sum(1 for key in run.keys if member.machine.owns(run.shard_of(key)))
            check_invariant(
                member.machine.stored_key_count() == owned,
                f"{member.node_id} stores {member.machine.stored_key_count()} keys, owns {owned}",
            )
    run.check_values()


def unaffected_shards(run: ScenarioRun) -> None:
    """A shard that is not moving keeps serving while another migrates from a group that is
    partitioned away."""
    cluster = run.cluster
    cluster.join(100, 101)
    run.append_all()
    moving_shard = run.shard_of(run.keys_of_group(100)[0])
    staying = [key for key in run.keys_of_group(101) if run.shard_of(key) != moving_shard]
    moving = [key for key in run.keys if run.shard_of(key) == moving_shard]
    cluster.partition_away(100)
    number = cluster.move(moving_shard, 101)

    def pulling() -> bool:
        leader = cluster.leader_of(101)
        return (
            leader is not None
            and leader.machine.current_configuration.number == number
            and leader.machine.shard_state(moving_shard) is ShardState.PULLING
        )

    cluster.run_until(pulling, 10_000)
    states = cluster.shard_states(101)
    check_invariant(
        states[moving_shard] is ShardState.PULLING,
        f"shard {moving_shard} should be PULLING at group 101, is {states[moving_shard]}",
    )
    for key in staying:
        run.append(key)
    run.check_values(staying)
    run.expect_unavailable(moving[0])
    cluster.heal()
    run.check_values()


def partial_migration(run: ScenarioRun) -> None:
    """A group pulling from two groups, one of them down, serves what the live one sent."""
    cluster = run.cluster
    cluster.join(100, 101)
    run.append_all()
    before = cluster.latest_configuration()
    cluster.crash_group(100)
    cluster.join(102)
    after = cluster.latest_configuration()
    from_live = [
        key
        for key in run.keys
        if before.shards[run.shard_of(key)] == 101 and after.shards[run.shard_of(key)] == 102
    ]
    from_down = [
        key
        for key in run.keys
        if before.shards[run.shard_of(key)] == 100 and after.shards[run.shard_of(key)] == 102
    ]
    check_invariant(bool(from_live) and bool(from_down), "group 102 should pull from both")
    run.check_values(from_live)
    for key in from_live:
        run.append(key)
    run.expect_unavailable(from_down[0])
    cluster.restart_group(100)
    run.check_values()


Scenario = Callable[[ScenarioRun], None]

SCENARIOS: dict[str, Scenario] = {
    "static_shards": static_shards,
    "join_then_leave": join_then_leave,
    "snapshots": snapshots,
    "missed_changes": missed_changes,
    "concurrent_changes": concurrent_changes,
    "unreliable_network": unreliable_network,
    "deleted_shards": deleted_shards,
    "unaffected_shards": unaffected_shards,
    "partial_migration": partial_migration,
}


__all__ = ["SCENARIOS", "Scenario", "ScenarioRun", "finish"]
