"""The recovery core, scripted. Reference 001, "客户端故障": fence, recover the LAC, re-write,
close; the races that make fencing necessary, played out message by message."""

from __future__ import annotations

import random

import pytest

from quorumlog.codec.wire import (
    AddEntries,
    BookieStatus,
    LastAddConfirmedResult,
    ReadEntries,
    ReadLastAddConfirmed,
)
from quorumlog.errors import BadPasswordError, LedgerFencedError
from quorumlog.ledger.metadata import LedgerState, check_password, master_key
from quorumlog.ledger.protocol_actions import LedgerProtocolConfig
from quorumlog.ledger.protocol_recovery import LedgerRecovery, RecoveryPhase
from tests.unit.ledger.harness import (
    TEST_CONFIG,
    LedgerWorld,
    answers_from,
    metadata_of,
    of_client,
    requests_to,
)


def request_of(client: str, bookie_id: str, kind: type) -> object:
    return lambda message: (
        message.to_bookie
        and message.client == client
        and message.bookie_id == bookie_id
        and isinstance(message.payload, kind)
    )


def fence_all(world: LedgerWorld, client: str) -> None:
    """Deliver the recoverer's metadata traffic and fence requests (and their answers)."""
    world.deliver_matching(metadata_of(client))  # mark IN_RECOVERY
    world.deliver_matching(metadata_of(client))  # its result: fencing starts
    world.deliver_matching(lambda m: m.client == client and m.to_bookie)
    world.deliver_matching(lambda m: m.client == client and not m.to_bookie)


def write_acknowledged(world: LedgerWorld, name: str, count: int) -> None:
    """Entries 0..count-1, each acknowledged before the next is sent (so the bookies' LAC
    ends at count - 2: the piggyback lags one entry)."""
    record = world.clients[name]
    for entry_id in range(count):
        world.append(name, b"entry-%d" % entry_id)
        world.run(until=lambda wanted=entry_id: record.last_add_confirmed == wanted)


def test_fencing_race_the_writer_is_fenced_and_nothing_acknowledged_is_lost() -> None:
    """Writer W streams while recoverer R fences and recovers the ledger. Entries W had on
    one bookie only are recoverable (found) and R keeps them; W's later adds meet fenced
    bookies and fail with LedgerFencedError; W never hears an ack beyond R's end."""
    world = LedgerWorld()
    metadata = world.create_ledger(3, 3, 2)
    world.writer("w", metadata)
    write_acknowledged(world, "w", 5)
    first, second, third = metadata.ensembles[0]
    for entry_id in range(5, 8):
        world.append("w", b"entry-%d" % entry_id)
    world.deliver_matching(requests_to(first, "w"))  # 5..7 reach `first` only
    world.held_clients.add("w")  # W's traffic waits (a long pause)
    world.recovery("r", metadata.ledger_id)
    world.run(until=lambda: world.clients["r"].closed is not None)
    world.held_clients.clear()
    recovered = world.clients["r"].closed
    assert recovered is not None
    assert recovered.last_entry_id == 7
    # W's held adds now reach fenced bookies.
    world.run()
    writer = world.clients["w"]
    assert isinstance(writer.failure, LedgerFencedError)
    assert writer.last_add_confirmed <= recovered.last_entry_id
    with pytest.raises(LedgerFencedError):
        world.append("w", b"after")
    entries = world.read_all(metadata.ledger_id)
    assert [entry.data for entry in entries] == [b"entry-%d" % e for e in range(8)]
    # The recovered entries were re-written: each now on all three bookies.
    for bookie_id in (first, second, third):
        assert set(range(8)) <= set(world.bookies[bookie_id].ledgers[0].entries)


def test_fencing_race_entries_nowhere_stop_recovery_and_their_adds_fail() -> None:
    world = LedgerWorld()
    metadata = world.create_ledger(3, 3, 2)
    world.writer("w", metadata)
    write_acknowledged(world, "w", 3)
    for entry_id in range(3, 6):
        world.append("w", b"entry-%d" % entry_id)  # held: on no bookie yet
    world.held_clients.add("w")
    world.recovery("r", metadata.ledger_id)
    world.run(until=lambda: world.clients["r"].closed is not None)
    world.held_clients.clear()
    recovered = world.clients["r"].closed
    assert recovered is not None and recovered.last_entry_id == 2
    world.run()
    assert isinstance(world.clients["w"].failure, LedgerFencedError)
    assert world.clients["w"].last_add_confirmed == 2


def test_a_not_here_from_a_bookie_not_yet_fenced_does_not_count() -> None:
    """E=Qw=3, Qa=2, so Qf=2. Entry 0 sits on `second`. `first` and `second` confirm the
    fence; `third` answers a read ("not here") before its fence arrives. Counting that
    answer would end recovery before entry 0, and `third` would then take W's add of entry
    0: with `second`'s, two acks — an acknowledged entry beyond the recovered end."""
    world = LedgerWorld()
    metadata = world.create_ledger(3, 3, 2)
    world.writer("w", metadata)
    first, second, third = metadata.ensembles[0]
    world.append("w", b"entry-0")
    world.deliver_matching(requests_to(second, "w"))  # stored on `second`; ack held
    world.recovery("r", metadata.ledger_id)
    world.deliver_matching(metadata_of("r"))
    world.deliver_matching(metadata_of("r"))
    for bookie_id in (first, second):
        world.deliver_matching(request_of("r", bookie_id, ReadLastAddConfirmed))
        world.deliver_matching(answers_from(bookie_id, "r"))
    # Fenced enough: R reads. `third` answers its read before its fence arrives.
    world.deliver_matching(request_of("r", third, ReadEntries))
    world.deliver_matching(request_of("r", first, ReadEntries))
    world.deliver_matching(answers_from(third, "r"))
    world.deliver_matching(answers_from(first, "r"))
    # Now W's add reaches `third`, which is not fenced yet.
    world.deliver_matching(requests_to(third, "w"))
    world.run()
    recovered = world.store.read_ledger(metadata.ledger_id)
    assert recovered.state is LedgerState.CLOSED
    assert world.clients["w"].last_add_confirmed <= recovered.last_entry_id
    assert recovered.last_entry_id == 0


def test_unknown_answers_are_retried_never_counted_as_not_here() -> None:
    """001: "unknown" (no connection, a timeout) is not "not found". Entry 0 is on `first`
    and `third` (acknowledged, Qa=2) but both become unreachable after the fence; recovery
    must wait for them rather than stop on `second`'s "not here"."""
    world = LedgerWorld()
    metadata = world.create_ledger(3, 3, 2)
    world.writer("w", metadata)
    first, second, third = metadata.ensembles[0]
    world.append("w", b"entry-0")
    world.drop_matching(requests_to(second, "w"))
    world.run(until=lambda: world.clients["w"].last_add_confirmed == 0)
    world.recovery("r", metadata.ledger_id)
    fence_all(world, "r")
    world.unreachable |= {first, third}
    for _ in range(5 * TEST_CONFIG.request_timeout_ticks):
        world.step() or world.tick()
    recovery = world.clients["r"].core
    assert isinstance(recovery, LedgerRecovery)
    assert recovery.phase is RecoveryPhase.RECOVERING  # still asking, not stopped
    world.unreachable.clear()
    world.run(until=lambda: world.clients["r"].closed is not None)
    closed = world.clients["r"].closed
    assert closed is not None and closed.last_entry_id == 0


def test_recovery_starts_after_the_highest_lac_a_bookie_stored() -> None:
    """001: the start is max(metadata LAC, bookie LACs): nothing before it is read again."""
    world = LedgerWorld()
    metadata = world.create_ledger(3, 3, 3)
    world.writer("w", metadata)
    write_acknowledged(world, "w", 20)
    world.recovery("r", metadata.ledger_id)
    fence_all(world, "r")
    reads = [m.payload for m in world.queue if isinstance(m.payload, ReadEntries)]
    assert reads and {read.first_entry_id for read in reads} == {19}  # bookies' LAC is 18
    world.run()
    closed = world.store.read_ledger(metadata.ledger_id)
    assert (closed.last_entry_id, closed.length) == (
        19,
        sum(len(b"entry-%d" % e) for e in range(20)),
    )


def test_without_stored_lengths_recovery_reads_from_the_last_fragment() -> None:
    """A bookie that does not return the length (-1) still bounds what must be found, but
    recovery starts where it knows the length: the last fragment's first entry."""
    world = LedgerWorld()
    metadata = world.create_ledger(3, 3, 3)
    world.writer("w", metadata)
    write_acknowledged(world, "w", 20)
    for bookie in world.bookies.values():
        for ledger in bookie.ledgers.values():
            ledger.length = -1
    world.recovery("r", metadata.ledger_id)
    fence_all(world, "r")
    reads = [m.payload for m in world.queue if isinstance(m.payload, ReadEntries)]
    assert {read.first_entry_id for read in reads} == {0}
    world.run()
    closed = world.store.read_ledger(metadata.ledger_id)
    assert (closed.last_entry_id, closed.length) == (
        19,
        sum(len(b"entry-%d" % e) for e in range(20)),
    )


def test_an_ensemble_change_during_recovery_is_stored_with_the_close() -> None:
    """The re-writer replaces a bookie that fails under it, but the new fragment reaches the
    metadata only with the close (as BookKeeper since 4.9): a concurrent recoverer never
    sees a bookie that holds only part of the re-writes."""
    world = LedgerWorld()
    metadata = world.create_ledger(3, 3, 3)
    world.writer("w", metadata)
    write_acknowledged(world, "w", 3)
    first, _, third = metadata.ensembles[0]
    world.append("w", b"entry-3")
    world.deliver_matching(requests_to(first, "w"))  # entry 3 on `first` only
    world.held_clients.add("w")
    world.recovery("r", metadata.ledger_id)
    fence_all(world, "r")
    world.unreachable.add(third)  # fenced, then gone: the re-writes need a replacement
    world.run(until=lambda: world.clients["r"].closed is not None)
    history = world.store.history[metadata.ledger_id]
    assert [m.state for m in history] == [
        LedgerState.OPEN,
        LedgerState.IN_RECOVERY,
        LedgerState.CLOSED,
    ]
    closed = history[-1]
    # Entry 3's frame carried LAC 2 to `first`, so re-writes began at entry 3.
    assert sorted(closed.ensembles) == [0, 3]
    assert third not in closed.ensembles[3]
    world.unreachable.clear()
    entries = world.read_all(metadata.ledger_id)
    assert [entry.data for entry in entries] == [b"entry-%d" % e for e in range(4)]


def test_recovery_of_a_closed_ledger_just_returns_it() -> None:
    world = LedgerWorld()
    metadata = world.create_ledger(3, 2, 2)
    writer = world.writer("w", metadata)
    write_acknowledged(world, "w", 4)
    writer.close()
    world.collect("w")
    world.run()
    recovery = world.recovery("r", metadata.ledger_id)
    assert recovery.phase is RecoveryPhase.DONE
    assert not any(message.client == "r" for message in world.queue)
    assert world.clients["r"].closed == world.store.read_ledger(metadata.ledger_id)


def test_two_concurrent_recoveries_agree() -> None:
    world = LedgerWorld(seed=3)
    metadata = world.create_ledger(3, 3, 2)
    world.writer("w", metadata)
    write_acknowledged(world, "w", 6)
    first = metadata.ensembles[0][0]
    for entry_id in range(6, 9):
        world.append("w", b"entry-%d" % entry_id)
    world.deliver_matching(requests_to(first, "w"))
    world.drop_matching(of_client("w"))  # W crashed
    world.recovery("r1", metadata.ledger_id)
    world.recovery("r2", metadata.ledger_id)
    shuffle = random.Random(7)
    while world.queue:
        world.deliver(shuffle.randrange(len(world.queue)))
    world.run()
    one, two = world.clients["r1"].closed, world.clients["r2"].closed
    assert one is not None and two is not None
    assert one == two == world.store.read_ledger(metadata.ledger_id)
    assert one.last_entry_id == 8


def test_the_writers_ensemble_change_before_the_mark_is_marked_again() -> None:
    """R read the metadata, then W's ensemble change won the race: R's mark conflicts with
    OPEN metadata, so R marks the new version and fences W's new ensemble."""
    world = LedgerWorld()
    metadata = world.create_ledger(3, 3, 3)
    world.writer("w", metadata)
    write_acknowledged(world, "w", 2)
    failed = metadata.ensembles[0][0]
    world.unreachable.add(failed)
    world.append("w", b"entry-2")
    world.deliver_matching(requests_to(failed, "w"))  # W starts an ensemble change
    world.recovery("r", metadata.ledger_id)  # R holds version 0
    world.deliver_matching(of_client("w"))  # W's change is stored (version 1)
    world.deliver_matching(metadata_of("w"))
    world.deliver_matching(metadata_of("w"))
    assert world.store.read_ledger(metadata.ledger_id).version == 1
    world.run(until=lambda: world.clients["r"].closed is not None)
    new_ensemble = world.store.history[metadata.ledger_id][1].ensembles[2]
    fenced = [
        bookie_id
        for bookie_id, bookie in world.bookies.items()
        if metadata.ledger_id in bookie.ledgers and bookie.ledgers[metadata.ledger_id].fenced
    ]
    assert set(new_ensemble) <= set(fenced)
    assert failed not in fenced
    versions = [m.version for m in world.store.history[metadata.ledger_id]]
    assert versions == [0, 1, 2, 3]


def test_a_wrong_master_key_fails_the_recovery() -> None:
    world = LedgerWorld()
    metadata = world.create_ledger(3, 2, 2)
    world.writer("w", metadata)
    write_acknowledged(world, "w", 2)
    with pytest.raises(BadPasswordError):
        check_password(metadata, b"wrong")
    recovery = LedgerRecovery(
        metadata,
        master_key(b"wrong"),
        TEST_CONFIG,
        request_ids=world.request_ids,
        random=random.Random(0),
    )
    world.add_client("r", recovery)
    world.run()
    assert isinstance(world.clients["r"].failure, BadPasswordError)


def test_a_late_fence_answer_still_raises_what_must_be_found() -> None:
    """A fence answer after reading began counts: its LAC was acknowledged, so recovery
    may not end before it."""
    world = LedgerWorld()
    metadata = world.create_ledger(3, 3, 3)
    recovery = LedgerRecovery(
        metadata.updated(state=LedgerState.IN_RECOVERY),
        check_password(metadata, b"secret"),
        TEST_CONFIG,
        request_ids=world.request_ids,
        random=random.Random(0),
    )
    fences = [
        send
        for send in recovery.take_actions().sends
        if isinstance(send.request, ReadLastAddConfirmed)
    ]
    first = fences[0]
    recovery.receive(
        first.bookie_id,
        LastAddConfirmedResult(first.request.request_id, 0, BookieStatus.OK, 5, 6, 60),
    )
    assert recovery.phase is RecoveryPhase.RECOVERING  # Qf = 1: one fence covers
    late = fences[1]
    recovery.receive(
        late.bookie_id, LastAddConfirmedResult(late.request.request_id, 0, BookieStatus.OK, 9)
    )
    assert recovery.known_acknowledged == 9


def test_a_recovery_whose_close_meets_another_change_starts_over() -> None:
    """Someone changed the IN_RECOVERY metadata (here: its labels) before the close: the
    compare-and-set fails and the recovery runs again on what is stored now."""
    world = LedgerWorld()
    metadata = world.create_ledger(3, 3, 2)
    world.writer("w", metadata)
    write_acknowledged(world, "w", 4)
    world.held_clients.add("w")
    world.recovery("r", metadata.ledger_id)
    record = world.clients["r"]
    recovery = record.core
    assert isinstance(recovery, LedgerRecovery)
    world.run(until=lambda: recovery.phase is RecoveryPhase.CLOSING)
    current = world.store.read_ledger(metadata.ledger_id)
    world.store.update_ledger(current.updated(properties={"owner": "n2"}), current.version)
    world.run(until=lambda: record.closed is not None)
    assert recovery.restarts == 1
    closed = world.store.read_ledger(metadata.ledger_id)
    assert (closed.last_entry_id, closed.properties) == (3, {"owner": "n2"})


def test_recovery_re_writes_within_the_writers_pending_bounds() -> None:
    """Found entries wait while the re-writer holds all it may (entries or bytes)."""
    config = LedgerProtocolConfig(
        request_timeout_ticks=20,
        retry_delay_ticks=2,
        read_entries_max=64,
        pending_entries_max=5,
        pending_bytes_max=30,
        entry_bytes_max=20,
    )
    world = LedgerWorld(config=config)
    metadata = world.create_ledger(3, 3, 2)
    world.writer("w", metadata)
    for entry_id in range(30):
        world.append("w", b"entry-%d" % entry_id)
        world.run()
    world.drop_matching(of_client("w"))
    for bookie in world.bookies.values():
        for ledger in bookie.ledgers.values():
            ledger.last_add_confirmed, ledger.length = -1, -1  # make recovery re-write all
    world.recovery("r", metadata.ledger_id)
    world.run(until=lambda: world.clients["r"].closed is not None)
    closed = world.clients["r"].closed
    assert closed is not None and closed.last_entry_id == 29


def test_re_writes_carry_the_lac_recovery_started_from() -> None:
    """Re-written entries are recovered, not acknowledged (a concurrent recoverer may close
    before them): the LAC on recovery adds stays at the start, so a bookie's LAC only ever
    names acknowledged entries."""
    world = LedgerWorld()
    metadata = world.create_ledger(3, 3, 2)
    world.writer("w", metadata)
    write_acknowledged(world, "w", 4)  # bookies' LAC: 2 (entry 3's frame carried it)
    first = metadata.ensembles[0][0]
    for entry_id in range(4, 40):
        world.append("w", b"entry-%d" % entry_id)
    world.deliver_matching(requests_to(first, "w"))  # 4..39 on `first` only
    world.drop_matching(of_client("w"))
    world.recovery("r", metadata.ledger_id)
    announced: set[tuple[int, int]] = set()
    record = world.clients["r"]
    while record.closed is None:
        for message in world.queue:
            if message.client == "r" and isinstance(message.payload, AddEntries):
                announced.add((message.payload.last_add_confirmed, message.payload.length))
        world.step() or world.tick()
    assert record.closed.last_entry_id == 39
    length_through_3 = sum(len(b"entry-%d" % e) for e in range(4))
    assert announced == {(3, length_through_3)}
    world.last_add_confirmed_read("lac", metadata.ledger_id)
    world.run()
    assert world.clients["lac"].last_add_confirmed == 39  # closed: from the metadata


def test_an_error_answer_is_an_unknown_not_a_not_here() -> None:
    """A bookie whose storage fails answers ErrorResponse: recovery asks again later and
    never counts it as "not here" (as with a timeout)."""
    world = LedgerWorld()
    metadata = world.create_ledger(3, 3, 2)
    world.writer("w", metadata)
    first, second, _ = metadata.ensembles[0]
    world.append("w", b"entry-0")
    world.deliver_matching(requests_to(first, "w"))
    world.deliver_matching(requests_to(second, "w"))
    world.run(until=lambda: world.clients["w"].last_add_confirmed == 0)
    world.held_clients.add("w")
    world.recovery("r", metadata.ledger_id)
    fence_all(world, "r")
    world.bookies[first].sick = True
    world.bookies[second].sick = True
    for _ in range(3 * TEST_CONFIG.request_timeout_ticks):
        world.step() or world.tick()
    recovery = world.clients["r"].core
    assert isinstance(recovery, LedgerRecovery)
    assert recovery.phase is RecoveryPhase.RECOVERING
    world.bookies[first].sick = False
    world.run(until=lambda: world.clients["r"].closed is not None)
    closed = world.clients["r"].closed
    assert closed is not None and closed.last_entry_id == 0
