"""Events derived from what a host sees: each logged once, with group, term and index;
nothing per entry. Run on a real one-node host (manual clock, simulated disk)."""

from __future__ import annotations

import logging
import random

import pytest

from quorumlog.obs.events import EventLog, GroupObserver
from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import ChangeKind, Configuration, MembershipChange
from quorumlog.runtime.host import HostSettings, RaftHost
from quorumlog.testing.manual import InlineBackground, ManualScheduler
from quorumlog.testing.sim.disk import SimDisk
from tests.unit.runtime.test_group import ListMachine


def observed_node(slow_sync_seconds: float = 1.0) -> tuple[RaftHost, EventLog, ManualScheduler]:
    scheduler = ManualScheduler()
    events = EventLog("n1")
    observer = GroupObserver("g", events, slow_sync_seconds)
    disk = SimDisk()
    host = RaftHost(
        "g",
        RaftConfig(node_id="n1"),
        store=disk.store,
        hard_state=disk.hard_state,
        snapshots=disk.snapshots,
        machine=ListMachine(),
        send=lambda message: None,
        bootstrap=Configuration(voters=("n1",)),
        scheduler=scheduler,
        background=InlineBackground(scheduler),
        random_source=random.Random(1),
        settings=HostSettings(tick_seconds=1.0),
        hooks=observer,
    )
    observer.attach(host.core)
    host.start()
    for _ in range(2 * host.core.config.election_ticks + 1):
        if host.is_leader:
            break
        scheduler.advance(1.0)
    scheduler.run_until_idle()
    return host, events, scheduler


def kinds(events: EventLog) -> list[str]:
    return [event.kind for event in reversed(events.newest(1000))]


def test_an_election_is_logged_once_with_group_and_term() -> None:
    host, events, _ = observed_node()
    assert host.is_leader
    assert kinds(events) == ["term_changed", "became_leader", "leader_changed"]
    elected = events.newest(1000)[1]
    assert (elected.group, elected.term) == ("g", host.core.term)
    observer = host.hooks
    assert isinstance(observer, GroupObserver)
    assert observer.leader_changes_seen == 1


def test_entries_make_no_events() -> None:
    host, events, scheduler = observed_node()
    before = kinds(events)
    for number in range(50):
        host.propose(b"entry %d" % number)
        scheduler.run_until_idle()
    assert kinds(events) == before


def test_a_snapshot_taken_is_an_event_at_its_index() -> None:
    host, events, scheduler = observed_node()
    host.propose(b"x")
    scheduler.run_until_idle()
    host.take_snapshot()
    scheduler.run_until_idle()
    taken = events.newest(1)[0]
    assert (taken.kind, taken.index) == ("snapshot_taken", host.core.applied_index)


@pytest.mark.parametrize(("threshold_seconds", "warned"), [(0.0, True), (1.0, False)])
def test_a_sync_at_or_over_the_threshold_is_a_slow_fsync_event(
    threshold_seconds: float, warned: bool
) -> None:
    # The manual clock stands still during a sync: every sync takes 0 s here.
    _, events, _ = observed_node(slow_sync_seconds=threshold_seconds)
    assert ("slow_fsync" in kinds(events)) is warned


def test_a_stopped_host_counts_its_pending_proposals_as_failed() -> None:
    host, _, _ = observed_node()
    host.propose(b"never committed")  # the scheduler is not run: still pending
    host.stop()
    assert host.proposals_failed == 1


def test_peer_links_are_up_then_lost_then_regained(caplog: pytest.LogCaptureFixture) -> None:
    events = EventLog("n1")
    with caplog.at_level(logging.INFO, logger="quorumlog.events"):
        events.peer_link("n2", True)
        events.peer_link("n2", False)
        events.peer_link("n2", True)
    assert kinds(events) == ["peer_link_up", "peer_link_lost", "peer_link_regained"]
    assert [record.levelname for record in caplog.records] == ["INFO", "WARNING", "INFO"]
    assert caplog.records[1].event == {"kind": "peer_link_lost", "peer": "n2"}  # type: ignore[attr-defined]


def test_the_ring_keeps_only_the_newest() -> None:
    events = EventLog("n1", kept_max=3)
    for number in range(5):
        events.record("snapshot_taken", group="g", index=number)
    assert [event.index for event in events.newest(10)] == [4, 3, 2]
    assert events.counts["snapshot_taken"] == 5


def test_a_membership_change_is_an_event_naming_the_new_members() -> None:
    host, events, scheduler = observed_node()
    host.change_membership(MembershipChange(kind=ChangeKind.ADD_LEARNER, node_id="n2"))
    scheduler.run_until_idle()
    changed = [event for event in events.newest(1000) if event.kind == "membership_changed"]
    assert len(changed) == 1
    assert changed[0].detail == "voters=n1 learners=n2"
    assert changed[0].group == "g" and changed[0].term == host.core.term
