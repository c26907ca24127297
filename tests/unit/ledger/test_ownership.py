"""The ownership lease rule of ledger-backed partitions (ledger/ownership.py): who renews,
who takes a missing or stale lease and when, and the lease's text form."""

from __future__ import annotations

import pytest

from quorumlog.errors import LedgerMetadataFormatError
from quorumlog.ledger.ownership import (
    LeaseMove,
    OwnerLease,
    decode_lease,
    encode_lease,
    next_move,
    taken_lease,
)

CANDIDATES = ["n1", "n2", "n3"]
STALE_SECONDS = 3.0
STAGGER_SECONDS = 1.0


def move(node_id: str, lease: OwnerLease | None, unchanged: float, holding: bool = False) -> str:
    return next_move(
        node_id, CANDIDATES, lease, holding, unchanged, STALE_SECONDS, STAGGER_SECONDS
    ).value


def test_the_holder_renews_whatever_its_copy_of_the_metadata_says() -> None:
    assert move("n2", OwnerLease("n1", 4), 0.0, holding=True) == LeaseMove.RENEW.value


def test_with_no_lease_the_first_candidate_takes_it_at_once_and_the_others_wait_their_turn() -> (
    None
):
    assert move("n1", None, 0.0) == "take"
    assert move("n2", None, 0.0) == "wait"
    assert move("n2", None, STALE_SECONDS + STAGGER_SECONDS - 0.1) == "wait"
    assert move("n2", None, STALE_SECONDS + STAGGER_SECONDS) == "take"
    assert move("n3", None, STALE_SECONDS + STAGGER_SECONDS) == "wait"


def test_a_stale_lease_goes_to_the_first_other_candidate_first() -> None:
    lease = OwnerLease("n1", 2, renewals=9)
    assert move("n2", lease, STALE_SECONDS - 0.1) == "wait"
    assert move("n2", lease, STALE_SECONDS) == "take"
    assert move("n3", lease, STALE_SECONDS) == "wait"
    assert move("n3", lease, STALE_SECONDS + STAGGER_SECONDS) == "take"


def test_a_lease_naming_a_node_that_does_not_hold_it_is_taken_back_at_once() -> None:
    # A handover at a clean stop, or our own lease from before a restart.
    assert move("n3", OwnerLease("n3", 5), 0.0) == "take"


def test_a_node_that_is_no_candidate_never_takes_the_lease() -> None:
    assert move("n9", None, 1000.0) == "wait"


def test_taking_over_raises_the_epoch_and_the_text_form_round_trips() -> None:
    assert taken_lease("n2", None) == OwnerLease("n2", 1)
    assert taken_lease("n2", OwnerLease("n1", 7, 30)) == OwnerLease("n2", 8)
    lease = OwnerLease("n1", 3).renewed()
    assert decode_lease(encode_lease(lease)) == OwnerLease("n1", 3, 1)
    assert decode_lease(None) is None
    with pytest.raises(LedgerMetadataFormatError):
        decode_lease("not a lease")
