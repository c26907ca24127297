"""Deleting a deleted partition's keys: the ledger list goes, and the ownership lease goes
when this node holds it, even if a renewal changed the lease's value after it was read."""

from __future__ import annotations

from quorumlog.ledger.managed_format import managed_ledger_key
from quorumlog.ledger.ownership import OwnerLease, decode_lease, encode_lease, owner_key
from quorumlog.node.ledger_topics import forget_keys
from tests.unit.ledger.test_managed_kv import DictKV

NAME = "events@1/0"


class RenewingKV(DictKV):
    """A lease renewal lands between each read of the lease and the CAS that follows it,
    `renewals` times."""

    def __init__(self, renewals: int) -> None:
        super().__init__()
        self.renewals = renewals

    def cas(self, key: str, expected: str | None, new: str | None) -> bool:
        if key == owner_key(NAME) and self.renewals > 0:
            self.renewals -= 1
            lease = decode_lease(self.data[key])
            assert lease is not None
            self.data[key] = encode_lease(lease.renewed())
        return super().cas(key, expected, new)


def test_a_lease_renewed_while_deleting_is_still_deleted() -> None:
    kv = RenewingKV(renewals=2)
    kv.data[managed_ledger_key(NAME)] = "record"
    kv.data[owner_key(NAME)] = encode_lease(OwnerLease("n1", epoch=3))
    forget_keys(kv, NAME, "n1")
    assert kv.data == {}


def test_another_nodes_lease_is_left_alone() -> None:
    kv = DictKV()
    kv.data[managed_ledger_key(NAME)] = "record"
    theirs = encode_lease(OwnerLease("n2", epoch=4))
    kv.data[owner_key(NAME)] = theirs
    forget_keys(kv, NAME, "n1")
    assert kv.data == {owner_key(NAME): theirs}
