"""Admin, Producer and Consumer against the in-process fake stream cluster."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest

from quorumlog import Admin, Consumer, Producer
from quorumlog.codec import wire
from quorumlog.errors import (
    ClientError,
    NotEnoughReplicasError,
    RequestRejectedError,
    UnavailableError,
    UnknownOutcomeError,
)
from quorumlog.stream.client_common import (
    OffsetOutOfRangeError,
    TopicExistsError,
    TopicNotFoundError,
    partition_for_key,
)
from quorumlog.stream.producer import BufferFullError, ProducerClosedError
from quorumlog.stream.records import Record, RecordMetadata
from quorumlog.testing.queue_checker import (
    ConsumedRecord,
    ProducedRecord,
    ProduceStatus,
    check_queue,
)
from tests.unit.kv.fake_cluster import ClusterThread
from tests.unit.stream.fake_stream_cluster import FakeStreamCluster


@pytest.fixture
def cluster() -> Iterator[FakeStreamCluster]:
    with ClusterThread(FakeStreamCluster()) as running:
        yield running  # type: ignore[misc]


@pytest.fixture
def admin(cluster: FakeStreamCluster) -> Iterator[Admin]:
    with Admin(cluster.endpoints) as client:
        yield client


def read_all(consumer: Consumer, topic: str, partition: int) -> list[Record]:
    records: list[Record] = []
    offset = consumer.begin_offset(topic, partition)
    while batch := consumer.read(topic, partition, offset, 1000):
        records += batch
        offset = batch[-1].offset + 1
    return records


# --- admin ---------------------------------------------------------------------------------


def test_admin_creates_lists_describes_and_deletes(
    cluster: FakeStreamCluster, admin: Admin
) -> None:
    admin.create_topic("events", partitions=3, replication=3, retention_bytes=1_000_000)
    admin.create_topic("audit", partitions=1, replication=1)
    assert admin.list_topics() == ["audit", "events"]
    description = admin.describe_topic("events")
    assert description.partition_count == 3
    assert description.retention_bytes == 1_000_000
    assert [p.partition for p in description.partitions] == [0, 1, 2]
    assert [p.leader for p in description.partitions] == ["n1", "n2", "n3"]
    assert description.partitions[0].end_offset == 0
    admin.delete_topic("audit")
    assert admin.list_topics() == ["events"]


def test_admin_refusals_are_typed(admin: Admin) -> None:
    admin.create_topic("events", partitions=1)
    with pytest.raises(TopicExistsError):
        admin.create_topic("events", partitions=1)
    with pytest.raises(TopicNotFoundError):
        admin.delete_topic("missing")
    with pytest.raises(TopicNotFoundError):
        admin.describe_topic("missing")
    with pytest.raises(ValueError, match="topic name"):
        admin.create_topic("no spaces please")
    with pytest.raises(ValueError, match="partitions"):
        admin.create_topic("zero", partitions=0)


def test_refusals_after_a_redirect_are_still_refusals(cluster: FakeStreamCluster) -> None:
    # A NOT_LEADER answer means "not accepted": the leader's NOT_FOUND that follows is ours.
    with Admin([cluster.node("n2").address]) as admin:
        admin.create_topic("events", partitions=1)
        with pytest.raises(TopicExistsError):
            admin.create_topic("events", partitions=1)
        admin.delete_topic("events")
        with pytest.raises(TopicNotFoundError):
            admin.delete_topic("events")


def test_admin_follows_the_metadata_leader(cluster: FakeStreamCluster) -> None:
    cluster.leader_id = "n3"
    with Admin([cluster.node("n1").address]) as admin:
        admin.create_topic("events", partitions=1)
    assert "events" in cluster.topics
    refused = [f for f in cluster.node("n1").requests if isinstance(f, wire.CreateTopic)]
    assert len(refused) == 1


# --- produce and read ----------------------------------------------------------------------


def test_produce_then_read_back_in_order(cluster: FakeStreamCluster, admin: Admin) -> None:
    admin.create_topic("events", partitions=2)
    with Producer(cluster.endpoints) as producer:
        futures = [
            producer.send("events", f"v{i}".encode(), partition=i % 2, headers={"h": b"x"})
            for i in range(200)
        ]
        producer.flush()
        metadata = [future.result(timeout=0) for future in futures]
    assert [m.offset for m in metadata if m.partition == 0] == list(range(100))
    assert metadata[1] == RecordMetadata("events", 1, 0, cluster.clock_ms)
    with Consumer(cluster.endpoints) as consumer:
        records = consumer.read("events", 1, 0, 1000)
        assert [r.value for r in records] == [f"v{i}".encode() for i in range(1, 200, 2)]
        assert [r.offset for r in records] == list(range(100))
        assert records[0].headers == [("h", b"x")]
        assert records[0].timestamp == cluster.clock_ms
        assert records[0].key is None
        assert consumer.end_offset("events", 1) == 100
        assert consumer.begin_offset("events", 1) == 0
        assert consumer.read("events", 1, 100, 10) == []


def test_records_are_batched(cluster: FakeStreamCluster, admin: Admin) -> None:
    admin.create_topic("events", partitions=1)
    with Producer(cluster.endpoints, linger_ms=50) as producer:
        futures = [producer.send("events", b"x" * 100) for _ in range(5000)]
        producer.flush()
        assert all(f.result(timeout=0).partition == 0 for f in futures)
    produces = cluster.node("n1").produces()
    assert sum(len(p.records) for p in produces) == 5000
    assert len(produces) <= 10
    # Sequences count records: each batch starts where the previous one ended.
    sequences = [p.base_sequence for p in produces]
    counts = [len(p.records) for p in produces]
    assert sequences == [sum(counts[:i]) for i in range(len(counts))]


def test_batch_records_max_and_bytes_max_split_batches(
    cluster: FakeStreamCluster, admin: Admin
) -> None:
    admin.create_topic("events", partitions=1)
    with Producer(
        cluster.endpoints, linger_ms=1000, batch_records_max=7, batch_bytes_max=4096
    ) as producer:
        for _ in range(20):
            producer.send("events", b"x")
        for _ in range(3):
            producer.send("events", b"y" * 3000)
        producer.flush()
    sizes = [len(p.records) for p in cluster.node("n1").produces()]
    assert sum(sizes) == 23
    assert max(sizes) <= 7
    big = [p for p in cluster.node("n1").produces() if p.records[-1].value[:1] == b"y"]
    assert all(sum(len(r.value) for r in p.records) <= 4096 for p in big)


def test_keys_choose_partitions_stably(cluster: FakeStreamCluster, admin: Admin) -> None:
    admin.create_topic("events", partitions=4)
    with Producer(cluster.endpoints) as producer:
        futures = {key: producer.send("events", b"v", key=key) for key in (b"a", b"b", b"c")}
        producer.flush()
    for key, future in futures.items():
        assert future.result().partition == partition_for_key(key, 4)


def test_read_trims_to_offset_and_max_records(cluster: FakeStreamCluster, admin: Admin) -> None:
    admin.create_topic("events", partitions=1)
    with Producer(cluster.endpoints, linger_ms=20) as producer:
        for i in range(50):
            producer.send("events", str(i).encode(), key=b"k")
        producer.flush()
    with Consumer(cluster.endpoints) as consumer:
        records = consumer.read("events", 0, 17, 5)
        assert [r.offset for r in records] == [17, 18, 19, 20, 21]
        assert [r.value for r in records] == [b"17", b"18", b"19", b"20", b"21"]
        assert records[0].key == b"k"
        with pytest.raises(OffsetOutOfRangeError, match="ends at offset 50"):
            consumer.read("events", 0, 51, 5)


def test_topic_missing_from_a_stale_list_is_found_at_the_leader(
    cluster: FakeStreamCluster, admin: Admin
) -> None:
    admin.create_topic("events", partitions=1)
    follower = cluster.node("n2")
    follower.stale_topic_list = True
    with Producer([follower.address]) as producer:
        assert producer.send("events", b"v").result(timeout=10).offset == 0
    with Admin([follower.address]) as fresh_admin:
        assert fresh_admin.list_topics() == ["events"]


def test_unknown_topic_and_partition_raise_at_send(
    cluster: FakeStreamCluster, admin: Admin
) -> None:
    admin.create_topic("events", partitions=2)
    with Producer(cluster.endpoints) as producer:
        with pytest.raises(TopicNotFoundError):
            producer.send("missing", b"v")
        with pytest.raises(ValueError, match="partitions 0 to 1"):
            producer.send("events", b"v", partition=2)
        with pytest.raises(TypeError, match="bytes"):
            producer.send("events", "text")  # type: ignore[arg-type]
    with pytest.raises(ProducerClosedError):
        producer.send("events", b"v")


# --- retries and idempotence ---------------------------------------------------------------


def test_lost_answer_is_retried_with_same_sequence_and_written_once(
    cluster: FakeStreamCluster, admin: Admin
) -> None:
    admin.create_topic("events", partitions=1)
    leader = cluster.node("n1")
    leader.unanswered_produces = 1
    with Producer(cluster.endpoints, attempt_timeout_seconds=0.2) as producer:
        first = producer.send("events", b"a")
        assert first.result(timeout=10).offset == 0
        second = producer.send("events", b"b")
        assert second.result(timeout=10).offset == 1
    produces = leader.produces()
    assert [p.base_sequence for p in produces] == [0, 0, 1]
    assert cluster.partition("events", 0).machine.next_offset == 2


def test_leader_change_is_followed(cluster: FakeStreamCluster, admin: Admin) -> None:
    admin.create_topic("events", partitions=1)
    with Producer(cluster.endpoints) as producer:
        assert producer.send("events", b"a").result(timeout=10).offset == 0
        cluster.partition("events", 0).leader_id = "n3"
        assert producer.send("events", b"b").result(timeout=10).offset == 1
        assert producer.transport.leader_endpoint("events", 0) == cluster.node("n3").address
    assert [p.base_sequence for p in cluster.node("n3").produces()] == [1]


def test_a_replay_with_the_same_producer_id_and_batches_writes_nothing_twice(
    cluster: FakeStreamCluster, admin: Admin
) -> None:
    admin.create_topic("events", partitions=1)
    offsets = []
    for _attempt in range(2):
        with Producer(
            cluster.endpoints,
            producer_id="query-7-batch-3-task-0",
            linger_ms=math.inf,
            batch_records_max=10,
        ) as producer:
            futures = [producer.send("events", str(i).encode()) for i in range(25)]
            producer.flush()
            offsets.append([future.result(timeout=0).offset for future in futures])
    assert offsets[0] == offsets[1] == list(range(25))
    assert [len(p.records) for p in cluster.node("n1").produces()] == [10, 10, 5] * 2
    assert cluster.partition("events", 0).machine.next_offset == 25


def test_busy_codes_are_retried_and_refusals_fail_the_batch(
    cluster: FakeStreamCluster, admin: Admin
) -> None:
    admin.create_topic("events", partitions=1)
    leader = cluster.node("n1")
    leader.produce_errors = [wire.ErrorCode.PENDING_FULL, wire.ErrorCode.TOO_LARGE]
    with Producer(cluster.endpoints) as producer:
        refused = producer.send("events", b"a")
        with pytest.raises(RequestRejectedError, match="too_large"):
            refused.result(timeout=10)
        # The refused batch was not written: its sequence is the next batch's.
        assert producer.send("events", b"b").result(timeout=10).offset == 0
    assert [p.base_sequence for p in leader.produces()] == [0, 0, 0]


def test_not_enough_replicas_is_retried_after_a_back_off_and_written_once(
    cluster: FakeStreamCluster, admin: Admin
) -> None:
    """Like Kafka's NOT_ENOUGH_REPLICAS: the master wrote nothing, so the same batch goes
    again (same sequence) until the SyncStateSet is large enough."""
    admin.create_topic("events", partitions=1)
    leader = cluster.node("n1")
    leader.produce_errors = [wire.ErrorCode.NOT_ENOUGH_REPLICAS] * 3
    with Producer(cluster.endpoints) as producer:
        assert producer.send("events", b"a").result(timeout=10).offset == 0
    assert [p.base_sequence for p in leader.produces()] == [0, 0, 0, 0]
    assert cluster.partition("events", 0).machine.next_offset == 1


def test_not_enough_replicas_until_the_timeout_is_raised_typed(
    cluster: FakeStreamCluster, admin: Admin
) -> None:
    admin.create_topic("events", partitions=1)
    leader = cluster.node("n1")
    leader.produce_errors = [wire.ErrorCode.NOT_ENOUGH_REPLICAS] * 1000
    with Producer(cluster.endpoints, delivery_timeout_seconds=0.5) as producer:
        refused = producer.send("events", b"a")
        with pytest.raises(NotEnoughReplicasError, match="too few in-sync replicas") as raised:
            refused.result(timeout=10)
        assert isinstance(raised.value, UnavailableError), "certainly not written"
        assert len(leader.produces()) > 1, "retried before giving up"
        leader.produce_errors = []
        # Nothing was written: the next batch takes the refused one's sequence.
        assert producer.send("events", b"b").result(timeout=10).offset == 0
    assert {p.base_sequence for p in leader.produces()} == {0}


def test_a_batch_perhaps_written_keeps_its_sequence_through_not_enough_replicas(
    cluster: FakeStreamCluster, admin: Admin
) -> None:
    """The first attempt is written but its answer lost (outcome unknown); then the master
    refuses with NOT_ENOUGH_REPLICAS until a later call gives up. That call wrote nothing,
    but the first did: the batch must keep its sequence (and be resent until answered),
    or the next batch would reuse it and be taken for a duplicate, its record lost."""
    admin.create_topic("events", partitions=1)
    leader = cluster.node("n1")
    leader.produce_errors = [None, *[wire.ErrorCode.NOT_ENOUGH_REPLICAS] * 20]
    with Producer(
        cluster.endpoints, attempt_timeout_seconds=0.1, delivery_timeout_seconds=0.25
    ) as producer:
        with pytest.raises(UnknownOutcomeError):
            producer.send("events", b"a").result(timeout=10)
        deadline = time.monotonic() + 10
        while leader.produce_errors:  # the batch is resent through every refusal
            assert time.monotonic() < deadline, "the batch of unknown outcome was given up"
            time.sleep(0.01)  # polling the condition above, with its deadline
        assert producer.send("events", b"c").result(timeout=10).offset == 1
    with Consumer(cluster.endpoints) as consumer:
        values = [record.value for record in read_all(consumer, "events", 0)]
    assert values == [b"a", b"c"]


def test_out_of_order_answer_fails_batch_and_moves_to_fresh_identity(
    cluster: FakeStreamCluster, admin: Admin
) -> None:
    admin.create_topic("events", partitions=1)
    leader = cluster.node("n1")
    leader.produce_errors = [wire.ErrorCode.OUT_OF_RANGE]
    with Producer(cluster.endpoints, producer_id="fixed") as producer:
        with pytest.raises(RequestRejectedError, match="out_of_range"):
            producer.send("events", b"a").result(timeout=10)
        assert producer.send("events", b"b").result(timeout=10).offset == 0
    assert [p.producer_id for p in leader.produces()] == ["fixed", "fixed.1"]


def test_delivery_timeout_reports_unknown_and_keeps_sequences_right(
    cluster: FakeStreamCluster, admin: Admin
) -> None:
    admin.create_topic("events", partitions=1)
    leader = cluster.node("n1")
    leader.unanswered_produces = 3
    with Producer(
        cluster.endpoints, attempt_timeout_seconds=0.1, delivery_timeout_seconds=0.25
    ) as producer:
        stuck = producer.send("events", b"a")
        with pytest.raises(UnknownOutcomeError):
            stuck.result(timeout=10)
        # The stuck batch is resent until answered, so the next one gets the right sequence.
        assert producer.send("events", b"b").result(timeout=10).offset == 1
    assert cluster.partition("events", 0).machine.next_offset == 2


def test_send_blocks_for_room_then_raises(cluster: FakeStreamCluster, admin: Admin) -> None:
    admin.create_topic("events", partitions=1)
    cluster.node("n1").unanswered_produces = 1000
    producer = Producer(
        cluster.endpoints,
        batch_bytes_max=1000,
        buffer_bytes_max=1000,
        max_block_seconds=0.05,
        attempt_timeout_seconds=0.2,
    )
    try:
        pending = producer.send("events", b"x" * 900)
        with pytest.raises(BufferFullError):
            producer.send("events", b"x" * 900)
    finally:
        producer.close(timeout=0.1)
    with pytest.raises((ProducerClosedError, UnknownOutcomeError)):
        pending.result(timeout=0)


# --- retention and offsets -----------------------------------------------------------------


def test_reading_a_deleted_offset_names_the_first_kept(
    cluster: FakeStreamCluster, admin: Admin
) -> None:
    admin.create_topic("events", partitions=1)
    with Producer(cluster.endpoints, linger_ms=0) as producer:
        for _ in range(10):
            producer.send("events", b"x" * 100).result(timeout=10)
    cluster.partition("events", 0).cut(retention_bytes=500)
    with Consumer(cluster.endpoints) as consumer:
        begin = consumer.begin_offset("events", 0)
        assert 0 < begin < 10
        with pytest.raises(OffsetOutOfRangeError, match="deleted by retention") as raised:
            consumer.read("events", 0, 0, 10)
        assert raised.value.begin_offset == begin
        assert isinstance(raised.value, IndexError)
        assert [r.offset for r in consumer.read("events", 0, begin, 100)] == list(range(begin, 10))


def test_group_offsets_commit_and_poll(cluster: FakeStreamCluster, admin: Admin) -> None:
    admin.create_topic("events", partitions=2)
    with Producer(cluster.endpoints) as producer:
        for i in range(30):
            producer.send("events", str(i).encode(), partition=i % 2)
    with Consumer(cluster.endpoints, group="g", auto_offset_reset="earliest") as consumer:
        assert consumer.committed("events", 0) is None
        consumer.commit("events", 0, 5)
        assert consumer.committed("events", 0) == 5
        first = consumer.poll("events", max_records=12)
        assert 0 < len(first) <= 12
        records = list(first)
        deadline = time.monotonic() + 30
        while len(records) < 25 and time.monotonic() < deadline:
            records += consumer.poll("events", max_records=100)  # a poll takes what is there
        seen = [(r.partition, r.offset) for r in records]
        assert sorted(seen) == sorted({(0, o) for o in range(5, 15)} | {(1, o) for o in range(15)})
        assert consumer.poll("events") == []
        consumer.commit_positions()
    with Consumer(cluster.endpoints, group="g") as again:
        assert again.committed("events", 0) == 15
        assert again.committed("events", 1) == 15
        assert again.poll("events") == []
    with Consumer(cluster.endpoints) as no_group, pytest.raises(ClientError, match="no group"):
        no_group.commit("events", 0, 1)


def test_poll_after_retention_restarts_at_earliest(
    cluster: FakeStreamCluster, admin: Admin
) -> None:
    admin.create_topic("events", partitions=1)
    with Producer(cluster.endpoints, linger_ms=0) as producer:
        for _ in range(10):
            producer.send("events", b"x" * 100).result(timeout=10)
    with Consumer(cluster.endpoints, group="g", auto_offset_reset="earliest") as consumer:
        consumer.commit("events", 0, 1)
        cluster.partition("events", 0).cut(retention_bytes=500)
        begin = consumer.begin_offset("events", 0)
        records = consumer.poll("events")
        records += consumer.poll("events")
        assert [r.offset for r in records] == list(range(begin, 10))


def test_queue_checker_finds_nothing_lost_or_doubled_across_leader_changes(
    cluster: FakeStreamCluster, admin: Admin
) -> None:
    admin.create_topic("events", partitions=2)
    produced: list[ProducedRecord] = []
    with Producer(cluster.endpoints, linger_ms=1, attempt_timeout_seconds=0.2) as producer:
        for round_number in range(5):
            cluster.node("n1").unanswered_produces = 1
            cluster.partition("events", round_number % 2).leader_id = f"n{round_number % 3 + 1}"
            futures = [
                (f"{round_number}-{i}", producer.send("events", f"{round_number}-{i}".encode()))
                for i in range(100)
            ]
            producer.flush()
            for value, future in futures:
                metadata = future.result(timeout=0)
                produced.append(
                    ProducedRecord(
                        value, ProduceStatus.ACKNOWLEDGED, metadata.partition, metadata.offset
                    )
                )
    with Consumer(cluster.endpoints) as consumer:
        consumed = [
            ConsumedRecord(record.partition, record.offset, record.value.decode())
            for partition in (0, 1)
            for record in read_all(consumer, "events", partition)
        ]
    result = check_queue(produced, consumed, all_acknowledged_read=True)
    assert result.ok, result.explanation
    assert result.consumed_count == 500


def test_consumer_batch_layout_decodes_like_the_wire_record_batch() -> None:
    from quorumlog.stream.consumer import FetchedRecord, batch_decoder

    records = [
        wire.Record(b"v", b"k", 5, [("h", b"1")]),
        wire.Record(b"w"),
        wire.Record(b"", None, 0, []),
    ]
    data = wire.encode_record_batch(wire.RecordBatch("p", 7, 99, records))
    decoded = batch_decoder.decode(data)
    assert (decoded.producer_id, decoded.base_sequence, decoded.timestamp_ms) == ("p", 7, 99)
    assert decoded.records == [
        FetchedRecord(r.value, r.key, r.timestamp_ms, r.headers) for r in records
    ]
