"""Ledger metadata: encoding, passwords, the compare-and-set store; placement."""

from __future__ import annotations

import random

import msgspec
import pytest

from quorumlog.errors import (
    BadPasswordError,
    LedgerMetadataConflictError,
    LedgerMetadataFormatError,
    LedgerNotFoundError,
    NotEnoughBookiesError,
)
from quorumlog.ledger.metadata import (
    METADATA_FORMAT_VERSION,
    InMemoryMetadataStore,
    LedgerState,
    check_password,
    decode_metadata,
    encode_metadata,
    master_key,
    new_ledger_metadata,
)
from quorumlog.ledger.placement import choose_ensemble, replace_bookies
from quorumlog.ledger.protocol_actions import (
    ListWritableBookies,
    MetadataConflict,
    MetadataMissing,
    MetadataRead,
    ReadLedgerMetadata,
    UpdateLedgerMetadata,
    WritableBookies,
    run_metadata_operation,
)


def test_metadata_round_trips_through_its_versioned_encoding() -> None:
    metadata = new_ledger_metadata(
        ensemble=["b1", "b2", "b3"],
        write_quorum_size=2,
        ack_quorum_size=2,
        password=b"pw",
        properties={"topic": "orders/0"},
    )
    metadata = metadata.updated(ensembles={0: ["b1", "b2", "b3"], 7: ["b1", "b4", "b3"]})
    data = encode_metadata(metadata)
    assert data[4] == METADATA_FORMAT_VERSION
    assert decode_metadata(data) == metadata


@pytest.mark.parametrize(
    "data",
    [b"", b"QLLM", b"XXXX\x01abc", b"QLLM\x02" + b"\x80", b"QLLM\x01\xff\xff"],
)
def test_bad_bytes_are_a_typed_error(data: bytes) -> None:
    with pytest.raises(LedgerMetadataFormatError):
        decode_metadata(data)


def test_inconsistent_metadata_is_refused() -> None:
    metadata = new_ledger_metadata(
        ensemble=["b1", "b2", "b3"], write_quorum_size=2, ack_quorum_size=2, password=b""
    )
    for broken in (
        msgspec.structs.replace(metadata, ensembles={0: ["b1", "b1", "b2"]}),
        msgspec.structs.replace(metadata, ensembles={1: ["b1", "b2", "b3"]}),
        msgspec.structs.replace(metadata, ack_quorum_size=3),
        msgspec.structs.replace(
            metadata,
            state=LedgerState.CLOSED,
            ensembles={0: ["b1", "b2", "b3"], 5: ["b1", "b2", "b4"]},
            last_entry_id=2,
        ),
    ):
        with pytest.raises(LedgerMetadataFormatError):
            decode_metadata(encode_metadata(broken))


def test_the_password_is_never_stored_and_checked_by_digest() -> None:
    metadata = new_ledger_metadata(
        ensemble=["b1", "b2"], write_quorum_size=2, ack_quorum_size=1, password=b"hunter2"
    )
    assert b"hunter2" not in encode_metadata(metadata)
    assert master_key(b"hunter2") not in encode_metadata(metadata)
    assert check_password(metadata, b"hunter2") == master_key(b"hunter2")
    with pytest.raises(BadPasswordError):
        check_password(metadata, b"hunter3")


def test_the_store_gives_unique_ids_and_updates_by_compare_and_set() -> None:
    store = InMemoryMetadataStore()
    template = new_ledger_metadata(
        ensemble=["b1", "b2"], write_quorum_size=2, ack_quorum_size=1, password=b""
    )
    first, second = store.create_ledger(template), store.create_ledger(template)
    assert first.ledger_id != second.ledger_id
    assert first.version == 0
    updated = store.update_ledger(first.updated(state=LedgerState.IN_RECOVERY), 0)
    assert store.read_ledger(first.ledger_id) == updated
    with pytest.raises(LedgerMetadataConflictError) as conflict:
        store.update_ledger(first.updated(state=LedgerState.CLOSED), 0)
    assert (conflict.value.expected_version, conflict.value.actual_version) == (0, 1)
    with pytest.raises(ValueError):
        store.update_ledger(updated, 1)  # must store version 2
    assert store.list_ledgers() == [first.ledger_id, second.ledger_id]
    store.delete_ledger(second.ledger_id)
    with pytest.raises(LedgerNotFoundError):
        store.read_ledger(second.ledger_id)
    with pytest.raises(LedgerMetadataConflictError):
        store.delete_ledger(first.ledger_id, expected_version=0)


def test_metadata_operations_become_results() -> None:
    store = InMemoryMetadataStore()
    store.register_bookie("b2")
    store.register_bookie("b1")
    store.register_bookie("b3")
    store.set_bookie_writable("b3", False)
    template = new_ledger_metadata(
        ensemble=["b1", "b2"], write_quorum_size=2, ack_quorum_size=1, password=b""
    )
    stored = store.create_ledger(template)
    assert run_metadata_operation(store, ListWritableBookies(1)) == WritableBookies(1, ["b1", "b2"])
    assert run_metadata_operation(store, ReadLedgerMetadata(2, stored.ledger_id)) == MetadataRead(
        2, stored
    )
    assert run_metadata_operation(store, ReadLedgerMetadata(3, 99)) == MetadataMissing(3)
    closed = stored.updated(state=LedgerState.CLOSED)
    assert run_metadata_operation(store, UpdateLedgerMetadata(4, closed, 0)) == MetadataRead(
        4, closed
    )
    assert run_metadata_operation(store, UpdateLedgerMetadata(5, closed, 0)) == MetadataConflict(
        5, closed
    )
    store.delete_ledger(stored.ledger_id)
    assert run_metadata_operation(store, UpdateLedgerMetadata(6, closed, 1)) == MetadataConflict(
        6, None
    )


def test_placement_is_deterministic_for_a_seed_and_spreads_bookies() -> None:
    bookies = [f"b{index}" for index in range(10)]
    first = choose_ensemble(bookies, 3, random.Random(5))
    assert first == choose_ensemble(list(reversed(bookies)), 3, random.Random(5))
    assert len(set(first)) == 3
    used = {b for seed in range(50) for b in choose_ensemble(bookies, 3, random.Random(seed))}
    assert used == set(bookies)
    with pytest.raises(NotEnoughBookiesError):
        choose_ensemble(bookies[:2], 3, random.Random(0))


def test_a_replacement_is_never_a_bookie_already_in_the_ensemble() -> None:
    ensemble = ["b0", "b1", "b2"]
    for seed in range(30):
        replaced = replace_bookies(
            ensemble, {1}, ["b0", "b1", "b2", "b3", "b4"], random.Random(seed)
        )
        assert replaced[0] == "b0" and replaced[2] == "b2"
        assert replaced[1] in {"b3", "b4"}
    two = replace_bookies(ensemble, {0, 2}, ["b0", "b1", "b2", "b3", "b4"], random.Random(1))
    assert sorted(two) == ["b1", "b3", "b4"]
    with pytest.raises(NotEnoughBookiesError):
        replace_bookies(ensemble, {0, 2}, ["b0", "b1", "b2", "b3"], random.Random(1))
    with pytest.raises(NotEnoughBookiesError):
        replace_bookies(ensemble, {0}, ["b0", "b1", "b2", "b3"], random.Random(1), exclude={"b3"})
