"""Managed ledgers (ledger/managed.py) over shipped bookies on a manual scheduler: offsets
across rollovers, takeover (fencing, recovery, idempotence), retention, ensemble change,
and randomized takeovers checking that nothing acknowledged is lost or written twice."""

from __future__ import annotations

import random

import msgspec
import pytest

import quorumlog.ledger.managed_index as managed_index_module
from quorumlog.codec.compression import compress
from quorumlog.codec.wire import Record
from quorumlog.errors import BadPasswordError, NotPartitionOwnerError
from quorumlog.ledger.managed import ManagedLedger, ManagedLedgerConfig
from quorumlog.ledger.managed_format import (
    ENTRY_FORMAT_V1,
    ENTRY_FORMAT_V3,
    EPOCH_PROPERTY,
    PRODUCERS_PROPERTY,
    TOPIC_PROPERTY,
    CompressedRecords,
    ManagedLedgerRecord,
    ProducerTable,
    encode_producer_table,
    replay_batch,
)
from quorumlog.ledger.metadata import LedgerMetadata, LedgerState, master_key, new_ledger_metadata
from quorumlog.runtime.completion import Completion
from quorumlog.stream.partition import (
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    ProduceOutcome,
)
from tests.unit.ledger.managed_v1 import (
    LedgerInfoV1,
    RecordV1,
    encode_batch_v1,
    encode_record_v1,
)
from tests.unit.ledger.managed_world import NAME, PASSWORD, Client, ManagedWorld


def config(**changes: object) -> ManagedLedgerConfig:
    return msgspec.structs.replace(ManagedLedgerConfig(password=PASSWORD), **changes)


def batch(producer_id: str, base_sequence: int, count: int) -> list[Record]:
    return [
        Record(b"%s-%d" % (producer_id.encode(), base_sequence + index), key=b"k")
        for index in range(count)
    ]


def opened(world: ManagedWorld, owner: str, seed: int, **changes: object) -> ManagedLedger:
    managed = world.client(seed).managed(owner, config(**changes))
    world.wait(managed.open())
    return managed


def stored_record(world: ManagedWorld) -> ManagedLedgerRecord:
    record = world.wait(world.store.read_record(NAME))
    assert record is not None
    return record


def read_all(world: ManagedWorld, managed: ManagedLedger) -> list[tuple[int, bytes]]:
    records = world.wait(managed.read(managed.start_offset, 1_000_000))
    return [(offset, record.value) for offset, record in records]


def test_offsets_stay_contiguous_across_rollovers_and_reads_cross_ledgers() -> None:
    world = ManagedWorld()
    managed = opened(world, "node-a", 1, rollover_records_max=10)
    outcomes = [managed.append(batch("p", 4 * number, 4), "p", 4 * number) for number in range(7)]
    world.settle(outcomes[-1])
    assert [outcome.result().base_offset for outcome in outcomes] == list(range(0, 28, 4))
    assert managed.end_offset == 28
    record = stored_record(world)
    assert len(record.ledgers) == 3  # 12 + 12 entries (batches are never split), then 4
    offset = 0
    for ledger in record.ledgers:
        assert ledger.first_offset == offset
        offset = ledger.end_offset if ledger.closed else offset
    closed = [world.metadata.read_ledger(ledger.ledger_id) for ledger in record.ledgers[:-1]]
    assert all(metadata.state is LedgerState.CLOSED for metadata in closed)
    assert read_all(world, managed) == [(n, b"p-%d" % n) for n in range(28)]
    across = world.wait(managed.read(10, 6))
    assert [offset for offset, _ in across] == list(range(10, 16))
    with pytest.raises(OffsetOutOfRangeError):
        world.wait(managed.read(29, 1))
    assert world.wait(managed.read(28, 5)) == []


def test_a_new_owner_fences_the_old_one_and_continues_at_the_right_offset() -> None:
    world = ManagedWorld()
    first = opened(world, "node-a", 1)
    for number in range(5):
        world.wait(first.append(batch("p", 3 * number, 3), "p", 3 * number))
    assert first.end_offset == 15
    second = opened(world, "node-b", 2)
    assert second.end_offset == 15
    late = first.append(batch("p", 15, 3), "p", 15)
    world.settle(late)
    assert isinstance(late.exception(), NotPartitionOwnerError)
    assert read_all(world, second) == [(n, b"p-%d" % n) for n in range(15)]
    outcome = world.wait(second.append(batch("p", 15, 3), "p", 15))
    assert (outcome.base_offset, outcome.duplicate) == (15, False)
    record = stored_record(world)
    assert (record.owner, record.owner_epoch) == ("node-b", 2)
    assert [ledger.closed for ledger in record.ledgers] == [True, False]


def test_idempotent_retries_after_a_takeover_get_the_original_offsets() -> None:
    world = ManagedWorld()
    # Small ledgers: the retried batch lives in an older ledger than the last one, so the
    # new owner knows it from the producer table copied into the last ledger's metadata.
    first = opened(world, "node-a", 1, rollover_records_max=4)
    originals = [first.append(batch("p", 2 * n, 2), "p", 2 * n) for n in range(6)]
    other = first.append(batch("q", 0, 3), "q", 0)
    world.settle(other)
    assert other.result().base_offset == 12
    second = opened(world, "node-b", 2, rollover_records_max=4)
    retried = world.wait(second.append(batch("p", 2, 2), "p", 2))
    assert retried == ProduceOutcome(base_offset=2, count=2, duplicate=True)
    retried_last = world.wait(second.append(batch("p", 10, 2), "p", 10))
    assert retried_last == ProduceOutcome(
        base_offset=originals[5].result().base_offset, count=2, duplicate=True
    )
    retried_other = world.wait(second.append(batch("q", 0, 3), "q", 0))
    assert retried_other == ProduceOutcome(base_offset=12, count=3, duplicate=True)
    gap = second.append(batch("p", 20, 2), "p", 20)
    world.settle(gap)
    assert isinstance(gap.exception(), OutOfOrderSequenceError)
    following = world.wait(second.append(batch("p", 12, 2), "p", 12))
    assert (following.base_offset, following.duplicate) == (15, False)


def test_a_retry_of_a_batch_in_flight_is_answered_only_with_the_original() -> None:
    world = ManagedWorld()
    client = world.client(1)
    managed = client.managed("node-a", config())
    world.wait(managed.open())
    world.wait(managed.append(batch("p", 0, 2), "p", 0))
    client.dropping.update(world.bookies)  # nothing more reaches a bookie
    original = managed.append(batch("p", 2, 2), "p", 2)
    retry = managed.append(batch("p", 2, 2), "p", 2)
    world.scheduler.run_until_idle()
    assert not retry.done()  # a duplicate is not acknowledged before its original
    opened(world, "node-b", 2)
    world.settle(retry)
    # The writer gave up (its bookies all timed out) or was fenced: either way the batch
    # was never acknowledged, and neither is its retry.
    assert original.exception() is not None
    assert retry.exception() is original.exception()


@pytest.mark.parametrize("slice_records", [1, 2])
def test_a_batch_recovered_only_in_part_is_left_out_and_its_retry_written_whole(
    slice_records: int,
) -> None:
    """Each batch is three entries of `slice_records` records (1: as entry format 1 held
    them; 2: a batch sliced across entries in format 3)."""
    world = ManagedWorld()
    first_client = world.client(1)
    first = first_client.managed("node-a", config(slice_records_max=slice_records))
    world.wait(first.open())
    size = 3 * slice_records
    world.wait(first.append(batch("p", 0, size), "p", 0))
    writer = first.writer
    assert writer is not None
    assert writer.last_add_confirmed == 2  # three entries
    ensemble = writer.metadata.last_ensemble
    # Entries 3, 4, 5 go to write sets (e0,e1), (e1,e2), (e2,e0): with e1 and e2 cut off,
    # only entry 3 reaches a bookie (e0): recovery finds it and stops before entry 4.
    first_client.dropping.update(ensemble[1:])
    pending = first.append(batch("p", size, size), "p", size)
    world.scheduler.run_until_idle()
    assert not pending.done()
    second = opened(world, "node-b", 2)
    recovered = world.metadata.read_ledger(writer.ledger_id)
    assert recovered.last_entry_id == 3  # the ledger holds a third of the batch ...
    assert second.end_offset == size  # ... which the managed ledger leaves out
    closed = stored_record(world).ledgers[0]
    assert (closed.last_entry_id, closed.end_offset) == (2, size)
    world.settle(pending)
    assert isinstance(pending.exception(), NotPartitionOwnerError)
    retried = world.wait(second.append(batch("p", size, size), "p", size))
    assert (retried.base_offset, retried.duplicate) == (size, False)
    assert read_all(world, second) == [(n, b"p-%d" % n) for n in range(2 * size)]


def test_retention_drops_whole_closed_ledgers_and_advances_the_start() -> None:
    world = ManagedWorld()
    managed = opened(world, "node-a", 1, rollover_records_max=5, retention_ms=60_000)
    for number in range(4):
        world.wait(managed.append(batch("p", 5 * number, 5), "p", 5 * number))
    before = stored_record(world)
    assert len(before.ledgers) == 5  # four closed, one open (empty)
    assert world.wait(managed.trim()) == []  # nothing is old enough yet
    world.scheduler.advance(61.0)
    world.wait(managed.append(batch("p", 20, 5), "p", 20))
    dropped = world.wait(managed.trim())
    assert dropped == [ledger.ledger_id for ledger in before.ledgers[:4]]
    world.scheduler.run_until_idle()
    after = stored_record(world)
    assert after.start_offset == managed.start_offset == 20
    assert after.ledgers[0].ledger_id == before.ledgers[4].ledger_id
    assert all(ledger_id not in world.metadata.list_ledgers() for ledger_id in dropped)
    with pytest.raises(OffsetOutOfRangeError):
        world.wait(managed.read(19, 1))
    assert read_all(world, managed) == [(n, b"p-%d" % n) for n in range(20, 25)]


def test_retention_by_bytes_keeps_at_least_the_bytes_asked_for() -> None:
    world = ManagedWorld()
    managed = opened(world, "node-a", 1, rollover_records_max=5)
    for number in range(6):
        world.wait(managed.append(batch("p", 5 * number, 5), "p", 5 * number))
    record = stored_record(world)
    ledger_bytes = record.ledgers[0].data_bytes
    assert ledger_bytes > 0
    assert world.wait(managed.trim()) == []  # no retention set: everything stays
    managed.config = config(rollover_records_max=5, retention_bytes=2 * ledger_bytes)
    dropped = world.wait(managed.trim())
    assert len(dropped) == 4  # six closed ledgers, two kept
    assert managed.start_offset == 20
    assert read_all(world, managed)[0] == (20, b"p-20")


def test_a_bookie_dying_mid_stream_loses_no_records() -> None:
    world = ManagedWorld()
    managed = opened(world, "node-a", 1)
    for number in range(5):
        world.wait(managed.append(batch("p", 4 * number, 4), "p", 4 * number))
    writer = managed.writer
    assert writer is not None
    victim = writer.metadata.last_ensemble[1]
    world.down.add(victim)
    tail = [managed.append(batch("p", 4 * n, 4), "p", 4 * n) for n in range(5, 10)]
    world.settle(tail[-1])
    assert [outcome.result().base_offset for outcome in tail] == list(range(20, 40, 4))
    ledger = world.metadata.read_ledger(writer.ledger_id)
    assert len(ledger.ensembles) == 2 and victim not in ledger.last_ensemble
    assert read_all(world, managed) == [(n, b"p-%d" % n) for n in range(40)]
    successor = opened(world, "node-b", 2)
    assert read_all(world, successor) == [(n, b"p-%d" % n) for n in range(40)]


def test_a_closed_managed_ledger_opens_again_without_recovery() -> None:
    world = ManagedWorld()
    managed = opened(world, "node-a", 1)
    world.wait(managed.append(batch("p", 0, 3), "p", 0))
    world.wait(managed.close())
    closing = stored_record(world)
    assert all(ledger.closed for ledger in closing.ledgers)
    again = opened(world, "node-a", 3)
    assert again.end_offset == 3
    assert world.wait(again.append(batch("p", 0, 3), "p", 0)).duplicate


@pytest.mark.parametrize("points_max", [1024, 2])
def test_a_fetch_from_mid_batch_starts_at_the_offset_asked(
    points_max: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also with closed ledgers' indexes thinned to their ends (2 points): reads probe."""
    monkeypatch.setattr(managed_index_module, "CLOSED_INDEX_POINTS_MAX", points_max)
    world = ManagedWorld()
    managed = opened(world, "node-a", 1, rollover_records_max=20)
    for number in range(12):
        world.wait(managed.append(batch("p", 5 * number, 5), "p", 5 * number))
    assert len(stored_record(world).ledgers) == 4  # three closed (20 records each), one open
    for offset, count in [(3, 4), (17, 6), (25, 100), (59, 5), (41, 1), (12, 30)]:
        records = world.wait(managed.read(offset, count))
        expected = list(range(offset, min(offset + count, 60)))
        assert [(n, record.value) for n, record in records] == [(n, b"p-%d" % n) for n in expected]


def test_small_reads_of_a_large_entry_read_it_from_the_bookies_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = ManagedWorld()
    client = world.client(1)
    managed = client.managed("node-a", config())
    world.wait(managed.open())
    world.wait(managed.append(batch("p", 0, 50), "p", 0))
    world.wait(managed.append(batch("p", 50, 50), "p", 50))
    reads: list[tuple[int, int]] = []
    read = client.driver.read

    def counted(metadata: LedgerMetadata, first: int, last: int, lac: int) -> object:
        reads.append((first, last))
        return read(metadata, first, last, lac)

    monkeypatch.setattr(client.driver, "read", counted)
    found = []
    for offset in range(0, 100, 7):
        found += [n for n, _ in world.wait(managed.read(offset, 7))]
    assert found == list(range(100))
    assert reads == [(0, 0), (1, 1)]


def test_a_new_owner_reads_older_ledgers_it_never_wrote_from_any_offset() -> None:
    """The successor knows the older ledgers by their ends only: it probes for the entry
    that holds an offset, batches of unequal sizes included."""
    world = ManagedWorld()
    first = opened(world, "node-a", 1, rollover_records_max=30)
    sizes = [1, 7, 2, 13, 1, 1, 9, 4, 20, 3, 1, 6, 11, 2, 5]
    sequence = 0
    for size in sizes:
        world.wait(first.append(batch("p", sequence, size), "p", sequence))
        sequence += size
    second = opened(world, "node-b", 2)
    assert len(second.closed_indexes) == 1  # the last ledger, replayed at the takeover
    for offset in range(sequence):
        records = world.wait(second.read(offset, 3))
        expected = list(range(offset, min(offset + 3, sequence)))
        assert [(n, record.value) for n, record in records] == [(n, b"p-%d" % n) for n in expected]
    assert read_all(world, second) == [(n, b"p-%d" % n) for n in range(sequence)]


# --- a topic the previous release wrote (entry format 1) ---------------------------------


def write_v1_ledger(
    world: ManagedWorld, batches: list[tuple[str, int, int]], table: ProducerTable, close: bool
) -> LedgerMetadata:
    """A ledger as the previous release's owner wrote it: one entry per record, its
    producer table before it in its metadata; closed, or left open (its owner died)."""
    created = world.metadata.create_ledger(
        new_ledger_metadata(
            ensemble=["b0", "b1", "b2"],
            write_quorum_size=2,
            ack_quorum_size=2,
            password=PASSWORD,
            properties={
                TOPIC_PROPERTY: NAME,
                PRODUCERS_PROPERTY: encode_producer_table(table, 100),
            },
        )
    )
    writer = world.client(50).driver.start_writer(
        created, master_key(PASSWORD), lambda _: None, lambda _: None
    )
    datas = []
    for producer_id, base_sequence, count in batches:
        datas += encode_batch_v1(
            batch(producer_id, base_sequence, count), producer_id, base_sequence, 9
        )
    writer.append_many(datas)
    world.scheduler.run_until_idle()
    assert writer.last_add_confirmed == len(datas) - 1
    return world.wait(writer.close()) if close else writer.metadata


def test_a_topic_written_in_entry_format_1_keeps_working() -> None:
    world = ManagedWorld()
    table = ProducerTable()
    first = write_v1_ledger(world, [("p", 0, 3), ("q", 0, 2)], table, close=True)
    replay_batch(table, "p", 0, 3, 0, 100, 5)
    replay_batch(table, "q", 0, 2, 3, 100, 5)
    second = write_v1_ledger(world, [("p", 3, 2)], table, close=False)
    world.store.records[NAME] = encode_record_v1(
        RecordV1(
            name=NAME,
            version=3,
            owner_epoch=1,
            owner="old-release",
            ledgers=[
                LedgerInfoV1(first.ledger_id, 0, closed=True, last_entry_id=4, data_bytes=100),
                LedgerInfoV1(second.ledger_id, 5),
            ],
        )
    )
    managed = opened(world, "node-new", 3)  # recovers the open format-1 ledger
    assert managed.end_offset == 7
    assert world.wait(managed.append(batch("q", 0, 2), "q", 0)) == ProduceOutcome(3, 2, True)
    assert world.wait(managed.append(batch("p", 3, 2), "p", 3)) == ProduceOutcome(5, 2, True)
    assert world.wait(managed.append(batch("p", 5, 4), "p", 5)) == ProduceOutcome(7, 4, False)
    record = stored_record(world)
    assert [ledger.entry_format for ledger in record.ledgers] == [
        ENTRY_FORMAT_V1,
        ENTRY_FORMAT_V1,
        ENTRY_FORMAT_V3,
    ]
    expected = [(n, b"p-%d" % n) for n in range(3)] + [(3, b"q-0"), (4, b"q-1")]
    expected += [(n, b"p-%d" % (n - 2)) for n in range(5, 11)]
    assert read_all(world, managed) == expected
    assert [n for n, _ in world.wait(managed.read(6, 3))] == [6, 7, 8]
    successor = opened(world, "node-next", 4)  # takes over from the format-3 ledger
    assert read_all(world, successor) == expected
    assert world.wait(successor.append(batch("q", 0, 2), "q", 0)).base_offset == 3


# --- randomized takeovers -----------------------------------------------------------------


class Producer:
    """An idempotent producer: batches in sequence order, resent from the first one not
    acknowledged whenever an owner fails it."""

    def __init__(self, producer_id: str, rng: random.Random) -> None:
        self.producer_id = producer_id
        self.rng = rng
        self.next_sequence = 0
        self.unacknowledged: list[tuple[int, int]] = []
        self.acknowledged: dict[int, ProduceOutcome] = {}
        """Base sequence -> the outcome an owner acknowledged."""

    def new_batch(self) -> tuple[int, int]:
        count = self.rng.randint(1, 4)
        sent = (self.next_sequence, count)
        self.next_sequence += count
        self.unacknowledged.append(sent)
        return sent

    def send(self, managed: ManagedLedger, sent: tuple[int, int]) -> None:
        base_sequence, count = sent
        completion = managed.append(
            batch(self.producer_id, base_sequence, count), self.producer_id, base_sequence
        )

        def done(finished: Completion[ProduceOutcome]) -> None:
            if finished.exception() is None and sent in self.unacknowledged:
                self.unacknowledged.remove(sent)
                self.acknowledged[base_sequence] = finished.result()

        completion.add_done_callback(done)


def run_takeovers(seed: int) -> None:
    rng = random.Random(seed)
    world = ManagedWorld()
    producers = [Producer(f"p{number}", rng) for number in range(3)]
    settings = config(
        rollover_records_max=rng.choice([3, 7, 50]),
        # Slices of one or two records: batches cut across entries, so recovery finds
        # parts of batches; 4096: a batch per entry.
        slice_records_max=rng.choice([1, 2, 4096]),
    )
    owner_client: Client | None = None
    for round_number in range(rng.randint(3, 6)):
        if owner_client is not None and rng.random() < 0.5:
            # The old owner loses some bookies: its batches in flight may reach only part
            # of their write sets, so recovery can find part of a batch.
            owner_client.dropping.update(rng.sample(sorted(world.bookies), rng.randint(1, 2)))
        client = world.client(seed * 100 + round_number)
        candidate = client.managed(f"node-{round_number}", settings)
        opening = candidate.open()
        for _ in range(rng.randint(0, 40)):
            world.scheduler.run_next()  # the takeover interleaves with the old owner's work
        world.settle(opening, seconds_max=30)
        if opening.exception() is not None:
            assert isinstance(opening.exception(), NotPartitionOwnerError), seed
            continue  # the old owner stored its list first: the next round takes over
        managed = candidate
        owner_client = client
        for producer in producers:
            for sent in list(producer.unacknowledged):
                producer.send(managed, sent)
        for _ in range(rng.randint(1, 12)):
            producer = rng.choice(producers)
            producer.send(managed, producer.new_batch())
            for _ in range(rng.randint(0, 6)):
                world.scheduler.run_next()
    # A last owner takes over, and every producer resends what is still unacknowledged.
    final = take_over(world, settings, f"node-final-{seed}", seed * 100 + 99)
    for producer in producers:
        for sent in list(producer.unacknowledged):
            producer.send(final, sent)
    world.scheduler.advance(1.0)
    check_log(world, final, producers, seed)


def take_over(
    world: ManagedWorld, settings: ManagedLedgerConfig, owner: str, seed: int
) -> ManagedLedger:
    for attempt in range(5):
        managed = world.client(seed + attempt).managed(owner, settings)
        opening = managed.open()
        world.settle(opening, seconds_max=30)
        if opening.exception() is None:
            return managed
    raise AssertionError("no owner could take over in 5 attempts")


def check_log(
    world: ManagedWorld, managed: ManagedLedger, producers: list[Producer], seed: int
) -> None:
    log = read_all(world, managed)
    offsets = [offset for offset, _ in log]
    assert offsets == list(range(managed.start_offset, managed.end_offset)), seed
    values = [value for _, value in log]
    assert len(values) == len(set(values)), f"seed {seed}: a record was written twice"
    by_offset = dict(log)
    for producer in producers:
        assert producer.unacknowledged == [], f"seed {seed}: {producer.producer_id} stuck"
        for base_sequence, outcome in producer.acknowledged.items():
            for index in range(outcome.count):
                expected = b"%s-%d" % (producer.producer_id.encode(), base_sequence + index)
                assert expected in by_offset.values(), f"seed {seed}: {expected!r} lost"
                if outcome.base_offset >= 0:  # -1: a duplicate too old to remember where
                    assert by_offset.get(outcome.base_offset + index) == expected, seed


@pytest.mark.parametrize("seed", range(30))
def test_randomized_takeovers_lose_nothing_acknowledged_and_write_nothing_twice(
    seed: int,
) -> None:
    run_takeovers(seed)


def test_a_wrong_password_fails_the_takeover_typed() -> None:
    world = ManagedWorld()
    managed = opened(world, "node-a", 1)
    world.wait(managed.append(batch("p", 0, 1), "p", 0))
    intruder = world.client(2).managed("node-b", ManagedLedgerConfig(password=b"wrong"))
    world.settle(intruder.open())
    assert isinstance(intruder.open().exception(), BadPasswordError)
    assert world.wait(managed.append(batch("p", 1, 1), "p", 1)).base_offset == 1


def compressed_batch(producer_id: str, base_sequence: int, count: int) -> CompressedRecords:
    records = batch(producer_id, base_sequence, count)
    return CompressedRecords("zstd", compress("zstd", msgspec.msgpack.encode(records)), count)


def test_compressed_batches_are_kept_whole_read_decompressed_and_replayed_by_a_new_owner() -> None:
    world = ManagedWorld()
    # Slices of 300 bytes: the larger compressed batch does not fit one and goes in plain.
    first = opened(world, "node-a", 1, slice_bytes_max=300, slice_records_max=8)
    small = compressed_batch("p", 0, 20)
    noise = random.Random(5)
    values = [noise.randbytes(60) for _ in range(12)]  # incompressible
    large_records = [Record(value) for value in values]
    large = CompressedRecords("lz4", compress("lz4", msgspec.msgpack.encode(large_records)), 12)
    assert len(small.data) <= 300 < len(large.data)
    assert world.wait(first.append([], "p", 0, small, timestamp_ms=1234)) == ProduceOutcome(0, 20)
    assert world.wait(first.append(batch("q", 0, 3), "q", 0)) == ProduceOutcome(20, 3)
    assert world.wait(first.append([], "r", 0, large)) == ProduceOutcome(23, 12)
    ledger_index = first.ledger_index
    assert ledger_index.entry_count > 1 + 1 + 1, "the small one whole, the large one sliced"
    expected = [(n, b"p-%d" % n) for n in range(20)] + [(20 + n, b"q-%d" % n) for n in range(3)]
    expected += [(23 + n, value) for n, value in enumerate(values)]
    assert read_all(world, first) == expected
    middle = world.wait(first.read(5, 3))
    assert [(offset, record.timestamp_ms) for offset, record in middle] == [
        (5, 1234),
        (6, 1234),
        (7, 1234),
    ]
    second = opened(world, "node-b", 2)  # replays the compressed entry from the bookies
    assert read_all(world, second) == expected
    retried = world.wait(second.append([], "p", 0, compressed_batch("p", 0, 20)))
    assert retried == ProduceOutcome(0, 20, duplicate=True)
    assert world.wait(second.append([], "p", 20, compressed_batch("p", 20, 2))).base_offset == 35
    with pytest.raises(ValueError, match="at least one record"):
        second.append(batch("p", 22, 1), "p", 22, compressed_batch("p", 22, 1))


def test_each_ledger_is_stamped_with_the_owner_epoch_its_record_stores() -> None:
    # The sweep (node/ledger_sweep.py) deletes an unlisted ledger stamped below the
    # record's epoch: a stamp that ran ahead of the record would lose a live ledger.
    world = ManagedWorld()
    first = opened(world, "node-a", 1, rollover_records_max=3)
    for number in range(3):
        world.wait(first.append(batch("p", 2 * number, 2), "p", 2 * number))
    second = opened(world, "node-b", 2, rollover_records_max=3)
    for number in range(3, 6):
        world.wait(second.append(batch("p", 2 * number, 2), "p", 2 * number))
    record = stored_record(world)
    stamps = [
        world.metadata.read_ledger(ledger.ledger_id).properties[EPOCH_PROPERTY]
        for ledger in record.ledgers
    ]
    assert record.owner_epoch == 2
    assert stamps[0] == "1" and stamps[-1] == "2" and sorted(stamps) == stamps, stamps
