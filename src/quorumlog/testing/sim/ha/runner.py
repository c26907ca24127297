"""Run controller-mode seeds: the seed's shape, faults, the final heal, the checks.

The timeline of one seed:

    [0, heal)          the producer produces; the shape's faults (or, for "random", a
                       seeded nemesis of crashes, pauses, partitions and mid-write halts of
                       brokers and controller nodes) happen at seeded times
    heal               every fault ends, every process is up
    [heal, +settle)    a master must be elected and every broker's log must equal its
                       master's; then the end checks (checks.py)

The shapes replay the RocketMQ bugs whose names they carry:

- "ack-lost-while-expanding" (apache/rocketmq #5663): the master's AlterSyncStateSet answers
  are lost while slaves join, then the master dies with its slaves trailing it (its links
  slowed by `lag_ms`);
- "controller-and-master-killed" (#7689): the controller's leader and the master die at once,
  the slaves trailing the master as above (so a master that acknowledged alone loses what
  it acknowledged: the checks catch it, tests/sim/test_ha_sim.py);
- "two-masters-after-partition" (#6316): the master is cut from the controller and the
  slaves, not from the producer; a new master is elected; the old one must acknowledge
  nothing more, then truncate its divergent tail when it comes back;
- "crash-mid-truncation" (#10666): the old master of the previous shape crashes (its disk
  halts it) in the middle of the truncation at its handshake, then restarts.

One shape runs only when asked (`run_seed(seed, shape="sync-failure")`), outside the seed %
5 rotation so that no existing seed moves:

- "sync-failure": a commit-log sync fails (EIO or a full disk) at the master or at a slave,
  or (by seed) that broker's disk fills, so its next write fails (an append, a truncation,
  an epoch). The broker must step out at once: `SYNC_FAILURE_CHECK_MS` later nothing waits on it, it
  is not master, another broker is, and produces were acknowledged since (a failed slave
  left the SyncStateSet). Then its disk has room again and it restarts (the operator, or a
  node reopening the log), and the usual end checks hold.
"""

from __future__ import annotations

import errno
import hashlib
import os
import time
import traceback
from collections.abc import Sequence

import msgspec

from quorumlog.storage.files import storage_error
from quorumlog.testing.sim.checks import InvariantViolation, check_invariant
from quorumlog.testing.sim.events import derive_random, draw_int
from quorumlog.testing.sim.ha.broker import LOG_PATH
from quorumlog.testing.sim.ha.checks import log_messages
from quorumlog.testing.sim.ha.world import HAWorld, HAWorldOptions
from quorumlog.testing.sim.network import NetworkFaults
from quorumlog.testing.sim.seed_runs import SeedRunSummary, format_seed_failure, map_seeds
from quorumlog.testing.sim.trace import TraceRecorder

SHAPES = (
    "random",
    "ack-lost-while-expanding",
    "controller-and-master-killed",
    "two-masters-after-partition",
    "crash-mid-truncation",
)
EXTRA_SHAPES = ("sync-failure",)
"""Shapes run only when asked (see the module docstring)."""
SYNC_FAILURE_CHECK_MS = 3_000
"""Time for a failed master's silence to elect another (the controller's broker timeout is
1 s here) or for a failed slave to leave the SyncStateSet (0.8 s), and for acks to resume."""
SETTLE_MS = 20_000
TRACE_TAIL_LINES = 60


class HAPlan(msgspec.Struct, frozen=True):
    shape: str
    world: HAWorldOptions
    heal_ms: int
    fault_ms: int
    """When the shape's fault happens (the random shape: when the nemesis starts)."""
    halt_operations: int
    """For crash-mid-truncation: disk changes allowed before the halt."""
    lag_ms: int = 200
    """For the #5663 and #7689 shapes: how far the slaves trail the master (its links slowed
    by this much) when it dies."""


class HASeedResult(msgspec.Struct):
    seed: int
    ok: bool
    shape: str = ""
    simulated_ms: int = 0
    wall_seconds: float = 0.0
    invariant_checks: int = 0
    produced: int = 0
    acknowledged: int = 0
    elections: int = 0
    handshakes: int = 0
    broker_crashes: int = 0
    final_messages: int = 0
    failure: str | None = None
    replay_command: str = ""
    trace_digest: str = ""
    trace_tail: list[str] = msgspec.field(default_factory=list)


def replay_command(seed: int, shape: str | None = None) -> str:
    if shape is not None and shape not in SHAPES:
        return (
            f"python -c 'from quorumlog.testing.sim.ha.runner import run_seed; "
            f"print(run_seed({seed}, shape={shape!r}))'"
        )
    return f"quorumlog sim ha --seeds {seed}-{seed}"


def plan_seed(seed: int, shape: str | None = None) -> HAPlan:
    """The seed's plan; `shape` replaces the rotation's (every other draw stays the same)."""
    if shape is not None and shape not in SHAPES + EXTRA_SHAPES:
        raise ValueError(f"unknown shape {shape!r}")
    rng = derive_random(seed, "ha-plan")
    shape = shape or SHAPES[seed % len(SHAPES)]
    network = NetworkFaults(
        delay_ms_min=1,
        delay_ms_max=rng.choice([2, 5, 10]),
        drop_probability=rng.choice([0.0, 0.0, 0.002]),
    )
    world = HAWorldOptions(
        network=network,
        link_break_probability=rng.choice([0.0, 0.0, 0.001]),
        produce_interval_ms=rng.choice([5, 10, 20]),
    )
    return HAPlan(
        shape=shape,
        world=world,
        heal_ms=rng.randint(7000, 9000),
        fault_ms=rng.randint(2500, 3500),
        halt_operations=rng.randint(0, 6),
        lag_ms=rng.randint(100, 400),
    )


class HASeed:
    def __init__(self, seed: int, plan: HAPlan, trace: TraceRecorder | None) -> None:
        self.seed = seed
        self.plan = plan
        self.world = HAWorld(seed, plan.world, trace)
        self.rng = derive_random(seed, "ha-nemesis")
        self.halted: set[str] = set()

    # --- running -----------------------------------------------------------------------

    def run(self) -> None:
        world, plan = self.world, self.plan
        world.start()
        world.events.schedule(1500, lambda _: world.start_producing())
        world.events.schedule(plan.fault_ms, self.fault)
        world.cluster.run_until_time(plan.heal_ms)
        self.heal()
        settled = world.cluster.run_until(self.converged, SETTLE_MS // world.cluster.tick_ms)
        world.stop_producing()
        world.cluster.run(ms=2000)
        settled = world.cluster.run_until(self.converged, SETTLE_MS // world.cluster.tick_ms)
        check_invariant(settled, f"no converged broker group {SETTLE_MS} ms after the heal")
        self.final_checks()

    def converged(self) -> bool:
        master = self.world.master()
        if master is None or master.log is None:
            return False
        for broker in self.world.brokers.values():
            host = broker.host
            if host is None or (host.slave is None and broker is not master):
                return False
            if broker.log is None or broker.log.max_offset != master.log.max_offset:
                return False
        return True

    def final_checks(self) -> None:
        world = self.world
        master = world.master()
        if master is None or master.log is None:
            raise InvariantViolation("no master at the end")
        world.checker.final_log(master.name, master.log)
        expected = log_messages(master.log)
        for broker in world.brokers.values():
            if broker.log is None or broker.epochs is None or master.epochs is None:
                continue
            world.checker.check(
                log_messages(broker.log) == expected,
                f"{broker.name}'s final log differs from master {master.name}'s",
            )
            world.checker.epochs_agree(
                broker.name, broker.epochs.entries, master.name, master.epochs.entries
            )

    # --- the shapes --------------------------------------------------------------------

    def fault(self, _: object) -> None:
        shape = self.plan.shape
        world = self.world
        master = world.master()
        world.note(f"fault {shape} (master {master.name if master else None})")
        if shape == "random":
            self.nemesis_step(None)
        elif master is None:
            world.events.schedule(200, self.fault)  # no master yet: try again a little later
        elif shape == "ack-lost-while-expanding":
            self.ack_lost_while_expanding(master.name)
        elif shape == "sync-failure":
            self.sync_failure(master.name)
        elif shape == "controller-and-master-killed":
            # Slaves trail the master by a slow link first, so a master that acknowledged
            # what they did not have loses it when it dies (the gap a real kill finds).
            world.slow_links_from(master.name, self.plan.lag_ms)
            world.events.schedule(self.plan.lag_ms * 2, self.kill_controller_and_master)
        else:
            self.two_masters(master.name, halt=shape == "crash-mid-truncation")

    def kill_controller_and_master(self, _: object) -> None:
        world = self.world
        master = world.master()
        leader = world.controller_leader()
        if leader is not None:
            world.cluster.crash(leader)
            world.events.schedule(1500, world.cluster.restart, leader)
        if master is not None:
            self.crash_broker(master.name, 2000)

    def ack_lost_while_expanding(self, master: str) -> None:
        """Restart a slave so it rejoins the SyncStateSet while the master's alter answers
        are lost, its links to the slaves slow (they trail it); then the master dies."""
        world = self.world
        slaves = sorted(name for name in world.brokers if name != master)
        self.crash_broker(slaves[0], 300)
        world.brokers[master].drop_alter_answers = True
        world.events.schedule(
            1500 - self.plan.lag_ms * 2,
            lambda _: world.slow_links_from(master, self.plan.lag_ms),
        )
        world.events.schedule(1500, lambda _: self.crash_broker(master, 1500))

    def two_masters(self, master: str, halt: bool) -> None:
        world = self.world
        world.isolate(master, keep=lambda other: other == "producer")

        def heal(_: object) -> None:
            broker = world.brokers[master]
            if halt:
                # The next disk changes at the old master are its handshake truncation.
                broker.disk.halt_after(self.plan.halt_operations)
                self.halted.add(master)
            world.heal_network()

        world.events.schedule(2500, heal)

    def sync_failure(self, master: str) -> None:
        world, rng = self.world, self.rng
        slaves = sorted(name for name in world.brokers if name != master)
        victim = master if rng.random() < 0.5 else rng.choice(slaves)
        code = rng.choice([errno.EIO, errno.ENOSPC])
        broker = world.brokers[victim]
        sync = rng.random() < 0.5
        if sync:
            broker.fail_next_sync = storage_error(LOG_PATH, OSError(code, os.strerror(code)))
            world.note(f"arm sync failure {victim} ({errno.errorcode[code]}; master {master})")
        else:
            broker.disk.bytes_max = broker.disk.bytes_used  # the next write that grows fails
            world.note(f"fill the disk of {victim} (master {master})")
        acknowledged = len(world.checker.acknowledged)
        world.events.schedule(
            SYNC_FAILURE_CHECK_MS, lambda _: self.stepped_out(victim, master, acknowledged, sync)
        )

    def stepped_out(self, victim: str, master: str, acknowledged_before: int, sync: bool) -> None:
        """`SYNC_FAILURE_CHECK_MS` after the fault was armed: see the module docstring."""
        world = self.world
        check = world.checker.check
        broker = world.brokers[victim]
        host = broker.host
        check(host is not None, f"{victim} is down")
        assert host is not None
        if sync:
            check(broker.syncs_failed == 1, f"{victim}'s armed sync never ran")
        else:
            check(host.sync_failed, f"{victim} with a full disk never failed a write")
        check(
            not host.pending,
            f"{victim} holds {len(host.pending)} produces {SYNC_FAILURE_CHECK_MS} ms after "
            "its sync failed",
        )
        check(not host.is_master, f"{victim} is still master after its sync failed")
        now_master = world.master()
        check(
            now_master is not None and now_master.name != victim,
            f"no master but the failed {victim} {SYNC_FAILURE_CHECK_MS} ms after its sync failed",
        )
        check(
            len(world.checker.acknowledged) > acknowledged_before,
            f"nothing acknowledged in the {SYNC_FAILURE_CHECK_MS} ms after {victim}'s sync "
            f"failed (master was {master})",
        )
        broker.disk.bytes_max = None  # room again (a full disk)
        self.crash_broker(victim, 300)  # the operator restarts it, or the node reopens it

    def crash_broker(self, name: str, down_ms: int) -> None:
        world = self.world
        broker = world.brokers[name]
        report = broker.crash(power_loss=self.rng.random() < 0.5)
        world.note(f"crash {name} {report!r}")
        world.events.schedule(down_ms, lambda _: broker.restart())

    def nemesis_step(self, _: object) -> None:
        world, rng = self.world, self.rng
        if world.now_ms >= self.plan.heal_ms - 1500:
            return
        fault_ms = draw_int(rng, 200, 1500)
        kind = rng.choice(["crash", "pause", "isolate", "controller", "halt", "master"])
        names = sorted(world.brokers)
        name = rng.choice(names)
        master = world.master()
        if kind == "master" and master is not None:
            name = master.name
            kind = rng.choice(["crash", "pause", "isolate"])
        broker = world.brokers[name]
        if kind == "crash" and broker.process.up:
            self.crash_broker(name, fault_ms)
        elif kind == "pause" and broker.process.up:
            broker.pause()
            world.note(f"pause {name}")
            world.events.schedule(fault_ms, lambda _: broker.resume())
        elif kind == "isolate":
            world.isolate(name)
            world.events.schedule(fault_ms, lambda _: world.heal_network())
        elif kind == "controller":
            node = rng.choice(sorted(world.cluster.nodes))
            world.cluster.crash(node)
            world.note(f"crash controller {node}")
            world.events.schedule(fault_ms, lambda _: world.cluster.restart(node))
        elif kind == "halt" and broker.process.up:
            broker.disk.halt_after(draw_int(rng, 0, 20))
            self.halted.add(name)
            world.note(f"arm halt {name}")
        world.events.schedule(draw_int(rng, 300, 1200), self.nemesis_step)

    def heal(self) -> None:
        world = self.world
        world.heal_network()
        for node_id in world.cluster.nodes:
            world.cluster.resume(node_id)
            world.cluster.restart(node_id)
        for broker in world.brokers.values():
            broker.disk.halt_after(None)
            broker.resume()
            broker.restart()
            broker.drop_alter_answers = False


# --- seeds ---------------------------------------------------------------------------


def run_seed(
    seed: int,
    *,
    trace: TraceRecorder | None = None,
    capture_trace: bool = True,
    shape: str | None = None,
) -> HASeedResult:
    """Run one seed (under `shape` if given, else the rotation's); on failure, run it again
    with tracing to capture the trace tail."""
    plan = plan_seed(seed, shape)
    started = time.perf_counter()
    runner = HASeed(seed, plan, trace)
    failure = None
    try:
        runner.run()
    except InvariantViolation as error:
        failure = f"{error}\n{runner.world.describe()}"
    except Exception:  # a crash of the code under test is a finding too, with its seed
        failure = traceback.format_exc() + runner.world.describe()
    world = runner.world
    result = HASeedResult(
        seed=seed,
        ok=failure is None,
        shape=plan.shape,
        simulated_ms=world.now_ms,
        wall_seconds=time.perf_counter() - started,
        invariant_checks=world.checker.checks,
        produced=world.produced,
        acknowledged=len(world.checker.acknowledged),
        elections=world.checker.elections,
        handshakes=world.checker.handshakes,
        broker_crashes=sum(broker.crashes for broker in world.brokers.values()),
        failure=failure,
        replay_command=replay_command(seed, shape),
    )
    if trace is not None:
        result.trace_digest = hashlib.sha256("\n".join(trace.lines).encode()).hexdigest()
    if failure is not None and capture_trace and trace is None:
        recorder = TraceRecorder()
        run_seed(seed, trace=recorder, capture_trace=False, shape=shape)
        result.trace_tail = recorder.tail(TRACE_TAIL_LINES)
    return result


class HARunSummary(SeedRunSummary[HASeedResult]):
    def world_figures(self) -> dict[str, object]:
        results = self.results
        return {
            "messages_acknowledged": sum(result.acknowledged for result in results),
            "elections": sum(result.elections for result in results),
            "handshakes": sum(result.handshakes for result in results),
            "broker_crashes": sum(result.broker_crashes for result in results),
        }


def run_seeds(seeds: Sequence[int], jobs: int = 1) -> HARunSummary:
    started = time.perf_counter()
    return HARunSummary.of(map_seeds(run_seed, seeds, jobs), started)


def format_failure(result: HASeedResult) -> str:
    return format_seed_failure(result, f"shape {result.shape}")
