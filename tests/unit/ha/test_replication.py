"""The master and slave cores driven by a manual pump (tests/unit/ha/harness.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from quorumlog.errors import HAHandshakeRefusedError, MasterFencedError, NotEnoughReplicasError
from quorumlog.ha.commit_log import MmapCommitLog
from quorumlog.ha.epoch_file import EpochEntry, EpochFile
from quorumlog.ha.replication_actions import HAReplicationConfig
from quorumlog.ha.replication_master import MasterCore
from quorumlog.ha.replication_slave import SlaveCore, SlaveState
from quorumlog.ha.wire import Ack, HandshakeRequest, HandshakeResponse, TransferBatch
from quorumlog.testing.sim.filesystem import SimulatedCrash

from .harness import Cluster

CONFIG = HAReplicationConfig(
    transfer_batch_bytes_max=1024,
    inflight_bytes_max=4096,
    heartbeat_interval_ms=100,
    ha_max_time_slave_not_catch_up_ms=1000,
    alter_retry_interval_ms=300,
    min_in_sync=2,
)
BROKERS = ["b1", "b2", "b3"]


def messages(first: int, count: int, size: int = 90) -> list[bytes]:
    return [f"m{number:06d}".encode().ljust(size, b".") for number in range(first, first + count)]


def started(tmp_path: Path, config: HAReplicationConfig = CONFIG) -> Cluster:
    cluster = Cluster(tmp_path, BROKERS, config)
    cluster.elect("b1")
    cluster.pump()
    return cluster


def test_slaves_join_the_sync_state_set_and_produces_are_acknowledged(tmp_path: Path) -> None:
    cluster = started(tmp_path)
    assert cluster.controller.sync_state_set == ["b1", "b2", "b3"]
    end = cluster.produce(messages(0, 60))
    cluster.pump()
    assert cluster.acknowledged_offset == end == cluster.master_core().confirm_offset
    master = cluster.brokers["b1"].contents()
    assert len(master) == 60
    for slave_id in ("b2", "b3"):
        broker = cluster.brokers[slave_id]
        assert broker.contents() == master
        assert broker.epochs.entries == (EpochEntry(1, 0),)
        assert broker.slave is not None and broker.slave.confirm_offset <= end


def test_a_produce_is_refused_while_the_sync_state_set_is_below_min_in_sync(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path, BROKERS, CONFIG)
    for slave_id in ("b2", "b3"):
        cluster.isolate(slave_id)
    cluster.elect("b1")
    cluster.pump()
    with pytest.raises(NotEnoughReplicasError):
        cluster.produce(messages(0, 1))
    assert cluster.master.log.max_offset == 0  # nothing written
    cluster.heal("b2")
    cluster.pump()
    assert cluster.controller.sync_state_set == ["b1", "b2"]
    end = cluster.produce(messages(0, 1))
    cluster.pump()
    assert cluster.acknowledged_offset == end


def test_confirm_offset_waits_for_a_lagging_member_until_it_is_shrunk_away(
    tmp_path: Path,
) -> None:
    cluster = started(tmp_path)
    first_end = cluster.produce(messages(0, 10))
    cluster.pump()
    cluster.isolate("b3")
    second_end = cluster.produce(messages(10, 10))
    cluster.pump()
    assert cluster.acknowledged_offset == first_end  # b3, in the set, does not have the rest
    cluster.advance(CONFIG.ha_max_time_slave_not_catch_up_ms // 2)
    assert cluster.controller.sync_state_set == ["b1", "b2", "b3"]
    cluster.advance(CONFIG.ha_max_time_slave_not_catch_up_ms)
    assert cluster.controller.sync_state_set == ["b1", "b2"]
    assert cluster.acknowledged_offset == second_end
    cluster.heal("b3")  # it catches up, its ack reaches confirmOffset: it joins again
    cluster.pump()
    assert cluster.controller.sync_state_set == ["b1", "b2", "b3"]
    assert cluster.brokers["b3"].contents() == cluster.brokers["b1"].contents()


def test_an_idle_caught_up_slave_stays_in_the_set(tmp_path: Path) -> None:
    cluster = started(tmp_path)
    cluster.produce(messages(0, 3))
    epoch = cluster.controller.sync_state_set_epoch
    for _ in range(30):
        cluster.advance(CONFIG.heartbeat_interval_ms)
    assert cluster.controller.sync_state_set == ["b1", "b2", "b3"]
    assert cluster.controller.sync_state_set_epoch == epoch  # never shrunk and expanded again


def test_an_async_learner_replicates_but_never_joins(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, BROKERS, CONFIG)
    cluster.elect("b1")
    learner = cluster.brokers["b3"].slave
    assert learner is not None
    learner.async_learner = True
    cluster.pump()
    cluster.produce(messages(0, 20))
    cluster.advance(50)
    assert cluster.controller.sync_state_set == ["b1", "b2"]
    assert cluster.brokers["b3"].contents() == cluster.brokers["b1"].contents()


def test_batches_never_cross_an_epoch_boundary(tmp_path: Path) -> None:
    """b3 sleeps through two masters, then catches up: each epoch arrives in its own
    batches and b3 records each new epoch before its messages."""
    cluster = started(tmp_path)
    cluster.crash("b3")
    cluster.produce(messages(0, 5))
    cluster.pump()
    cluster.elect("b2")
    cluster.pump()
    cluster.produce(messages(5, 5))
    cluster.pump()
    batches: list[TransferBatch] = []
    cluster.restart("b3")
    slave = cluster.brokers["b3"].slave
    assert slave is not None
    original_receive = slave.receive

    def spy(frame: object) -> object:
        if isinstance(frame, TransferBatch) and frame.messages:
            batches.append(frame)
        return original_receive(frame)  # type: ignore[arg-type]

    slave.receive = spy  # type: ignore[method-assign, assignment]
    cluster.pump()
    master_epochs = cluster.brokers["b2"].epochs
    assert [batch.epoch for batch in batches] == [1, 2]
    for batch in batches:
        assert master_epochs.epoch_at(batch.start_offset) == batch.epoch
        assert master_epochs.start_of(batch.epoch) == batch.epoch_start_offset
    assert cluster.brokers["b3"].epochs.entries == master_epochs.entries
    assert cluster.brokers["b3"].contents() == cluster.brokers["b2"].contents()


def test_an_old_master_rejoining_as_slave_truncates_its_divergent_tail(tmp_path: Path) -> None:
    cluster = started(tmp_path)
    acked_end = cluster.produce(messages(0, 8))
    cluster.pump()
    cluster.isolate("b1")  # partitioned: it still takes writes no one acknowledges
    old_master = cluster.brokers["b1"].master
    assert old_master is not None
    old_master.append(messages(100, 6))
    old_master.sync()
    cluster.elect("b2")
    cluster.pump()
    cluster.produce(messages(8, 4))
    cluster.pump()
    assert old_master.acknowledged_offset == acked_end  # nothing of the divergent tail
    cluster.heal("b1")  # the controller's view fences it; it follows b2
    assert old_master.fenced
    with pytest.raises(MasterFencedError):
        old_master.append(messages(200, 1))
    cluster.pump()
    slave = cluster.brokers["b1"].slave
    assert slave is not None and slave.state is SlaveState.TRANSFER
    assert slave.last_truncation is not None
    assert slave.last_truncation[1] == acked_end  # cut where epoch 1 ended at b2
    assert cluster.brokers["b1"].contents() == cluster.brokers["b2"].contents()
    assert cluster.brokers["b1"].epochs.entries == cluster.brokers["b2"].epochs.entries


def test_an_ack_lost_while_the_set_expands_keeps_the_new_member_counted(tmp_path: Path) -> None:
    """apache/rocketmq #5663's shape: the controller applied an expansion whose answer was
    lost. The joiner may now be elected, so the master must not acknowledge past it."""
    cluster = Cluster(tmp_path, BROKERS, CONFIG)
    cluster.isolate("b3")
    cluster.elect("b1")
    cluster.pump()
    cluster.produce(messages(0, 5))
    cluster.pump()
    cluster.alter_answers_lost = True
    cluster.heal("b3")
    cluster.take_role(cluster.brokers["b3"])
    cluster.pump()  # b3 catches up; the expansion applies, its answer is lost
    assert cluster.controller.sync_state_set == ["b1", "b2", "b3"]
    assert cluster.master_core().sync_state_set == ["b1", "b2"]
    cluster.isolate("b3")
    cluster.produce(messages(5, 5))
    cluster.pump()
    b3_end = cluster.brokers["b3"].log.max_offset
    assert cluster.acknowledged_offset <= b3_end
    cluster.crash("b1")  # the controller may elect b3 now: every acknowledged message is there
    cluster.heal("b3")
    cluster.elect("b3")
    cluster.pump()
    assert cluster.brokers["b3"].log.max_offset >= cluster.acknowledged_offset


def diverged_behind_in_an_earlier_epoch(tmp_path: Path) -> Cluster:
    """b1 holds less of epoch 1 than b2, then a divergent epoch 2 of its own; b2 is master
    of epoch 3. b1's handshake must cut at the end of ITS epoch 1, below b2's."""
    cluster = Cluster(tmp_path, BROKERS, CONFIG)
    cluster.elect("b3")
    cluster.pump()
    cluster.produce(messages(0, 6))
    cluster.pump()
    cluster.isolate("b1")
    cluster.produce(messages(6, 6))  # b2 has these, b1 does not
    cluster.pump()
    cluster.crash("b3")
    cluster.isolate("b2")
    cluster.heal("b1")
    cluster.elect("b1")  # b1 was still in the set: the controller may choose it
    cluster.master_core().append(messages(100, 9))  # epoch 2, never acknowledged
    cluster.master_core().sync()
    cluster.isolate("b1")
    cluster.heal("b2")
    cluster.elect("b2")
    cluster.pump()
    cluster.produce(messages(12, 3))
    cluster.pump()
    return cluster


@pytest.mark.parametrize("crash_in", ["log-truncation", "epoch-file-truncation"])
def test_a_crash_in_the_middle_of_truncation_restarts_cleanly(
    tmp_path: Path, crash_in: str
) -> None:
    """apache/rocketmq #10666's shape: the slave dies in the middle of its truncation.
    The log is cut first: a crash at either step leaves a state the next handshake
    repairs. (Cut the epoch file first and the log-step crash leaves epoch 1 seeming to
    run over epoch 2's divergent messages; this test then fails.)"""
    cluster = diverged_behind_in_an_earlier_epoch(tmp_path)
    old = cluster.brokers["b1"]
    cut_at = old.epochs.start_of(2)
    if crash_in == "epoch-file-truncation":
        old.disk.halt_after(0)  # the epoch file's first write after the log's cut
    else:

        def dies(offset: int) -> None:
            raise SimulatedCrash(f"in truncate({offset})")

        old.log.truncate = dies  # type: ignore[method-assign]
    with pytest.raises(SimulatedCrash):
        cluster.heal("b1")
        cluster.pump()
    cluster.crash("b1")
    cluster.restart("b1")
    cluster.pump()
    slave = old.slave
    assert slave is not None and slave.last_truncation is not None
    assert slave.last_truncation[1] == cut_at
    assert old.contents() == cluster.brokers["b2"].contents()
    assert old.epochs.entries == cluster.brokers["b2"].epochs.entries


def test_a_slave_that_knows_a_newer_epoch_fences_the_master_it_reaches(tmp_path: Path) -> None:
    cluster = started(tmp_path)
    master = cluster.master_core()
    master.receive(99, HandshakeRequest("b9", "b9:0", False, 5, 2048), cluster.now_ms)
    answer = master.take_actions(cluster.now_ms).sends[-1].frame
    assert isinstance(answer, HandshakeResponse) and answer.refused is not None
    assert master.fenced


def test_different_layouts_are_refused_at_handshake(tmp_path: Path) -> None:
    cluster = started(tmp_path)
    master = cluster.master_core()
    master.receive(98, HandshakeRequest("b9", "b9:0", False, 1, 4096), cluster.now_ms)
    answer = master.take_actions(cluster.now_ms).sends[-1].frame
    assert isinstance(answer, HandshakeResponse) and "layouts differ" in str(answer.refused)
    log = MmapCommitLog.open(tmp_path / "b9", data_file_bytes=4096, index_file_bytes=4096)
    slave = SlaveCore(
        broker_id="b9",
        address="b9:0",
        master_id="b1",
        master_epoch=1,
        commit_log=log,
        epoch_file=EpochFile(tmp_path / "b9-epochs"),
    )
    slave.connect()
    with pytest.raises(HAHandshakeRefusedError):
        slave.receive(answer)


def test_a_new_master_records_its_epoch_durably_before_taking_writes(tmp_path: Path) -> None:
    cluster = started(tmp_path)
    cluster.produce(messages(0, 4))
    cluster.pump()
    end = cluster.brokers["b2"].log.max_offset
    cluster.elect("b2")
    assert cluster.brokers["b2"].epochs.entries == (EpochEntry(1, 0), EpochEntry(2, end))
    durable = cluster.brokers["b2"].disk.durable_file_contents()
    assert (
        "/b2/epochs" in durable
        and durable["/b2/epochs"] == (cluster.brokers["b2"].disk.file_contents()["/b2/epochs"])
    )


def test_acks_beyond_what_was_sent_break_the_connection(tmp_path: Path) -> None:
    cluster = started(tmp_path)
    master: MasterCore = cluster.master_core()
    link_id = next(iter(cluster.links))
    master.receive(link_id, Ack(10**9), cluster.now_ms)
    assert [d.connection_id for d in master.take_actions(cluster.now_ms).disconnects] == [link_id]
