"""Who owns a ledger-backed partition: a lease in the metadata group, and the rule each
candidate node follows to take it (pure: times come in as arguments).

The lease, key `__owners/<managed ledger name>`, names the owner and an epoch, and counts
renewals. The owner rewrites it (renewals + 1) by compare-and-set every renew interval.
Other candidates never compare clocks across nodes: each notes, on its own monotonic
clock, when it last saw the lease's value change; a value unchanged for `stale_seconds`
means the owner stopped renewing. The candidates of a partition are its descriptor's
replicas, in order; ranking them (the lease holder left out) staggers who tries first, so
the descriptor's first live replica becomes the owner and partitions spread as their
replica lists do.

Safety does not rest on the lease. Two nodes may both believe they own a partition for a
while (a paused owner, a partition of the network), but a new owner's first act is to
recover the last ledger, which fences it on the bookies: the old owner's next append fails
with LedgerFencedError (NotPartitionOwnerError) and nothing it wrote after the fence is
acknowledged. The lease only keeps takeovers rare and orderly.
"""

from __future__ import annotations

import enum

import msgspec

from quorumlog.errors import LedgerMetadataFormatError

OWNER_PREFIX = "__owners/"


def owner_key(name: str) -> str:
    return OWNER_PREFIX + name


class OwnerLease(msgspec.Struct, frozen=True, array_like=True):
    owner: str
    epoch: int
    """Raised by one at every change of owner."""
    renewals: int = 0
    """Raised by one at every renewal, so a live owner's lease value keeps changing."""

    def renewed(self) -> OwnerLease:
        return OwnerLease(self.owner, self.epoch, self.renewals + 1)


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(OwnerLease)


def encode_lease(lease: OwnerLease) -> str:
    return _encoder.encode(lease).decode()


def decode_lease(value: str | None) -> OwnerLease | None:
    """None for no lease; LedgerMetadataFormatError for a value that is not one."""
    if value is None:
        return None
    try:
        return _decoder.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise LedgerMetadataFormatError(f"bad ownership lease {value!r}: {error}") from error


class LeaseMove(enum.Enum):
    WAIT = "wait"
    RENEW = "renew"
    TAKE = "take"


def next_move(
    node_id: str,
    candidates: list[str],
    lease: OwnerLease | None,
    holding: bool,
    unchanged_seconds: float,
    stale_seconds: float,
    stagger_seconds: float,
) -> LeaseMove:
    """What `node_id` does now about a partition whose candidates are `candidates`.

    `holding`: this node wrote the lease it believes current (it renews, by CAS against
    what it wrote, and learns it lost the lease when that fails). Otherwise it takes the
    lease once no one holds it, or once its value has been `unchanged_seconds` >= the stale
    time; each candidate waits `stagger_seconds` more per rank, so the first one that is
    alive goes first. With no lease at all the first candidate does not wait."""
    if holding:
        return LeaseMove.RENEW
    if node_id not in candidates:
        return LeaseMove.WAIT
    holder = None if lease is None else lease.owner
    others = [candidate for candidate in candidates if candidate != holder]
    rank = others.index(node_id) if node_id in others else 0
    if lease is None:
        wait_seconds = 0.0 if rank == 0 else stale_seconds + rank * stagger_seconds
    elif lease.owner == node_id:
        # Ours from before a restart: nobody renews it; take it back at once (a new
        # epoch, then the usual open, which fences whatever our old self wrote).
        wait_seconds = 0.0
    else:
        wait_seconds = stale_seconds + rank * stagger_seconds
    return LeaseMove.TAKE if unchanged_seconds >= wait_seconds else LeaseMove.WAIT


def taken_lease(node_id: str, lease: OwnerLease | None) -> OwnerLease:
    """The lease `node_id` writes to take over from `lease`."""
    return OwnerLease(node_id, 1 if lease is None else lease.epoch + 1)
