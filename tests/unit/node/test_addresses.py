"""Which address of a node wins: own > announced in a handshake > operator > stored in logs."""

from __future__ import annotations

import pytest

from quorumlog.node.addresses import AddressBook, AddressSource, replaces
from quorumlog.raft.invariants import InvariantViolation

OLD = "127.0.0.1:7001"
NEW = "127.0.0.1:7101"
NEWER = "127.0.0.1:7201"


def book_with(address: str, source: AddressSource) -> AddressBook:
    book = AddressBook("n1")
    book.learn("n2", address, source)
    return book


def test_a_stored_address_fills_a_gap() -> None:
    book = AddressBook("n1")
    assert book.learn("n2", OLD, AddressSource.STORED)
    assert book.address_of("n2") == OLD


@pytest.mark.parametrize(
    "known", [AddressSource.STORED, AddressSource.OPERATOR, AddressSource.ANNOUNCED]
)
def test_a_stored_address_replayed_later_never_replaces_a_known_one(
    known: AddressSource,
) -> None:
    # Log entries are replayed at every start, and topic descriptors are re-read whenever
    # topics change: their order says nothing about their age.
    book = book_with(NEW, known)
    assert not book.learn("n2", OLD, AddressSource.STORED)
    assert book.address_of("n2") == NEW
    assert book.source_of("n2") is known


def test_the_command_line_beats_the_logs() -> None:
    book = book_with(OLD, AddressSource.STORED)
    assert book.learn("n2", NEW, AddressSource.OPERATOR)
    assert book.address_of("n2") == NEW


def test_a_live_announcement_beats_the_command_line_and_the_logs() -> None:
    for known in (AddressSource.STORED, AddressSource.OPERATOR):
        book = book_with(OLD, known)
        assert book.learn("n2", NEW, AddressSource.ANNOUNCED)
        assert book.address_of("n2") == NEW


def test_the_latest_announcement_wins_a_node_that_moves_twice_is_followed() -> None:
    book = book_with(OLD, AddressSource.ANNOUNCED)
    assert book.learn("n2", NEW, AddressSource.ANNOUNCED)
    assert book.learn("n2", NEWER, AddressSource.ANNOUNCED)
    assert book.address_of("n2") == NEWER


def test_the_command_line_does_not_undo_an_announcement() -> None:
    book = book_with(NEW, AddressSource.ANNOUNCED)
    assert not book.learn("n2", OLD, AddressSource.OPERATOR)
    assert book.address_of("n2") == NEW


def test_a_fresher_source_confirming_the_same_address_protects_it_from_weaker_ones() -> None:
    book = book_with(OLD, AddressSource.STORED)
    assert not book.learn("n2", OLD, AddressSource.ANNOUNCED)  # same address: no change
    assert book.source_of("n2") is AddressSource.ANNOUNCED
    assert not book.learn("n2", NEW, AddressSource.OPERATOR)
    assert book.address_of("n2") == OLD


def test_nobody_else_moves_this_node() -> None:
    book = AddressBook("n1")
    assert book.learn("n1", NEW, AddressSource.SELF)
    for source in (AddressSource.STORED, AddressSource.OPERATOR, AddressSource.ANNOUNCED):
        assert not book.learn("n1", OLD, source)
    assert book.address_of("n1") == NEW
    assert book.peer_addresses() == {}
    assert book.addresses() == {"n1": NEW}


def test_only_this_node_speaks_for_itself() -> None:
    with pytest.raises(InvariantViolation):
        AddressBook("n1").learn("n2", NEW, AddressSource.SELF)


def test_learn_all_reports_whether_anything_changed() -> None:
    book = AddressBook("n1")
    assert book.learn_all({"n2": OLD, "n3": NEW}, AddressSource.OPERATOR)
    assert not book.learn_all({"n2": OLD, "n3": NEW}, AddressSource.OPERATOR)
    assert not book.learn_all({"n2": NEWER}, AddressSource.STORED)
    assert book.peer_addresses() == {"n2": OLD, "n3": NEW}


def test_the_precedence_table() -> None:
    order = [
        AddressSource.STORED,
        AddressSource.OPERATOR,
        AddressSource.ANNOUNCED,
        AddressSource.SELF,
    ]
    for new in order:
        for current in order:
            expected = new is not AddressSource.STORED and new >= current
            assert replaces(new, current) is expected, (new, current)
