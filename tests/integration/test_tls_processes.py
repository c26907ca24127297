"""TLS on real node processes: KV, streams and ledgers over TLS, and every refusal.

One module-scoped cluster of 3 nodes requires TLS of peers and clients, with a certificate
each (`--client-cert-auth`, `--peer-client-cert-auth`, `--peer-cert-allowed-cn`), made by
the certificate maker the command uses (tls/certificates.py); it also hosts the sharded
KV (a controller and two shard groups) and serves ledger and HA topics, whose nodes dial
each other as clients (shard pulls, bookie links, the HA controller) or as HA peers, all
under TLS. A refused client gets a
`TLSHandshakeError` at once (not a timeout), the node logs one line saying why, and the
cluster goes on serving the good clients. Intruding nodes (a certificate from another CA,
the wrong common name, no TLS at all) are single extra processes started against it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog.errors import TLSHandshakeError
from quorumlog.kv.client import KVClient
from quorumlog.ledger.client import LedgerClient
from quorumlog.ledger.metadata_kv import KVMetadataStore
from quorumlog.shard.admin import ShardAdmin
from quorumlog.shard.client import ShardedKVClient
from quorumlog.stream.client_admin import Admin
from quorumlog.stream.consumer import Consumer
from quorumlog.stream.producer import Producer
from quorumlog.tls.certificates import CertificateAuthority, KeyPair
from quorumlog.tls.config import TLSConfig

from .process_cluster import ProcessCluster, free_ports, query_status, wait_until

CLUSTER_ID = "tls"
NODE_COMMON_NAME = "quorumlog-node"
WAIT_SECONDS = 20.0
REFUSAL_SECONDS_MAX = 3.0
"""A refused client hears it at once: well under its 10 s timeout."""
CLIENT_TIMEOUT_SECONDS = 10.0


class Certificates:
    """Our CA with node and client certificates, and intruders' certificates."""

    def __init__(self, directory: Path) -> None:
        ours = CertificateAuthority(directory / "ours", "ca")
        other = CertificateAuthority(directory / "other", "ca")
        self.ca_file = ours.cert_file
        self.node = ours.issue("node", NODE_COMMON_NAME)
        self.client = ours.issue("client", "alice")
        self.wrong_name = ours.issue("intruder", "intruder")
        self.nobody = ours.issue("nobody", "nobody")
        self.other_ca_file = other.cert_file
        self.other_node = other.issue("node", NODE_COMMON_NAME)
        self.other_client = other.issue("client", "alice")

    def client_tls(self) -> TLSConfig:
        return TLSConfig(
            ca_file=self.ca_file, cert_file=self.client.cert_file, key_file=self.client.key_file
        )


def node_tls_arguments(ca_file: str, node: KeyPair) -> list[str]:
    return [
        *("--cert-file", node.cert_file, "--key-file", node.key_file),
        *("--trusted-ca-file", ca_file, "--client-cert-auth"),
        *("--peer-cert-file", node.cert_file, "--peer-key-file", node.key_file),
        *("--peer-trusted-ca-file", ca_file, "--peer-client-cert-auth"),
        *("--peer-cert-allowed-cn", NODE_COMMON_NAME),
    ]


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return Certificates(tmp_path_factory.mktemp("certificates"))


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, certificates: Certificates
) -> Iterator[ProcessCluster]:
    with ProcessCluster(
        tmp_path_factory.mktemp("tls-cluster"),
        cluster_id=CLUSTER_ID,
        extra_arguments=[
            *node_tls_arguments(certificates.ca_file, certificates.node),
            *("--controller", "n1,n2,n3"),
            *("--shard-group", "1=n1,n2,n3", "--shard-group", "2=n1,n2,n3"),
        ],
        tls=certificates.client_tls(),
    ) as started:
        started.wait_for_leader(timeout_seconds=WAIT_SECONDS)
        yield started


def tls_client(cluster: ProcessCluster, tls: TLSConfig | None) -> KVClient:
    return KVClient(
        cluster.endpoints, timeout=CLIENT_TIMEOUT_SECONDS, cluster_id=CLUSTER_ID, tls=tls
    )


def logged(cluster: ProcessCluster, text: str) -> bool:
    return any(text in cluster.log_text(node_id) for node_id in cluster.nodes)


def assert_refused_quickly(
    cluster: ProcessCluster, tls: TLSConfig | None, says: str
) -> TLSHandshakeError:
    started = time.monotonic()
    with tls_client(cluster, tls) as client, pytest.raises(TLSHandshakeError) as raised:
        client.get("anything")
    assert time.monotonic() - started < REFUSAL_SECONDS_MAX
    assert says in str(raised.value)
    return raised.value


def assert_still_serving(cluster: ProcessCluster, certificates: Certificates, key: str) -> None:
    with tls_client(cluster, certificates.client_tls()) as client:
        client.put(key, "still here")
        assert client.get(key) == "still here"


# --- over TLS ------------------------------------------------------------------------------


def test_kv_over_tls(cluster: ProcessCluster, certificates: Certificates) -> None:
    with tls_client(cluster, certificates.client_tls()) as client:
        client.put("colour", "blue")
        assert client.get("colour") == "blue"
        assert client.cas("colour", "blue", "green")
        assert [member.node_id for member in client.member_list()] == ["n1", "n2", "n3"]


def test_produce_and_consume_over_tls(cluster: ProcessCluster, certificates: Certificates) -> None:
    tls = certificates.client_tls()
    endpoints = cluster.endpoints
    with Admin(endpoints, cluster_id=CLUSTER_ID, tls=tls) as admin:
        admin.create_topic("orders", partitions=2, replication=3)
    with Producer(endpoints, cluster_id=CLUSTER_ID, linger_ms=0, tls=tls) as producer:
        sent = [producer.send("orders", f"order-{n}".encode(), partition=n % 2) for n in range(20)]
        producer.flush()
        assert all(future.result(timeout=WAIT_SECONDS).offset >= 0 for future in sent)
    with Consumer(endpoints, cluster_id=CLUSTER_ID, tls=tls) as consumer:
        values = [record.value for p in (0, 1) for record in consumer.read("orders", p, 0)]
    assert sorted(values) == sorted(f"order-{n}".encode() for n in range(20))


def test_ledger_client_over_tls(cluster: ProcessCluster, certificates: Certificates) -> None:
    tls = certificates.client_tls()
    with tls_client(cluster, tls) as kv:
        # The nodes' bookies register themselves through TLS clients of their own.
        store = KVMetadataStore(kv)
        wait_until(lambda: len(store.writable_bookies()) >= 3, WAIT_SECONDS, "3 bookies")
    with LedgerClient(cluster.endpoints, cluster_id=CLUSTER_ID, tls=tls) as client:
        handle = client.create_ledger(3, 2, 2, password=b"secret")
        first = handle.append_many([f"entry-{n}".encode() for n in range(50)])
        handle.close()
        reader = client.open_ledger(handle.ledger_id, password=b"secret")
        entries = reader.read(first, reader.last_add_confirmed)
    assert [entry.data for entry in entries] == [f"entry-{n}".encode() for n in range(50)]


@pytest.mark.parametrize("storage", ["ledger", "ha"])
def test_ledger_and_ha_topics_over_tls(
    cluster: ProcessCluster, certificates: Certificates, storage: str
) -> None:
    tls = certificates.client_tls()
    topic = f"{storage}-topic"
    with tls_client(cluster, tls) as kv:
        store = KVMetadataStore(kv)
        wait_until(lambda: len(store.writable_bookies()) >= 3, WAIT_SECONDS, "3 bookies")
    with Admin(cluster.endpoints, cluster_id=CLUSTER_ID, tls=tls) as admin:
        admin.create_topic(topic, partitions=1, replication=3, storage=storage)
    with Producer(
        cluster.endpoints, cluster_id=CLUSTER_ID, linger_ms=0, timeout=WAIT_SECONDS, tls=tls
    ) as producer:
        sent = [producer.send(topic, f"{storage}-{n}".encode()) for n in range(10)]
        producer.flush()
        assert all(future.result(timeout=WAIT_SECONDS).offset >= 0 for future in sent)
    with Consumer(cluster.endpoints, cluster_id=CLUSTER_ID, tls=tls) as consumer:
        values = [record.value for record in consumer.read(topic, 0, 0)]
    assert values == [f"{storage}-{n}".encode() for n in range(10)]


def test_sharded_kv_over_tls_moves_shards_between_groups(
    cluster: ProcessCluster, certificates: Certificates
) -> None:
    """Joining the second group moves shards to it: its leader pulls them from the first
    group's through the nodes' own TLS clients (node/peer_requests.py)."""
    tls = certificates.client_tls()
    servers = ["n1", "n2", "n3"]
    with ShardAdmin(
        cluster.endpoints, timeout=WAIT_SECONDS, cluster_id=CLUSTER_ID, tls=tls
    ) as admin:
        admin.join({1: servers})
        with ShardedKVClient(
            cluster.endpoints, timeout=WAIT_SECONDS, cluster_id=CLUSTER_ID, tls=tls
        ) as client:
            for number in range(20):
                client.put(f"sharded-{number}", str(number))
            admin.join({2: servers})
            owners = admin.query().shards
            assert set(owners) == {1, 2}  # some shards moved to the new group
            assert [client.get(f"sharded-{number}") for number in range(20)] == [
                str(number) for number in range(20)
            ]


# --- refused clients -----------------------------------------------------------------------


def test_a_plaintext_client_is_refused_with_the_reason(
    cluster: ProcessCluster, certificates: Certificates
) -> None:
    assert_refused_quickly(cluster, None, "speaks TLS and this client does not")
    wait_until(lambda: logged(cluster, "it does not speak TLS"), WAIT_SECONDS, "the node's log")
    assert_still_serving(cluster, certificates, "after-plaintext")


def test_a_client_without_a_certificate_is_refused(
    cluster: ProcessCluster, certificates: Certificates
) -> None:
    assert_refused_quickly(
        cluster, TLSConfig(ca_file=certificates.ca_file), "did not accept this client's"
    )
    wait_until(
        lambda: logged(cluster, "no certificate was presented"), WAIT_SECONDS, "the node's log"
    )
    assert_still_serving(cluster, certificates, "after-no-certificate")


def test_a_client_certificate_from_another_ca_is_refused(
    cluster: ProcessCluster, certificates: Certificates
) -> None:
    other = certificates.other_client
    tls = TLSConfig(
        ca_file=certificates.ca_file, cert_file=other.cert_file, key_file=other.key_file
    )
    assert_refused_quickly(cluster, tls, "did not accept this client's")
    wait_until(
        lambda: logged(cluster, "TLS handshake failed: the node's certificate is not trusted"),
        WAIT_SECONDS,
        "the node's log",
    )
    assert_still_serving(cluster, certificates, "after-other-ca")


def test_a_client_that_does_not_trust_the_nodes_ca_is_told_so(
    cluster: ProcessCluster, certificates: Certificates
) -> None:
    client = certificates.client
    tls = TLSConfig(
        ca_file=certificates.other_ca_file, cert_file=client.cert_file, key_file=client.key_file
    )
    assert_refused_quickly(cluster, tls, "the node's certificate is not trusted")


def test_the_host_name_is_checked_unless_turned_off(
    cluster: ProcessCluster, certificates: Certificates
) -> None:
    trusted = certificates.client_tls()
    wrong_name = TLSConfig(
        ca_file=trusted.ca_file,
        cert_file=trusted.cert_file,
        key_file=trusted.key_file,
        server_hostname="node.example.com",
    )
    assert_refused_quickly(cluster, wrong_name, "Hostname mismatch")
    unchecked = TLSConfig(
        ca_file=trusted.ca_file,
        cert_file=trusted.cert_file,
        key_file=trusted.key_file,
        server_hostname="node.example.com",
        check_hostname=False,
    )
    with tls_client(cluster, unchecked) as client:
        client.put("unchecked", "ok")


# --- refused peers -------------------------------------------------------------------------


class Intruder:
    """One extra node process that says it is a peer of the cluster ("n0": the smaller id
    dials, so it dials every member at once)."""

    def __init__(self, cluster: ProcessCluster, directory: Path, arguments: list[str]) -> None:
        self.address = f"127.0.0.1:{free_ports(1)[0]}"
        peers = ",".join(f"{node_id}={node.address}" for node_id, node in cluster.nodes.items())
        self.log_path = directory / "n0.log"
        command = [
            *(sys.executable, "-m", "quorumlog", "node", "--id", "n0"),
            *("--listen", self.address, "--peers", peers, "--join"),
            *("--data-dir", str(directory / "n0"), "--cluster-id", CLUSTER_ID),
            *("--no-bookie", "--tick-ms", "25"),
            *arguments,
        ]
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(command, stdout=log_file, stderr=log_file)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.mark.parametrize(
    ("kind", "members_log"),
    [
        ("another CA", "TLS handshake failed"),
        ("the wrong common name", "CN is 'intruder', not the allowed 'quorumlog-node'"),
        ("no TLS", "it does not speak TLS"),
    ],
)
def test_a_peer_without_a_valid_certificate_cannot_join(
    cluster: ProcessCluster,
    certificates: Certificates,
    tmp_path: Path,
    kind: str,
    members_log: str,
) -> None:
    arguments = {
        "another CA": node_tls_arguments(certificates.other_ca_file, certificates.other_node),
        "the wrong common name": node_tls_arguments(certificates.ca_file, certificates.wrong_name),
        "no TLS": [],
    }[kind]
    before = {node_id: len(cluster.log_text(node_id)) for node_id in cluster.nodes}

    def members_refused() -> bool:
        return any(
            members_log in cluster.log_text(node_id)[offset:] for node_id, offset in before.items()
        )

    intruder = Intruder(cluster, tmp_path, arguments)
    try:
        wait_until(members_refused, WAIT_SECONDS, f"a member refusing a peer with {kind}")
        leader = cluster.wait_for_leader(timeout_seconds=WAIT_SECONDS)
        status = cluster.status(leader)
        assert status is not None and "n0" not in status.voters + status.learners
        assert_still_serving(cluster, certificates, f"after-intruder-{kind}")
        assert intruder.process.poll() is None, intruder.log_text()  # it runs, unheard
    finally:
        intruder.stop()


def test_a_status_query_without_tls_gets_nothing(cluster: ProcessCluster) -> None:
    """The test kit's own plaintext probe is refused as any plaintext client is."""
    assert query_status(cluster.endpoints[0], CLUSTER_ID) is None


def test_with_auth_on_a_client_certificate_names_its_user(
    cluster: ProcessCluster, certificates: Certificates
) -> None:
    """--client-cert-auth with auth enabled (etcd's rule): a client that sends no user or
    password is served with the rights of the user its certificate's common name names;
    a certificate naming no user gets AuthenticationRequiredError. Runs last: it turns
    auth on, and off again at the end."""
    from quorumlog.auth.client import AuthClient
    from quorumlog.auth.model import Access, Permission, PermissionKind
    from quorumlog.errors import AuthenticationRequiredError, PermissionDeniedError

    nobody = certificates.nobody
    client_tls = certificates.client_tls()  # CN "alice"
    admin = AuthClient(
        cluster.endpoints, cluster_id=CLUSTER_ID, timeout=CLIENT_TIMEOUT_SECONDS, tls=client_tls
    )
    with admin:
        admin.user_add("root", "rootpw")
        admin.user_grant_role("root", "root")
        admin.role_add("app")
        admin.role_grant_permission(
            "app", Permission(PermissionKind.KEY, Access.READWRITE, "app/", "app0")
        )
        admin.user_add("alice", "alicepw")
        admin.user_grant_role("alice", "app")
        admin.auth_enable()
    try:
        with tls_client(cluster, client_tls) as alice:
            alice.put("app/x", "by certificate")
            assert alice.get("app/x") == "by certificate"
            with pytest.raises(PermissionDeniedError):
                alice.put("other/x", "no")
        stranger = TLSConfig(
            ca_file=certificates.ca_file, cert_file=nobody.cert_file, key_file=nobody.key_file
        )
        with tls_client(cluster, stranger) as client, pytest.raises(AuthenticationRequiredError):
            client.get("app/x")
    finally:
        with AuthClient(
            cluster.endpoints,
            cluster_id=CLUSTER_ID,
            timeout=CLIENT_TIMEOUT_SECONDS,
            tls=client_tls,
            user="root",
            password="rootpw",
        ) as root:
            root.auth_disable()
