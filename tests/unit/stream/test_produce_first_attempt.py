"""A batch's first attempt goes straight to the partition's known leader on its open
connection (`stream/produce_first_attempt.py`); anything but a result hands the attempt,
as the retry loop would have recorded it, to the retry loop: sequences, refusals, leader
hints and unknown outcomes stay what they were."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from quorumlog import Admin, Producer
from quorumlog.codec import wire
from quorumlog.errors import RequestRejectedError, UnknownOutcomeError
from quorumlog.stream.client_common import StreamTransport
from tests.unit.kv.fake_cluster import ClusterThread
from tests.unit.stream.fake_stream_cluster import FakeStreamCluster

WAIT_SECONDS = 10.0


@pytest.fixture
def cluster() -> Iterator[FakeStreamCluster]:
    with ClusterThread(FakeStreamCluster()) as running:
        with Admin(running.endpoints) as admin:  # type: ignore[attr-defined]
            admin.create_topic("events", partitions=1)
        yield running  # type: ignore[misc]


def sequences_at(cluster: FakeStreamCluster, node_id: str) -> list[int]:
    return [part.base_sequence for part in cluster.node(node_id).produces()]


def test_batches_to_a_known_leader_skip_the_general_request_path(
    cluster: FakeStreamCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    general_calls: list[str] = []
    partition_call = StreamTransport.partition_call
    call_with = StreamTransport.call_with

    async def counted_partition_call(self: StreamTransport, *args: Any, **kwargs: Any) -> Any:
        general_calls.append("partition_call")
        return await partition_call(self, *args, **kwargs)

    async def counted_call_with(self: StreamTransport, *args: Any, **kwargs: Any) -> Any:
        general_calls.append("call_with")
        return await call_with(self, *args, **kwargs)

    monkeypatch.setattr(StreamTransport, "partition_call", counted_partition_call)
    monkeypatch.setattr(StreamTransport, "call_with", counted_call_with)
    with Producer(cluster.endpoints, linger_ms=0) as producer:
        producer.send("events", b"first").result(timeout=WAIT_SECONDS)  # leader, connection
        general_calls.clear()
        offsets = [
            producer.send("events", b"v").result(timeout=WAIT_SECONDS).offset for _ in range(20)
        ]
    assert offsets == list(range(1, 21))
    assert general_calls == []
    assert sequences_at(cluster, "n1") == list(range(21))


def test_a_lost_first_attempt_is_retried_with_its_sequence_and_written_once(
    cluster: FakeStreamCluster,
) -> None:
    leader = cluster.node("n1")
    with Producer(cluster.endpoints, attempt_timeout_seconds=0.2) as producer:
        assert producer.send("events", b"a").result(timeout=WAIT_SECONDS).offset == 0
        leader.unanswered_produces = 1  # applied, answer lost: the attempt times out
        assert producer.send("events", b"b").result(timeout=WAIT_SECONDS).offset == 1
        assert producer.send("events", b"c").result(timeout=WAIT_SECONDS).offset == 2
    assert sequences_at(cluster, "n1") == [0, 1, 1, 2]
    assert cluster.partition("events", 0).machine.next_offset == 3


def test_a_refused_first_attempt_fails_its_records_and_is_not_sent_again(
    cluster: FakeStreamCluster,
) -> None:
    leader = cluster.node("n1")
    with Producer(cluster.endpoints) as producer:
        producer.send("events", b"a").result(timeout=WAIT_SECONDS)
        leader.produce_errors = [wire.ErrorCode.TOO_LARGE]
        with pytest.raises(RequestRejectedError, match="too_large"):
            producer.send("events", b"b").result(timeout=WAIT_SECONDS)
        # Not written, so its sequence goes to the next batch.
        assert producer.send("events", b"c").result(timeout=WAIT_SECONDS).offset == 1
    assert sequences_at(cluster, "n1") == [0, 1, 1]


def test_a_lost_first_attempt_then_no_node_reachable_is_an_unknown_outcome() -> None:
    # The first attempt may have been written: that its connection breaks unanswered, and
    # that no later attempt can even connect, must not make it "certainly not written".
    running = ClusterThread(FakeStreamCluster())
    with running as cluster:
        with Admin(cluster.endpoints) as admin:
            admin.create_topic("events", partitions=1)
        leader = cluster.node("n1")
        # `timeout` bounds the requests asking where the nodes listen, made once every
        # replica failed in a row.
        producer = Producer(
            cluster.endpoints,
            attempt_timeout_seconds=0.2,
            delivery_timeout_seconds=1.0,
            timeout=1.0,
        )
        try:
            producer.send("events", b"a").result(timeout=WAIT_SECONDS)
            leader.unanswered_produces = 1
            future = producer.send("events", b"b")
            deadline = time.monotonic() + WAIT_SECONDS
            while len(leader.produces()) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)  # polling a condition, with a deadline
            assert len(leader.produces()) == 2
            running.run(cluster.stop())  # its connection closes; nothing listens any more
            with pytest.raises(UnknownOutcomeError):
                future.result(timeout=WAIT_SECONDS)
        finally:
            producer.close(timeout=0.1)  # the batch is still retried (its outcome unknown)
