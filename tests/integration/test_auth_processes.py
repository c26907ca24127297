"""Authentication and permissions on real node processes (one 3-node cluster for the
module): set up with the `quorumlog user|role|auth` commands as an operator would, then
every refusal the issue asks for, and a leader change under an authenticated client.

Roles: "app" has readwrite on keys starting "app/"; "orders-reader" read on topic
"orders"; "orders-writer" write on it. Users: root (root), alice (app), carol
(orders-reader), dave (orders-writer).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from quorumlog import Admin, Consumer, KVClient, Producer
from quorumlog.auth.client import AuthClient
from quorumlog.cli.main import cli
from quorumlog.errors import AuthenticationRequiredError, PermissionDeniedError

from .process_cluster import ProcessCluster, wait_until

WAIT_SECONDS = 20.0
ROOT = "root:rootpw"


class AuthCluster:
    def __init__(self, cluster: ProcessCluster) -> None:
        self.cluster = cluster
        self.endpoints = cluster.endpoints
        self.cluster_id = cluster.cluster_id

    def command(self, *arguments: str, user: str | None = ROOT, ok: bool = True) -> str:
        """Run `quorumlog ARGUMENTS` in process; its output (asserting it succeeded, or
        failed when `ok` is False)."""
        options = ["--endpoints", ",".join(self.endpoints), "--cluster-id", self.cluster_id]
        if user is not None:
            options += ["--user", user]
        result = CliRunner().invoke(cli, [*arguments, *options])
        assert (result.exit_code == 0) == ok, (arguments, result.output, result.exception)
        # A refusal reaches the runner as the exception `quorumlog`'s main() would print.
        return result.output + ("" if result.exception is None else str(result.exception))

    def kv(self, user: str | None, password: str | None, timeout: float = 10.0) -> KVClient:
        return KVClient(
            self.endpoints,
            timeout=timeout,
            cluster_id=self.cluster_id,
            user=user,
            password=password,
        )


@pytest.fixture(scope="module")
def auth_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthCluster]:
    with ProcessCluster(tmp_path_factory.mktemp("auth"), node_count=3) as running:
        running.wait_for_leader(timeout_seconds=WAIT_SECONDS)
        cluster = AuthCluster(running)
        cluster.command("user", "add", ROOT, user=None)
        # No root role yet: `auth enable` is refused, and auth stays off.
        refused = cluster.command("auth", "enable", user=None, ok=False)
        assert "root" in refused
        cluster.command("user", "grant-role", "root", "root", user=None)
        assert "Enabled" in cluster.command("auth", "enable", user=None)
        cluster.command("role", "add", "app")
        cluster.command("role", "grant-permission", "app", "readwrite", "app/", "--prefix")
        for role, access in (("orders-reader", "read"), ("orders-writer", "write")):
            cluster.command("role", "add", role)
            cluster.command("role", "grant-permission", role, access, "orders", "--topic")
        for name, role in (("alice", "app"), ("carol", "orders-reader"), ("dave", "orders-writer")):
            cluster.command("user", "add", name, "--new-user-password", f"{name}pw")
            cluster.command("user", "grant-role", name, role)
        with Admin(
            cluster.endpoints, cluster_id=cluster.cluster_id, user="root", password="rootpw"
        ) as admin:
            admin.create_topic("orders", partitions=1, replication=3)
        yield cluster


def test_the_commands_show_the_state(auth_cluster: AuthCluster) -> None:
    assert "true" in auth_cluster.command("auth", "status")
    assert auth_cluster.command("user", "list").split() == ["alice", "carol", "dave", "root"]
    assert "Roles: app" in auth_cluster.command("user", "get", "alice")
    assert "app/" in auth_cluster.command("role", "get", "app")
    # Without credentials, or as a user without the auth right, the state is not shown.
    auth_cluster.command("user", "list", user=None, ok=False)
    auth_cluster.command("user", "list", user="alice:alicepw", ok=False)


def test_requests_without_or_with_wrong_credentials_are_refused(
    auth_cluster: AuthCluster,
) -> None:
    with auth_cluster.kv(None, None) as anonymous, pytest.raises(AuthenticationRequiredError):
        anonymous.put("app/x", "1")
    with (
        auth_cluster.kv("alice", "wrong") as guessing,
        pytest.raises(AuthenticationRequiredError, match="authentication_failed"),
    ):
        guessing.get("app/x")


def test_a_user_with_readwrite_on_a_prefix_is_held_to_it(auth_cluster: AuthCluster) -> None:
    with auth_cluster.kv("alice", "alicepw") as alice:
        alice.put("app/x", "1")
        assert alice.get("app/x") == "1"
        assert alice.scan_prefix("app/") == [("app/x", "1")]
        with pytest.raises(PermissionDeniedError):
            alice.put("other/x", "1")
        with pytest.raises(PermissionDeniedError):
            alice.get("other/x")
        with pytest.raises(PermissionDeniedError):
            alice.scan_prefix("ap")  # [ap, aq) reaches past app/
        with pytest.raises(PermissionDeniedError):
            alice.get("__auth/users")
        with pytest.raises(PermissionDeniedError):
            alice.member_remove("n3")
    with auth_cluster.kv("root", "rootpw") as root, pytest.raises(PermissionDeniedError):
        root.put("__auth/users", "{}")  # not even root writes the auth state as a key


def test_topic_permissions_hold_producers_and_consumers(auth_cluster: AuthCluster) -> None:
    endpoints, cluster_id = auth_cluster.endpoints, auth_cluster.cluster_id
    with Producer(endpoints, cluster_id=cluster_id, user="dave", password="davepw") as dave:
        assert dave.send("orders", b"order-1").result(timeout=WAIT_SECONDS).offset == 0
    with Producer(
        endpoints, cluster_id=cluster_id, user="carol", password="carolpw", timeout=5.0
    ) as carol_producing:
        refused = carol_producing.send("orders", b"order-2")
        carol_producing.flush()
        assert isinstance(refused.exception(), PermissionDeniedError)
    with Consumer(
        endpoints, cluster_id=cluster_id, user="carol", password="carolpw", group="billing"
    ) as carol:
        assert [record.value for record in carol.read("orders", 0, 0, 10)] == [b"order-1"]
        carol.commit("orders", 0, 1)
        assert carol.committed("orders", 0) == 1
    with (
        Consumer(endpoints, cluster_id=cluster_id, user="alice", password="alicepw") as alice,
        pytest.raises(PermissionDeniedError),
    ):
        alice.read("orders", 0, 0, 10)
    with (
        Admin(endpoints, cluster_id=cluster_id, user="dave", password="davepw") as admin,
        pytest.raises(PermissionDeniedError),
    ):
        admin.create_topic("more-orders")


def test_only_root_switches_auth(auth_cluster: AuthCluster) -> None:
    for arguments in (("auth", "disable"), ("auth", "enable")):
        output = auth_cluster.command(*arguments, user="alice:alicepw", ok=False)
        assert "permission_denied" in output
    auth_cluster.command("auth", "disable", user=None, ok=False)
    with AuthClient(
        auth_cluster.endpoints, cluster_id=auth_cluster.cluster_id, user="root", password="rootpw"
    ) as root:
        assert root.auth_status()


def test_an_authenticated_client_follows_a_leader_change(auth_cluster: AuthCluster) -> None:
    cluster = auth_cluster.cluster
    with auth_cluster.kv("alice", "alicepw") as alice, auth_cluster.kv("root", "rootpw") as root:
        alice.put("app/before", "1")
        leader = cluster.wait_for_leader(timeout_seconds=WAIT_SECONDS)
        target = next(node for node in sorted(cluster.nodes) if node != leader)
        root.transfer_leader(target)
        wait_until(lambda: cluster.leader() == target or None, WAIT_SECONDS, f"{target} to lead")
        # The new leader never issued alice's token: she authenticates there, unseen.
        alice.put("app/after", "2")
        assert alice.get("app/before") == "1"
        assert alice.get("app/after") == "2"


def test_ledger_topics_work_with_auth_on(auth_cluster: AuthCluster) -> None:
    """Nodes write ledger metadata, leases and bookie heartbeats through the checked KV:
    they authenticate to each other with the node secret `auth enable` stored."""
    endpoints, cluster_id = auth_cluster.endpoints, auth_cluster.cluster_id
    with Admin(endpoints, cluster_id=cluster_id, user="root", password="rootpw") as admin:
        admin.create_topic("ledgered", storage="ledger", ensemble=3, write_quorum=2, ack_quorum=2)
    with Producer(endpoints, cluster_id=cluster_id, user="root", password="rootpw") as producer:
        sent = [producer.send("ledgered", f"entry-{i}".encode()) for i in range(20)]
        offsets = [future.result(timeout=WAIT_SECONDS).offset for future in sent]
    assert offsets == list(range(20))
    with Consumer(endpoints, cluster_id=cluster_id, user="root", password="rootpw") as consumer:
        values = [record.value for record in consumer.read("ledgered", 0, 0, 100)]
    assert values == [f"entry-{i}".encode() for i in range(20)]
