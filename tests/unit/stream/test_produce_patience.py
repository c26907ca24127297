"""A produce at a leader that is busy but alive is waited for, not sent again: a leader
answering other requests on the same connection keeps its produce attempts open until the
delivery timeout (`StreamConnection.wait_patiently`); a silent one is still given up on
after one attempt (the producer's own, longer than other clients'). Partitions that all
lost their connection at once ask where the nodes listen once, not once each."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from quorumlog import Admin, Producer
from quorumlog.codec import wire
from quorumlog.stream.client_common import StreamTransport
from tests.unit.kv.fake_cluster import ClusterThread
from tests.unit.stream.fake_stream_cluster import FakeStreamCluster

ANSWER_DELAY_SECONDS = 1.2
ATTEMPT_TIMEOUT_SECONDS = 0.3
"""Well under the answer's delay: the old client gave up on the attempt four times over."""
WAIT_SECONDS_MAX = 20.0


@pytest.fixture
def cluster() -> Iterator[FakeStreamCluster]:
    with ClusterThread(FakeStreamCluster()) as running:
        with Admin(running.endpoints) as admin:  # type: ignore[attr-defined]
            admin.create_topic("events", partitions=6)
        yield running  # type: ignore[misc]


def produces_to(cluster: FakeStreamCluster, partition: int) -> int:
    return sum(1 for part in cluster.node("n1").produces() if part.partition == partition)


def test_a_slow_answer_from_a_leader_busy_answering_others_is_waited_for(
    cluster: FakeStreamCluster,
) -> None:
    # Partitions 0 and 3 are both led by n1, so they share one connection.
    cluster.node("n1").produce_answer_delays[("events", 0)] = ANSWER_DELAY_SECONDS
    with Producer(
        cluster.endpoints,
        linger_ms=0,
        attempt_timeout_seconds=ATTEMPT_TIMEOUT_SECONDS,
        delivery_timeout_seconds=5.0,
    ) as producer:
        slow = producer.send("events", b"slow", partition=0)
        deadline = time.monotonic() + WAIT_SECONDS_MAX
        busy_offsets = []
        while not slow.done() and time.monotonic() < deadline:
            busy = producer.send("events", b"busy", partition=3)
            busy_offsets.append(busy.result(timeout=WAIT_SECONDS_MAX).offset)
        assert slow.result(timeout=0).offset == 0
    assert produces_to(cluster, 0) == 1, "the produce was sent again to a live leader"
    assert busy_offsets == list(range(len(busy_offsets)))
    assert cluster.partition("events", 0).machine.next_offset == 1


def test_a_silent_leader_is_still_given_up_on_after_one_attempt(
    cluster: FakeStreamCluster,
) -> None:
    cluster.node("n1").produce_answer_delays[("events", 0)] = ANSWER_DELAY_SECONDS
    with Producer(
        cluster.endpoints,
        linger_ms=0,
        attempt_timeout_seconds=ATTEMPT_TIMEOUT_SECONDS,
        delivery_timeout_seconds=5.0,
    ) as producer:
        # Nothing else goes to n1: its connection is silent while the answer is held.
        metadata = producer.send("events", b"alone", partition=0).result(timeout=WAIT_SECONDS_MAX)
    assert metadata.offset == 0  # the resend was deduplicated: the original offset
    assert produces_to(cluster, 0) >= 2
    assert cluster.partition("events", 0).machine.next_offset == 1


def test_by_default_a_produce_waits_longer_than_other_requests_for_a_silent_node(
    cluster: FakeStreamCluster,
) -> None:
    """The producer's attempt (ATTEMPT_TIMEOUT_SECONDS_DEFAULT) outlasts the other clients'
    1 s, so a node silent for a little over a second is not given up on."""
    cluster.node("n1").produce_answer_delays[("events", 0)] = ANSWER_DELAY_SECONDS
    with Producer(cluster.endpoints, linger_ms=0) as producer:
        metadata = producer.send("events", b"alone", partition=0).result(timeout=WAIT_SECONDS_MAX)
    assert metadata.offset == 0
    assert produces_to(cluster, 0) == 1


async def refresh_together(transport: StreamTransport, callers: int) -> list[bool]:
    return list(await asyncio.gather(*(transport.refresh_addresses() for _ in range(callers))))


def test_callers_refreshing_addresses_together_share_one_status_request(
    cluster: FakeStreamCluster,
) -> None:
    def status_requests() -> int:
        return sum(
            1
            for node_id in ("n1", "n2", "n3")
            for frame in cluster.node(node_id).requests
            if isinstance(frame, wire.StatusRequest)
        )

    with Producer(cluster.endpoints) as producer:
        before = status_requests()
        answers = producer.run(refresh_together(producer.transport, 50))
        assert len(answers) == 50
        assert status_requests() - before == 1
        producer.run(refresh_together(producer.transport, 1))  # a later caller asks again
        assert status_requests() - before == 2
