"""Is this node healthy? etcd's answer: every group it hosts has a leader, and its KV group
serves a linearizable read now.

`decide_health` is the decision, pure (groups' state and the read's outcome in, a verdict
out), so `quorumlog endpoint health` or anything else holding the same facts reaches the
same verdict. `check_health` gathers the facts on a running node: the groups' state as
their cores see it, then one real read through the client KV read path (a `KVRead` that
is not stale, sent to this node's own client port first; a follower answers NOT_LEADER
with its leader, which then does a ReadIndex round with a quorum) within a short
deadline. `check_liveness` is `/livez`: the process runs and no group has stopped itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import msgspec

from quorumlog.codec import wire
from quorumlog.errors import QuorumLogError
from quorumlog.node.dispatch import KV_GROUP
from quorumlog.node.peer_requests import PeerRequests
from quorumlog.runtime.group import GroupRunner, completion_future

HEALTH_READ_TIMEOUT_SECONDS_DEFAULT = 2.0
"""Long enough for a read on a loaded machine; short enough for a probe's own timeout."""
HEALTH_READ_ATTEMPT_SECONDS = 1.0


class GroupState(msgspec.Struct, frozen=True):
    name: str
    leader: str | None
    failure: str | None = None


class HealthVerdict(msgspec.Struct, frozen=True):
    healthy: bool
    reason: str = ""

    def body(self) -> dict[str, str]:
        """etcd's JSON: {"health": "true"} or {"health": "false", "reason": ...}."""
        if self.healthy:
            return {"health": "true"}
        return {"health": "false", "reason": self.reason}


def decide_health(groups: Iterable[GroupState], kv_read_problem: str | None) -> HealthVerdict:
    """Healthy when no group failed, every group has a leader, and the KV read worked
    (`kv_read_problem` None). The reason names the first problem, groups sorted by name."""
    for group in sorted(groups, key=lambda state: state.name):
        if group.failure is not None:
            return HealthVerdict(False, f"group {group.name} stopped: {group.failure}")
        if group.leader is None:
            return HealthVerdict(False, f"group {group.name} has no leader")
    if kv_read_problem is not None:
        return HealthVerdict(False, f"linearizable read failed: {kv_read_problem}")
    return HealthVerdict(True)


def group_states(groups: Mapping[str, GroupRunner]) -> list[GroupState]:
    states = []
    for name, group in groups.items():
        host = group.host
        failure = host.failure or ("stopping" if host.stopped else None)
        states.append(GroupState(name=name, leader=group.core.leader_id, failure=failure))
    return states


async def linearizable_read_problem(
    peers: PeerRequests, endpoints: Sequence[str], timeout_seconds: float
) -> str | None:
    """Read nothing, linearizably, through the KV group at `endpoints` (this node's own
    address first): None if a leader confirmed it within the deadline, else why not."""
    if not endpoints:
        return "no address of the KV group is known"
    completion = peers.request(
        endpoints,
        lambda request_id: wire.KVRead(request_id=request_id, keys=[], group=KV_GROUP),
        accept=lambda frame: isinstance(frame, wire.KVReadResult),
        timeout_seconds=timeout_seconds,
        attempt_timeout_seconds=min(HEALTH_READ_ATTEMPT_SECONDS, timeout_seconds),
    )
    try:
        await completion_future(completion)
    except QuorumLogError as error:
        return str(error)
    return None


async def check_health(
    groups: Mapping[str, GroupRunner],
    peers: PeerRequests | None,
    endpoints: Callable[[], list[str]],
    timeout_seconds: float = HEALTH_READ_TIMEOUT_SECONDS_DEFAULT,
) -> HealthVerdict:
    """The node's health now (see the module docstring); a failed group or a missing
    leader answers at once, without waiting for the read."""
    states = group_states(groups)
    verdict = decide_health(states, None)
    if not verdict.healthy:
        return verdict
    if peers is None:
        return decide_health(states, "the node is not serving yet")
    problem = await linearizable_read_problem(peers, endpoints(), timeout_seconds)
    return decide_health(states, problem)


def check_liveness(groups: Mapping[str, GroupRunner]) -> HealthVerdict:
    """`/livez`: alive unless a group stopped itself (then the node needs a person)."""
    for state in sorted(group_states(groups), key=lambda state: state.name):
        if state.failure is not None and state.failure != "stopping":
            return HealthVerdict(False, f"group {state.name} stopped: {state.failure}")
    return HealthVerdict(True)
