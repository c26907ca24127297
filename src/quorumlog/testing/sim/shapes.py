"""Fault shapes the nemesis scripts in steps, timed to protocol events.

A random schedule of partitions and changes hits these too rarely, because each needs a
fault to land between one protocol event and the messages that follow it. So a shape
watches the cluster every `NemesisOptions.watch_ms` (under one network delay) and acts
the moment its event happens. Both draw every choice from the nemesis's seeded stream.

- `MembershipRace`: a leader proposes a promotion and is cut off at once with the node
  it promotes; the first leader the others elect removes one of them as soon as it wins
  (the removed node is often cut off too, before the new leader's first entry reaches
  it); later the old leader's side gets the removed node. Two membership changes from two
  terms, each uncommitted when the next begins: with a new leader that does not wait for
  an entry of its own term to commit, two majorities that do not overlap each commit
  (the single-server change bug, Ongaro on raft-dev 2015).
- `TransferThenCut`: a leader hands over to a target, and the moment the target
  campaigns, nothing reaches the old leader any more. Voters grant a transfer candidate
  despite their lease, so the old leader, which still believes it leads, must not answer
  reads from its lease.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quorumlog.raft.configuration import ChangeKind, MembershipChange

if TYPE_CHECKING:
    from quorumlog.testing.sim.nemesis import Nemesis


def election_ms(nemesis: Nemesis) -> int:
    cluster = nemesis.cluster
    return cluster.options.raft.election_ticks * cluster.tick_ms


class MembershipRace:
    """One race, from the promotion to the final heal. The nemesis holds it in `race`
    while it runs, and starts no network fault, transfer or membership step meanwhile."""

    ELECT_TIMEOUTS_MAX = 8
    """Election timeouts the others get to elect a leader before the race gives up."""
    CHANGE_TIMEOUTS_MAX = 3
    """Election timeouts the new leader gets to have its change taken."""

    def __init__(self, nemesis: Nemesis, old_leader: str, promoted: str) -> None:
        self.nemesis = nemesis
        self.old_leader = old_leader
        self.promoted = promoted
        core = nemesis.cluster.nodes[old_leader].core
        self.old_term = core.term
        self.others = sorted(voter for voter in core.configuration.voters if voter != old_leader)
        """The voters left behind, who elect the next leader."""
        self.deadline_ms = 0
        self.phase = "elect"
        """elect -> change (the new leader tries its change) -> rejoin -> over."""
        self.new_leader: str | None = None
        self.removed: str | None = None

    @staticmethod
    def fits(nemesis: Nemesis, leader: str, target: str) -> bool:
        """`target` is a learner to promote, and three voters or more stay behind: enough
        to elect a leader without the old one and still lose one to a removal."""
        configuration = nemesis.cluster.nodes[leader].core.configuration
        return target in configuration.learners and len(configuration.voters) >= 4

    def start(self) -> bool:
        """Propose the promotion at the old leader and cut it off with the promoted node.
        False (and nothing done) if the leader refuses the change now."""
        nemesis = self.nemesis
        cluster = nemesis.cluster
        promote = MembershipChange(ChangeKind.PROMOTE_LEARNER, self.promoted)
        if cluster.change_membership(promote, node_id=self.old_leader) is None:
            return False
        # The entry went out in this event; the partition drops every copy still in
        # flight to the others, so only the promoted node can receive it.
        nemesis.own_network()
        cluster.partition([sorted([self.old_leader, self.promoted]), self.others])
        self.deadline_ms = cluster.now_ms + self.ELECT_TIMEOUTS_MAX * election_ms(nemesis)
        self.schedule_watch()
        return True

    def schedule_watch(self) -> None:
        self.nemesis.cluster.events.schedule(self.nemesis.options.watch_ms, self.watch)

    def watch(self, _: object) -> None:
        nemesis = self.nemesis
        if nemesis.race is not self:
            return
        if not nemesis.running or nemesis.cluster.now_ms >= self.deadline_ms:
            self.end(None)
            return
        if self.phase == "elect":
            self.watch_election()
        if self.phase == "change":
            self.try_change()
        if self.phase in ("elect", "change"):
            self.schedule_watch()

    def watch_election(self) -> None:
        """The moment one of the others leads a newer term, pick whom it removes, and
        maybe cut that node off before the new leader's first entry reaches it."""
        nemesis = self.nemesis
        nodes = nemesis.cluster.nodes
        elected = [
            node_id
            for node_id in self.others
            if nodes[node_id].available
            and nodes[node_id].is_leader
            and nodes[node_id].core.term > self.old_term
        ]
        if not elected:
            return
        self.new_leader = new_leader = elected[0]
        candidates = [other for other in self.others if other != new_leader]
        self.removed = removed = nemesis.rng.choice(candidates)
        if nemesis.rng.random() < nemesis.options.race_isolate_removed_probability:
            staying = [other for other in self.others if other != removed]
            old_side = sorted([self.old_leader, self.promoted])
            nemesis.cluster.partition([old_side, staying, [removed]])
        self.phase = "change"
        change_deadline_ms = nemesis.cluster.now_ms + self.CHANGE_TIMEOUTS_MAX * election_ms(
            nemesis
        )
        self.deadline_ms = min(self.deadline_ms, change_deadline_ms)

    def try_change(self) -> None:
        """The new leader removes `removed`, tried at every watch until it is taken or
        the leader is gone; then, a seeded while later, the old side gets that node."""
        nemesis = self.nemesis
        cluster = nemesis.cluster
        new_leader, removed = self.new_leader, self.removed
        if new_leader is None or removed is None:
            return
        if cluster.nodes[new_leader].is_leader:
            change = MembershipChange(ChangeKind.REMOVE, removed)
            if cluster.change_membership(change, node_id=new_leader) is None:
                return  # refused for now (e.g. the leader's term has no commit yet)
            nemesis.stats.race_changes += 1
        self.phase = "rejoin"
        nemesis.membership_returns.append(removed)
        wait_ms = nemesis.rng.randint(election_ms(nemesis) // 2, 3 * election_ms(nemesis))
        cluster.events.schedule(wait_ms, self.rejoin)

    def rejoin(self, _: object) -> None:
        """The old leader's side, with the removed node, against the new leader's side."""
        nemesis = self.nemesis
        if nemesis.race is not self:
            return
        if not nemesis.running:
            self.end(None)
            return
        removed = str(self.removed)
        staying = [other for other in self.others if other != removed]
        nemesis.cluster.heal()
        nemesis.cluster.partition([staying, sorted([self.old_leader, self.promoted, removed])])
        nemesis.cluster.events.schedule(nemesis.fault_ms(), self.end)

    def end(self, _: object) -> None:
        nemesis = self.nemesis
        if nemesis.race is self:
            nemesis.race = None
            nemesis.own_network()


class TransferThenCut:
    """A transfer whose old leader is cut off from everything once the target campaigns
    (its vote requests, and all after them, never reach the old leader)."""

    WATCH_TIMEOUTS_MAX = 3
    """Election timeouts to wait for the target to campaign (a transfer gives up after
    one, but a late TimeoutNow may still start a campaign)."""

    def __init__(self, nemesis: Nemesis, old_leader: str, target: str) -> None:
        self.nemesis = nemesis
        self.old_leader = old_leader
        self.target = target
        self.old_term = nemesis.cluster.nodes[old_leader].core.term
        self.token = 0
        self.deadline_ms = 0

    def start(self) -> bool:
        nemesis = self.nemesis
        cluster = nemesis.cluster
        nemesis.network_fault()  # heals now, and again after a seeded while
        if not cluster.transfer_leadership(self.target):
            return False
        self.token = nemesis.network_fault_token
        self.deadline_ms = cluster.now_ms + self.WATCH_TIMEOUTS_MAX * election_ms(nemesis)
        cluster.events.schedule(nemesis.options.watch_ms, self.watch)
        return True

    def watch(self, _: object) -> None:
        nemesis = self.nemesis
        cluster = nemesis.cluster
        if (
            not nemesis.running
            or self.token != nemesis.network_fault_token  # another fault took over
            or cluster.now_ms >= self.deadline_ms
        ):
            return
        target = cluster.nodes[self.target]
        if not (target.up and target.core.term > self.old_term):
            cluster.events.schedule(nemesis.options.watch_ms, self.watch)
            return
        nemesis.stats.transfer_cuts += 1
        for node_id in sorted(cluster.nodes):
            if node_id != self.old_leader:
                cluster.cut(node_id, self.old_leader)
