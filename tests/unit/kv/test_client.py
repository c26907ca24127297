"""KVClient (blocking) against the in-process fake cluster."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from quorumlog import KVClient
from quorumlog.codec import wire
from quorumlog.errors import (
    ConnectionRefusedByNodeError,
    RequestRejectedError,
    UnavailableError,
    UnknownOutcomeError,
)
from tests.unit.kv.fake_cluster import ClusterThread, FakeCluster


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    with ClusterThread(FakeCluster()) as running:
        yield running


def unused_endpoint() -> str:
    """A loopback port nothing listens on: bind one, then close it."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_put_get_append_delete_cas(cluster: FakeCluster) -> None:
    with KVClient(cluster.endpoints) as client:
        client.put("k", "a")
        client.append("k", "b")
        assert client.get("k") == "ab"
        assert client.get("k", stale=True) == "ab"
        assert client.cas("k", "wrong", "c") is False
        assert client.cas("k", "ab", "c") is True
        assert client.cas("missing", None, "x") is True
        client.delete("k")
        assert client.get("k") is None
        assert client.get("missing") == "x"


def test_follows_leader_hint_and_caches_leader(cluster: FakeCluster) -> None:
    cluster.leader_id = "n3"
    # Start at a follower: it must answer NOT_LEADER with the leader's address.
    with KVClient([cluster.node("n2").address, cluster.node("n1").address]) as client:
        client.put("k", "v")
        client.put("k", "w")
        assert client.selector.leader == cluster.node("n3").address
    assert len(cluster.node("n2").writes()) == 1
    assert len(cluster.node("n3").writes()) == 2


def test_not_leader_without_hint_tries_next_endpoint_with_same_sequence(
    cluster: FakeCluster,
) -> None:
    cluster.leader_id = "n2"
    cluster.node("n1").hide_leader_hint = True
    with KVClient(cluster.endpoints) as client:
        client.append("k", "x")
    [refused] = cluster.node("n1").writes()
    [accepted] = cluster.node("n2").writes()
    assert refused.commands[0].sequence == accepted.commands[0].sequence == 1
    assert refused.request_id != accepted.request_id


def test_lost_answer_is_retried_with_same_sequence_and_applied_once(
    cluster: FakeCluster,
) -> None:
    leader = cluster.node("n1")
    leader.unanswered_writes = 1
    with KVClient(cluster.endpoints, timeout=5.0, attempt_timeout_seconds=0.2) as client:
        client.append("k", "x")
        assert client.get("k") == "x"
    sequences = [write.commands[0].sequence for write in leader.writes()]
    assert sequences == [1, 1]
    assert cluster.machine.duplicate_count == 1


def test_busy_codes_back_off_and_retry(cluster: FakeCluster) -> None:
    cluster.node("n1").write_errors = [wire.ErrorCode.PENDING_FULL, wire.ErrorCode.UNAVAILABLE]
    with KVClient(cluster.endpoints) as client:
        client.put("k", "v")
        assert client.get("k") == "v"
    assert len(cluster.node("n1").writes()) == 3


def test_timeout_after_sending_is_unknown_outcome(cluster: FakeCluster) -> None:
    cluster.node("n1").swallow_writes = True
    with KVClient([cluster.node("n1").address], timeout=0.3) as client:
        with pytest.raises(UnknownOutcomeError, match="may or may not"):
            client.put("k", "v")
        # The same call again reuses the sequence, so it cannot apply twice.
        cluster.node("n1").swallow_writes = False
        client.put("k", "v")
    sequences = {write.commands[0].sequence for write in cluster.node("n1").writes()}
    assert sequences == {1}


def test_different_call_after_unknown_outcome_gets_new_sequence(cluster: FakeCluster) -> None:
    cluster.node("n1").swallow_writes = True
    with KVClient([cluster.node("n1").address], timeout=0.2) as client:
        with pytest.raises(UnknownOutcomeError):
            client.append("k", "x")
        cluster.node("n1").swallow_writes = False
        client.append("k", "y")
        last = cluster.node("n1").writes()[-1]
        assert last.commands[0].sequence == 2
        # Sequence 1 is still reserved for a retry, so the cluster must keep its result.
        assert last.first_unacknowledged == 1


def test_nothing_reachable_is_unavailable() -> None:
    with KVClient([unused_endpoint(), unused_endpoint()], timeout=0.2) as client:
        with pytest.raises(UnavailableError, match="no node could serve"):
            client.put("k", "v")
        with pytest.raises(UnavailableError):
            client.get("k")


def test_refused_handshake_raises(cluster: FakeCluster) -> None:
    with (
        KVClient(cluster.endpoints, cluster_id="other") as client,
        pytest.raises(ConnectionRefusedByNodeError, match="cluster id 'other'"),
    ):
        client.put("k", "v")


def test_rejected_request_raises(cluster: FakeCluster) -> None:
    cluster.node("n1").write_errors = [wire.ErrorCode.TOO_LARGE]
    with KVClient(cluster.endpoints) as client:
        with pytest.raises(RequestRejectedError, match="too_large") as caught:
            client.put("k", "v")
        assert caught.value.code == "too_large"
        with pytest.raises(RequestRejectedError, match="not_found"):
            client.transfer_leader("n9")


def test_status_members_and_transfer(cluster: FakeCluster) -> None:
    with KVClient(cluster.endpoints) as client:
        status = client.status(cluster.node("n2").address)
        assert status.node_id == "n2"
        assert status.is_leader is False
        members = client.member_list()
        assert [(member.node_id, member.is_leader) for member in members] == [
            ("n1", True),
            ("n2", False),
            ("n3", False),
        ]
        client.member_add("n4", "127.0.0.1:1", learner=True)
        client.member_promote("n4")
        client.member_remove("n4")
        assert [change.kind for change in cluster.member_changes] == [
            "add_learner",
            "promote_learner",
            "remove",
        ]
        client.transfer_leader("n2")
        assert cluster.leader_id == "n2"
        client.put("k", "v")
    assert len(cluster.node("n2").writes()) == 1


def test_clients_in_threads_and_a_shared_client(cluster: FakeCluster) -> None:
    errors: list[BaseException] = []
    shared = KVClient(cluster.endpoints)

    def work(number: int) -> None:
        try:
            with KVClient(cluster.endpoints) as own:
                for step in range(20):
                    own.append("own", "x")
                    shared.append("shared", "y")
                    assert own.get(f"missing{number}.{step}") is None
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(number,)) for number in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    shared.close()
    assert errors == []
    assert cluster.machine.get("own") == "x" * 80
    assert cluster.machine.get("shared") == "y" * 80


def test_closed_client_refuses_calls(cluster: FakeCluster) -> None:
    client = KVClient(cluster.endpoints)
    client.close()
    with pytest.raises(Exception, match="closed"):
        client.put("k", "v")


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="at least one endpoint"):
        KVClient([])
    with pytest.raises(ValueError, match="not host:port"):
        KVClient(["localhost"])
    with pytest.raises(ValueError, match="timeout"):
        KVClient(["127.0.0.1:1"], timeout=0)
