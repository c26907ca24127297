"""Node-level liveness: one signal per pair of nodes, that every quiet group relies on.

A quiet Raft group sends nothing (raft/core.py), so a follower of a quiet group cannot
notice its leader's death from that group's traffic. Instead each node tells each peer it
is alive — any frame counts, and a ping goes out every `ping_ticks` ticks — and a peer
not heard from for `silent_ticks_max` ticks is reported unreachable, once, to every quiet
group through `unreachable(peer)` (the node calls `RaftHost.peer_unreachable`). Heard
from again, it is reachable once more, reported through `reachable(peer)` (the node calls
`RaftHost.peer_reachable`); the next silence is reported again.

Time is ticks of the node's `GroupTicker` (`tick` runs once per tick), never a clock: a
node whose event loop stalls counts a stall as one tick, so it does not declare its peers
dead because it was itself too busy to read their pings. The cost is O(peers) per tick,
whatever the number of groups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

PING_TICKS_DEFAULT = 2
SILENT_TICKS_MAX_DEFAULT = 10
"""One election timeout (the default election_ticks): a quiet follower then notices a
dead leader about as soon as an awake one would."""


class PeerLiveness:
    def __init__(
        self,
        node_id: str,
        *,
        ping: Callable[[str], None],
        unreachable: Callable[[str], None],
        ping_ticks: int = PING_TICKS_DEFAULT,
        silent_ticks_max: int = SILENT_TICKS_MAX_DEFAULT,
        reachable: Callable[[str], None] | None = None,
    ) -> None:
        if ping_ticks < 1 or silent_ticks_max <= ping_ticks:
            raise ValueError("need ping_ticks >= 1 and silent_ticks_max > ping_ticks")
        self.node_id = node_id
        self.ping = ping
        self.unreachable = unreachable
        self.reachable = reachable
        self.ping_ticks = ping_ticks
        self.silent_ticks_max = silent_ticks_max
        self.ticks = 0
        self.last_heard_tick: dict[str, int] = {}
        """Per peer: the tick we last heard from it (peers start as just heard, so a node
        that comes up gives its peers a whole silence before calling them unreachable)."""
        self.unreachable_peers: set[str] = set()

    def set_peers(self, peers: Iterable[str]) -> None:
        known = self.last_heard_tick
        wanted = {peer for peer in peers if peer != self.node_id}
        for peer in wanted - known.keys():
            known[peer] = self.ticks
        for peer in known.keys() - wanted:
            del known[peer]
            self.unreachable_peers.discard(peer)

    def heard(self, peer: str) -> None:
        """Anything arrived from `peer`'s node."""
        if peer in self.last_heard_tick:
            self.last_heard_tick[peer] = self.ticks
            if peer in self.unreachable_peers:
                self.unreachable_peers.discard(peer)
                if self.reachable is not None:
                    self.reachable(peer)

    def is_reachable(self, peer: str) -> bool:
        return peer not in self.unreachable_peers

    def tick(self) -> None:
        self.ticks += 1
        ticks = self.ticks
        if ticks % self.ping_ticks == 0:
            for peer in sorted(self.last_heard_tick):
                self.ping(peer)
        for peer, heard_tick in sorted(self.last_heard_tick.items()):
            if ticks - heard_tick > self.silent_ticks_max and peer not in self.unreachable_peers:
                self.unreachable_peers.add(peer)
                self.unreachable(peer)
