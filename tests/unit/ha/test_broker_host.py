"""BrokerHost: roles from the controller's view, produce acknowledgement by the SyncStateSet,
failover to a SyncStateSet member, and an old master truncating at handshake."""

from __future__ import annotations

from pathlib import Path

import pytest

from quorumlog.errors import MasterFencedError, NotEnoughReplicasError
from quorumlog.ha.wire import HAFrame, TransferBatch
from quorumlog.runtime.completion import Completion
from quorumlog.storage.mmap_sync import CapturedSync

from .broker_harness import GROUP, BrokerCluster

BROKERS = ["b1", "b2", "b3"]


def started(tmp_path: Path, min_in_sync: int = 2) -> BrokerCluster:
    cluster = BrokerCluster(tmp_path, BROKERS, min_in_sync=min_in_sync)
    for broker_id in BROKERS:
        cluster.brokers[broker_id].start()
        cluster.run(0.05)  # b1 registers first: the first broker of a group is its master

    def full_set() -> bool:
        info = cluster.controller.machine.group_info(GROUP)
        return info is not None and len(info.sync_state_set) == len(BROKERS)

    cluster.run_until(full_set)
    return cluster


def produce(cluster: BrokerCluster, broker_id: str, message: bytes) -> Completion[int]:
    return cluster.host(broker_id).produce([message])


def test_first_broker_is_master_and_slaves_join_the_sync_state_set(tmp_path: Path) -> None:
    cluster = started(tmp_path)
    assert cluster.master_id() == "b1"
    assert cluster.host("b1").is_master
    assert [cluster.host(b).status().role for b in BROKERS] == ["master", "slave", "slave"]
    info = cluster.controller.machine.group_info(GROUP)
    assert info is not None and info.sync_state_set == BROKERS


def test_produce_is_acknowledged_once_every_member_has_it(tmp_path: Path) -> None:
    cluster = started(tmp_path)
    done = [produce(cluster, "b1", f"m{number}".encode()) for number in range(20)]
    cluster.run_until(lambda: all(completion.done() for completion in done))
    ends = [completion.result() for completion in done]
    assert ends == sorted(ends)
    for broker_id in BROKERS:
        assert cluster.brokers[broker_id].messages() == [f"m{n}".encode() for n in range(20)]
        assert cluster.brokers[broker_id].log.max_offset >= ends[-1]
    assert cluster.host("b1").confirm_offset == ends[-1]


def test_produce_waits_while_a_member_is_behind(tmp_path: Path) -> None:
    cluster = started(tmp_path)
    cluster.network.isolate("b3:7000")
    waiting = produce(cluster, "b1", b"held")
    cluster.run(0.5)
    assert not waiting.done()  # b3 is still in the SyncStateSet and does not have it
    cluster.run_until(waiting.done)  # until b3 leaves the set (not caught up for 2 s)
    info = cluster.controller.machine.group_info(GROUP)
    assert info is not None and "b3" not in info.sync_state_set
    assert waiting.result() == cluster.brokers["b1"].log.max_offset


def test_produce_elsewhere_and_below_min_in_sync_is_refused(tmp_path: Path) -> None:
    cluster = started(tmp_path, min_in_sync=3)
    refused = produce(cluster, "b2", b"x")
    cluster.run(0.05)
    assert isinstance(refused.exception(), MasterFencedError)
    assert cluster.host("b2").master_address == "b1:7000"
    cluster.network.isolate("b3:7000")
    cluster.run_until(lambda: len(cluster.host("b1").status().epochs) == 1 and _shrunk(cluster))
    too_few = produce(cluster, "b1", b"y")
    cluster.run(0.05)
    assert isinstance(too_few.exception(), NotEnoughReplicasError)


def _shrunk(cluster: BrokerCluster) -> bool:
    info = cluster.controller.machine.group_info(GROUP)
    return info is not None and len(info.sync_state_set) == 2


def test_master_stopped_a_member_takes_over_and_nothing_acknowledged_is_lost(
    tmp_path: Path,
) -> None:
    cluster = started(tmp_path)
    done = [produce(cluster, "b1", f"a{number}".encode()) for number in range(10)]
    cluster.run_until(lambda: all(completion.done() for completion in done))
    acknowledged = [f"a{number}".encode() for number in range(10)]
    cluster.brokers["b1"].stop()
    cluster.run_until(lambda: cluster.master_id() in ("b2", "b3"))
    new_master = cluster.master_id()
    assert new_master is not None
    cluster.run_until(lambda: cluster.host(new_master).is_master and _shrunk(cluster))
    after = produce(cluster, new_master, b"after")
    cluster.run_until(after.done)
    assert after.result() > 0
    for broker_id in ("b2", "b3"):
        assert cluster.brokers[broker_id].messages() == [*acknowledged, b"after"]
    info = cluster.controller.machine.group_info(GROUP)
    assert info is not None and info.master_epoch == 2
    assert [entry.epoch for entry in cluster.host(new_master).status().epochs] == [1, 2]


def test_restarted_old_master_truncates_its_unacknowledged_tail(tmp_path: Path) -> None:
    cluster = started(tmp_path)
    first = produce(cluster, "b1", b"kept")
    cluster.run_until(first.done)
    # b1 is cut off from its slaves (and the controller) and writes a tail nobody has.
    cluster.network.isolate("b1:7000")
    cluster.controller.unreachable.add("b1")
    lost = [produce(cluster, "b1", f"tail{number}".encode()) for number in range(5)]
    cluster.run(0.1)
    assert not any(completion.done() for completion in lost)
    assert len(cluster.brokers["b1"].messages()) == 6
    cluster.run_until(lambda: cluster.master_id() in ("b2", "b3"))
    new_master = cluster.master_id()
    assert new_master is not None
    cluster.brokers["b1"].stop()
    assert all(isinstance(completion.exception(), MasterFencedError) for completion in lost)
    cluster.run_until(lambda: _members(cluster, new_master) == 2)
    after = produce(cluster, new_master, b"new")
    cluster.run_until(after.done)
    assert after.result() > 0

    cluster.network.cut.clear()
    cluster.controller.unreachable.clear()
    cluster.brokers["b1"].start()
    old = cluster.brokers["b1"]
    cluster.run_until(lambda: old.messages() == [b"kept", b"new"])
    assert old.truncated_to[0] == cluster.brokers[new_master].epochs.entries[-1].start_offset
    assert cluster.host("b1").status().role == "slave"
    assert cluster.host("b1").truncations == 1
    assert [entry.epoch for entry in old.epochs.entries] == [1, 2]


def test_alter_answers_lost_still_settle(tmp_path: Path) -> None:
    cluster = BrokerCluster(tmp_path, BROKERS)
    cluster.controller.answers_lost = False
    for broker_id in BROKERS:
        cluster.brokers[broker_id].start()
        cluster.run(0.05)
    cluster.controller.answers_lost = True  # every answer lost: heartbeats, alters
    cluster.run(1.0)
    cluster.controller.answers_lost = False
    cluster.run_until(lambda: cluster.host("b1").status().role == "master" and _full(cluster))
    done = produce(cluster, "b1", b"x")
    cluster.run_until(done.done)
    assert done.result() > 0


def _full(cluster: BrokerCluster) -> bool:
    master = cluster.host("b1").master
    return master is not None and len(master.sync_state_set) == len(BROKERS)


@pytest.mark.parametrize("broker_id", ["b2"])
def test_admin_switch_over_moves_the_master(tmp_path: Path, broker_id: str) -> None:
    from quorumlog.ha.controller_model import ElectMaster

    cluster = started(tmp_path)
    first = produce(cluster, "b1", b"one")
    cluster.run_until(first.done)
    result = cluster.controller.run(ElectMaster(GROUP, broker_id=broker_id, sequence=10_000))
    assert result.ok
    cluster.run_until(
        lambda: cluster.host(broker_id).is_master and not cluster.host("b1").is_master
    )
    cluster.run_until(lambda: _members(cluster, broker_id) == 3)
    second = produce(cluster, broker_id, b"two")
    cluster.run_until(second.done)
    for other in BROKERS:
        cluster.run_until(lambda other=other: len(cluster.brokers[other].messages()) == 2)


def _members(cluster: BrokerCluster, broker_id: str) -> int:
    master = cluster.host(broker_id).master
    return 0 if master is None else len(master.sync_state_set)


def test_the_master_replicates_a_produce_before_it_syncs_it(tmp_path: Path) -> None:
    """The slaves write their disks while the master writes its own (one fsync less on the
    path of a produce); the acknowledgement still waits for the master's sync."""
    cluster = started(tmp_path)
    master = cluster.host("b1")
    log = cluster.brokers["b1"].log
    events: list[str] = []
    acknowledged_at_sync: list[int] = []
    send, begin_sync = master.links.send, log.begin_sync

    def recording_send(connection_id: int, frame: HAFrame) -> None:
        if isinstance(frame, TransferBatch) and frame.messages:
            events.append("transfer")
        send(connection_id, frame)

    def recording_begin_sync() -> CapturedSync:
        events.append("sync")
        acknowledged_at_sync.append(master.acknowledged_offset)
        return begin_sync()

    master.links.send = recording_send  # type: ignore[method-assign]
    log.begin_sync = recording_begin_sync  # type: ignore[method-assign]
    done = produce(cluster, "b1", b"m")
    cluster.run_until(done.done)
    assert events[:3] == ["transfer", "transfer", "sync"]
    assert acknowledged_at_sync[0] < done.result()
