"""A node's Prometheus metrics: etcd's names with the `quorumlog_` prefix.

Each node owns its `CollectorRegistry` (not prometheus-client's global one), so several
nodes in one process (tests, the simulator) do not collide. Almost everything is read at
scrape time by `NodeCollector` from what the node already keeps — each group's core and
host (leader, term, commit and applied index, pending and failed proposals), the event
observers (leader changes), the transport (bytes per peer) — so serving requests pays
nothing for it. The two histograms are observed once per sync job (a group commit), never
per entry.

Labels are bounded: `group` (the groups this node hosts), `peer` (the cluster's members),
`topic` (created topics); never a key, a client or a producer.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from quorumlog.obs.events import GroupObserver
from quorumlog.obs.topic_traffic import TopicTraffic
from quorumlog.runtime.group import GroupRunner

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SYNC_BUCKETS_SECONDS = tuple(0.001 * 2**power for power in range(14))
"""etcd's buckets for wal_fsync and backend_commit: 1 ms to about 8 s."""
ROUND_TRIP_BUCKETS_SECONDS = tuple(0.0001 * 2**power for power in range(16))
"""etcd's buckets for peer round trips: 0.1 ms to about 3 s."""


class ObservedNode(Protocol):
    """What the collector reads of a node (node/server.py's `Node` has these)."""

    @property
    def groups(self) -> Mapping[str, GroupRunner]: ...

    @property
    def group_observers(self) -> Mapping[str, GroupObserver]: ...

    @property
    def peer_bytes_sent(self) -> Mapping[str, int]: ...

    @property
    def peer_bytes_received(self) -> Mapping[str, int]: ...

    @property
    def topic_traffic(self) -> TopicTraffic: ...

    def consumer_lags(self) -> list[tuple[str, str, int, int]]:
        """(consumer group, topic, partition, lag) for partitions this node leads."""
        ...

    def ha_confirm_lags(self) -> list[tuple[str, int, int]]:
        """(topic, partition, bytes written but not yet confirmed by the SyncStateSet) for
        the HA partitions this node is master of."""
        ...

    def bookie_state(self) -> tuple[int, bool] | None:
        """The hosted bookie's journal syncs so far and whether it takes adds (None: no
        bookie on this node)."""
        ...


class NodeMetrics:
    """The registry and the few metrics observed as things happen."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.wal_fsync_seconds = Histogram(
            "quorumlog_disk_wal_fsync_duration_seconds",
            "Latency of the log syncs (one per group commit), every group together.",
            buckets=SYNC_BUCKETS_SECONDS,
            registry=self.registry,
        )
        self.backend_commit_seconds = Histogram(
            "quorumlog_disk_backend_commit_duration_seconds",
            "Latency of saving the hard state (term, vote, commit) after a log sync.",
            buckets=SYNC_BUCKETS_SECONDS,
            registry=self.registry,
        )
        self.round_trip_seconds = Histogram(
            "quorumlog_network_peer_round_trip_time_seconds",
            "Round-trip time of pings on each peer link (a few a second per peer, idle or not).",
            ["peer"],
            buckets=ROUND_TRIP_BUCKETS_SECONDS,
            registry=self.registry,
        )
        self.ledgers_collected = Counter(
            "quorumlog_ledger_garbage_collected",
            "Ledgers of deleted topics removed here: dropped from this node's bookie"
            ' (collector="bookie"), or their metadata deleted by the sweep (collector="sweep").',
            ["collector"],
            registry=self.registry,
        )

    def round_trip(self, peer: str, seconds: float) -> None:
        """A ping on the peer link to `peer` came back after `seconds`."""
        self.round_trip_seconds.labels(peer).observe(seconds)

    def collected_by_bookie(self, ledgers: int) -> None:
        self.ledgers_collected.labels("bookie").inc(ledgers)

    def collected_by_sweep(self, ledgers: int) -> None:
        self.ledgers_collected.labels("sweep").inc(ledgers)

    def synced(
        self, group: str, log_sync_seconds: float | None, hard_state_seconds: float | None
    ) -> None:
        """A group's sync job landed (see `GroupObserver.on_synced`)."""
        if log_sync_seconds is not None:
            self.wal_fsync_seconds.observe(log_sync_seconds)
        if hard_state_seconds is not None:
            self.backend_commit_seconds.observe(hard_state_seconds)

    def watch(self, node: ObservedNode) -> None:
        """Read `node`'s groups and links at every scrape."""
        self.registry.register(NodeCollector(node))

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric, read now."""
        return generate_latest(self.registry)


def group_families() -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
    gauges = {
        "has_leader": "Whether a leader exists for the group (1) or not (0), as this node sees.",
        "is_leader": "Whether this node leads the group.",
        "term": "The group's current term on this node.",
        "proposals_committed_total": "The group's commit index on this node.",
        "proposals_applied_total": "The index this node has applied in the group.",
        "proposals_pending": "Proposals on this node waiting to be committed and applied.",
        "snapshot_apply_in_progress_total": "Snapshots of the group being saved (0 or 1).",
    }
    families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
        name: GaugeMetricFamily(f"quorumlog_server_{name}", text, labels=["group"])
        for name, text in gauges.items()
    }
    families["leader_changes_seen"] = CounterMetricFamily(
        "quorumlog_server_leader_changes_seen",
        "Leader changes this node has seen in the group since it started.",
        labels=["group"],
    )
    families["proposals_failed"] = CounterMetricFamily(
        "quorumlog_server_proposals_failed",
        "Proposals that failed or whose outcome became unknown (leader lost, replaced).",
        labels=["group"],
    )
    families["follower_lag"] = GaugeMetricFamily(
        "quorumlog_server_follower_lag_entries",
        "On the leader: entries each follower is behind the leader's last index.",
        labels=["group", "peer"],
    )
    return families


class NodeCollector(Collector):
    """Reads the node's state when Prometheus scrapes (nothing on the request path)."""

    def __init__(self, node: ObservedNode) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        families = group_families()
        observers = self.node.group_observers
        for name, group in sorted(self.node.groups.items()):
            core = group.core
            host = group.host
            labels = [name]
            alive = host.failure is None and not host.stopped
            families["has_leader"].add_metric(labels, int(alive and core.leader_id is not None))
            families["is_leader"].add_metric(labels, int(host.is_leader))
            families["term"].add_metric(labels, core.term)
            families["proposals_committed_total"].add_metric(labels, core.commit_index)
            families["proposals_applied_total"].add_metric(labels, core.applied_index)
            families["proposals_pending"].add_metric(labels, len(host.waiters))
            families["snapshot_apply_in_progress_total"].add_metric(
                labels, int(host.snapshot_in_flight)
            )
            families["proposals_failed"].add_metric(labels, host.proposals_failed)
            observer = observers.get(name)
            seen = observer.leader_changes_seen if observer is not None else 0
            families["leader_changes_seen"].add_metric(labels, seen)
            if core.leader is not None:
                last_index = core.log.last_index
                for peer, progress in sorted(core.leader.progress.items()):
                    families["follower_lag"].add_metric(
                        [name, peer], max(0, last_index - progress.match_index)
                    )
        yield from families.values()
        yield from self.network_families()
        yield from self.node.topic_traffic.families()
        lag = GaugeMetricFamily(
            "quorumlog_consumer_group_lag",
            "Records between a consumer group's committed offset and the partition's end, "
            "reported by the partition's leader.",
            labels=["consumer_group", "topic", "partition"],
        )
        for consumer_group, topic, partition, records in self.node.consumer_lags():
            lag.add_metric([consumer_group, topic, str(partition)], records)
        yield lag
        yield from self.bookie_families()
        confirm_lag = GaugeMetricFamily(
            "quorumlog_ha_confirm_offset_lag_bytes",
            "On an HA topic's master: bytes in its commit log past confirmOffset (written, "
            "not yet held by every SyncStateSet member).",
            labels=["topic", "partition"],
        )
        for topic, partition, lag_bytes in self.node.ha_confirm_lags():
            confirm_lag.add_metric([topic, str(partition)], lag_bytes)
        yield confirm_lag

    def bookie_families(self) -> Iterator[Metric]:
        state = self.node.bookie_state()
        if state is None:
            return
        syncs, writable = state
        yield CounterMetricFamily(
            "quorumlog_bookie_journal_syncs",
            "Journal fsyncs of this node's bookie (each covers every add written before it).",
            value=syncs,
        )
        yield GaugeMetricFamily(
            "quorumlog_bookie_writable", "Whether this node's bookie takes adds.", value=writable
        )

    def network_families(self) -> Iterator[Metric]:
        sent = CounterMetricFamily(
            "quorumlog_network_peer_sent_bytes",
            "Bytes sent to each peer on its Raft link.",
            labels=["peer"],
        )
        for peer, count in sorted(self.node.peer_bytes_sent.items()):
            sent.add_metric([peer], count)
        received = CounterMetricFamily(
            "quorumlog_network_peer_received_bytes",
            "Bytes received from each peer on its Raft link.",
            labels=["peer"],
        )
        for peer, count in sorted(self.node.peer_bytes_received.items()):
            received.add_metric([peer], count)
        yield sent
        yield received
