"""Settings of one Raft core, checked as a whole at construction."""

from __future__ import annotations

import msgspec


class RaftConfig(msgspec.Struct, frozen=True):
    """Every bound has its unit in its name. Times are in ticks: the core reads no clock."""

    node_id: str
    election_ticks: int = 10
    """Election timeout; each term a node draws its timeout from [election, 2 * election)."""
    heartbeat_ticks: int = 1
    """A leader sends a COMMIT push (heartbeat) to each follower this often."""
    pre_vote: bool = True
    """Ask for votes without raising the term first, so a rejoining node cannot disrupt."""
    check_quorum: bool = True
    """A leader that has not heard a majority for one election timeout steps down."""
    lease_read: bool = False
    """Serve reads on a valid leader lease without a heartbeat round (needs check_quorum)."""
    append_entries_max: int = 256
    """Entries in one APPEND push."""
    append_bytes_max: int = 1024 * 1024
    """Data bytes in one APPEND push (one entry larger than this still goes alone)."""
    inflight_appends_max: int = 64
    """APPEND pushes a leader may have outstanding to one follower (the pipeline window)."""
    append_timeout_ticks: int = 4
    """An APPEND or COMPARE unanswered this long is resent."""
    pending_entries_max: int = 10_000
    """Uncommitted entries a leader holds before proposals fail with PendingFullError."""
    pending_bytes_max: int = 64 * 1024 * 1024
    """Uncommitted data bytes a leader holds before proposals fail with PendingFullError."""
    snapshot_chunk_bytes_max: int = 1024 * 1024
    """Bytes per INSTALL_SNAPSHOT chunk."""
    transfer_timeout_ticks: int = 0
    """A leader transfer that has not finished in this many ticks is abandoned (0: election)."""
    quiesce_idle_ticks: int = 0
    """0: never quiesce. Else a leader whose followers hold its whole log, with nothing
    pending, goes quiet after this many idle ticks and tells its followers to: no more
    heartbeats or ticks until a proposal, a read, a message or `peer_unreachable` wakes
    the group. The runtime must then report unreachable peers (node-level liveness), or a
    quiet follower would never notice that its leader died."""
    leader_node_hold_ticks: int = 0
    """0: off. Else a follower whose election timeout ran out does not campaign while the
    runtime's node-level liveness still hears its leader's node (`RaftCore.leader_node_live`,
    CockroachDB's rule: no campaign against a leader whose node is live), for at most this
    many ticks in a row; then it campaigns anyway (the leader's node may be live while the
    group's leader is gone). Liveness only: a hold never decides anything a campaign would."""
    commit_heartbeat_ticks: int = 0
    """0: a follower that lacks only the leader's commit index gets it with the next tick's
    heartbeat. Else with a busy group's heartbeats thinned (no reads waiting, no lease), a
    follower pushed to fewer than this many ticks ago waits for the commit index until then
    (at most the keepalive interval, election_ticks // 5): its applied state lags by that,
    nothing else changes. Keeps a busy node's heartbeats and answers down."""

    def validate(self) -> None:
        """Raise ValueError naming the first setting that is out of range or inconsistent."""
        if not self.node_id:
            raise ValueError("node_id must not be empty")
        if self.heartbeat_ticks < 1:
            raise ValueError("heartbeat_ticks must be >= 1")
        if self.election_ticks <= self.heartbeat_ticks:
            raise ValueError("election_ticks must be greater than heartbeat_ticks")
        if self.lease_read and not self.check_quorum:
            raise ValueError("lease_read needs check_quorum: a lease is only as good as it")
        for name in (
            "append_entries_max",
            "append_bytes_max",
            "inflight_appends_max",
            "append_timeout_ticks",
            "pending_entries_max",
            "pending_bytes_max",
            "snapshot_chunk_bytes_max",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.transfer_timeout_ticks < 0:
            raise ValueError("transfer_timeout_ticks must be >= 0")
        if self.quiesce_idle_ticks < 0:
            raise ValueError("quiesce_idle_ticks must be >= 0")
        if self.leader_node_hold_ticks < 0:
            raise ValueError("leader_node_hold_ticks must be >= 0")
        if not 0 <= self.commit_heartbeat_ticks < self.election_ticks:
            raise ValueError("commit_heartbeat_ticks must be in [0, election_ticks)")
