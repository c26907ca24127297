"""The writer core, scripted: striping, batching, ack order, ensemble changes, fencing, close.

Each test names the part of reference 001 it checks.
"""

from __future__ import annotations

import random

import pytest

from quorumlog.codec.wire import AddEntries, ReadLastAddConfirmed
from quorumlog.errors import (
    EntryTooLargeError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerPendingFullError,
    NotEnoughBookiesError,
)
from quorumlog.ledger.metadata import LedgerState, check_password
from quorumlog.ledger.protocol_actions import (
    LedgerProtocolConfig,
    MetadataConflict,
    UpdateLedgerMetadata,
    request_id_counter,
)
from quorumlog.ledger.protocol_write import LedgerWriter, WriterState
from tests.unit.ledger.harness import (
    TEST_CONFIG,
    LedgerWorld,
    answers_from,
    metadata_of,
    requests_to,
)


def adds_to(world: LedgerWorld, bookie_id: str) -> list[AddEntries]:
    return [
        message.payload
        for message in world.queue
        if message.to_bookie
        and message.bookie_id == bookie_id
        and isinstance(message.payload, AddEntries)
    ]


def test_entry_goes_to_the_write_set_starting_at_its_id_mod_ensemble_size() -> None:
    """001 "数据写入": E=3, Qw=2 -> entry 0 to positions 0,1; entry 1 to 1,2; entry 2 to 2,0."""
    world = LedgerWorld()
    metadata = world.create_ledger(3, 2, 2)
    world.writer("w", metadata)
    for entry_id in range(6):
        world.append("w", b"e%d" % entry_id)
    ensemble = metadata.ensembles[0]
    for position, bookie_id in enumerate(ensemble):
        held = sorted(entry.entry_id for add in adds_to(world, bookie_id) for entry in add.entries)
        expected = [e for e in range(6) if position in {e % 3, (e + 1) % 3}]
        assert held == expected, (position, held)


def test_appends_between_take_actions_go_out_as_one_frame_per_bookie() -> None:
    """Work per batch: every entry appended since the last take_actions shares a frame (up
    to batch_entries_max)."""
    world = LedgerWorld(config=LedgerProtocolConfig(batch_entries_max=1000))
    metadata = world.create_ledger(3, 3, 2)
    writer = world.writer("w", metadata)
    for entry_id in range(100):
        writer.append(b"x%d" % entry_id)
    world.collect("w")
    for bookie_id in metadata.ensembles[0]:
        adds = adds_to(world, bookie_id)
        assert len(adds) == 1
        assert [entry.entry_id for entry in adds[0].entries] == list(range(100))


@pytest.mark.parametrize("shape", [(3, 2, 2), (5, 3, 2), (4, 1, 1)])
def test_a_batch_is_striped_into_each_bookies_share(shape: tuple[int, int, int]) -> None:
    world = LedgerWorld(bookie_count=6, config=LedgerProtocolConfig(batch_entries_max=1000))
    metadata = world.create_ledger(*shape)
    writer = world.writer("w", metadata)
    writer.append_many([b"e%d" % entry_id for entry_id in range(3)])
    for entry_id in range(3, 50):
        writer.append(b"e%d" % entry_id)
    world.collect("w")
    ensemble_size, write_quorum, _ = shape
    for position, bookie_id in enumerate(metadata.ensembles[0]):
        [add] = adds_to(world, bookie_id)
        expected = [e for e in range(50) if (position - e) % ensemble_size < write_quorum]
        assert [entry.entry_id for entry in add.entries] == expected
        assert all(entry.data == b"e%d" % entry.entry_id for entry in add.entries)
    world.run()
    assert world.clients["w"].last_add_confirmed == 49


def test_append_many_is_all_or_nothing() -> None:
    world = LedgerWorld(config=LedgerProtocolConfig(pending_entries_max=4))
    metadata = world.create_ledger(3, 2, 2)
    writer = world.writer("w", metadata)
    assert writer.append_many([b"a", b"bb"]) == 0
    with pytest.raises(LedgerPendingFullError):
        writer.append_many([b"c", b"d", b"e"])
    assert writer.append_many([b"c", b"d"]) == 2
    world.collect("w")
    world.run()
    writer.close()
    world.collect("w")
    world.run()
    closed = world.clients["w"].closed
    assert closed is not None and (closed.last_entry_id, closed.length) == (3, 5)


def test_acks_complete_in_entry_order() -> None:
    """An entry later in the ledger that has its quorum waits for every earlier one."""
    world = LedgerWorld()
    metadata = world.create_ledger(3, 3, 2)
    world.writer("w", metadata)
    _, second, third = metadata.ensembles[0]
    world.append("w", b"zero")
    world.append("w", b"one")  # a second frame to each bookie
    # Entry 1's frames are answered by two bookies; entry 0's by one only.
    world.deliver_matching(requests_to(second))
    world.deliver_matching(requests_to(third))
    late = [m for m in world.queue if answers_from(second)(m) or answers_from(third)(m)]
    zero_answers = [late[0], late[2]]
    for message in late:
        if message not in zero_answers:
            world.deliver(world.queue.index(message))
    world.deliver(world.queue.index(zero_answers[0]))
    assert world.clients["w"].last_add_confirmed == -1  # entry 0 has one ack (of Qa=2)
    world.deliver(world.queue.index(zero_answers[1]))
    assert world.clients["w"].acknowledged_history == [1]  # both at once, in order


def test_the_lac_and_length_ride_on_every_add() -> None:
    """001 "LAC": the LAC (and the length through it) is stored with the next entries."""
    world = LedgerWorld()
    metadata = world.create_ledger(3, 3, 3)
    world.writer("w", metadata)
    world.append("w", b"abc")
    world.run()
    world.append("w", b"de")
    [add] = adds_to(world, metadata.ensembles[0][0])
    assert (add.last_add_confirmed, add.length) == (0, 3)
    world.run()
    bookie = world.bookies[metadata.ensembles[0][0]]
    assert bookie.ledgers[metadata.ledger_id].last_add_confirmed == 0  # lags one round


def test_a_bookie_failing_before_the_ack_quorum_is_replaced_at_once() -> None:
    """001 "EnsembleChange": a new fragment at LAC + 1, stored with a version check; the new
    bookie gets the unacknowledged entries of its share."""
    world = LedgerWorld()
    metadata = world.create_ledger(3, 2, 2)
    world.writer("w", metadata)
    for entry_id in range(4):
        world.append("w", b"e%d" % entry_id)
    world.run()  # entries 0..3 acknowledged
    failing = metadata.ensembles[0][1]
    world.unreachable.add(failing)
    for entry_id in range(4, 10):
        world.append("w", b"e%d" % entry_id)
    world.run()
    assert world.clients["w"].last_add_confirmed == 9
    stored = world.store.read_ledger(metadata.ledger_id)
    assert stored.version == 1
    assert sorted(stored.ensembles) == [0, 4]
    new_ensemble = stored.ensembles[4]
    assert failing not in new_ensemble
    assert [b for b in new_ensemble if b not in metadata.ensembles[0]] == [new_ensemble[1]]
    replacement = world.bookies[new_ensemble[1]]
    held = sorted(replacement.ledgers[metadata.ledger_id].entries)
    assert held == [e for e in range(4, 10) if 1 in {e % 3, (e + 1) % 3}]
    assert stored.length_before_last_fragment == sum(len(b"e%d" % e) for e in range(4))


def test_a_bookie_failing_after_the_ack_quorum_is_replaced_before_the_next_add() -> None:
    """001: with Qa < Qw, an error after the entry has its Qa acks is only remembered; the
    ensemble changes before the next entries go out."""
    world = LedgerWorld()
    metadata = world.create_ledger(3, 3, 2)
    world.writer("w", metadata)
    slow = metadata.ensembles[0][2]
    world.append("w", b"zero")
    world.deliver_matching(lambda m: m.to_bookie and m.bookie_id != slow)
    world.deliver_matching(lambda m: not m.to_bookie and m.bookie_id is not None)
    assert world.clients["w"].last_add_confirmed == 0
    world.unreachable.add(slow)
    world.deliver_matching(requests_to(slow))  # the connection fails: remembered only
    assert world.queue == []
    assert world.writer_of("w").state is WriterState.WRITING
    world.append("w", b"one")  # now the change comes first
    assert world.writer_of("w").state is WriterState.CHANGING_ENSEMBLE
    assert not any(isinstance(m.payload, AddEntries) for m in world.queue)
    world.run()
    stored = world.store.read_ledger(metadata.ledger_id)
    assert sorted(stored.ensembles) == [0, 1]
    assert slow not in stored.ensembles[1]
    assert world.clients["w"].last_add_confirmed == 1


def test_acks_of_a_replaced_bookie_do_not_count_in_the_new_fragment() -> None:
    """An entry of the new fragment must reach Qa bookies of the new ensemble: the old
    bookie's earlier ack for it no longer counts (else a reader of the metadata could find
    it on fewer than Qa bookies, and a recovery could cut it off)."""
    world = LedgerWorld()
    metadata = world.create_ledger(3, 3, 2)
    world.writer("w", metadata)
    first, _, third = metadata.ensembles[0]
    for entry_id in range(3):
        world.append("w", b"e%d" % entry_id)
    # `third` stores and acknowledges entries 0..2; the others are slow.
    world.deliver_matching(requests_to(third))
    world.deliver_matching(answers_from(third))
    assert world.clients["w"].last_add_confirmed == -1
    world.unreachable.add(third)
    world.append("w", b"e3")
    world.deliver_matching(requests_to(third))  # its connection fails: replace it now
    world.deliver_matching(metadata_of("w"))  # list bookies
    world.deliver_matching(metadata_of("w"))  # their list
    world.deliver_matching(metadata_of("w"))  # the update, stored
    world.deliver_matching(metadata_of("w"))  # its result
    stored = world.store.read_ledger(metadata.ledger_id)
    assert sorted(stored.ensembles) == [0]  # LAC was -1: the new fragment replaces 0
    assert third not in stored.ensembles[0]
    # `first` now acknowledges 0..3; with the old bookie's acks that would make Qa=2.
    world.deliver_matching(requests_to(first))
    world.deliver_matching(answers_from(first))
    assert world.clients["w"].last_add_confirmed == -1
    world.run()
    assert world.clients["w"].last_add_confirmed == 3


def test_no_ack_is_reported_while_an_ensemble_change_is_in_flight() -> None:
    """BookKeeper issue 1591: acknowledging entries before the new fragment is stored could
    lose them to a reader of the stored metadata. The LAC waits for the change."""
    world = LedgerWorld()
    metadata = world.create_ledger(3, 3, 2)
    world.writer("w", metadata)
    first, _, third = metadata.ensembles[0]
    world.append("w", b"zero")
    world.deliver_matching(requests_to(third))
    world.deliver_matching(answers_from(third))  # `third` holds entry 0
    world.unreachable.add(third)
    world.append("w", b"one")
    world.deliver_matching(requests_to(third))  # fails: the change starts
    assert world.writer_of("w").state is WriterState.CHANGING_ENSEMBLE
    world.deliver_matching(requests_to(first))
    world.deliver_matching(answers_from(first))  # with `third`'s ack: Qa for entry 0
    assert world.clients["w"].last_add_confirmed == -1
    world.run()
    assert world.clients["w"].last_add_confirmed == 1


def test_a_fenced_answer_fails_the_handle_and_later_appends() -> None:
    """001 "Fence Bookie": once a bookie of the write set is fenced, adds fail."""
    world = LedgerWorld()
    metadata = world.create_ledger(3, 3, 3)
    world.writer("w", metadata)
    world.append("w", b"zero")
    world.run()
    for bookie_id in metadata.ensembles[0]:
        key = check_password(metadata, b"secret")
        world.bookies[bookie_id].handle(ReadLastAddConfirmed(0, metadata.ledger_id, True, key))
    world.append("w", b"one")
    world.run()
    record = world.clients["w"]
    assert isinstance(record.failure, LedgerFencedError)
    assert record.last_add_confirmed == 0
    with pytest.raises(LedgerFencedError):
        world.append("w", b"two")


def test_an_ensemble_change_after_recovery_began_fails_fenced() -> None:
    """The change's compare-and-set meets IN_RECOVERY metadata: the writer is fenced."""
    world = LedgerWorld()
    metadata = world.create_ledger(3, 2, 2)
    world.writer("w", metadata)
    world.store.update_ledger(metadata.updated(state=LedgerState.IN_RECOVERY), 0)
    world.unreachable.add(metadata.ensembles[0][0])
    world.append("w", b"zero")
    world.run()
    assert isinstance(world.clients["w"].failure, LedgerFencedError)


def test_an_update_whose_answer_was_lost_is_recognised_as_stored() -> None:
    """A metadata update may happen although its answer is lost; its retry then conflicts
    with its own result, which the writer takes as success."""
    world = LedgerWorld()
    metadata = world.create_ledger(3, 2, 2)
    world.writer("w", metadata)
    world.unreachable.add(metadata.ensembles[0][0])
    world.append("w", b"zero")
    world.deliver_matching(requests_to(metadata.ensembles[0][0]))
    world.deliver_matching(metadata_of("w"))  # list bookies, then its result
    world.deliver_matching(metadata_of("w"))
    [update] = [m for m in world.queue if isinstance(m.payload, UpdateLedgerMetadata)]
    world.deliver(world.queue.index(update))  # stored...
    world.drop_matching(metadata_of("w"))  # ...but the answer is lost
    world.run()
    assert world.clients["w"].failure is None
    assert world.clients["w"].last_add_confirmed == 0
    assert world.store.read_ledger(metadata.ledger_id).version == 1


def test_close_waits_for_pending_entries_then_stores_closed() -> None:
    world = LedgerWorld()
    metadata = world.create_ledger(3, 2, 2)
    writer = world.writer("w", metadata)
    for entry_id in range(5):
        world.append("w", b"e%d" % entry_id)
    writer.close()
    world.collect("w")
    assert not any(m.bookie_id is None for m in world.queue)  # entries first
    world.run()
    closed = world.clients["w"].closed
    assert closed is not None
    assert (closed.state, closed.last_entry_id, closed.length) == (LedgerState.CLOSED, 4, 10)
    with pytest.raises(LedgerClosedError):
        writer.append(b"late")


def test_a_closed_ledger_of_a_conflicting_close_is_not_taken_as_ours() -> None:
    world = LedgerWorld()
    metadata = world.create_ledger(3, 2, 2)
    writer = world.writer("w", metadata)
    world.append("w", b"zero")
    world.run()
    writer.close()
    world.collect("w")
    [update] = [m for m in world.queue if isinstance(m.payload, UpdateLedgerMetadata)]
    recovered = metadata.updated(state=LedgerState.CLOSED, last_entry_id=-1, length=0)
    world.queue.remove(update)
    writer.metadata_result(MetadataConflict(update.payload.operation_id, recovered))
    world.collect("w")
    assert isinstance(world.clients["w"].failure, LedgerFencedError)
    assert world.clients["w"].closed is None


def test_a_close_meeting_a_change_of_labels_closes_on_top_of_it() -> None:
    world = LedgerWorld()
    metadata = world.create_ledger(3, 2, 2)
    writer = world.writer("w", metadata)
    world.append("w", b"zero")
    world.run()
    writer.close()
    world.collect("w")
    world.store.update_ledger(metadata.updated(properties={"topic": "t"}), 0)
    world.run()
    closed = world.clients["w"].closed
    assert closed is not None
    assert (closed.version, closed.last_entry_id, closed.properties) == (2, 0, {"topic": "t"})


def test_no_writable_replacement_fails_the_handle_after_the_attempts() -> None:
    world = LedgerWorld(bookie_count=3)
    metadata = world.create_ledger(3, 2, 2)
    world.writer("w", metadata)
    world.unreachable.add(metadata.ensembles[0][0])
    world.append("w", b"zero")
    world.run()
    assert isinstance(world.clients["w"].failure, NotEnoughBookiesError)


def test_appends_beyond_the_pending_bounds_are_refused() -> None:
    config = LedgerProtocolConfig(pending_entries_max=3, entry_bytes_max=10)
    world = LedgerWorld(config=config)
    metadata = world.create_ledger(3, 2, 2)
    writer = world.writer("w", metadata)
    with pytest.raises(EntryTooLargeError):
        writer.append(b"x" * 11)
    for entry_id in range(3):
        writer.append(b"e%d" % entry_id)
    with pytest.raises(LedgerPendingFullError):
        writer.append(b"e3")
    world.collect("w")
    world.run()
    assert writer.append(b"e3") == 3  # room again once acknowledged


def test_a_silent_bookie_is_replaced_after_the_request_timeout() -> None:
    world = LedgerWorld()
    metadata = world.create_ledger(3, 3, 3)
    world.writer("w", metadata)
    world.down.add(metadata.ensembles[0][2])
    world.append("w", b"zero")
    world.run()
    assert world.clients["w"].last_add_confirmed == 0
    stored = world.store.read_ledger(metadata.ledger_id)
    assert metadata.ensembles[0][2] not in stored.ensembles[0]


def test_a_bookie_answering_errors_is_replaced() -> None:
    world = LedgerWorld()
    metadata = world.create_ledger(3, 3, 3)
    world.writer("w", metadata)
    sick = metadata.ensembles[0][1]
    world.bookies[sick].sick = True
    world.append("w", b"zero")
    world.deliver_all()  # at once: no timeout needed
    assert world.clients["w"].last_add_confirmed == 0
    assert sick not in world.store.read_ledger(metadata.ledger_id).ensembles[0]


def test_an_unavailable_store_is_asked_again() -> None:
    world = LedgerWorld()
    metadata = world.create_ledger(3, 2, 2)
    world.writer("w", metadata)
    world.store_unavailable = True
    world.unreachable.add(metadata.ensembles[0][0])
    world.append("w", b"zero")
    for _ in range(50):
        world.step() or world.tick()
    assert world.writer_of("w").state is WriterState.CHANGING_ENSEMBLE
    world.store_unavailable = False
    world.run()
    assert world.clients["w"].last_add_confirmed == 0


def test_a_writer_needs_open_metadata() -> None:
    world = LedgerWorld()
    metadata = world.create_ledger(3, 2, 2)
    closed = metadata.updated(state=LedgerState.CLOSED)
    from quorumlog.raft.invariants import InvariantViolation

    with pytest.raises(InvariantViolation):
        LedgerWriter(
            closed,
            b"key",
            TEST_CONFIG,
            request_ids=request_id_counter(),
            random=random.Random(0),
        )


def test_each_ensemble_change_stores_the_next_version() -> None:
    """Metadata versions never go back: each change stores version + 1."""
    world = LedgerWorld()
    metadata = world.create_ledger(3, 3, 3)
    world.writer("w", metadata)
    for round_number in range(3):
        world.unreachable.add(world.writer_of("w").ensemble[0])
        world.append("w", b"r%d" % round_number)
        world.run()
        world.unreachable.clear()
    assert world.clients["w"].last_add_confirmed == 2
    versions = [m.version for m in world.store.history[metadata.ledger_id]]
    assert versions == [0, 1, 2, 3]
