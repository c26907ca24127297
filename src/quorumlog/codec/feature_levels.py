"""Feature levels: which rules a replicated state machine applies its log by, agreed by the
cluster, so that a rolling upgrade cannot make replicas diverge.

A replica of an older release decodes a command that carries a new trailing field by
dropping the field (msgspec skips unknown trailing fields), and so applies it by older
rules than its newer peers: their states diverge, and nothing reports it. The same holds
for a snapshot written by a newer release. So a release never *uses* a new field (or a new
command) before every replica can. This is etcd's cluster version (etcdserver/version:
the cluster version is the minimum of the members' server versions, set through the Raft
log by `ClusterVersionSet`, and a member whose version is below it refuses to start),
adapted to multi-Raft:

1. Every release has one feature level, `FEATURE_LEVEL`, and `FEATURE_LEVELS` names what
   each level added. A node says its level to its peers in the handshake
   (`wire.Hello.feature_level`, `wire.Welcome.feature_level`); a node from before the
   gate says nothing and is taken at `BASELINE_FEATURE_LEVEL`.
2. The level is agreed, not guessed: a gated group's leader proposes the lowest level
   among the nodes it counts (the group's replicas and every peer this node knows), and
   only once every one of them has said its level (`agreed_level`, `level_to_propose`).
   It is committed in the gated group's OWN log, and applying it only ever raises the
   machine's level (`raised`).
   Why the group's own log and not the metadata group's: the apply of the entry at index
   i must depend only on the log up to i. Nothing orders a level committed in another
   group's log against this log, so two replicas could apply entry i before and after
   they learn of it. In the group's own log the level in force at i is the last raise
   before i (or the snapshot's, which covers every entry before it) on every replica.
3. Until the level that introduced a field is committed, the leader strips the field from
   what it proposes, so a replica that drops it at decode applies the same commands as the
   others. Apply, though, honours every field the log holds at every level, because the
   release users ran before this one may have put them there: the session-7 release
   applies the consumer-group fencing fields ungated and says no level (it counts as
   level 1), so its leader proposes them and its replicas apply them. A replica of this
   release at level 1 applies exactly as a session-7 one does (fields honoured,
   `revoking_since` always noted), and one of the session-6 release sees no field from a
   leader of this release. What a session-6 snapshot can leave different (a
   `revoking_since` it never noted) is set from shared state when the raise to level 2
   is applied (`group_coordinator.normalise_revocations`), at the same index everywhere.
   Rolling upgrades are safe from session 6 and from session 7; a cluster mixing
   session-6 and session-7 nodes (that release's own upgrade, before this gate) can
   diverge, and nothing here can repair that.
4. A node whose level is below a level that was committed refuses (`check_level`,
   `ClusterLevelError`, one line naming both levels): at start (the node keeps the level
   it last applied in its data directory), in the peer handshake (a peer below the
   committed level is refused), and in apply (a raise above its own level stops the
   group: it must not apply by older rules).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from quorumlog.errors import ClusterLevelError

BASELINE_FEATURE_LEVEL = 1
"""What a node that says no level runs: the release closed in session 6 (main at 136a7c7),
the last one before any trailing field that changes a replicated apply, or the session-7
release, which added the fencing fields ungated (point 3 above)."""
GROUP_FENCING_LEVEL = 2
"""The consumer-group coordinator's fencing of stale joins and commits (added ungated in
session 7): from this level on this release's leader proposes the fencing fields."""
FEATURE_LEVEL = GROUP_FENCING_LEVEL
"""This release's level: the highest in `FEATURE_LEVELS`. Raise it, and add a row, with
every new trailing field (or command, or snapshot field) that changes what apply does."""

FEATURE_LEVELS: dict[int, str] = {
    BASELINE_FEATURE_LEVEL: (
        "baseline: every replicated command and snapshot field of the session-6 release"
    ),
    GROUP_FENCING_LEVEL: (
        "consumer groups: JoinGroup.owned_generation with MemberState.revoking_since "
        "(stale joins release nothing), CommitOffsets.sequence with "
        "MemberState.commit_sequence (stale commits change nothing)"
    ),
}


def agreed_level(levels: Mapping[str, int], members: Iterable[str]) -> int | None:
    """The lowest level among `members` by what they said (`levels`: node id → level).
    None while any of them has not said its level (not heard from since this node
    started), or there are none: a level is never agreed on a guess."""
    said = []
    for member in members:
        level = levels.get(member)
        if level is None:
            return None
        said.append(level)
    return min(said) if said else None


def level_to_propose(committed: int, agreed: int | None, own: int = FEATURE_LEVEL) -> int | None:
    """The level a leader proposes: the agreed one, when above the committed one and not
    above its own (it counts itself, so it never is); None: nothing to propose (a level
    only goes up)."""
    if agreed is None or agreed <= committed:
        return None
    return min(agreed, own)


def raised(committed: int, proposed: int, own: int = FEATURE_LEVEL) -> int:
    """The committed level after applying a raise to `proposed`: it only goes up (a lower
    raise, proposed by a leader that had not applied a later one, changes nothing). Raises
    ClusterLevelError if this build runs below `proposed`: it cannot apply by its rules."""
    check_level(own, proposed)
    return max(committed, proposed)


def check_level(own: int, committed: int, who: str = "this node") -> None:
    """Raise ClusterLevelError if `own` is below `committed` (no downgrade past it)."""
    if own < committed:
        raise ClusterLevelError(
            f"{who} runs feature level {own}, below the cluster's committed feature level "
            f"{committed}: a downgrade past the committed level is refused "
            f"(start a release of level {committed} or later)"
        )


__all__ = [
    "BASELINE_FEATURE_LEVEL",
    "FEATURE_LEVEL",
    "FEATURE_LEVELS",
    "GROUP_FENCING_LEVEL",
    "agreed_level",
    "check_level",
    "level_to_propose",
    "raised",
]
