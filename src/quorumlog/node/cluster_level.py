"""This node's side of the cluster's feature level (the rules are in codec/feature_levels.py):
what each peer said its level is, and the highest level this node ever applied, kept in its
data directory so that a downgrade past it is refused at start.

- `PeerLevels`: the level each node said in its latest handshake (this node's own from the
  start); a gated group's leader agrees on the lowest among the group's members and every
  node heard from (`agreed`). A peer that says a level below the committed one is refused
  at the handshake (`refusal`): its release would apply the log by older rules.
- `CommittedLevelFile`: `data_dir/cluster_level`, one decimal line, written atomically when
  an applied entry raises the level. A node reads it before it listens and refuses to
  start, with one line naming both levels, if its own level is below it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from quorumlog.codec.feature_levels import (
    BASELINE_FEATURE_LEVEL,
    FEATURE_LEVEL,
    agreed_level,
    check_level,
)
from quorumlog.errors import ClusterLevelError
from quorumlog.storage.filesystem import atomic_write

log = logging.getLogger("quorumlog.node")

LEVEL_FILE_NAME = "cluster_level"


class PeerLevels:
    """The feature level each node said (node id → level), this node's own included."""

    def __init__(
        self,
        node_id: str,
        own_level: int = FEATURE_LEVEL,
        committed: Callable[[], int] = lambda: BASELINE_FEATURE_LEVEL,
    ) -> None:
        """`committed()`: the highest level this node knows was committed (a peer below it
        is refused)."""
        self.node_id = node_id
        self.own_level = own_level
        self.committed = committed
        self.levels: dict[str, int] = {node_id: own_level}

    def heard(self, peer: str, level: int) -> str | None:
        """Note what `peer` said in its handshake; the reason to refuse it, if its level is
        below the committed one, else None."""
        if peer == self.node_id:
            return None
        self.levels[peer] = level
        committed = self.committed()
        if level < committed:
            return (
                f"peer {peer!r} runs feature level {level}, below the cluster's committed "
                f"feature level {committed}: a downgrade past the committed level is refused"
            )
        return None

    def agreed(self, members: Iterable[str]) -> int | None:
        """The lowest level among `members` and every node heard from; None while a member
        has not said its level."""
        return agreed_level(self.levels, {*members, *self.levels})


class CommittedLevelFile:
    """The highest feature level this node applied, in `data_dir/cluster_level`."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LEVEL_FILE_NAME

    def read(self) -> int:
        """The level kept; the baseline if there is none (a node from before the gate, or a
        new one)."""
        try:
            text = self.path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return BASELINE_FEATURE_LEVEL
        if not text.isdigit():
            raise ClusterLevelError(f"{self.path} holds {text!r}, not a feature level")
        return int(text)

    def raise_to(self, level: int) -> None:
        """Keep `level` if it is above the one kept (the kept level never goes down)."""
        if level <= self.read():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, f"{level}\n".encode("ascii"))
        log.info("cluster feature level %d committed (kept in %s)", level, self.path)

    def check_start(self, own_level: int = FEATURE_LEVEL) -> int:
        """The level kept; raises ClusterLevelError if `own_level` is below it (the node
        command prints it as "error: node n1 cannot run: this release runs feature level
        ...")."""
        committed = self.read()
        check_level(own_level, committed, "this release")
        return committed


__all__ = ["LEVEL_FILE_NAME", "CommittedLevelFile", "PeerLevels"]
