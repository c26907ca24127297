"""Unit tests of the simulator's parts: event queue, network, disk."""

from __future__ import annotations

import random

import pytest

from quorumlog.raft.configuration import Configuration
from quorumlog.raft.messages import Push, PushKind, SnapshotMeta, VoteRequest
from quorumlog.raft.ready import HardState
from quorumlog.storage.entry import LogEntry
from quorumlog.testing.sim.checks import SimulationError
from quorumlog.testing.sim.disk import SimDisk
from quorumlog.testing.sim.events import EventQueue, derive_random
from quorumlog.testing.sim.filesystem import SimulatedCrash
from quorumlog.testing.sim.network import NetworkFaults, SimNetwork


def entries(low: int, high: int, term: int = 1) -> list[LogEntry]:
    return [LogEntry(index, term, f"e{index}".encode()) for index in range(low, high + 1)]


# --- events ---------------------------------------------------------------------------


def test_events_run_in_time_order_and_ties_in_scheduling_order() -> None:
    events = EventQueue()
    seen: list[str] = []
    events.schedule(5, seen.append, "b")
    events.schedule(1, seen.append, "a")
    events.schedule(5, seen.append, "c")
    events.schedule(0, seen.append, "now")
    while events.run_next():
        pass
    assert seen == ["now", "a", "b", "c"]
    assert events.now_ms == 5
    assert events.events_run == 4


def test_events_refuse_the_past() -> None:
    with pytest.raises(SimulationError):
        EventQueue().schedule(-1, print)


def test_derived_streams_are_fixed_by_seed_and_name() -> None:
    assert derive_random(7, "network").random() == derive_random(7, "network").random()
    assert derive_random(7, "network").random() != derive_random(7, "disk").random()
    assert derive_random(7, "network").random() != derive_random(8, "network").random()


# --- network --------------------------------------------------------------------------


def heartbeat(source: str, target: str, term: int = 1) -> Push:
    return Push(source=source, target=target, term=term, kind=PushKind.COMMIT, round=1)


def make_network(faults: NetworkFaults, seed: int = 1) -> tuple[EventQueue, SimNetwork, list]:
    events = EventQueue()
    delivered: list = []
    receivers = {node_id: delivered.append for node_id in ("n1", "n2", "n3")}
    network = SimNetwork(events, random.Random(seed), faults, receivers)
    return events, network, delivered


def drain(events: EventQueue) -> None:
    while events.run_next():
        pass


def test_network_delivers_a_decoded_copy_within_the_delay_bounds() -> None:
    events, network, delivered = make_network(NetworkFaults(delay_ms_min=3, delay_ms_max=7))
    message = VoteRequest(source="n1", target="n2", term=3, last_log_index=4, last_log_term=2)
    network.send(message)
    drain(events)
    assert delivered == [message]
    assert delivered[0] is not message
    assert 3 <= events.now_ms <= 7


def test_network_partition_and_one_way_cut_drop_only_what_crosses_them() -> None:
    events, network, delivered = make_network(NetworkFaults())
    network.partition([["n1"], ["n2", "n3"]])
    network.cut("n2", "n3")
    for source, target in [("n1", "n2"), ("n2", "n1"), ("n2", "n3"), ("n3", "n2")]:
        network.send(heartbeat(source, target))
    drain(events)
    assert [(m.source, m.target) for m in delivered] == [("n3", "n2")]
    network.heal()
    network.send(heartbeat("n1", "n2"))
    drain(events)
    assert (delivered[-1].source, delivered[-1].target) == ("n1", "n2")


def test_network_drops_messages_in_flight_when_the_link_is_cut() -> None:
    events, network, delivered = make_network(NetworkFaults(delay_ms_min=10, delay_ms_max=10))
    network.send(heartbeat("n1", "n2"))
    network.cut("n1", "n2")
    drain(events)
    assert delivered == []
    assert network.stats.dropped_blocked == 1


def test_network_drops_duplicates_and_reorders_by_seed() -> None:
    faults = NetworkFaults(
        delay_ms_min=1, delay_ms_max=30, drop_probability=0.2, duplicate_probability=0.2
    )
    events, network, delivered = make_network(faults, seed=3)
    for term in range(1, 201):
        network.send(heartbeat("n1", "n2", term))
    drain(events)
    terms = [message.term for message in delivered]
    assert network.stats.dropped_random > 0
    assert network.stats.duplicated > 0
    assert len(terms) == 200 - network.stats.dropped_random + network.stats.duplicated
    assert terms != sorted(terms)
    _, network_again, delivered_again = make_network(faults, seed=3)
    for term in range(1, 201):
        network_again.send(heartbeat("n1", "n2", term))
    drain(network_again.events)
    assert [message.term for message in delivered_again] == terms


def test_network_faults_are_validated() -> None:
    with pytest.raises(ValueError):
        NetworkFaults(delay_ms_min=5, delay_ms_max=1).validate()
    with pytest.raises(ValueError):
        NetworkFaults(drop_probability=1.5).validate()


# --- disk -----------------------------------------------------------------------------


def test_disk_crash_loses_unsynced_entries_and_keeps_the_saved_hard_state() -> None:
    disk = SimDisk()
    disk.store.append(entries(1, 3))
    disk.store.sync()
    disk.hard_state.save(HardState(term=1, vote="n1", commit=2))
    disk.store.append(entries(4, 6))
    report = disk.crash(random.Random(1), torn_tail_probability=0.0)
    assert disk.store.last_index == 3
    assert disk.durable_hard_state == HardState(term=1, vote="n1", commit=2)
    assert report.entries_lost == 3


def test_disk_crash_may_keep_a_prefix_of_the_unsynced_tail_but_never_a_gap() -> None:
    last_indexes = set()
    for seed in range(40):
        disk = SimDisk()
        disk.store.append(entries(1, 2))
        disk.store.sync()
        for index in range(3, 9):
            disk.store.append(entries(index, index))  # one write each: each may tear
        disk.crash(random.Random(seed), torn_tail_probability=1.0)
        last = disk.store.last_index
        assert 2 <= last <= 8
        assert [e.index for e in disk.store.entries(1, last + 1)] == list(range(1, last + 1))
        last_indexes.add(last)
    assert len(last_indexes) > 3


def test_disk_truncation_is_durable() -> None:
    disk = SimDisk()
    disk.store.append(entries(1, 5))
    disk.store.sync()
    disk.store.truncate_suffix(3)
    disk.store.append(entries(4, 4, term=2))
    disk.crash(random.Random(1), torn_tail_probability=0.0)
    assert disk.store.last_index == 3
    assert disk.store.term(3) == 1


def test_disk_snapshot_save_and_reset_are_durable_at_once() -> None:
    disk = SimDisk()
    disk.store.append(entries(1, 10))
    disk.store.sync()
    meta = SnapshotMeta(index=20, term=3, configuration=Configuration(voters=("n1",)))
    disk.snapshots.save(meta, b"new")
    disk.store.reset(21)
    assert (disk.store.first_index, disk.store.last_index) == (21, 20)
    disk.crash(random.Random(1), torn_tail_probability=1.0)
    assert disk.snapshot is not None and disk.snapshot.data == b"new"
    assert (disk.store.first_index, disk.store.last_index) == (21, 20)


def test_a_halted_disk_stops_the_process_between_two_persistence_steps() -> None:
    disk = SimDisk()
    disk.store.append(entries(1, 10))
    disk.store.sync()
    meta = SnapshotMeta(index=12, term=3, configuration=Configuration(voters=("n1",)))
    disk.snapshots.save(meta, b"installed")
    disk.halt_after(0)
    with pytest.raises(SimulatedCrash):
        disk.store.reset(13)
    disk.crash(random.Random(1), torn_tail_probability=0.0)
    # The snapshot is durable, the reset never happened: the state defect 4 has to repair.
    assert disk.snapshot is not None and disk.snapshot.meta.index == 12
    assert (disk.store.first_index, disk.store.last_index) == (1, 10)


def test_network_fifo_links_keep_send_order_per_link() -> None:
    faults = NetworkFaults(delay_ms_min=1, delay_ms_max=30, fifo_links=True)
    events, network, delivered = make_network(faults, seed=3)
    for term in range(1, 101):
        network.send(heartbeat("n1", "n2", term))
        network.send(heartbeat("n2", "n1", term))
    drain(events)
    for source in ("n1", "n2"):
        terms = [message.term for message in delivered if message.source == source]
        assert terms == list(range(1, 101))
