"""Preferred leaders: spread the leaders of a node's shard groups over their members.

Groups that start together on the same nodes tend to elect the same node (the first to
time out wins them all), and then one process does every group's leader work while the
others idle. Like Kafka's preferred replica election, each shard group has a preferred
leader (member (gid - 1) mod n of its sorted members, so groups 1, 2, 3 on n1..n3 prefer
n1, n2, n3); a leader that is not the preferred one hands leadership over, but only when the
preferred member is nearly caught up and answered recently, so a transfer finishes at once
(a transfer to a dead node would hold proposals until it timed out).

The check runs on a timer of the groups' scheduler (the hosts of one node share one), so the
simulator runs it on virtual time as the node runs it on asyncio.
"""

from __future__ import annotations

import logging
from collections import deque

from quorumlog.errors import QuorumLogError
from quorumlog.raft.progress import ReplicationState
from quorumlog.runtime.host import RaftHost
from quorumlog.runtime.resources import Timer

log = logging.getLogger("quorumlog.node")

HAND_OVER_LAG_ENTRIES_MAX = 64
"""How far behind the leader's log the preferred member may be when a hand-over starts."""

TRANSFERS_KEPT = 256
"""Hand-overs remembered (for status and tests); older ones are forgotten."""


def preferred_leader(gid: int, members: list[str]) -> str:
    ordered = sorted(members)
    return ordered[(gid - 1) % len(ordered)]


def ready_to_hand_over(group: RaftHost, target: str) -> bool:
    """This node leads `group`, and `target` is a voter that is caught up and active."""
    core = group.core
    leader = core.leader
    if leader is None or target == core.node_id or not core.configuration.is_voter(target):
        return False
    if leader.transfer_target is not None:
        return False
    progress = leader.progress.get(target)
    # A little behind is fine: the transfer itself brings the target up to date before
    # it sends TimeoutNow. Requiring it exactly caught up would put hand-overs off for as
    # long as writes keep coming.
    return (
        progress is not None
        and progress.recent_active
        and progress.state is ReplicationState.APPEND
        and progress.match_index + HAND_OVER_LAG_ENTRIES_MAX >= core.log.last_index
    )


class PreferredLeaders:
    def __init__(self, groups: list[tuple[RaftHost, str]], interval_seconds: float) -> None:
        self.groups = groups
        """Each hosted group with its preferred leader's node id."""
        self.interval_seconds = interval_seconds
        self.timer: Timer | None = None
        self.stopped = False
        self.checks = 0
        """Check periods run (tests wait on it instead of on the clock)."""
        self.transfers: deque[tuple[str, str]] = deque(maxlen=TRANSFERS_KEPT)
        """(group, target) of the latest hand-overs started here, oldest first."""

    def start(self) -> None:
        if self.groups and self.interval_seconds > 0:
            self.schedule()

    def stop(self) -> None:
        self.stopped = True
        if self.timer is not None:
            self.timer.cancel()

    def schedule(self) -> None:
        # A periodic check, as Kafka's.
        scheduler = self.groups[0][0].scheduler
        self.timer = scheduler.call_later(self.interval_seconds, self.on_timer)

    def on_timer(self) -> None:
        if self.stopped:
            return
        self.schedule()
        self.check()

    def check(self) -> None:
        self.checks += 1
        for group, target in self.groups:
            if group.stopped or group.failure is not None or not ready_to_hand_over(group, target):
                continue
            try:
                group.transfer_leadership(target)
            except QuorumLogError as error:  # a membership change raced us: try next period
                log.debug("group %s: no transfer to %s: %s", group.group_id, target, error)
                continue
            self.transfers.append((group.group_id, target))
            log.info("group %s: leadership to preferred leader %s", group.group_id, target)
