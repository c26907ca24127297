"""`GroupHandle`: all a service may ask of the Raft group it serves.

Services (the KV, shard, controller and stream services in node/) answer clients on top of
a group. They see it only through this narrow handle — propose, a read barrier, who leads,
hand over leadership — and schedule their own work through its scheduler, never through
asyncio. `RaftHost` is a handle, in the real node and in the simulator alike, so the
simulator runs the services exactly as they ship.
"""

from __future__ import annotations

from typing import Any, Protocol

from quorumlog.raft.configuration import Configuration, MembershipChange
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.resources import Scheduler


class GroupHandle(Protocol):
    @property
    def group_id(self) -> str: ...

    @property
    def node_id(self) -> str: ...

    @property
    def scheduler(self) -> Scheduler: ...

    @property
    def is_leader(self) -> bool: ...

    @property
    def leader_id(self) -> str | None: ...

    @property
    def applied_index(self) -> int: ...

    @property
    def configuration(self) -> Configuration: ...

    def propose(self, data: bytes) -> Completion[Any]:
        """The state machine's result once the entry is applied here. Raises a typed
        `QuorumLogError` at once if the group refuses (not the leader, pending full, ...)."""
        ...

    def linearizable_read(self) -> Completion[int]:
        """Resolves once state applied here may be read linearizably (ReadIndex or lease)."""
        ...

    def change_membership(self, change: MembershipChange) -> Completion[Any]: ...

    def transfer_leadership(self, target: str) -> None: ...
