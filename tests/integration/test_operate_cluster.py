"""Operating a cluster of real node processes: advertised addresses, `endpoint health` and
`endpoint status`, and the internal keys the user KV API cannot touch.

One cluster serves the module (its nodes listen on 0.0.0.0 and advertise 127.0.0.1); the
last test kills a member, so tests that need every member come first.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog.codec.frame import FrameDecoder, encode_frame
from quorumlog.codec.wire import ErrorResponse, Frame, KVRead, decode, encode
from quorumlog.kv.connection import hello_frame
from quorumlog.ledger.metadata_kv import KVMetadataStore
from quorumlog.stream.client_admin import Admin

from .process_cluster import NodeProcess, ProcessCluster, wait_until

WAIT_SECONDS = 30.0
"""Generous: the machine is shared, and bookies register only after an election."""
COMMAND_TIMEOUT_SECONDS = 60.0


class WildcardCluster(ProcessCluster):
    """Nodes that listen on every interface and advertise their loopback address."""

    def command(self, node: NodeProcess) -> list[str]:
        arguments = super().command(node)
        listen = arguments.index("--listen")
        arguments[listen + 1] = f"0.0.0.0:{node.port}"
        return [*arguments, "--advertise", node.address]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WildcardCluster]:
    with WildcardCluster(tmp_path_factory.mktemp("operate")) as started:
        started.wait_for_leader(timeout_seconds=WAIT_SECONDS)
        yield started


def quorumlog(*arguments: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quorumlog", *arguments],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_SECONDS,
        cwd=cwd,
    )


def one_request(address: str, request: KVRead, cluster_id: str) -> Frame:
    """The answer to `request` sent on a fresh connection to `address` alone."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5.0) as sock:
        sock.sendall(hello_frame(cluster_id, "operate-test"))
        sock.sendall(encode_frame(encode(request)))
        decoder = FrameDecoder()
        frames: list[Frame] = []
        while len(frames) < 2:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError(f"{address} closed the connection")
            frames.extend(decode(payload) for payload in decoder.feed(data))
        return frames[1]


# --- advertised addresses --------------------------------------------------------------


def test_a_node_that_would_advertise_a_wildcard_refuses_to_start(tmp_path: Path) -> None:
    """On the real command: one line, exit 2 (every wildcard form: tests/unit/node)."""
    finished = quorumlog(
        *("node", "--id", "n1", "--listen", "0.0.0.0:0", "--data-dir", str(tmp_path / "n1"))
    )
    assert finished.returncode == 2, finished.stderr
    lines = finished.stderr.strip().splitlines()
    assert len(lines) == 1 and "wildcard" in lines[0], finished.stderr
    assert "--advertise" in lines[0]
    assert not (tmp_path / "n1" / "kv").exists()  # refused before opening any group


def test_clients_are_told_the_advertised_address(cluster: WildcardCluster) -> None:
    leader = cluster.wait_for_leader(timeout_seconds=WAIT_SECONDS)
    follower = next(node_id for node_id in cluster.nodes if node_id != leader)
    status = cluster.status(follower)
    assert status is not None
    assert status.addresses == {node_id: cluster.address(node_id) for node_id in cluster.nodes}

    def hinted_refusal() -> ErrorResponse | None:
        # A follower knows the leader from its first message: a moment after the election.
        answer = one_request(
            cluster.address(follower), KVRead(request_id=7, keys=["k"]), "integration"
        )
        assert isinstance(answer, ErrorResponse)
        return answer if answer.leader_hint is not None else None

    refusal = wait_until(hinted_refusal, WAIT_SECONDS, "the follower to know its leader")
    assert refusal.leader_hint == cluster.address(leader)

    with Admin(cluster.endpoints, timeout=WAIT_SECONDS, cluster_id="integration") as admin:
        admin.create_topic("advertised", partitions=1, replication=3)
        descriptor = admin.topic_descriptor("advertised")
    assert set(descriptor.addresses.values()) == set(cluster.endpoints)

    store = KVMetadataStore(cluster.client(timeout=WAIT_SECONDS))
    bookies = wait_until(
        lambda: (found := store.all_bookies()) and len(found) == 3 and found,
        WAIT_SECONDS,
        "three bookie registrations",
    )
    assert {bookie.address for bookie in bookies} == set(cluster.endpoints)


# --- endpoint health and status ---------------------------------------------------------


def test_endpoint_health_of_the_whole_cluster_from_one_endpoint(cluster: WildcardCluster) -> None:
    one = cluster.endpoints[0]
    finished = quorumlog(
        "endpoint", "health", "--cluster", "-w", "json", "--endpoints", one,
        "--cluster-id", "integration",
    )  # fmt: skip
    assert finished.returncode == 0, finished.stdout + finished.stderr
    rows = json.loads(finished.stdout)
    assert sorted(row["endpoint"] for row in rows) == sorted(cluster.endpoints)
    assert all(row["health"] and not row["error"] for row in rows)


def test_endpoint_status_of_the_whole_cluster(cluster: WildcardCluster) -> None:
    leader = cluster.wait_for_leader(timeout_seconds=WAIT_SECONDS)
    finished = quorumlog(
        "endpoint", "status", "--cluster", "-w", "json",
        "--endpoints", cluster.endpoints[-1], "--cluster-id", "integration",
    )  # fmt: skip
    assert finished.returncode == 0, finished.stdout + finished.stderr
    rows = json.loads(finished.stdout)
    assert sorted(row["node_id"] for row in rows) == sorted(cluster.nodes)
    assert [row["node_id"] for row in rows if row["is_leader"]] == [leader]
    table = quorumlog(
        "endpoint", "status", "--endpoints", ",".join(cluster.endpoints),
        "--cluster-id", "integration",
    )  # fmt: skip
    assert table.returncode == 0 and "IS LEADER" in table.stdout, table.stderr


# --- internal keys ------------------------------------------------------------------------


def test_quorumlog_kv_cannot_touch_internal_keys(cluster: WildcardCluster) -> None:
    """The topic made above has its descriptor at __topics/advertised; `quorumlog kv` may
    read it by name but not overwrite or delete it (the node refuses, exit 1)."""
    endpoints = ("--endpoints", ",".join(cluster.endpoints), "--cluster-id", "integration")
    for arguments in (("put", "__topics/advertised", "x"), ("del", "__topics/advertised")):
        finished = quorumlog("kv", *arguments, *endpoints)
        assert finished.returncode == 1, finished.stdout + finished.stderr
        lines = finished.stderr.strip().splitlines()
        assert len(lines) == 1 and "reserved_key" in lines[0], finished.stderr
    with Admin(cluster.endpoints, timeout=WAIT_SECONDS, cluster_id="integration") as admin:
        assert admin.describe_topic("advertised").partition_count == 1


# --- last: a member killed ------------------------------------------------------------------


def test_endpoint_health_names_a_killed_member_and_fails(cluster: WildcardCluster) -> None:
    leader = cluster.wait_for_leader(timeout_seconds=WAIT_SECONDS)
    victim = next(node_id for node_id in sorted(cluster.nodes) if node_id != leader)
    survivor = next(node_id for node_id in cluster.nodes if node_id not in (leader, victim))
    cluster.kill(victim)
    finished = quorumlog(
        "endpoint", "health", "--cluster", "-w", "json", "--timeout", "3",
        "--endpoints", cluster.address(survivor), "--cluster-id", "integration",
    )  # fmt: skip
    assert finished.returncode == 1, finished.stdout + finished.stderr
    assert "1 of 3 endpoints are unhealthy" in finished.stderr
    health = {row["endpoint"]: row for row in json.loads(finished.stdout)}
    assert not health[cluster.address(victim)]["health"]
    assert health[cluster.address(victim)]["error"]
    assert health[cluster.address(leader)]["health"]
    assert health[cluster.address(survivor)]["health"]
