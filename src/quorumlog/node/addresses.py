"""Where each node listens, as this node knows it, and which source of an address wins.

A node can come back on a new address (`quorumlog dev down` then `dev up` binds new ports;
an operator moves a node). Its old address lives on in the logs — in Raft configuration
entries (members added with an address) and in topic descriptors — and those are replayed
at every start. The address must follow the node, so each address is kept with where it
came from, and a source only replaces an address learned from a source that is not newer
news than itself:

1. `SELF` — this node's own listen address. Nobody else can tell a node where it is.
2. `ANNOUNCED` — what a peer says about itself in the handshake of a live connection
   (`Hello.listen`). It is the freshest fact there is: the peer is running there now.
   Among announcements, the latest wins (a peer that restarts again announces again).
3. `OPERATOR` — what this process was told when it started (`--peers`, or a harness that
   knows the addresses). It was current when the process started, so it beats the logs,
   but a later announcement beats it: the peer may have moved since.
4. `STORED` — addresses read back from log entries and state (configuration changes,
   topic descriptors). They may be any age, and they are replayed in an order that says
   nothing about their age (descriptors are re-read whenever topics change, long after
   the configuration entry that followed them), so a stored address only fills a gap: it
   never replaces an address already known, not even another stored one. A node that a
   stored address sent us to the wrong place for is put right when it announces itself.

How the nodes' addresses reach everything else:

- peers: a peer's `Hello` carries where it listens (`--advertise`, else `--listen` with the
  port bound), and a node that waits to be dialled dials a smaller-id peer itself when it
  has no link to it for a moment, so a peer that did not restart still learns where a
  restarted node went (`runtime/transport.py`);
- leader hints and `StatusResponse.addresses` come from this book, so clients are sent to
  where nodes listen now;
- shard groups are best named by node id in the controller's configurations (what
  `quorumlog dev up --groups` joins): a configuration stays in the controller's log for
  good, so an address in it goes stale, while an id is looked up each time — here for
  shard pulls (`PeerRequester`'s `resolve`), and by clients in a node's
  `StatusResponse.addresses`;
- stream clients take a node's `StatusResponse.addresses` over the addresses stored in a
  topic descriptor, the same rule seen from outside: a node's current view beats the log.
"""

from __future__ import annotations

import enum

import msgspec

from quorumlog.errors import AdvertisedAddressError
from quorumlog.raft.invariants import require
from quorumlog.runtime.transport import WILDCARD_HOSTS


class AddressSource(enum.IntEnum):
    """Where an address came from; a higher value is fresher news (see the module doc)."""

    STORED = 1
    OPERATOR = 2
    ANNOUNCED = 3
    SELF = 4


class KnownAddress(msgspec.Struct, frozen=True):
    address: str
    source: AddressSource


class AddressBook:
    """Node id → address, each with its source; `learn` applies the precedence rule."""

    def __init__(self, own_id: str) -> None:
        self.own_id = own_id
        self.known: dict[str, KnownAddress] = {}

    def learn(self, node_id: str, address: str, source: AddressSource) -> bool:
        """Take `address` for `node_id` if `source` is news enough; True if it changed."""
        require(
            source is not AddressSource.SELF or node_id == self.own_id,
            f"{self.own_id} cannot set {node_id}'s address as its own",
        )
        if node_id == self.own_id and source is not AddressSource.SELF:
            return False  # others' view of us is never better than our own
        current = self.known.get(node_id)
        if current is not None and not replaces(source, current.source):
            return False
        if current is not None and current.address == address:
            if source > current.source:
                self.known[node_id] = KnownAddress(address, source)
            return False
        self.known[node_id] = KnownAddress(address, source)
        return True

    def learn_all(self, addresses: dict[str, str], source: AddressSource) -> bool:
        """`learn` each; True if any address changed."""
        changed = [self.learn(node, address, source) for node, address in addresses.items()]
        return any(changed)

    def address_of(self, node_id: str) -> str | None:
        known = self.known.get(node_id)
        return known.address if known is not None else None

    def source_of(self, node_id: str) -> AddressSource | None:
        known = self.known.get(node_id)
        return known.source if known is not None else None

    def addresses(self) -> dict[str, str]:
        """Every known node's address (this node's too)."""
        return {node_id: known.address for node_id, known in self.known.items()}

    def peer_addresses(self) -> dict[str, str]:
        """Every known node's address but this node's."""
        return {
            node_id: known.address
            for node_id, known in self.known.items()
            if node_id != self.own_id
        }


def replaces(new: AddressSource, current: AddressSource) -> bool:
    """Whether an address from `new` replaces one from `current`: a fresher source always
    does, the same source does (its latest word), except `STORED`, which only fills gaps."""
    if new is AddressSource.STORED:
        return False
    return new >= current


def host_of(address: str) -> str:
    """The host of HOST:PORT ("" when there is none, as in ":2379"), brackets dropped."""
    return address.rpartition(":")[0].strip("[]")


def check_advertised(listen: str, advertise: str) -> None:
    """Refuse an address others would be told but could not dial: a wildcard `advertise`,
    or a wildcard `listen` with no `advertise` (it would be what peers learn from our
    handshake, clients from leader hints and topic descriptions, the metadata group from
    our bookie's registration). A wildcard listen with a real `advertise` is the way to
    serve on every interface."""
    if advertise:
        host = host_of(advertise)
        port = advertise.rpartition(":")[2]
        if host in WILDCARD_HOSTS:
            raise AdvertisedAddressError(
                f"--advertise {advertise} is a wildcard address; give the HOST:PORT peers "
                f"and clients can reach this node at"
            )
        if not port.isdigit() or int(port) == 0:
            raise AdvertisedAddressError(f"--advertise {advertise} needs a port (HOST:PORT)")
        return
    if host_of(listen) in WILDCARD_HOSTS:
        raise AdvertisedAddressError(
            f"--listen {listen} is a wildcard address, which peers and clients cannot dial; "
            f"give --advertise HOST:PORT too"
        )


__all__ = [
    "AddressBook",
    "AddressSource",
    "KnownAddress",
    "check_advertised",
    "host_of",
    "replaces",
]
