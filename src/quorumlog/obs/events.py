"""What happens to a node's groups and links, as events: logged once each and kept in a ring.

An event is something an operator wants to read about a group or a peer link: an election
(the node became pre-candidate, candidate, leader or follower), a term change, a new
leader, a leadership transfer, a membership change, a snapshot taken or installed, a log
truncation, a slow sync, a peer link lost or regained. Each is logged once, as one line
on the "quorumlog.events" logger with the group, term and index (the JSON formatter in
`obs/log_format.py` puts them in fields), and kept in a bounded ring that the dashboard
shows. Nothing here runs per entry.

The Raft core does no I/O and reads no clock, so events are derived here, from what its
host sees: `GroupObserver` is the host's `HostHooks` (runtime/host.py). After each Ready
it compares the core's soft state (role, term, leader, configuration) with what it saw
last; the snapshot, truncation and sync hooks name their own events.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

import msgspec

from quorumlog.raft.configuration import Configuration
from quorumlog.raft.core import RaftCore, Role
from quorumlog.raft.messages import SnapshotMeta, VoteRequest
from quorumlog.raft.ready import Ready
from quorumlog.runtime.host import HostHooks

EVENTS_KEPT_MAX = 256
"""The ring's bound: the dashboard shows the newest; the log keeps them all."""

log = logging.getLogger("quorumlog.events")

WARNING_KINDS = frozenset({"slow_fsync", "peer_link_lost", "log_truncated"})


class Event(msgspec.Struct, frozen=True):
    """One event. `group` is empty for a node-wide one (a peer link)."""

    time_ms: int
    kind: str
    group: str = ""
    term: int = 0
    index: int = 0
    detail: str = ""
    peer: str = ""


class EventLog:
    """A node's recent events (bounded) and the one place that logs them."""

    def __init__(self, node_id: str, kept_max: int = EVENTS_KEPT_MAX) -> None:
        self.node_id = node_id
        self.recent: deque[Event] = deque(maxlen=kept_max)
        self.counts: dict[str, int] = {}
        self.peers_lost: set[str] = set()

    def record(
        self,
        kind: str,
        *,
        group: str = "",
        term: int = 0,
        index: int = 0,
        detail: str = "",
        peer: str = "",
    ) -> Event:
        event = Event(
            time_ms=int(time.time() * 1000),
            kind=kind,
            group=group,
            term=term,
            index=index,
            detail=detail,
            peer=peer,
        )
        self.recent.append(event)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        level = logging.WARNING if kind in WARNING_KINDS else logging.INFO
        if log.isEnabledFor(level):
            log.log(level, describe(event), extra={"event": event_fields(event)})
        return event

    def newest(self, count: int) -> list[Event]:
        """The newest `count` events, newest first."""
        events = list(self.recent)[-count:]
        events.reverse()
        return events

    # --- peer links (node-wide) ---------------------------------------------------------

    def peer_link(self, peer: str, up: bool) -> None:
        """The transport's link to `peer` came up or went down (the first link is "up",
        one after a loss "regained")."""
        if up:
            kind = "peer_link_regained" if peer in self.peers_lost else "peer_link_up"
            self.peers_lost.discard(peer)
        else:
            kind = "peer_link_lost"
            self.peers_lost.add(peer)
        self.record(kind, peer=peer)


def event_fields(event: Event) -> dict[str, object]:
    """The event as log fields (empty ones left out)."""
    fields: dict[str, object] = {"kind": event.kind}
    if event.group:
        fields["group"] = event.group
        fields["term"] = event.term
        fields["index"] = event.index
    if event.peer:
        fields["peer"] = event.peer
    if event.detail:
        fields["detail"] = event.detail
    return fields


def describe(event: Event) -> str:
    """One human line: the kind, then key=value fields."""
    parts = [event.kind.replace("_", " ")]
    if event.group:
        parts.append(f"group={event.group} term={event.term} index={event.index}")
    if event.peer:
        parts.append(f"peer={event.peer}")
    if event.detail:
        parts.append(event.detail)
    return " ".join(parts)


class GroupObserver(HostHooks):
    """One group's host hooks: events from its soft state, sync timings for metrics.

    `attach` must be called with the core once the host is built (the host makes its
    core, and the hooks are handed to the host before that)."""

    def __init__(
        self,
        group: str,
        events: EventLog,
        slow_sync_seconds: float,
        synced: Callable[[str, float | None, float | None], None] | None = None,
    ) -> None:
        self.group = group
        self.events = events
        self.slow_sync_seconds = slow_sync_seconds
        self.synced = synced
        self.core: RaftCore | None = None
        self.role = Role.FOLLOWER
        self.term = 0
        self.leader_id: str | None = None
        self.configuration: Configuration | None = None
        self.leader_changes_seen = 0
        """etcd's leader_changes_seen_total: counted when the leader seen here becomes a
        node (not "none") other than the one seen just before (none included, as etcd:
        the same leader elected again after an interregnum counts)."""
        self.snapshots_taken = 0
        self.snapshots_installed = 0

    def attach(self, core: RaftCore) -> None:
        """Start from what the core recovered (its term from disk is no event)."""
        self.core = core
        self.role = core.role
        self.term = core.term
        self.leader_id = core.leader_id
        self.configuration = core.configuration

    def record(self, kind: str, detail: str = "", term: int | None = None) -> None:
        core = self.core
        self.events.record(
            kind,
            group=self.group,
            term=self.term if term is None else term,
            index=core.log.last_index if core is not None else 0,
            detail=detail,
        )

    # --- HostHooks ----------------------------------------------------------------------

    def on_ready(self, ready: Ready) -> None:
        core = self.core
        if core is None:
            return
        # Compared once per Ready (a batch), never per entry.
        if core.term != self.term:
            self.record("term_changed", f"from {self.term}", term=core.term)
            self.term = core.term
        if core.role is not self.role:
            self.role = core.role
            self.record(f"became_{core.role.value}", self.election_detail(core, ready))
        if core.leader_id != self.leader_id:
            self.leader_id = core.leader_id
            if core.leader_id is not None:
                self.record("leader_changed", f"leader={core.leader_id}")
                self.leader_changes_seen += 1
        if core.configuration is not self.configuration:
            previous, self.configuration = self.configuration, core.configuration
            if (
                previous is None
                or previous.voters != core.configuration.voters
                or (previous.learners != core.configuration.learners)
            ):
                self.record("membership_changed", describe_configuration(core.configuration))

    def election_detail(self, core: RaftCore, ready: Ready) -> str:
        if core.role is not Role.CANDIDATE:
            return ""
        for message in ready.messages_after_persist:
            if isinstance(message, VoteRequest) and message.transfer:
                return "leadership transfer"
        return ""

    def on_truncate(self, after: int) -> None:
        self.record("log_truncated", f"entries after {after} dropped")

    def on_snapshot_install(self, meta: SnapshotMeta, data: bytes) -> None:
        self.snapshots_installed += 1
        self.events.record(
            "snapshot_installed",
            group=self.group,
            term=meta.term,
            index=meta.index,
            detail=f"{len(data)} bytes",
        )

    def on_snapshot_taken(self, meta: SnapshotMeta, data: bytes) -> None:
        self.snapshots_taken += 1
        self.events.record(
            "snapshot_taken",
            group=self.group,
            term=meta.term,
            index=meta.index,
            detail=f"{len(data)} bytes",
        )

    def on_synced(self, log_sync_seconds: float | None, hard_state_seconds: float | None) -> None:
        if self.synced is not None:
            self.synced(self.group, log_sync_seconds, hard_state_seconds)
        slowest = max(log_sync_seconds or 0.0, hard_state_seconds or 0.0)
        if slowest >= self.slow_sync_seconds:
            self.record("slow_fsync", f"took {slowest * 1000:.0f} ms")


def describe_configuration(configuration: Configuration) -> str:
    text = f"voters={','.join(configuration.voters)}"
    if configuration.learners:
        text += f" learners={','.join(configuration.learners)}"
    return text
