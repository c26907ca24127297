"""Election timeout and heartbeat interval in milliseconds (etcd's flags) as Raft ticks.

The Raft core counts ticks, never milliseconds (it reads no clock); the node ticks every
`tick_ms`. etcd's operators set `--heartbeat-interval` and `--election-timeout` in ms, so
the node takes those and turns them into whole ticks here, refusing settings that would
break the rules elections rely on:

- the heartbeat interval is a whole number of ticks, at least one: a tick is the finest
  time the node can measure;
- the election timeout is a whole number of ticks and at least five heartbeat intervals
  (etcd's rule): a follower must miss several heartbeats in a row, not one late one,
  before it starts an election, or a busy leader is deposed for nothing;
- the election timeout is at most 50 s (etcd's bound): past it a dead leader goes
  unnoticed for longer than any client waits.
"""

from __future__ import annotations

import msgspec

ELECTION_TO_HEARTBEAT_RATIO_MIN = 5
ELECTION_TIMEOUT_MS_MAX = 50_000
ELECTION_TICKS_DEFAULT = 10
HEARTBEAT_TICKS_DEFAULT = 1


class RaftTiming(msgspec.Struct, frozen=True):
    election_ticks: int
    heartbeat_ticks: int


def whole_ticks(name: str, milliseconds: int, tick_ms: int) -> int:
    if milliseconds < tick_ms or milliseconds % tick_ms:
        raise ValueError(
            f"{name} {milliseconds} ms must be a whole multiple of --tick-ms ({tick_ms} ms)"
        )
    return milliseconds // tick_ms


def raft_timing(
    tick_ms: int, election_timeout_ms: int | None, heartbeat_interval_ms: int | None
) -> RaftTiming:
    """Ticks for the given times (None: the default in ticks). Raises ValueError naming the
    flag and the rule when the combination is unsafe."""
    heartbeat_ticks = (
        HEARTBEAT_TICKS_DEFAULT
        if heartbeat_interval_ms is None
        else whole_ticks("--heartbeat-interval-ms", heartbeat_interval_ms, tick_ms)
    )
    if election_timeout_ms is None:
        election_ticks = max(
            ELECTION_TICKS_DEFAULT, heartbeat_ticks * ELECTION_TO_HEARTBEAT_RATIO_MIN
        )
    else:
        if election_timeout_ms > ELECTION_TIMEOUT_MS_MAX:
            raise ValueError(
                f"--election-timeout-ms {election_timeout_ms} is over {ELECTION_TIMEOUT_MS_MAX} ms"
            )
        election_ticks = whole_ticks("--election-timeout-ms", election_timeout_ms, tick_ms)
    if election_ticks < heartbeat_ticks * ELECTION_TO_HEARTBEAT_RATIO_MIN:
        raise ValueError(
            f"--election-timeout-ms ({election_ticks * tick_ms} ms) must be at least "
            f"{ELECTION_TO_HEARTBEAT_RATIO_MIN} times --heartbeat-interval-ms "
            f"({heartbeat_ticks * tick_ms} ms)"
        )
    return RaftTiming(election_ticks=election_ticks, heartbeat_ticks=heartbeat_ticks)


__all__ = ["RaftTiming", "raft_timing"]
