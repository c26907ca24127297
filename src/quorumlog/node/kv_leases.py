"""The leader's side of KV leases: deciding, by its clock, that a lease expired.

Expiry is decided by the leader alone and carried out through the log: when a lease's
time is up by the leader's clock, the leader proposes an entry naming it
(`KVEntry.expired_leases`), and every replica revokes it on applying that entry, if it is
still expired by the entry's stamp (a keepalive applied in between wins). No replica reads
its own clock in apply.

A new leader gives every lease one more TTL from when it took over (etcd's rule): the old
leader's keepalives may not have reached the log, and a leader cannot tell how stale its
clock's view of them is. That extension lives here, on the leader, not in the replicated
state: it only ever delays an expiry, and a later leader extends again.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from quorumlog.kv.machine import KVStateMachine
from quorumlog.kv.mvcc import Lease
from quorumlog.runtime.handle import GroupHandle
from quorumlog.runtime.resources import Timer

LEASE_CHECK_INTERVAL_SECONDS = 0.25
"""How often a node holding leases looks for expired ones (and notices it leads)."""
EXPIRED_PER_ENTRY_MAX = 1_000
"""Leases one expiry entry names at most."""


class LeaseKeeper:
    """Watches the machine's leases on one node; proposes expiries while it leads."""

    def __init__(
        self,
        group: GroupHandle,
        machine: Callable[[], KVStateMachine],
        propose_expired: Callable[[list[int], Callable[[], None]], None],
    ) -> None:
        self.group = group
        self.machine = machine
        self.propose_expired = propose_expired
        """Propose an expiry entry; call the callback once it is applied or failed."""
        self.leader_since_ms: int | None = None
        self.in_flight: set[int] = set()
        self.timer: Timer | None = None

    def changed(self) -> None:
        """The machine's leases may have changed: make sure someone looks at them."""
        if self.timer is None and self.machine().store.leases:
            self.timer = self.group.scheduler.call_later(LEASE_CHECK_INTERVAL_SECONDS, self.check)

    def check(self) -> None:
        self.timer = None
        leases = self.machine().store.leases
        if not leases:
            return  # nothing to watch: no timer runs until a lease is granted
        self.timer = self.group.scheduler.call_later(LEASE_CHECK_INTERVAL_SECONDS, self.check)
        if not self.group.is_leader:
            self.leader_since_ms = None
            return
        now_ms = self.group.scheduler.wall_time_ms()
        if self.leader_since_ms is None:
            self.leader_since_ms = now_ms
        expired = [
            lease_id
            for lease_id, lease in leases.items()
            if lease_id not in self.in_flight and self.expiry_ms(lease) <= now_ms
        ][:EXPIRED_PER_ENTRY_MAX]
        if not expired:
            return
        self.in_flight.update(expired)

        def settled() -> None:
            self.in_flight.difference_update(expired)

        self.propose_expired(expired, settled)

    def expiry_ms(self, lease: Lease) -> int:
        """When this leader lets `lease` expire: its logged expiry, or one TTL after this
        node became leader, whichever is later."""
        since_ms = self.leader_since_ms
        if since_ms is None:
            since_ms = self.group.scheduler.wall_time_ms()
        return max(lease.expiry_ms, since_ms + lease.ttl_seconds * 1000)

    def remaining_seconds(self, lease: Lease) -> int:
        """Whole seconds left by this (leading) node's clock, at least 0."""
        left_ms = self.expiry_ms(lease) - self.group.scheduler.wall_time_ms()
        return max(0, math.ceil(left_ms / 1000))


__all__ = ["LEASE_CHECK_INTERVAL_SECONDS", "LeaseKeeper"]
