"""Seeded random runs of master changes, crashes and partitions over the real cores.

Each step is drawn from one seed (a failure names it; the seed replays it). After every
step the invariants of reference 003 that the broker side owns are checked:

- after handshake a slave's log is a prefix of its master's;
- epoch files agree where they overlap (a slave's epochs that hold messages start where
  its master's do), and every message's epoch is the one its broker's epoch file names;
- every acknowledged message is in the current master's log, at its offset; no two
  masters ever acknowledge different messages at one offset (two masters after a
  partition, apache/rocketmq #6316);
- the MasterEpoch a broker works under never goes back (its epoch file's newest entry may:
  a slave drops a divergent epoch at handshake); a master's epoch file ends with its own
  epoch; no two live masters share a MasterEpoch.

The stand-in controller elects only from the SyncStateSet, preferring the most caught-up
live member, as the real one does. The run is bounded: SEEDS x STEPS.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from quorumlog.errors import MasterFencedError, NotEnoughReplicasError
from quorumlog.ha.commit_log import CommitLog
from quorumlog.ha.replication_actions import HAReplicationConfig
from quorumlog.ha.replication_slave import SlaveState

from .harness import Broker, Cluster

SEEDS = 12
STEPS = 120
BROKERS = ["b1", "b2", "b3"]
CONFIG = HAReplicationConfig(
    transfer_batch_bytes_max=700,
    inflight_bytes_max=2800,
    heartbeat_interval_ms=100,
    ha_max_time_slave_not_catch_up_ms=800,
    alter_retry_interval_ms=250,
    min_in_sync=2,
)


def messages_until(log: CommitLog, offset: int) -> list[tuple[int, bytes]]:
    """(epoch, message) of every message ending at or before `offset`."""
    found: list[tuple[int, bytes]] = []
    position = log.min_offset
    while position < offset and (batch := log.read_batch(position, 1)) is not None:
        if batch.end_offset > offset:
            break
        found.extend((batch.epoch, message) for message in batch.messages)
        position = batch.end_offset
    return found


class CheckedCluster(Cluster):
    def __init__(self, root: Path, seed: int) -> None:
        super().__init__(root, BROKERS, CONFIG, seed)
        self.acknowledged: list[tuple[int, bytes]] = []
        self.newest_epoch = dict.fromkeys(BROKERS, 0)
        self.produced = 0

    def on_acknowledged(self, broker: Broker, offset: int) -> None:
        super().on_acknowledged(broker, offset)
        prefix = messages_until(broker.log, offset)
        shorter, longer = sorted([prefix, self.acknowledged], key=len)
        assert longer[: len(shorter)] == shorter, (
            f"{broker.broker_id} acknowledged messages that differ from ones acknowledged before"
        )
        self.acknowledged = longer

    def live_master(self) -> Broker | None:
        master_id = self.controller.master_id
        if master_id is None:
            return None
        broker = self.brokers[master_id]
        alive = broker.alive and master_id not in self.isolated and broker.master is not None
        return broker if alive else None

    def elect_from_sync_state_set(self) -> None:
        """As the controller: the most caught-up live member of the SyncStateSet."""
        candidates = [
            self.brokers[member]
            for member in self.controller.sync_state_set
            if member != self.controller.master_id
            and self.brokers[member].alive
            and member not in self.isolated
        ]
        if candidates:
            best = max(candidates, key=lambda broker: (broker.log.max_offset, broker.broker_id))
            self.elect(best.broker_id)

    # --- invariants ---------------------------------------------------------------

    def check(self, where: str) -> None:
        live_epochs = [
            broker.master.master_epoch
            for broker in self.brokers.values()
            if broker.alive and broker.master is not None and not broker.master.fenced
        ]
        assert len(live_epochs) == len(set(live_epochs)), f"{where}: two masters, one epoch"
        for broker in self.brokers.values():
            if not broker.alive:
                continue
            core = broker.master or broker.slave
            if core is not None:  # the MasterEpoch a broker works under never goes back
                newest = core.master_epoch
                assert newest >= self.newest_epoch[broker.broker_id], f"{where}: epoch went back"
                self.newest_epoch[broker.broker_id] = newest
            if broker.master is not None:
                assert broker.epochs.last_epoch == broker.master.master_epoch, where
            self.check_own_epochs(broker, where)
        master = self.live_master()
        if master is None:
            return
        master_contents = master.contents()
        assert master_contents[: len(self.acknowledged)] == self.acknowledged, (
            f"{where}: master {master.broker_id} lost an acknowledged message"
        )
        for broker in self.brokers.values():
            slave = broker.slave
            if not broker.alive or slave is None or slave.state is not SlaveState.TRANSFER:
                continue
            contents = broker.contents()
            assert master_contents[: len(contents)] == contents, (
                f"{where}: {broker.broker_id}'s log is not a prefix of {master.broker_id}'s"
            )
            for epoch_range in broker.epochs.ranges(broker.log.max_offset):
                if epoch_range.end_offset > epoch_range.start_offset:
                    assert master.epochs.start_of(epoch_range.epoch) == epoch_range.start_offset, (
                        f"{where}: epoch files of {broker.broker_id} and {master.broker_id} "
                        f"disagree on epoch {epoch_range.epoch}"
                    )

    def check_own_epochs(self, broker: Broker, where: str) -> None:
        position = broker.log.min_offset
        while (batch := broker.log.read_batch(position, 1 << 20)) is not None:
            named = broker.epochs.epoch_at(batch.start_offset)
            assert named == batch.epoch, (
                f"{where}: {broker.broker_id} holds epoch {batch.epoch} at "
                f"{batch.start_offset}, its epoch file says {named}"
            )
            position = batch.end_offset

    # --- steps --------------------------------------------------------------------

    def step(self, rng: random.Random) -> str:
        choice = rng.random()
        if choice < 0.35:
            return self.produce_some(rng)
        if choice < 0.55:
            milliseconds = rng.choice([10, 100, 300, 900])
            self.advance(milliseconds)
            return f"advance {milliseconds} ms"
        if choice < 0.65:
            return self.crash_one(rng)
        if choice < 0.75:
            dead = [b for b in BROKERS if not self.brokers[b].alive]
            if dead:
                target = rng.choice(dead)
                self.restart(target)
                self.pump()
                return f"restart {target}"
            return "nothing to restart"
        if choice < 0.85:
            return self.partition_or_heal(rng)
        if choice < 0.93:
            self.elect_from_sync_state_set()
            self.pump()
            return f"admin election -> {self.controller.master_id}"
        self.alter_answers_lost = not self.alter_answers_lost
        return f"alter answers lost: {self.alter_answers_lost}"

    def produce_some(self, rng: random.Random) -> str:
        isolated_master = next(
            (
                broker
                for broker in self.brokers.values()
                if broker.broker_id in self.isolated and broker.alive and broker.master
            ),
            None,
        )
        target = isolated_master if isolated_master and rng.random() < 0.7 else self.live_master()
        if target is None or target.master is None:
            return "no master to produce to"
        count = rng.randint(1, 6)
        batch = [
            f"{self.produced + n}:".encode().ljust(rng.randint(8, 300), b"x") for n in range(count)
        ]
        self.produced += count
        try:
            target.master.append(batch)
            target.master.sync()
        except (NotEnoughReplicasError, MasterFencedError) as error:
            return f"produce to {target.broker_id} refused: {type(error).__name__}"
        self.pump()
        return f"produce {count} to {target.broker_id}"

    def crash_one(self, rng: random.Random) -> str:
        alive = [b for b in BROKERS if self.brokers[b].alive]
        if len(alive) <= 1:
            return "too few alive to crash one"
        target = rng.choice(alive)
        self.crash(target)
        if target == self.controller.master_id:
            self.elect_from_sync_state_set()
        self.pump()
        return f"crash {target}"

    def partition_or_heal(self, rng: random.Random) -> str:
        if self.isolated:
            target = sorted(self.isolated)[0]
            self.heal(target)
            self.pump()
            return f"heal {target}"
        target = rng.choice(BROKERS)
        self.isolate(target)
        if target == self.controller.master_id:  # the controller hears nothing: elects
            self.elect_from_sync_state_set()
        self.pump()
        return f"isolate {target}"


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_master_changes_keep_logs_and_epoch_files_consistent(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    cluster = CheckedCluster(tmp_path, seed)
    cluster.elect("b1")
    cluster.pump()
    history: list[str] = []
    for number in range(STEPS):
        history.append(cluster.step(rng))
        cluster.check(f"seed {seed}, step {number} ({history[-1]}); before: {history[-6:-1]}")
    elections = cluster.controller.master_epoch
    assert elections >= 1
    assert cluster.acknowledged or cluster.produced == 0
