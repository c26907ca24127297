"""What a leader knows about one follower, and the named replication states (DLedger)."""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterator


class ReplicationState(enum.Enum):
    COMPARE = "compare"
    """Finding the highest index where the follower's log matches ours."""
    TRUNCATE = "truncate"
    """Telling the follower to drop its entries after the match point."""
    APPEND = "append"
    """Pipelining entries from `next_index`, at most `inflight_appends_max` pushes at once."""
    INSTALL_SNAPSHOT = "install_snapshot"
    """The entries the follower needs are compacted away: sending a snapshot in chunks."""


class Progress:
    """Replication progress of one follower, from the leader's side."""

    def __init__(self, next_index: int, rounds: Iterator[int]) -> None:
        self.state = ReplicationState.COMPARE
        self.rounds = rounds
        """Shared by every follower of one leader, so a follower removed and added back
        never sees a round number again (its old pushes may still be in flight)."""
        self.round = 0
        self.match_index = 0
        self.next_index = next_index
        """COMPARE: the index compared is next_index - 1. APPEND: the next entry to send."""
        self.inflight: deque[tuple[int, int]] = deque()
        """APPEND pushes in flight: (last index sent, tick sent)."""
        self.request_tick: int | None = None
        """COMPARE / TRUNCATE / INSTALL_SNAPSHOT: when the outstanding request went out."""
        self.snapshot_offset = 0
        self.recent_active = False
        """Heard from in the current check-quorum window."""
        self.read_sequence_acked = 0
        self.retry_ticks = 0
        """How long to wait before resending; doubles with each unanswered retry (a slow
        link must not be flooded with retries it cannot answer in time). 0: the default."""
        self.commit_sent = -1
        """The commit index the last push of any kind carried (-1: none yet)."""
        self.sent_tick = 0
        """When the last push of any kind went out: it reset the follower's election timer
        as a heartbeat would (see LeaderState.broadcast_heartbeat)."""

    def enter(self, state: ReplicationState, leader_last_index: int | None = None) -> None:
        """Every new COMPARE, APPEND or INSTALL_SNAPSHOT phase is a new round (see
        messages.py for why).

        COMPARE always starts at the leader's last index (as DLedger starts at its ledger
        end): searching down from there, the first match found is the highest one, so the
        follower's entries after it are all divergent and TRUNCATE may drop them. Starting
        lower could find a match below entries that match too, and truncate those.
        """
        if state is ReplicationState.COMPARE:
            if leader_last_index is None:
                raise ValueError("COMPARE starts at the leader's last index")
            self.next_index = leader_last_index + 1
        self.state = state
        if state is not ReplicationState.TRUNCATE:  # TRUNCATE answers its COMPARE's round
            self.round = next(self.rounds)
        self.inflight.clear()
        self.request_tick = None
        self.snapshot_offset = 0

    def acknowledge(self, match_index: int) -> None:
        if match_index > self.match_index:
            self.match_index = match_index
        while self.inflight and self.inflight[0][0] <= self.match_index:
            self.inflight.popleft()

    def __repr__(self) -> str:
        return (
            f"Progress({self.state.value}, round={self.round}, match={self.match_index}, "
            f"next={self.next_index}, inflight={len(self.inflight)})"
        )
